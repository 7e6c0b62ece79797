"""The rows of a packed forward's output that no sequence covers (one Triton pass).

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
def _clear_uncovered_rows_kernel(Out, Lse, cu_q, counter, n_seqs, total_q, n_heads, row_elems,
                                 BLOCK_R: tl.constexpr, BLOCK_E: tl.constexpr):
    if counter is not None:
        if tl.program_id(0) == 0:
            tl.store(counter, 0)
    rows = tl.program_id(0) * BLOCK_R + tl.arange(0, BLOCK_R)
    first = tl.minimum(tl.maximum(tl.load(cu_q), 0), total_q)
    last = tl.minimum(tl.maximum(tl.load(cu_q + n_seqs), first), total_q)
    uncovered = ((rows < first) | (rows >= last)) & (rows < total_q)
    if tl.max(uncovered.to(tl.int32), axis=0) > 0:
        row_off = rows.to(tl.int64) * row_elems
        for e in range(0, row_elems, BLOCK_E):
            cols = e + tl.arange(0, BLOCK_E)
            mask = uncovered[:, None] & (cols[None, :] < row_elems)
            zeros = tl.zeros([BLOCK_R, BLOCK_E], dtype=Out.dtype.element_ty)
            tl.store(Out + row_off[:, None] + cols[None, :], zeros, mask=mask)
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


__all__ = ["clear_uncovered_rows"]
