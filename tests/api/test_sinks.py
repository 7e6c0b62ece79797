"""Learnable attention sinks (gpt-oss's ``sinks``, transformers' ``s_aux``; issue 20): one
extra logit per head in every row's softmax denominator, attending to nothing.

Expected values come from that definition, computed in float64 by appending the sink as an
extra key column whose value is zero and dropping it after the softmax (the way gpt-oss's
reference code writes it), not from the library's composition."""
from __future__ import annotations

import pytest
import torch

import flashattn
from flashattn.reference import visible_mask


def _ref(q, k, v, sink, causal=False, window=(-1, -1), scale=None):
    """float64 attention with a sink column: (out (b, s_q, h, d_v), lse (b, h, s_q))."""
    b, s_q, h, d = q.shape
    s_k, h_k = k.shape[1], k.shape[2]
    kk = k.double().repeat_interleave(h // h_k, 2)
    vv = v.double().repeat_interleave(h // h_k, 2)
    scale = d ** -0.5 if scale is None else scale
    scores = torch.einsum("bihd,bjhd->bhij", q.double() * scale, kk)
    left, right = window
    if causal:
        right = 0
    vis = visible_mask(s_q, s_k, left, right, q.device)
    scores = scores.masked_fill(~vis, float("-inf"))
    col = sink.double().view(1, h, 1, 1).expand(b, h, s_q, 1)
    full = torch.cat([scores, col], dim=-1)
    lse = torch.logsumexp(full, dim=-1)
    probs = torch.softmax(full, dim=-1)[..., :-1]
    return torch.einsum("bhij,bjhd->bihd", probs, vv), lse


CASES = [(False, (-1, -1)), (True, (-1, -1)), (False, (6, 2))]


@pytest.mark.parametrize("backend", ["cpu", "portable"])
@pytest.mark.parametrize("causal,window", CASES)
def test_dense_forward_and_backward(backend, causal, window):
    torch.manual_seed(0)
    b, s_q, s_k, h, h_k, d = 2, 9, 13, 4, 2, 16
    q = torch.randn(b, s_q, h, d, requires_grad=True)
    k = torch.randn(b, s_k, h_k, d, requires_grad=True)
    v = torch.randn(b, s_k, h_k, d, requires_grad=True)
    sink = torch.randn(h, requires_grad=True)
    with flashattn.use_backend(backend):
        out, lse, _ = flashattn.flash_attn_func(q, k, v, causal=causal, window_size=window,
                                                learnable_sink=sink, return_attn_probs=True)
    qd, kd, vd, sd = (x.detach().double().requires_grad_() for x in (q, k, v, sink))
    ref, ref_lse = _ref(qd, kd, vd, sd, causal, window)
    torch.testing.assert_close(out.double(), ref, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(lse.double(), ref_lse, atol=1e-5, rtol=1e-5)
    g = torch.randn_like(out)
    grads = torch.autograd.grad(out, (q, k, v, sink), g)
    ref_grads = torch.autograd.grad(ref, (qd, kd, vd, sd), g.double())
    for a, r in zip(grads, ref_grads):
        torch.testing.assert_close(a.double(), r, atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("backend", ["cpu", "portable"])
def test_varlen_forward_and_backward(backend):
    torch.manual_seed(1)
    h, d = 2, 16
    cu = torch.tensor([0, 4, 4, 11], dtype=torch.int32)
    q = torch.randn(11, h, d, requires_grad=True)
    k = torch.randn(11, h, d, requires_grad=True)
    v = torch.randn(11, h, d, requires_grad=True)
    sink = torch.randn(h, requires_grad=True)
    with flashattn.use_backend(backend):
        out = flashattn.flash_attn_varlen_func(q, k, v, cu, cu, 7, 7, causal=True,
                                               learnable_sink=sink)
    out.sum().backward()
    for lo, hi in ((0, 4), (4, 11)):
        qd, kd, vd = (x.detach()[lo:hi][None].double() for x in (q, k, v))
        ref, _ = _ref(qd, kd, vd, sink.detach(), causal=True)
        torch.testing.assert_close(out[lo:hi].double(), ref[0], atol=1e-5, rtol=1e-5)
    # d sink = -sum over rows of p_sink * rowsum(dout * out) with dout = 1
    assert sink.grad is not None and torch.isfinite(sink.grad).all()
    sd = sink.detach().double().requires_grad_()
    total = sum(_ref(*(x.detach()[lo:hi][None].double() for x in (q, k, v)), sd, True)[0].sum()
                for lo, hi in ((0, 4), (4, 11)))
    (g_ref,) = torch.autograd.grad(total, sd)
    torch.testing.assert_close(sink.grad.double(), g_ref, atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("backend", ["cpu", "portable"])
def test_kvcache_forward(backend):
    torch.manual_seed(2)
    q = torch.randn(2, 1, 4, 16)
    cache = torch.randn(2, 20, 2, 16)
    seqlens = torch.tensor([20, 7], dtype=torch.int32)
    sink = torch.randn(4)
    with flashattn.use_backend(backend):
        out, lse = flashattn.flash_attn_with_kvcache(q, cache, cache, cache_seqlens=seqlens,
                                                     causal=True, learnable_sink=sink,
                                                     return_softmax_lse=True)
    for i, n in enumerate((20, 7)):
        ref, ref_lse = _ref(q[i:i + 1], cache[i:i + 1, :n], cache[i:i + 1, :n], sink, True)
        torch.testing.assert_close(out[i:i + 1].double(), ref, atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(lse[i:i + 1].double(), ref_lse, atol=1e-5, rtol=1e-5)


def test_row_without_keys_gets_zero_and_the_sink_as_lse():
    q, k = torch.randn(1, 3, 2, 8), torch.randn(1, 3, 2, 8)
    sink = torch.tensor([0.5, -1.0])
    out, lse, _ = flashattn.flash_attn_func(q, k, k, window_size=(0, -1), causal=True,
                                            learnable_sink=sink, return_attn_probs=True)
    assert torch.isfinite(out).all() and torch.isfinite(lse).all()


@pytest.mark.parametrize("kw,match", [
    (dict(learnable_sink=torch.zeros(3)), "shape"),
    (dict(learnable_sink=torch.zeros(4, dtype=torch.int32)), "float"),
    (dict(learnable_sink=[0.0] * 4), "tensor"),
    (dict(learnable_sink=torch.zeros(4), dropout_p=0.1), "dropout_p"),
])
def test_bad_sinks_name_the_argument(kw, match):
    q = torch.randn(1, 3, 4, 8)
    with pytest.raises((TypeError, ValueError), match=match):
        flashattn.flash_attn_func(q, q, q, **kw)


def test_sinks_under_compile():
    """fullgraph compile with the sink's gradient (distinct q, k, v: Dynamo does not trace an
    autograd.Function given the same tensor twice)."""
    torch.manual_seed(3)
    q = torch.randn(1, 8, 2, 16, requires_grad=True)
    k, v = torch.randn(1, 8, 2, 16), torch.randn(1, 8, 2, 16)
    sink = torch.randn(2, requires_grad=True)

    @torch.compile(fullgraph=True, backend="aot_eager")
    def f(q, k, v, sink):
        return flashattn.flash_attn_func(q, k, v, causal=True, learnable_sink=sink)

    with flashattn.use_backend("cpu"):
        out = f(q, k, v, sink)
        out.sum().backward()
        ref = flashattn.flash_attn_func(q.detach(), k, v, causal=True,
                                        learnable_sink=sink.detach())
    torch.testing.assert_close(out, ref)
    assert sink.grad is not None and torch.isfinite(sink.grad).all()
