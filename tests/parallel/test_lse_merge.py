"""ops.lse_merge, the ring's one-pass merge of two partial results through their lse: both
backends ('cpu' torch ops, 'portable' Triton under the interpreter) against attention over
all keys in float64; row-slice views, a 16-bit destination, in place, empty sides, inputs
without a contiguous last dim, and parallel.merge's packed (varlen) form."""
from __future__ import annotations

import pytest
import torch

from flashattn import ops
from flashattn.parallel.merge import merge_into, merge_varlen_into
from flashattn.reference import attention_ref
from tests.conftest import use_backend


def _halves(b, s, h, d, d_v, s_k, cut, gen):
    q = torch.randn(b, s, h, d, dtype=torch.float64, generator=gen)
    k = torch.randn(b, s_k, h, d, dtype=torch.float64, generator=gen)
    v = torch.randn(b, s_k, h, d_v, dtype=torch.float64, generator=gen)
    o_a, l_a = attention_ref(q, k[:, :cut], v[:, :cut])
    o_b, l_b = attention_ref(q, k[:, cut:], v[:, cut:])
    ref, ref_lse = attention_ref(q, k, v)
    return (o_a, l_a.float(), o_b, l_b.float()), (ref, ref_lse)


@pytest.mark.parametrize("d_v,b_dtype", [(16, torch.bfloat16), (80, torch.bfloat16),
                                         (512, torch.bfloat16), (80, torch.float16)])
def test_lse_merge_matches_attention_over_all_keys(d_v, b_dtype, backend):
    gen = torch.Generator().manual_seed(d_v)
    (o_a, l_a, o_b, l_b), (ref, ref_lse) = _halves(2, 9, 3, 16, d_v, 21, 8, gen)
    acc = o_a.float()
    ops.lse_merge(acc, l_a, o_b.to(b_dtype), l_b, acc)  # in place, the other side 16-bit
    torch.testing.assert_close(l_a.double(), ref_lse, atol=1e-5, rtol=1e-5)
    tol = 2.0 ** -8 * 2  # o_b rounded to bf16 (fp16: finer)
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


def _no_unit_last_stride(x):
    """x's values in a tensor whose last dim is not contiguous."""
    return x.transpose(-1, -2).contiguous().transpose(-1, -2)


def test_lse_merge_reads_sides_without_a_contiguous_last_dim(backend):
    gen = torch.Generator().manual_seed(3)
    (o_a, l_a, o_b, l_b), (ref, ref_lse) = _halves(1, 7, 2, 16, 24, 15, 6, gen)
    out_a, out_b = _no_unit_last_stride(o_a.float()), _no_unit_last_stride(o_b.float())
    assert out_a.stride(-1) != 1 and out_b.stride(-1) != 1
    dest = torch.empty(1, 7, 2, 24)
    ops.lse_merge(out_a, l_a, out_b, l_b, dest)
    torch.testing.assert_close(l_a.double(), ref_lse, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(dest.double(), ref, atol=1e-5, rtol=1e-5)


def test_lse_merge_kernel_refuses_what_it_cannot_write(monkeypatch):
    """The Triton kernel writes ``dest`` row by row with unit steps and trusts the shapes:
    a destination without a contiguous last dim, or mismatched shapes, raise before launch."""
    use_backend(monkeypatch, "portable")
    out_a, out_b = torch.randn(1, 4, 2, 16), torch.randn(1, 4, 2, 16)
    lse_a, lse_b = torch.randn(1, 2, 4), torch.randn(1, 2, 4)
    with pytest.raises(ValueError, match="contiguous last dim"):
        ops.lse_merge(out_a, lse_a, out_b, lse_b, _no_unit_last_stride(out_a))


def test_lse_merge_refuses_mismatched_shapes(backend):
    """Checked in dispatch for every backend: the kernel would read out of bounds, torch ops
    would broadcast an lse with size-1 dims silently."""
    out_a, out_b = torch.randn(1, 4, 2, 16), torch.randn(1, 4, 2, 16)
    lse_a, lse_b = torch.randn(1, 2, 4), torch.randn(1, 2, 4)
    with pytest.raises(ValueError, match="must be"):
        ops.lse_merge(out_a, lse_a, out_b[:, :3], lse_b[:, :, :3], out_a)
    with pytest.raises(ValueError, match="must be"):
        ops.lse_merge(out_a, lse_a, out_b, lse_b[:, :1], out_a)
    with pytest.raises(ValueError, match="must be"):
        ops.lse_merge(out_a, lse_a, out_b, lse_b[:, :, :1], out_a)  # would broadcast


@pytest.mark.parametrize("dest_dtype", [None, torch.bfloat16])
def test_merge_varlen_into_packed_row_slices(dest_dtype, backend):
    """parallel.merge's packed form: out (total, h, d_v), lse (h, total), here rows 3:9 of
    larger tensors, merged in place (dest None) or into a bf16 destination; other rows stay."""
    gen = torch.Generator().manual_seed(4)
    (o_a, l_a, o_b, l_b), (ref, ref_lse) = _halves(1, 6, 2, 16, 80, 11, 4, gen)
    big = torch.full((12, 2, 80), 7.0)
    big_lse = torch.full((2, 12), 3.0)
    big[3:9] = o_a[0].float()
    big_lse[:, 3:9] = l_a[0]
    dest = None if dest_dtype is None else torch.full((12, 2, 80), -5.0, dtype=dest_dtype)
    merge_varlen_into(big[3:9], big_lse[:, 3:9], o_b[0].bfloat16(), l_b[0],
                      None if dest is None else dest[3:9])
    res, keep = (big, 7.0) if dest is None else (dest, -5.0)
    assert (res[:3] == keep).all() and (res[9:] == keep).all()
    assert (big_lse[:, :3] == 3).all() and (big_lse[:, 9:] == 3).all()
    torch.testing.assert_close(big_lse[:, 3:9].double(), ref_lse[0], atol=1e-5, rtol=1e-5)
    tol = 2.0 ** -8 * 2
    torch.testing.assert_close(res[3:9].double(), ref[0], atol=tol, rtol=tol)
    if dest is not None:  # the accumulator is only read when a destination is given
        assert torch.equal(big[3:9], o_a[0].float())


def test_merge_into_default_is_in_place_and_both_empty_rows_stay_zero(backend):
    """parallel.merge.merge_into without dest: the accumulator itself; a row that no side saw
    (its buffers NaN) comes out 0 with lse -inf."""
    gen = torch.Generator().manual_seed(5)
    (o_a, l_a, o_b, l_b), (ref, ref_lse) = _halves(2, 5, 2, 16, 32, 9, 4, gen)
    acc, out_b = o_a.float(), o_b.float()
    l_a[1, 0, 2] = l_b[1, 0, 2] = float("-inf")
    acc[1, 2, 0] = out_b[1, 2, 0] = float("nan")
    merge_into(acc, l_a, out_b, l_b)
    assert (acc[1, 2, 0] == 0).all() and l_a[1, 0, 2] == float("-inf")
    acc[1, 2, 0], ref[1, 2, 0] = 0.0, 0.0
    l_a[1, 0, 2], ref_lse[1, 0, 2] = 0.0, 0.0
    torch.testing.assert_close(l_a.double(), ref_lse, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(acc.double(), ref, atol=1e-5, rtol=1e-5)
