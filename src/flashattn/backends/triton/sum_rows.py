"""The float32 sum of pieces that each cover a range of rows, rounded once, in one pass.

Context parallelism's ring backward gets each K / V block's dK / dV as 16-bit partials, one
per kernel call that saw the block, each over a range of the block's rows (a causal or
windowed call sees only some keys). Summing them at home in one pass (every partial read once,
the sum written once in its final dtype) replaces a float32 running sum that every visitor
read, added to and wrote back.

The pieces are separate allocations. The kernel takes the first piece as its base pointer and
each piece's start as an element offset from it (a table on the device), so one launch reads
any number of pieces: CUDA's flat 64-bit address space makes the difference of two device
pointers a valid offset. The wrapper checks that every offset is a multiple of 16 bytes, so
the loads can be vectorised like those of an argument pointer.

Layout: the output is (outer, n_rows, inner) contiguous; piece ``i`` is (outer, rows_i, inner)
contiguous and covers output rows ``[start_i, start_i + rows_i)``. Each output element is
``0 + piece_0 + piece_1 + ...`` over the pieces covering its row, in float32, in the pieces'
order (so the result is bitwise repeatable and equals a sequential float32 sum in that order).
"""
from __future__ import annotations

from typing import Sequence

import torch
import triton
import triton.language as tl

from flashattn.runtime.launch import launch_jit


@triton.jit
def _sum_rows_kernel(Out, Base, Offsets, Starts, Rows, n_parts, n_rows, inner,
                     VEC: tl.constexpr, BLOCK_R: tl.constexpr, BLOCK_C: tl.constexpr):
    # axis 0: outer x row blocks (up to 2**31 - 1 programs); axis 1: column blocks
    n_rb = tl.cdiv(n_rows, BLOCK_R)
    pid = tl.program_id(0)
    outer = (pid // n_rb).to(tl.int64)
    r0 = (pid % n_rb) * BLOCK_R
    rows = r0 + tl.arange(0, BLOCK_R)
    cols = tl.program_id(1) * BLOCK_C + tl.arange(0, BLOCK_C)
    col_ok = cols < inner
    acc = tl.zeros([BLOCK_R, BLOCK_C], dtype=tl.float32)
    for i in range(n_parts):
        start = tl.load(Starts + i)
        count = tl.load(Rows + i)
        if (start < r0 + BLOCK_R) & (start + count > r0):  # the piece meets these rows
            offset = tl.multiple_of(tl.load(Offsets + i), VEC)
            local = rows - start
            ok = (local >= 0) & (local < count)
            at = offset + (outer * count + local.to(tl.int64)) * inner
            at = tl.multiple_of(at, VEC)
            x = tl.load(Base + at[:, None] + cols[None, :],
                        mask=ok[:, None] & col_ok[None, :], other=0.0)
            acc += x.to(tl.float32)
    rows64 = rows.to(tl.int64)
    dest = Out + ((outer * n_rows + rows64) * inner)[:, None] + cols[None, :]
    tl.store(dest, acc.to(Out.dtype.element_ty), mask=(rows < n_rows)[:, None] & col_ok[None, :])


def sum_rows(parts: Sequence[torch.Tensor], starts: Sequence[int], out: torch.Tensor) -> None:
    """``out`` (outer, n_rows, inner) contiguous, any float dtype, becomes the float32 sum of
    ``parts[i]`` (outer, rows_i, inner) contiguous, one dtype, over output rows
    ``[starts[i], starts[i] + rows_i)``, rounded once; rows no piece covers become 0. The
    shapes (and that there is at least one part) are checked by ``dispatch.merge.sum_rows``."""
    outer, n_rows, inner = out.shape
    if out.numel() == 0:
        return
    base = parts[0]
    size = base.element_size()
    offsets = [(p.data_ptr() - base.data_ptr()) // size for p in parts]
    # 16-byte multiples (the caching allocator's blocks are 512-byte aligned): vector loads
    vec = 16 // size if (all(o * size % 16 == 0 for o in offsets) and base.data_ptr() % 16 == 0
                         and inner * size % 16 == 0) else 1
    table = torch.tensor([offsets, list(starts), [p.shape[1] for p in parts]],
                         dtype=torch.int64).to(out.device, non_blocking=True)
    block_c = min(triton.next_power_of_2(inner), 1024)
    block_r = max(1, 4096 // block_c)
    grid = (outer * triton.cdiv(n_rows, block_r), triton.cdiv(inner, block_c))
    args = (out, base, table[0], table[1], table[2], len(parts), n_rows, inner)
    launch_jit(_sum_rows_kernel, grid, args,
               dict(VEC=vec, BLOCK_R=block_r, BLOCK_C=block_c, num_warps=4))


__all__ = ["sum_rows"]
