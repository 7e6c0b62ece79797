"""flashattn.reference: the oracle itself, checked against hand-computed and loop-computed cases."""
from __future__ import annotations

import math

import pytest
import torch

from flashattn.philox import dropout_keep_mask
from flashattn.reference import (attention_probs_ref, attention_ref, normalize_window,
                                 visible_mask)


def _loop_attention(q, k, v, *, scale, window, softcap=0.0, slopes=None, keep=None, p=0.0):
    """Scalar-by-scalar attention in Python floats: an oracle for the oracle.

    q (b, s_q, h, d), k (b, s_k, h_k, d), v (b, s_k, h_k, d_v) float64; slopes (b, h) or None;
    keep (b, h, s_q, s_k) bool or None. Returns out (b, s_q, h, d_v) and lse (b, h, s_q).
    """
    b, s_q, h, d = q.shape
    s_k, h_k, d_v = k.shape[1], k.shape[2], v.shape[3]
    left, right = window
    out = torch.zeros(b, s_q, h, d_v, dtype=torch.float64)
    lse = torch.full((b, h, s_q), -math.inf, dtype=torch.float64)
    for bi in range(b):
        for hi in range(h):
            kh = hi // (h // h_k)
            for i in range(s_q):
                scores = {}
                for j in range(s_k):
                    c = i + s_k - s_q
                    if (left >= 0 and j < c - left) or (right >= 0 and j > c + right):
                        continue
                    s = sum(float(q[bi, i, hi, x]) * float(k[bi, j, kh, x]) for x in range(d)) * scale
                    if softcap:
                        s = softcap * math.tanh(s / softcap)
                    if slopes is not None:
                        s -= float(slopes[bi, hi]) * abs(c - j)
                    scores[j] = s
                if not scores:
                    continue
                mx = max(scores.values())
                z = sum(math.exp(s - mx) for s in scores.values())
                lse[bi, hi, i] = mx + math.log(z)
                for j, s in scores.items():
                    w = math.exp(s - mx) / z
                    if keep is not None:
                        w = w / (1 - p) if keep[bi, hi, i, j] else 0.0
                    for x in range(d_v):
                        out[bi, i, hi, x] += w * float(v[bi, j, kh, x])
    return out, lse


def test_hand_computed_tiny_case():
    # one head, d = 1, scale 1: scores are products of scalars
    q = torch.tensor([1.0, 2.0], dtype=torch.float64).view(1, 2, 1, 1)
    k = torch.tensor([0.5, -1.0, 3.0], dtype=torch.float64).view(1, 3, 1, 1)
    v = torch.tensor([10.0, 20.0, 30.0], dtype=torch.float64).view(1, 3, 1, 1)
    # causal, bottom-right: row 0 sees keys 0, 1; row 1 sees keys 0, 1, 2
    out, lse = attention_ref(q, k, v, softmax_scale=1.0, causal=True)
    e0 = [math.exp(0.5), math.exp(-1.0)]
    e1 = [math.exp(1.0), math.exp(-2.0), math.exp(6.0)]
    expected_out = [(10 * e0[0] + 20 * e0[1]) / sum(e0),
                    (10 * e1[0] + 20 * e1[1] + 30 * e1[2]) / sum(e1)]
    expected_lse = [math.log(sum(e0)), math.log(sum(e1))]
    assert out.dtype == torch.float64 and out.shape == (1, 2, 1, 1)
    assert lse.shape == (1, 1, 2)
    torch.testing.assert_close(out.flatten(), torch.tensor(expected_out, dtype=torch.float64))
    torch.testing.assert_close(lse.flatten(), torch.tensor(expected_lse, dtype=torch.float64))


def test_visible_mask_patterns():
    # causal, s_q < s_k: the diagonal ends at the bottom-right corner
    expected = torch.tensor([[1, 1, 1, 0, 0],
                             [1, 1, 1, 1, 0],
                             [1, 1, 1, 1, 1]], dtype=torch.bool)
    assert torch.equal(visible_mask(3, 5, -1, 0), expected)
    # causal, s_q > s_k: the first rows see nothing
    expected = torch.tensor([[0, 0], [0, 0], [1, 0], [1, 1]], dtype=torch.bool)
    assert torch.equal(visible_mask(4, 2, -1, 0), expected)
    # window (1, 1), square
    expected = torch.tensor([[1, 1, 0, 0],
                             [1, 1, 1, 0],
                             [0, 1, 1, 1],
                             [0, 0, 1, 1]], dtype=torch.bool)
    assert torch.equal(visible_mask(4, 4, 1, 1), expected)
    assert visible_mask(3, 7, -1, -1).all()


def test_normalize_window():
    assert normalize_window(False, (-1, -1)) == (-1, -1)
    assert normalize_window(True, (-1, -1)) == (-1, 0)
    assert normalize_window(True, (4, 7)) == (4, 0)
    assert normalize_window(False, (3, -5)) == (3, -1)


CASES = [
    # s_q, s_k, h, h_k, d, d_v, causal, window, softcap, alibi, dropout_p
    (3, 4, 2, 1, 3, 2, False, (-1, -1), 0.0, False, 0.0),
    (4, 3, 2, 2, 2, 3, True, (-1, -1), 0.0, True, 0.0),    # s_q > s_k: row 0 sees nothing
    (5, 5, 2, 1, 3, 3, False, (1, 2), 2.0, True, 0.0),
    (6, 2, 1, 1, 2, 2, False, (0, 0), 0.0, False, 0.0),    # most rows see nothing
    (4, 6, 2, 1, 2, 2, True, (2, -1), 1.5, False, 0.3),
]


@pytest.mark.parametrize("s_q, s_k, h, h_k, d, d_v, causal, window, softcap, alibi, p", CASES)
def test_matches_loop_oracle(s_q, s_k, h, h_k, d, d_v, causal, window, softcap, alibi, p):
    b = 2
    q = torch.randn(b, s_q, h, d, dtype=torch.float64)
    k = torch.randn(b, s_k, h_k, d, dtype=torch.float64)
    v = torch.randn(b, s_k, h_k, d_v, dtype=torch.float64)
    slopes = torch.rand(b, h, dtype=torch.float32) if alibi else None
    keep = dropout_keep_mask(977, p, b, h, s_q, s_k) if p > 0 else None
    scale = 0.7
    out, lse = attention_ref(q, k, v, softmax_scale=scale, causal=causal, window_size=window,
                             softcap=softcap, alibi_slopes=slopes, dropout_p=p, dropout_mask=keep)
    exp_out, exp_lse = _loop_attention(q, k, v, scale=scale, window=normalize_window(causal, window),
                                       softcap=softcap, slopes=slopes, keep=keep, p=p)
    torch.testing.assert_close(out, exp_out)
    torch.testing.assert_close(lse, exp_lse)  # -inf entries must coincide


def test_alibi_slopes_per_head_equals_per_batch_head():
    b, s, h, d = 2, 5, 3, 4
    q, k, v = (torch.randn(b, s, h, d, dtype=torch.float64) for _ in range(3))
    slopes = torch.rand(h)
    o1, l1 = attention_ref(q, k, v, alibi_slopes=slopes, causal=True)
    o2, l2 = attention_ref(q, k, v, alibi_slopes=slopes.expand(b, h), causal=True)
    torch.testing.assert_close(o1, o2)
    torch.testing.assert_close(l1, l2)


def test_rows_without_keys_are_zero_and_grads_finite():
    b, s_q, s_k, h, d = 1, 6, 3, 2, 4
    q, k, v = (torch.randn(b, s, h, d, dtype=torch.float64, requires_grad=True)
               for s in (s_q, s_k, s_k))
    out, lse = attention_ref(q, k, v, causal=True, softcap=3.0, alibi_slopes=torch.rand(h))
    # s_q - s_k = 3 leading rows see no key
    assert torch.equal(out[:, :3], torch.zeros_like(out[:, :3]))
    assert torch.isneginf(lse[..., :3]).all() and torch.isfinite(lse[..., 3:]).all()
    (out * torch.randn_like(out)).sum().backward()
    for x in (q, k, v):
        assert torch.isfinite(x.grad).all()
    assert torch.equal(q.grad[:, :3], torch.zeros_like(q.grad[:, :3]))


def test_gradcheck_with_every_feature():
    b, s_q, s_k, h, h_k, d, d_v = 1, 4, 5, 2, 1, 3, 2
    q = torch.randn(b, s_q, h, d, dtype=torch.float64, requires_grad=True)
    k = torch.randn(b, s_k, h_k, d, dtype=torch.float64, requires_grad=True)
    v = torch.randn(b, s_k, h_k, d_v, dtype=torch.float64, requires_grad=True)
    keep = dropout_keep_mask(5, 0.25, b, h, s_q, s_k)

    def f(q, k, v):
        # window (1, 0) with s_q < s_k: every row sees 2 keys, some columns none
        return attention_ref(q, k, v, window_size=(1, 0), softcap=2.5,
                             alibi_slopes=torch.rand(h, generator=torch.Generator().manual_seed(0)),
                             dropout_p=0.25, dropout_mask=keep)[0]

    assert torch.autograd.gradcheck(f, (q, k, v))


def test_gqa_equals_repeated_heads():
    b, s, h, h_k, d = 2, 5, 6, 2, 4
    q = torch.randn(b, s, h, d, dtype=torch.float64)
    k = torch.randn(b, s, h_k, d, dtype=torch.float64)
    v = torch.randn(b, s, h_k, d, dtype=torch.float64)
    out, lse = attention_ref(q, k, v, causal=True)
    # query heads 0..2 use kv head 0, heads 3..5 kv head 1
    k_rep = k[:, :, [0, 0, 0, 1, 1, 1]]
    v_rep = v[:, :, [0, 0, 0, 1, 1, 1]]
    out2, lse2 = attention_ref(q, k_rep, v_rep, causal=True)
    torch.testing.assert_close(out, out2)
    torch.testing.assert_close(lse, lse2)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32])
def test_low_precision_mode(dtype):
    b, s, h, d = 2, 9, 2, 8
    q, k, v = (torch.randn(b, s, h, d, dtype=dtype) for _ in range(3))
    out, lse = attention_ref(q, k, v, causal=True, upcast=False)
    out64, lse64 = attention_ref(q, k, v, causal=True)
    assert out.dtype == dtype and lse.dtype == torch.float32
    assert out64.dtype == torch.float64 and lse64.dtype == torch.float64
    tol = {torch.float16: 1e-2, torch.bfloat16: 5e-2, torch.float32: 1e-5}[dtype]
    torch.testing.assert_close(out.double(), out64, atol=tol, rtol=0)
    out_r, _ = attention_ref(q, k, v, causal=True, upcast=False, reorder_ops=True)
    torch.testing.assert_close(out_r.double(), out64, atol=tol, rtol=0)


def test_probs_are_a_softmax():
    b, s_q, s_k, h, d = 1, 7, 5, 2, 4
    q = torch.randn(b, s_q, h, d, dtype=torch.float64)
    k = torch.randn(b, s_k, h, d, dtype=torch.float64)
    probs, lse = attention_probs_ref(q, k, causal=True)
    sums = probs.sum(-1)
    has_key = torch.isfinite(lse)
    torch.testing.assert_close(sums[has_key], torch.ones_like(sums[has_key]))
    assert torch.equal(sums[~has_key], torch.zeros_like(sums[~has_key]))
    assert (probs[..., ~visible_mask(s_q, s_k, -1, 0)] == 0).all()
