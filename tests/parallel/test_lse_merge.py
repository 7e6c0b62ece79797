"""ops.lse_merge, the ring's one-pass merge of two partial results through their lse: both
backends ('cpu' torch ops, 'portable' Triton under the interpreter) against attention over
all keys in float64; row-slice views, a 16-bit destination, in place, empty sides."""
from __future__ import annotations

import pytest
import torch

from flashattn import ops
from flashattn.reference import attention_ref


def _halves(b, s, h, d, d_v, s_k, cut, gen):
    q = torch.randn(b, s, h, d, dtype=torch.float64, generator=gen)
    k = torch.randn(b, s_k, h, d, dtype=torch.float64, generator=gen)
    v = torch.randn(b, s_k, h, d_v, dtype=torch.float64, generator=gen)
    o_a, l_a = attention_ref(q, k[:, :cut], v[:, :cut])
    o_b, l_b = attention_ref(q, k[:, cut:], v[:, cut:])
    ref, ref_lse = attention_ref(q, k, v)
    return (o_a, l_a.float(), o_b, l_b.float()), (ref, ref_lse)


@pytest.mark.parametrize("d_v", [16, 80, 512])
def test_lse_merge_matches_attention_over_all_keys(d_v, backend):
    gen = torch.Generator().manual_seed(d_v)
    (o_a, l_a, o_b, l_b), (ref, ref_lse) = _halves(2, 9, 3, 16, d_v, 21, 8, gen)
    acc = o_a.float()
    ops.lse_merge(acc, l_a, o_b.bfloat16(), l_b, acc)  # in place, the other side in bf16
    torch.testing.assert_close(l_a.double(), ref_lse, atol=1e-5, rtol=1e-5)
    tol = 2.0 ** -8 * 2  # o_b rounded to bf16
    torch.testing.assert_close(acc.double(), ref, atol=tol, rtol=tol)


def test_lse_merge_into_row_slices_and_a_bf16_destination(backend):
    """Views of larger tensors (the ring merges a call's rows): rows outside stay untouched;
    the merged rows land in a bf16 destination, rounded once."""
    gen = torch.Generator().manual_seed(1)
    (o_a, l_a, o_b, l_b), (ref, ref_lse) = _halves(1, 6, 2, 16, 24, 13, 5, gen)
    big = torch.full((1, 10, 2, 24), 7.0)
    big_lse = torch.full((1, 2, 10), 3.0)
    big[:, 2:8] = o_a.float()
    big_lse[:, :, 2:8] = l_a
    dest = torch.full((1, 10, 2, 24), -5.0, dtype=torch.bfloat16)
    ops.lse_merge(big[:, 2:8], big_lse[:, :, 2:8], o_b.float(), l_b, dest[:, 2:8])
    assert (dest[:, :2] == -5).all() and (dest[:, 8:] == -5).all()
    assert (big_lse[:, :, :2] == 3).all() and (big_lse[:, :, 8:] == 3).all()
    torch.testing.assert_close(big_lse[:, :, 2:8].double(), ref_lse, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(dest[:, 2:8].double(), ref, atol=2.0 ** -8, rtol=2.0 ** -8)


def test_lse_merge_empty_sides_never_leak(backend):
    """A side whose lse is -inf weighs 0 and its buffer (NaN here) is never multiplied in; a
    row empty on both sides gets out 0 and lse -inf."""
    out_a = torch.randn(1, 3, 2, 16)
    out_b = torch.randn(1, 3, 2, 16)
    lse_a = torch.randn(1, 2, 3)
    lse_b = torch.randn(1, 2, 3)
    lse_a[0, 0, 0] = float("-inf")   # only b
    out_a[0, 0, 0] = float("nan")
    lse_b[0, 1, 1] = float("-inf")   # only a
    out_b[0, 1, 1] = float("nan")
    lse_a[0, 0, 2] = lse_b[0, 0, 2] = float("-inf")  # neither
    out_a[0, 2, 0] = out_b[0, 2, 0] = float("nan")
    keep_a, keep_b = out_a.clone(), out_b.clone()
    want_lse = torch.logaddexp(lse_a, lse_b)
    dest = torch.empty_like(out_a)
    ops.lse_merge(out_a, lse_a, out_b, lse_b, dest)
    assert not torch.isnan(dest).any() and not torch.isnan(lse_a).any()
    assert torch.equal(dest[0, 0, 0], keep_b[0, 0, 0])
    assert torch.equal(dest[0, 1, 1], keep_a[0, 1, 1])
    assert (dest[0, 2, 0] == 0).all() and lse_a[0, 0, 2] == float("-inf")
    torch.testing.assert_close(lse_a, want_lse)
