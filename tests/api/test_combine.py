"""flash_attn_combine: merging split-KV partial results, against an unsplit reference.

Both backends ('cpu' torch, 'portable' Triton under the interpreter). The partial results
come from real attention over disjoint key ranges (float64 reference per split), so the
merge must reproduce the attention over all keys; splits that see no key (lse -inf) are
filled with NaN and must not leak.
"""
from __future__ import annotations

import pytest
import torch

from flashattn import flash_attn_combine
from flashattn.reference import attention_ref


def _split_partials(q, k, v, bounds):
    """Per split [lo, hi): (out (b, s_q, h, d) float32, lse (b, h, s_q) float32)."""
    outs, lses = [], []
    b, s_q, h, _ = q.shape
    for lo, hi in bounds:
        if hi > lo:
            o, l = attention_ref(q, k[:, lo:hi], v[:, lo:hi])
        else:  # a split that saw no key: garbage that must be ignored
            o = torch.full((b, s_q, h, v.shape[-1]), float("nan"), dtype=torch.float64)
            l = torch.full((b, h, s_q), float("-inf"), dtype=torch.float64)
        outs.append(o.float())
        lses.append(l.float())
    return torch.stack(outs), torch.stack(lses)


@pytest.mark.parametrize("bounds", [
    [(0, 20), (20, 37)],
    [(0, 5), (5, 5), (5, 30), (30, 30), (30, 37)],  # empty splits in the middle
    [(0, 37)] + [(37, 37)] * 6,  # one real split, many empty ones
    [(i, i + 1) for i in range(37)],  # one key per split
], ids=["two", "empty-middle", "many-empty", "one-key-each"])
@pytest.mark.parametrize("out_dtype", [None, torch.bfloat16])
def test_combine_matches_unsplit(bounds, out_dtype, backend: str) -> None:
    b, s_q, h, d, s_k = 2, 3, 4, 24, 37
    q = torch.randn(b, s_q, h, d, dtype=torch.float64)
    k = torch.randn(b, s_k, h, d, dtype=torch.float64)
    v = torch.randn(b, s_k, h, d, dtype=torch.float64)
    out_p, lse_p = _split_partials(q, k, v, bounds)
    ref, ref_lse = attention_ref(q, k, v)
    out, lse = flash_attn_combine(out_p, lse_p, out_dtype=out_dtype)
    assert out.shape == (b, s_q, h, d)
    assert out.dtype == (out_dtype or torch.float32)
    assert lse.shape == (b, h, s_q) and lse.dtype == torch.float32
    assert not torch.isnan(out).any() and not torch.isnan(lse).any()
    tol = 1e-5 if out_dtype is None else 2.0**-7 * 2
    torch.testing.assert_close(out.double(), ref, atol=tol, rtol=tol)
    torch.testing.assert_close(lse.double(), ref_lse, atol=1e-5, rtol=1e-5)


def test_combine_all_empty_rows(backend: str) -> None:
    """A row whose every split is empty: out 0, lse -inf, no NaN."""
    out_p = torch.randn(3, 1, 2, 2, 16)
    lse_p = torch.randn(3, 1, 2, 2)
    lse_p[:, 0, 1, 0] = float("-inf")
    out_p[:, 0, 0, 1] = float("nan")
    out, lse = flash_attn_combine(out_p, lse_p)
    assert torch.all(out[0, 0, 1] == 0)
    assert lse[0, 1, 0] == float("-inf")
    assert not torch.isnan(out).any()
    # the other rows are the weighted means
    w = torch.softmax(lse_p[:, 0, 0, 0].double(), 0)
    torch.testing.assert_close(out[0, 0, 0].double(), (w[:, None] * out_p[:, 0, 0, 0].double()).sum(0),
                               atol=1e-5, rtol=1e-5)


def test_combine_into_out(backend: str) -> None:
    out_p = torch.randn(4, 2, 1, 3, 8)
    lse_p = torch.randn(4, 2, 3, 1)
    dst = torch.empty(2, 1, 3, 8, dtype=torch.float16)
    res, _ = flash_attn_combine(out_p, lse_p, out=dst)
    assert res.data_ptr() == dst.data_ptr() and res.dtype == torch.float16
    ref, _ = flash_attn_combine(out_p, lse_p)
    torch.testing.assert_close(res.float(), ref, atol=2e-3, rtol=2e-3)


@pytest.mark.parametrize("args, exc, words", [
    ((torch.randn(2, 1, 1, 2, 8, dtype=torch.float16), torch.randn(2, 1, 2, 1)), TypeError,
     "out_partial must have dtype torch.float32"),
    ((torch.randn(2, 1, 1, 2, 8), torch.randn(2, 1, 1, 2)), ValueError, "lse_partial must have shape"),
    ((torch.randn(1, 2, 8), torch.randn(2, 1, 2, 1)), ValueError, "out_partial must be a 5-d"),
    ((torch.randn(2, 1, 1, 2, 8), torch.randn(2, 1, 2, 1).double()), TypeError, "lse_partial must have dtype"),
])
def test_combine_errors(args, exc, words, cpu_backend: str) -> None:
    with pytest.raises(exc) as info:
        flash_attn_combine(*args)
    assert words in str(info.value), str(info.value)


def test_combine_bad_out_dtype(cpu_backend: str) -> None:
    with pytest.raises(TypeError, match="out_dtype"):
        flash_attn_combine(torch.randn(2, 1, 1, 2, 8), torch.randn(2, 1, 2, 1), out_dtype=torch.int32)
