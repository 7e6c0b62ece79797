"""Rows past a packed sequence's end: never multiplied into a GEMM when they may hold Inf / NaN.

The varlen modes (fwd_kernel.py, bwd_kernel.py, bwd_wide_kernel.py) load tiles by TMA over
the whole packed tensors, so a tile that crosses a sequence's end would also hold the rows
after it: the next sequence's (real values), unused cache slots past ``seqused_k``, or padding
after the last sequence (flash-attn users pad packed tensors to static shapes and leave those
rows uninitialised, a case reported to flash-attn upstream). Their scores are masked, so P
(and dS) is 0 there, but a GEMM still multiplies that 0 by the row's values, and 0 x Inf or 0 x NaN is NaN: the
padding would turn a sequence's output or gradients into NaN where the math has none. The
portable kernels never read those rows. What the Hopper kernels do instead:

- forward, 16-bit: the key block that crosses a sequence's end is loaded ending at its last
  key (fwd_kernel._last_block_start; the keys before the block's start are masked), so no row
  past the end is read at all. A sequence shorter than a block then reaches back before its
  first key: into the previous sequence's rows, or for the first sequence into the rows
  before cu_seqlens_k[0], which belong to no sequence (a packed tensor sliced out of a bigger
  buffer) and may hold anything. The consumers zero those V rows (:func:`zero_rows_before`,
  only in that block: K's rows are masked to -inf whatever they hold). With ``seqused_k``
  (a short sequence would reach back into the previous slot's unused keys) the block stays
  where it starts and the consumers zero its V rows past the end (:func:`zero_rows_from`).
  FP8: the packed V^T holds zeros past every sequence's used keys (v_layout.py), and the
  masked scores drop K's rows.
- backward: only the last sequence can be followed by rows of no sequence
  (:func:`padding_follows`); its tiles run a copy of the block loop that zeroes the K / V rows
  and the Q / dO rows past its end here, the other tiles the loop without it (measured: the
  guard in every tile cost the d = 128 backward 3-6 %, benchmarks/NOTES.md).

Both consumers of a CTA may rewrite the same tile: each writes back either the value that is
there (rows before the end) or 0, so every interleaving leaves the same tile, and each consumer
fences its own writes before its own GEMM.
"""
from __future__ import annotations

from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import fence_async_shared

from flashattn.runtime.gluon_api import cta_barrier
from flashattn.backends.sm90.tiles import clamped_load


@gluon.jit
def _zero_rows(tile, bound, BEFORE: gl.constexpr):
    """Rows [0, bound) (BEFORE) or [bound, ROWS) of the shared [ROWS, COLS] ``tile`` set to 0
    by the calling warpgroup (4 warps), in pieces of 2048 elements (16 values a thread: the
    callers have few registers to spare; 8 rows at 256 columns, the swizzle period of the
    NVMMA tiles); pieces with no row to zero are not touched. Ends with the async-proxy fence
    and a partition barrier: a wgmma the caller issues next reads the zeros."""
    ROWS: gl.constexpr = tile.shape[0]
    COLS: gl.constexpr = tile.shape[1]
    PIECE: gl.constexpr = 2048 // COLS
    VEC: gl.constexpr = 128 // tile.dtype.primitive_bitwidth  # 16-byte vectors
    LAYOUT: gl.constexpr = gl.BlockedLayout([1, VEC], [32 * VEC // COLS, COLS // VEC], [4, 1],
                                            [1, 0])
    for c in gl.static_range(ROWS // PIECE):
        if BEFORE:
            touched = c * PIECE < bound
        else:
            touched = (c + 1) * PIECE > bound
        if touched:
            piece = tile.slice(c * PIECE, PIECE, dim=0)
            x = piece.load(LAYOUT)
            rows = c * PIECE + gl.arange(0, PIECE, layout=gl.SliceLayout(1, LAYOUT))
            if BEFORE:
                keep = rows >= bound
            else:
                keep = rows < bound
            x = gl.where(gl.expand_dims(keep, 1), x, gl.zeros_like(x))
            piece.store(x)
    fence_async_shared()
    cta_barrier()


@gluon.jit
def zero_rows_from(tile, first_bad):
    """Rows [first_bad, ROWS) of the shared ``tile`` set to 0 (:func:`_zero_rows`)."""
    _zero_rows(tile, first_bad, False)


@gluon.jit
def zero_rows_before(tile, first_good):
    """Rows [0, first_good) of the shared ``tile`` set to 0 (:func:`_zero_rows`)."""
    _zero_rows(tile, first_good, True)


@gluon.jit
def zero_keys_past(k_tile, v_tile, n_start, len_k):
    """The backward's resident key block (keys n_start + [0, ROWS) of shared [ROWS, D] K and
    V tiles): its rows past the sequence's ``len_k`` keys zeroed, when it crosses that end."""
    ROWS: gl.constexpr = k_tile.shape[0]
    if n_start + ROWS > len_k:
        zero_rows_from(k_tile, len_k - n_start)
        zero_rows_from(v_tile, len_k - n_start)


@gluon.jit
def padding_follows(varlen, q_end, k_end, total_q, total_k):
    """Whether rows of no sequence may follow a sequence whose query rows end at ``q_end``
    and keys at ``k_end``: it is the last one of its packed tensor (varlen = (cu_seqlens_q,
    cu_seqlens_k, n_seqs, seqused_k or None)). Any other sequence is followed by the next
    one's rows: real values, which the masks hide; keys past seqused_k are unused slots
    (``seqused_k`` callers guard them in every tile). (Rows before cu_seqlens[0] are not
    guarded: a sequence's blocks never reach before its own start.)"""
    cu_q_ptr, cu_k_ptr, n_seqs, _ = varlen
    return ((q_end >= clamped_load(cu_q_ptr, n_seqs, total_q))
            | (k_end >= clamped_load(cu_k_ptr, n_seqs, total_k)))
