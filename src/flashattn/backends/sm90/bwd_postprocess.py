"""dQ out of the Hopper backward's fp32 workspace (plain Triton: a bandwidth-bound pass).

The backward kernels add softmax_scale * dS K into an fp32 workspace, (b, h, s_q_pad, d_pad)
(bwd_kernel.py) or transposed (b, h, d_pad, s_q_pad) (bwd_wide_kernel.py). This pass reads it
and writes dq (b, s_q, h, d) in q's dtype. torch's strided ``.to()`` of the permuted view ran a
generic element-wise kernel: at 16k tokens, hidden 2048, 104 us for d = 128 and 266 us for the
transposed d = 256 workspace (H100, benchmarks/NOTES.md), against cuDNN's 74 us conversion of
the same bytes. Here each program moves a [BLOCK_S, BLOCK_D] tile; Triton gives the load and
the store each a coalesced layout (along s or d) and transposes through shared memory.
Packed (varlen) calls of the wide kernel place each sequence's dQ^T columns on a 16-byte
boundary (``dq_from_packed_workspace`` maps them back). Key tiles cut in two by query heads
(``BwdConfig.tile_split``) leave two fp32 partial dK / dV; ``add_split_parts`` adds them and
writes the result in dk / dv's dtype, in one pass.
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


# bwd_wide_kernel's packed (varlen) dQ^T workspace: sequence i's columns start at
# DQT_SEQ_ALIGN * (i + cu_seqlens_q[i] // DQT_SEQ_ALIGN), 4 fp32 = 16 bytes (the TMA reduce's
# innermost coordinate must be 16-byte aligned); each start lies past the previous sequence's
# end (start_i - start_{i-1} >= DQT_SEQ_ALIGN + cu[i] - cu[i-1] - (DQT_SEQ_ALIGN - 1))
DQT_SEQ_ALIGN = 4


def packed_dq_t_columns(total_q: int, n_seqs: int, block_m: int) -> int:
    """Columns of the wide kernel's packed dQ^T workspace (and its row statistics): every
    sequence's aligned start, plus one query block past the last sequence's end (a block
    that crosses it), rounded up to whole blocks."""
    return cdiv(total_q + DQT_SEQ_ALIGN * n_seqs, block_m) * block_m + block_m


@triton.jit
def _dq_convert_packed_kernel(Acc, DQ, CuQ, stride_acc_h, stride_acc_d, stride_qs, stride_qh,
                              total_q, n_seqs, search_steps, HEAD_DIM: tl.constexpr,
                              ALIGN: tl.constexpr, BLOCK_S: tl.constexpr,
                              BLOCK_D: tl.constexpr):
    # dq rows (tokens) t of one head: sequence i = the last with cu[i] <= t (binary search,
    # offsets clamped to [0, total_q] as the kernels read them), column
    # ALIGN * (i + cu[i] // ALIGN) + t - cu[i]; tokens of no sequence get 0
    h = tl.program_id(0)
    rows = tl.program_id(1) * BLOCK_S + tl.arange(0, BLOCK_S)
    lo = tl.zeros([BLOCK_S], dtype=tl.int32)
    hi = tl.zeros([BLOCK_S], dtype=tl.int32) + (n_seqs - 1)
    for _ in range(search_steps):
        mid = (lo + hi + 1) // 2
        start = tl.minimum(tl.maximum(tl.load(CuQ + mid), 0), total_q)
        below = start <= rows
        lo = tl.where(below, mid, lo)
        hi = tl.where(below, hi, mid - 1)
    start = tl.minimum(tl.maximum(tl.load(CuQ + lo), 0), total_q)
    end = tl.minimum(tl.maximum(tl.load(CuQ + lo + 1), 0), total_q)
    inside = (rows >= start) & (rows < end)
    col = ALIGN * (lo + start // ALIGN) + rows - start
    cols = tl.arange(0, BLOCK_D)
    ok = (rows[:, None] < total_q) & (cols[None, :] < HEAD_DIM)
    acc = tl.load(Acc + h.to(tl.int64) * stride_acc_h + col[:, None].to(tl.int64)
                  + cols[None, :].to(tl.int64) * stride_acc_d, mask=ok & inside[:, None],
                  other=0.0)
    tl.store(DQ + h.to(tl.int64) * stride_qh + rows[:, None].to(tl.int64) * stride_qs
             + cols[None, :], acc.to(DQ.dtype.element_ty), mask=ok)


def dq_from_packed_workspace(dq_acc: torch.Tensor, q: torch.Tensor,
                             cu_seqlens_q: torch.Tensor) -> torch.Tensor:
    """dq (total_q, h, d), contiguous, q's dtype, from bwd_wide_kernel's packed fp32 dQ^T
    workspace ``dq_acc`` (1, h, d_pad, columns) (sequence starts: DQT_SEQ_ALIGN above); rows
    of no sequence are 0. q (total_q, h, d); cu_seqlens_q int32 (n_seqs + 1,) contiguous
    (read on the device only)."""
    total_q, n_heads, head_dim = q.shape
    n_seqs = cu_seqlens_q.shape[0] - 1
    dq = torch.empty((total_q, n_heads, head_dim), dtype=q.dtype, device=q.device)
    if total_q == 0:
        return dq
    block_d = next_pow2(head_dim)
    block_s = max(16, 8192 // block_d)
    steps = max(n_seqs - 1, 1).bit_length()  # enough halvings of [0, n_seqs - 1]
    key = (dq_acc.shape, dq_acc.stride(), q.shape, q.dtype, q.device, n_seqs)
    _PACKED_PLANS.launch(key, (dq_acc, dq, cu_seqlens_q), lambda: (
        _dq_convert_packed_kernel, (n_heads, cdiv(total_q, block_s)), (
            dq_acc, dq, cu_seqlens_q, dq_acc.stride(1), dq_acc.stride(2), dq.stride(0),
            dq.stride(1), total_q, n_seqs, steps),
        dict(HEAD_DIM=head_dim, ALIGN=DQT_SEQ_ALIGN, BLOCK_S=block_s, BLOCK_D=block_d,
             num_warps=8)))
    return dq


@triton.jit
def _split_sum_kernel(WS, DK, DV, grad_stride, part_stride, ws_batch_stride, out_batch_stride,
                      n, BLOCK: tl.constexpr):
    # program (chunk, batch): elements [chunk * BLOCK, + BLOCK) of the batch's n cut-key
    # elements, contiguous in the workspace's parts and in dk / dv alike
    offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    ok = offs < n
    batch = tl.program_id(1).to(tl.int64)
    src = WS + batch * ws_batch_stride + offs
    dst = batch * out_batch_stride + offs
    # part 0 + part 1, that order, in fp32; one rounding to the gradients' dtype
    dk = tl.load(src, mask=ok) + tl.load(src + part_stride, mask=ok)
    dv = tl.load(src + grad_stride, mask=ok) + tl.load(src + grad_stride + part_stride, mask=ok)
    tl.store(DK + dst, dk.to(DK.dtype.element_ty), mask=ok)
    tl.store(DV + dst, dv.to(DV.dtype.element_ty), mask=ok)


def add_split_parts(split_ws: torch.Tensor, dk: torch.Tensor, dv: torch.Tensor) -> None:
    """dk / dv of the cut key blocks: part 0 + part 1 of ``split_ws`` (fp32 (2, 2, b, rows,
    h_k, d), contiguous: [0, part] dK, [1, part] dV; one fixed order, so the result is the
    same on every run), cast to dk / dv's dtype, into their first min(rows, s_k) keys (the
    rows the kernel left unwritten). dk / dv (b, s_k, h_k, d) contiguous. One pass: the two
    parts read once, the gradients written once."""
    batch, seqlen_k, n_heads_k, head_dim = dk.shape
    n = min(split_ws.shape[3], seqlen_k) * n_heads_k * head_dim
    if n == 0 or batch == 0:
        return
    block = 2048
    key = (split_ws.shape, dk.shape, dk.dtype, dk.device)
    _SPLIT_PLANS.launch(key, (split_ws, dk, dv), lambda: (
        _split_sum_kernel, (cdiv(n, block), batch), (
            split_ws, dk, dv, split_ws.stride(0), split_ws.stride(1), split_ws.stride(2),
            dk.stride(0), n),
        dict(BLOCK=block, num_warps=8)))


# launch plans by call shape (runtime/launch.py); slots: the workspace, dq (and the offsets);
# the split workspace, dk, dv
_PLANS = LaunchPlans(slots=(0, 1))
_PACKED_PLANS = LaunchPlans(slots=(0, 1, 2))
_SPLIT_PLANS = LaunchPlans(slots=(0, 1, 2))
