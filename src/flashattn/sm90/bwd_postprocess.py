"""dQ out of the Hopper backward's fp32 workspace (plain Triton: a bandwidth-bound pass).

The backward kernels add softmax_scale * dS K into an fp32 workspace, (b, h, s_q_pad, d_pad)
(bwd_kernel.py) or transposed (b, h, d_pad, s_q_pad) (bwd_wide_kernel.py). This pass reads it
and writes dq (b, s_q, h, d) in q's dtype. torch's strided ``.to()`` of the permuted view ran a
generic element-wise kernel: at 16k tokens, hidden 2048, 104 us for d = 128 and 266 us for the
transposed d = 256 workspace (H100, benchmarks/NOTES.md), against cuDNN's 74 us conversion of
the same bytes. Here each program moves a [BLOCK_S, BLOCK_D] tile; Triton gives the load and
the store each a coalesced layout (along s or d) and transposes through shared memory.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from flashattn.runtime.grid import cdiv, next_pow2
from flashattn.runtime.launch import LaunchPlans


@triton.jit
def _dq_convert_kernel(Acc, DQ, stride_acc_bh, stride_acc_s, stride_acc_d, stride_qb, stride_qs,
                       stride_qh, n_heads, seqlen_q, HEAD_DIM: tl.constexpr,
                       BLOCK_S: tl.constexpr, BLOCK_D: tl.constexpr):
    # (batch, head) on grid axis 0: b * h can pass the 65535 limit of axis 1
    bh = tl.program_id(0)
    pid_s = tl.program_id(1)
    b = bh // n_heads
    h = bh % n_heads
    rows = pid_s * BLOCK_S + tl.arange(0, BLOCK_S)
    cols = tl.arange(0, BLOCK_D)
    ok = (rows[:, None] < seqlen_q) & (cols[None, :] < HEAD_DIM)
    acc = tl.load(Acc + bh.to(tl.int64) * stride_acc_bh + rows[:, None].to(tl.int64) * stride_acc_s
                  + cols[None, :].to(tl.int64) * stride_acc_d, mask=ok, other=0.0)
    tl.store(DQ + b.to(tl.int64) * stride_qb + h.to(tl.int64) * stride_qh
             + rows[:, None].to(tl.int64) * stride_qs + cols[None, :],
             acc.to(DQ.dtype.element_ty), mask=ok)


def workspace_strides(dq_acc: torch.Tensor, transposed: bool):
    """(per (batch, head), per query row, per head-dim column) element strides of the dQ
    workspace, (b, h, s_q_pad, d_pad) or, ``transposed``, (b, h, d_pad, s_q_pad): the passes
    that zero it and read it index it through these."""
    if transposed:
        return dq_acc.stride(1), dq_acc.stride(3), dq_acc.stride(2)
    return dq_acc.stride(1), dq_acc.stride(2), dq_acc.stride(3)


def dq_from_workspace(dq_acc: torch.Tensor, q: torch.Tensor, transposed: bool) -> torch.Tensor:
    """dq (b, s_q, h, d), contiguous, q's dtype, from the fp32 workspace ``dq_acc``:
    (b, h, s_q_pad, d_pad), or (b, h, d_pad, s_q_pad) when ``transposed``."""
    batch, seqlen_q, n_heads, head_dim = q.shape
    dq = torch.empty((batch, seqlen_q, n_heads, head_dim), dtype=q.dtype, device=q.device)
    stride_bh, stride_s, stride_d = workspace_strides(dq_acc, transposed)
    block_d = next_pow2(head_dim)
    block_s = max(16, 8192 // block_d)  # 8K fp32 per program
    key = (dq_acc.shape, dq_acc.stride(), q.shape, q.dtype, q.device, transposed)
    _PLANS.launch(key, (dq_acc, dq), lambda: (
        _dq_convert_kernel, (batch * n_heads, cdiv(seqlen_q, block_s)), (
            dq_acc, dq, stride_bh, stride_s, stride_d, dq.stride(0), dq.stride(1), dq.stride(2),
            n_heads, seqlen_q),
        dict(HEAD_DIM=head_dim, BLOCK_S=block_s, BLOCK_D=block_d, num_warps=8)))
    return dq


# launch plans by call shape (kernels/launch.py); slots: the workspace, dq
_PLANS = LaunchPlans(slots=(0, 1))
