"""No out-of-bounds memory access from any metadata value, by construction.

The Triton kernels read cache_seqlens, cache_batch_idx, cache_leftpad, block_table and
cu_seqlens / seqused_k from the device and never trust them with an address: positions past
the cache write nothing, batch indices and page numbers are clamped to the cache, packed
sequence bounds to the packed tensors. (Wrong values give wrong answers; ``flashattn.checks()``
turns them into errors, and CPU metadata is always checked at the API: these tests call the
backend functions directly, as a CUDA call with unchecked device metadata reaches them.)

Writes are checked against guard rows around the destination (a slab of a larger buffer that
must stay untouched); reads far outside a tensor (page 10**6, position 10**7) would fault in
the interpreter, which reads raw addresses.
"""
from __future__ import annotations

import pytest
import torch

from flashattn.backends.triton import decode, fwd, rotary

pytestmark = pytest.mark.skipif(
    not __import__("flashattn.dispatch.select", fromlist=["interpreting"]).interpreting(),
    reason="runs the Triton kernels in the interpreter (TRITON_INTERPRET=1)")

GUARD = 7.0


def _guarded(rows: int, *rest: int, guard: int = 2):
    """(buffer, view): a view of ``rows`` rows inside a buffer with ``guard`` rows of GUARD
    before and after it."""
    buf = torch.full((rows + 2 * guard, *rest), GUARD)
    return buf, buf[guard:guard + rows]


def _guards_intact(buf: torch.Tensor, guard: int = 2) -> bool:
    return bool((buf[:guard] == GUARD).all() and (buf[-guard:] == GUARD).all())


@pytest.mark.parametrize("seqlen", [40, 10**7, -3])
def test_append_past_the_cache_writes_nothing_outside(seqlen):
    b, s_cache, h, d = 2, 16, 2, 16
    buf, cache = _guarded(b, s_cache, h, d)
    x = torch.randn(b, 3, h, d)
    seqlens = torch.tensor([seqlen, 2], dtype=torch.int32)
    rotary.rotary_store(x, cache, seqlens)
    assert _guards_intact(buf)
    torch.testing.assert_close(cache[1, 2:5], x[1])  # the valid row is written


@pytest.mark.parametrize("bad", [999, -5, 10**6])
def test_append_through_bad_pages_and_batch_index_stays_in_the_cache(bad):
    num_blocks, page, h, d = 6, 4, 2, 16
    buf, pages = _guarded(num_blocks, page, h, d)
    x = torch.randn(2, 2, h, d)
    table = torch.tensor([[0, bad, 2], [3, 4, 5]], dtype=torch.int32)
    rotary.rotary_store(x, pages, torch.tensor([3, 1], dtype=torch.int32), block_table=table)
    assert _guards_intact(buf)
    buf2, cache = _guarded(2, 8, h, d)
    rotary.rotary_store(x, cache, torch.tensor([1, 1], dtype=torch.int32),
                        batch_idx=torch.tensor([bad, 0], dtype=torch.int32))
    assert _guards_intact(buf2)


@pytest.mark.parametrize("case", ["pages", "seqlens", "batch_idx", "leftpad", "varlen_q"])
def test_decode_reads_stay_in_bounds(case):
    b, h, h_k, d, page = 2, 4, 2, 16, 4
    q = torch.randn(b, 1, h, d)
    kw = dict(softmax_scale=d ** -0.5, window_left=-1, window_right=-1, softcap=0.0,
              alibi_slopes=None, num_splits=1, max_seqlen_k=12)
    seqlens = torch.tensor([12, 5], dtype=torch.int32)
    if case == "pages":
        k = torch.randn(6, page, h_k, d)
        table = torch.tensor([[0, 10**6, -5], [3, 4, 5]], dtype=torch.int32)
        out, lse = decode.decode_attention(q, k, k, seqlens, 0, block_table=table, **kw)
    elif case == "seqlens":
        k = torch.randn(b, 12, h_k, d)
        out, lse = decode.decode_attention(q, k, k, torch.tensor([10**7, -9], dtype=torch.int32),
                                           0, **kw)
    elif case == "batch_idx":
        k = torch.randn(b, 12, h_k, d)
        out, lse = decode.decode_attention(q, k, k, seqlens, 0,
                                           batch_idx=torch.tensor([10**6, -3], dtype=torch.int32),
                                           **kw)
    elif case == "leftpad":
        k = torch.randn(b, 12, h_k, d)
        out, lse = decode.decode_attention(q, k, k, seqlens, 0,
                                           leftpad=torch.tensor([10**6, -4], dtype=torch.int32),
                                           **kw)
    else:
        k = torch.randn(6, page, h_k, d)
        table = torch.tensor([[0, 1, 2], [3, 4, 5]], dtype=torch.int32)
        qv = torch.randn(5, h, d)
        cu_q = torch.tensor([0, 10**6, 3], dtype=torch.int32)  # past the 5 packed rows
        out, lse = decode.decode_attention(qv, k, k, seqlens, 0, block_table=table,
                                           cu_seqlens_q=cu_q, max_seqlen_q=2, **kw)
    assert torch.isfinite(out).all()


def test_varlen_bounds_past_the_packed_tensors():
    """cu_seqlens_k[-1] past the data, non-monotone cu_seqlens_q, seqused_k past the keys."""
    h, d = 2, 16
    q, k = torch.randn(10, h, d), torch.randn(12, h, d)
    cu_q = torch.tensor([0, 6, 3, 10**6], dtype=torch.int32)
    cu_k = torch.tensor([0, 5, 9, 10**7], dtype=torch.int32)
    kw = dict(softmax_scale=d ** -0.5, causal=False, window_left=-1, window_right=-1,
              softcap=0.0, alibi_slopes=None, dropout_p=0.0, philox_seed=0,
              return_softmax=False)
    out, lse, _ = fwd.flash_varlen_fwd(q, k, k, cu_q, cu_k, None, 8, 8, **kw)
    assert torch.isfinite(out).all()
    out, lse, _ = fwd.flash_varlen_fwd(q, k, k, torch.tensor([0, 4, 10], dtype=torch.int32),
                                       torch.tensor([0, 6, 12], dtype=torch.int32),
                                       torch.tensor([10**6, -2], dtype=torch.int32), 6, 6, **kw)
    assert torch.isfinite(out).all()
