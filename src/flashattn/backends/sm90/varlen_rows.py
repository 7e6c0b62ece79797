"""The rows of a packed forward's output, and the keys of a packed backward's dK / dV, that no
sequence covers (one Triton pass each).

cu_seqlens_q tiles [cu_seqlens_q[0], cu_seqlens_q[-1]) with consecutive sequences, and the
Hopper varlen forward writes every row there (0 / -inf for rows that see no key). Rows before
the first offset or from the last one to total_q (q holding more rows than the sequences use)
belong to no sequence: the varlen contract says out 0 and lse -inf there. Where they are is
only known on the device, so instead of clearing all of O first (a memset of the whole output:
~25 us for 16k tokens x 2048 values in bf16 on the H100, 2-10 % of the forward), one program
per block of rows reads the two offsets and exits, or clears its uncovered rows. The same
launch zeroes the forward's tile-queue counter (one launch fewer per call than torch.zeros).
"""
from __future__ import annotations

from typing import Optional

import torch
import triton
import triton.language as tl

from flashattn.runtime.launch import LaunchPlans

_BLOCK_ROWS = 64


@triton.jit
def _clamped(cu, i, total):
    """cu[i] clamped to [0, total], as the Hopper kernels read sequence offsets."""
    return tl.minimum(tl.maximum(tl.load(cu + i), 0), total)


@triton.jit
def _outside_sequences(rows, cu, n_seqs, total):
    """Rows (of [0, total)) before the first offset or from the last one on."""
    first = _clamped(cu, 0, total)
    last = tl.maximum(_clamped(cu, n_seqs, total), first)
    return ((rows < first) | (rows >= last)) & (rows < total)


@triton.jit
def _zero_rows(X, rows, mask_rows, row_elems, BLOCK_R: tl.constexpr, BLOCK_E: tl.constexpr):
    """Rows ``rows`` (where ``mask_rows``) of a contiguous (n, row_elems) tensor X set to 0."""
    row_off = rows.to(tl.int64) * row_elems
    for e in range(0, row_elems, BLOCK_E):
        cols = e + tl.arange(0, BLOCK_E)
        mask = mask_rows[:, None] & (cols[None, :] < row_elems)
        tl.store(X + row_off[:, None] + cols[None, :],
                 tl.zeros([BLOCK_R, BLOCK_E], dtype=X.dtype.element_ty), mask=mask)


@triton.jit
def _clear_uncovered_rows_kernel(Out, Lse, cu_q, counter, n_seqs, total_q, n_heads, row_elems,
                                 BLOCK_R: tl.constexpr, BLOCK_E: tl.constexpr):
    if counter is not None:
        if tl.program_id(0) == 0:
            tl.store(counter, 0)
    rows = tl.program_id(0) * BLOCK_R + tl.arange(0, BLOCK_R)
    uncovered = _outside_sequences(rows, cu_q, n_seqs, total_q)
    if tl.max(uncovered.to(tl.int32), axis=0) > 0:
        _zero_rows(Out, rows, uncovered, row_elems, BLOCK_R, BLOCK_E)
        neg_inf = tl.full([BLOCK_R], float("-inf"), tl.float32)
        lse_ptr = Lse + rows.to(tl.int64)
        for _ in range(0, n_heads):  # (pointer steps: 64-bit, h * total_q may pass 2^31)
            tl.store(lse_ptr, neg_inf, mask=uncovered)
            lse_ptr += total_q


def clear_uncovered_rows(out: torch.Tensor, lse: torch.Tensor, cu_seqlens_q: torch.Tensor,
                         counter: Optional[torch.Tensor] = None) -> None:
    """out (total_q, h, d_v) contiguous, lse float32 (h, total_q) contiguous, cu_seqlens_q
    int32 (b + 1,) contiguous: rows outside [cu_seqlens_q[0], cu_seqlens_q[b]) become 0 / -inf
    (offsets clamped to [0, total_q]); every other row is left as it is. ``counter``: an int32
    (1,) tensor set to 0 as well (the tile queue's), or None."""
    total_q, n_heads, d_v = out.shape
    row_elems = n_heads * d_v
    n_seqs = cu_seqlens_q.shape[0] - 1
    # a repeated shape replays its launch plan (no binder: ~20 us of host time on the H100 host)
    key = (out.shape, out.dtype, out.device, n_seqs)
    tensors = (out, lse, cu_seqlens_q) + (() if counter is None else (counter,))
    _PLANS[counter is not None].launch(key, tensors, lambda: (
        _clear_uncovered_rows_kernel, (max(1, triton.cdiv(total_q, _BLOCK_ROWS)),),
        (out, lse, cu_seqlens_q, counter, n_seqs, total_q, n_heads, row_elems),
        dict(BLOCK_R=_BLOCK_ROWS, BLOCK_E=min(256, triton.next_power_of_2(row_elems)),
             num_warps=4)))


# launch plans by (whether the tile-queue counter is cleared too); slots: out, lse, the
# offsets (and the counter)
_PLANS = {False: LaunchPlans(slots=(0, 1, 2)), True: LaunchPlans(slots=(0, 1, 2, 3))}


@triton.jit
def _clear_uncovered_keys_kernel(DK, DV, cu_k, used_k, n_seqs, total_k, row_elems,
                                 BLOCK_R: tl.constexpr, BLOCK_E: tl.constexpr):
    rows = tl.program_id(0) * BLOCK_R + tl.arange(0, BLOCK_R)
    uncovered = _outside_sequences(rows, cu_k, n_seqs, total_k)
    if used_k is not None:
        # each row's sequence: the last one starting at or before it (offsets clamped as the
        # kernels clamp them; non-decreasing for any valid cu_seqlens_k), by binary search
        lo = tl.zeros([BLOCK_R], tl.int32)
        hi = tl.zeros([BLOCK_R], tl.int32) + (n_seqs - 1)
        while tl.max(hi - lo, axis=0) > 0:
            mid = (lo + hi + 1) // 2
            go_up = _clamped(cu_k, mid, total_k) <= rows
            lo = tl.where(go_up, mid, lo)
            hi = tl.where(go_up, hi, mid - 1)
        start = _clamped(cu_k, lo, total_k)
        length = tl.maximum(_clamped(cu_k, lo + 1, total_k) - start, 0)
        used = tl.minimum(tl.maximum(tl.load(used_k + lo), 0), length)
        uncovered = uncovered | ((rows < total_k) & (rows >= start + used))
    if tl.max(uncovered.to(tl.int32), axis=0) > 0:
        _zero_rows(DK, rows, uncovered, row_elems, BLOCK_R, BLOCK_E)
        _zero_rows(DV, rows, uncovered, row_elems, BLOCK_R, BLOCK_E)


def clear_uncovered_keys(dk: torch.Tensor, dv: torch.Tensor, cu_seqlens_k: torch.Tensor,
                         seqused_k: Optional[torch.Tensor] = None) -> None:
    """dk / dv (total_k, h_k, d) contiguous, of one shape and dtype; cu_seqlens_k int32
    (b + 1,) and seqused_k int32 (b,) or None, contiguous: the keys that no tile of the packed
    backward covers become 0 (keys before cu_seqlens_k[0] or from cu_seqlens_k[b] on, and with
    seqused_k those of each sequence past its first seqused_k[i]; offsets clamped to
    [0, total_k] as the kernels clamp them); every other key is left as the backward wrote it.

    The backward's tiles write dK / dV of every key they cover (0 where no query sees it), so
    only these keys need clearing: a pass over the rows that reads two offsets per block of
    rows (a binary search over the offsets per row with seqused_k) and writes only uncovered
    rows, instead of zeroing all of dK and dV first (a write of both tensors: at 128k keys,
    32 KV heads, d 128, 2 x 1.07 GB, ~1.4 ms of a ring step's row-statistics pass on the
    H200, benchmarks/NOTES.md 2026-11-28)."""
    total_k, n_heads_k, d = dk.shape
    row_elems = n_heads_k * d
    n_seqs = cu_seqlens_k.shape[0] - 1
    if total_k == 0 or row_elems == 0:
        return
    if n_seqs < 1:  # no sequence: every key is uncovered
        dk.zero_()
        dv.zero_()
        return
    key = (dk.shape, dk.dtype, dk.device, n_seqs)
    tensors = (dk, dv, cu_seqlens_k) + (() if seqused_k is None else (seqused_k,))
    _KEY_PLANS[seqused_k is not None].launch(key, tensors, lambda: (
        _clear_uncovered_keys_kernel, (triton.cdiv(total_k, _BLOCK_ROWS),),
        (dk, dv, cu_seqlens_k, seqused_k, n_seqs, total_k, row_elems),
        dict(BLOCK_R=_BLOCK_ROWS, BLOCK_E=min(256, triton.next_power_of_2(row_elems)),
             num_warps=4)))


# by whether seqused_k is given; slots: dk, dv, the offsets (and seqused_k)
_KEY_PLANS = {False: LaunchPlans(slots=(0, 1, 2)), True: LaunchPlans(slots=(0, 1, 2, 3))}


__all__ = ["clear_uncovered_keys", "clear_uncovered_rows"]
