"""Portable Triton FP8 forward: FlashAttention-2 tiling on float8_e4m3fn Q, K, V with
block descales (FlashAttention-3's FP8 numerics), dense or packed varlen.

Both GEMMs run on fp8 operands (``tl.dot`` on e4m3: sm89 / sm90 tensor cores; elsewhere, and
in the interpreter, the operands are upcast to fp32, same numerics). Per key block j:

    S   = (Q8 K8_j^T) · q_descale[row] · k_descale[j] · softmax_scale   (fp32, per-row factor)
    P   = exp2(S·log2e - (m - 8))        so P in [0, 2^8]: e4m3's normal range (fp8_format.P_SCALE)
    acc = acc · alpha · v_descale[j-1] / v_descale[j] + e4m3(P) V8_j

``acc`` is kept in units of the current block's V descale, so a block's V scale never has to be
applied inside the GEMM (the rescale by alpha, needed anyway, carries the ratio); the epilogue
multiplies by the last block's V descale and divides by the row sum of P (which carries the
same 2^8). A key block must not straddle two V scale blocks: BLOCK_N <= the kv scale block
(the wrapper clamps BLOCK_N).

V may be in either layout (keys contiguous, as ``flashattn.fp8.quantize`` writes it, or the
(s, h, d) layout); the strides say which.
"""
from __future__ import annotations

from typing import Optional, Tuple

import torch
import triton
import triton.language as tl

from flashattn.fp8_format import P_SCALE_LOG2 as _P_SCALE_LOG2
from flashattn.params import Fp8Scales
from flashattn.runtime import device as _device
from flashattn.runtime.env import INTERPRET
from flashattn.runtime.grid import bh_on_axis0, cdiv, next_pow2
from flashattn.backends.triton.fp8_quantize import round_e4m3
from flashattn.backends.triton.mask import LN2, LOG2E, key_range, tanh_f32, visible_mask
from flashattn.backends.triton.prologue import (program_ids, qkv_offsets, query_tile, row_offset,
                                         seq_info, stats_base)

P_SCALE_LOG2 = tl.constexpr(_P_SCALE_LOG2)  # P is 2^8 larger before its e4m3 cast (fp8_format)


@triton.jit
def _block_scale(D, base, pos, shift, n_blocks):
    """The descale of position(s) ``pos``: D[base + min(pos >> shift, n_blocks - 1)]."""
    return tl.load(D + base + tl.minimum(pos >> shift, n_blocks - 1))


@triton.jit
def _fp8_inner(acc, l_i, m_i, vd_prev, q, k_base, v_base, KD, VD, kd_base, start, end,
               offs_m, offs_n0, offs_d, offs_dv, row_scale,
               stride_kn, stride_vn, stride_vd, seqlen_k, diag, window_left, window_right,
               softcap_inv, softcap_log2, kv_shift, n_kv_blocks,
               HEAD_DIM: tl.constexpr, HEAD_DIM_V: tl.constexpr, BLOCK_N: tl.constexpr,
               MASKED: tl.constexpr, HAS_LEFT: tl.constexpr, HAS_RIGHT: tl.constexpr,
               HAS_SOFTCAP: tl.constexpr, FP8_DOT: tl.constexpr):
    """Stream key blocks [start, end) through the online softmax (see the module doc)."""
    for start_n in range(start, end, BLOCK_N):
        offs_n = start_n + offs_n0
        k_ptrs = k_base + offs_n[None, :].to(tl.int64) * stride_kn + offs_d[:, None]
        v_ptrs = (v_base + offs_n[:, None].to(tl.int64) * stride_vn
                  + offs_dv[None, :].to(tl.int64) * stride_vd)
        k_mask = offs_d[:, None] < HEAD_DIM
        v_mask = offs_dv[None, :] < HEAD_DIM_V
        if MASKED:
            k_mask = k_mask & (offs_n[None, :] < seqlen_k)
            v_mask = v_mask & (offs_n[:, None] < seqlen_k)
        k = tl.load(k_ptrs, mask=k_mask, other=0.0)
        kd = _block_scale(KD, kd_base, start_n, kv_shift, n_kv_blocks)
        vd = _block_scale(VD, kd_base, start_n, kv_shift, n_kv_blocks)
        if FP8_DOT:
            qk = tl.dot(q, k)
        else:
            qk = tl.dot(q.to(tl.float32), k.to(tl.float32), input_precision="ieee")
        s = qk * (row_scale * kd)[:, None]  # natural-log units, softmax_scale included
        if HAS_SOFTCAP:
            s = tanh_f32(s * softcap_inv) * softcap_log2
        else:
            s = s * LOG2E
        if MASKED:
            vis = visible_mask(offs_m[:, None], offs_n[None, :], seqlen_k, diag,
                               window_left, window_right, HAS_LEFT, HAS_RIGHT)
            s = tl.where(vis, s, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, 1))
        # a row with no visible key so far keeps m = -inf: subtract 0 instead (no NaN)
        m_sub = tl.where(m_new == float("-inf"), 0.0, m_new)
        p = tl.exp2(s - (m_sub - P_SCALE_LOG2)[:, None])
        alpha = tl.exp2(m_i - m_sub)
        l_i = l_i * alpha + tl.sum(p, 1)
        acc = acc * (alpha * (vd_prev / vd))[:, None]
        v = tl.load(v_ptrs, mask=v_mask, other=0.0)
        if FP8_DOT:
            acc = tl.dot(p.to(v.dtype), v, acc)
        else:
            acc = tl.dot(round_e4m3(p), v.to(tl.float32), acc, input_precision="ieee")
        m_i = m_new
        vd_prev = vd
    return acc, l_i, m_i, vd_prev


@triton.jit
def _fwd_fp8_kernel(Q, K, V, Out, Lse, QD, KD, VD, CuSeqQ, CuSeqK, SeqUsedK,
                    stride_qb, stride_qm, stride_qh,
                    stride_kb, stride_kn, stride_kh,
                    stride_vb, stride_vn, stride_vh, stride_vd,
                    stride_ob, stride_om, stride_oh,
                    nheads, nheads_k, seqlen_q, seqlen_k, group, lse_stride_h, total_k,
                    n_q_blocks, n_kv_blocks, q_shift, kv_shift,
                    sm_scale, softcap, window_left, window_right,
                    HEAD_DIM: tl.constexpr, HEAD_DIM_V: tl.constexpr,
                    BLOCK_D: tl.constexpr, BLOCK_DV: tl.constexpr,
                    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                    HAS_LEFT: tl.constexpr, HAS_RIGHT: tl.constexpr, HAS_SOFTCAP: tl.constexpr,
                    FP8_DOT: tl.constexpr, VARLEN: tl.constexpr, HAS_SEQUSED: tl.constexpr,
                    BH_AXIS0: tl.constexpr):
    # heavy causal rows first, as in the bf16 forward kernel (fwd.py)
    pid_m, pid_bh, off_b, off_h = program_ids(nheads, BH_AXIS0, True)
    off_hk = off_h // group
    m_start = pid_m * BLOCK_M
    q_start, k_start, seqlen_q, seqlen_k = seq_info(CuSeqQ, CuSeqK, SeqUsedK, off_b, seqlen_q,
                                                    seqlen_k, lse_stride_h, total_k, VARLEN,
                                                    HAS_SEQUSED)
    if VARLEN:
        if m_start >= seqlen_q:
            return
    q_off, k_off, v_off = qkv_offsets(off_b, q_start, k_start, stride_qb, stride_qm, stride_kb,
                                      stride_kn, stride_vb, stride_vn, VARLEN)
    o_off = row_offset(off_b, q_start, stride_ob, stride_om, VARLEN)
    lse_base = stats_base(Lse, pid_bh, off_h, q_start, lse_stride_h, seqlen_q, VARLEN)
    diag = seqlen_k - seqlen_q
    m_end, offs_m, offs_n0, offs_d, offs_dv = query_tile(m_start, seqlen_q, BLOCK_M, BLOCK_N,
                                                         BLOCK_D, BLOCK_DV)

    q_base = Q + q_off + off_h.to(tl.int64) * stride_qh
    k_base = K + k_off + off_hk.to(tl.int64) * stride_kh
    v_base = V + v_off + off_hk.to(tl.int64) * stride_vh
    q = tl.load(q_base + offs_m[:, None].to(tl.int64) * stride_qm + offs_d[None, :],
                mask=(offs_m[:, None] < seqlen_q) & (offs_d[None, :] < HEAD_DIM), other=0.0)
    # descales: one per (row block of q), (key block of k / v); rows past s_q clamp
    qd_base = pid_bh.to(tl.int64) * n_q_blocks
    kd_base = (off_b * nheads_k + off_hk).to(tl.int64) * n_kv_blocks
    row_scale = _block_scale(QD, qd_base, offs_m, q_shift, n_q_blocks) * sm_scale
    softcap_inv = 0.0
    softcap_log2 = 0.0
    if HAS_SOFTCAP:
        softcap_inv = 1.0 / softcap
        softcap_log2 = softcap * LOG2E

    m_i = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
    acc = tl.zeros([BLOCK_M, BLOCK_DV], dtype=tl.float32)
    vd_prev = tl.load(VD + kd_base)  # any positive value: acc is still zero

    lo, mid_lo, mid_hi, hi = key_range(m_start, m_end, seqlen_k, diag, window_left, window_right,
                                       BLOCK_N, HAS_LEFT, HAS_RIGHT)
    acc, l_i, m_i, vd_prev = _fp8_inner(
        acc, l_i, m_i, vd_prev, q, k_base, v_base, KD, VD, kd_base, lo, mid_lo, offs_m, offs_n0,
        offs_d, offs_dv, row_scale, stride_kn, stride_vn, stride_vd, seqlen_k, diag,
        window_left, window_right, softcap_inv, softcap_log2, kv_shift, n_kv_blocks,
        HEAD_DIM, HEAD_DIM_V, BLOCK_N, True, HAS_LEFT, HAS_RIGHT, HAS_SOFTCAP, FP8_DOT)
    acc, l_i, m_i, vd_prev = _fp8_inner(
        acc, l_i, m_i, vd_prev, q, k_base, v_base, KD, VD, kd_base, mid_lo, mid_hi, offs_m,
        offs_n0, offs_d, offs_dv, row_scale, stride_kn, stride_vn, stride_vd, seqlen_k, diag,
        window_left, window_right, softcap_inv, softcap_log2, kv_shift, n_kv_blocks,
        HEAD_DIM, HEAD_DIM_V, BLOCK_N, False, HAS_LEFT, HAS_RIGHT, HAS_SOFTCAP, FP8_DOT)
    acc, l_i, m_i, vd_prev = _fp8_inner(
        acc, l_i, m_i, vd_prev, q, k_base, v_base, KD, VD, kd_base, mid_hi, hi, offs_m, offs_n0,
        offs_d, offs_dv, row_scale, stride_kn, stride_vn, stride_vd, seqlen_k, diag,
        window_left, window_right, softcap_inv, softcap_log2, kv_shift, n_kv_blocks,
        HEAD_DIM, HEAD_DIM_V, BLOCK_N, True, HAS_LEFT, HAS_RIGHT, HAS_SOFTCAP, FP8_DOT)

    # epilogue: O = acc · v_descale(last block) / l; l and P both carry 2^8
    empty = l_i == 0.0
    l_safe = tl.where(empty, 1.0, l_i)
    acc = acc * (vd_prev / l_safe)[:, None]
    lse2 = tl.where(empty, float("-inf"), m_i + tl.log2(l_safe) - P_SCALE_LOG2)
    tl.store(lse_base + offs_m, lse2 * LN2, mask=offs_m < seqlen_q)
    o_base = Out + o_off + off_h.to(tl.int64) * stride_oh
    o_ptrs = o_base + offs_m[:, None].to(tl.int64) * stride_om + offs_dv[None, :]
    tl.store(o_ptrs, acc.to(Out.dtype.element_ty),
             mask=(offs_m[:, None] < seqlen_q) & (offs_dv[None, :] < HEAD_DIM_V))


def fp8_dot_supported(device: torch.device) -> bool:
    """tl.dot on e4m3 operands: sm89 (Ada) and newer; elsewhere (and in the interpreter) the
    kernel upcasts the operands to fp32 (same numerics, no FP8 speed)."""
    if INTERPRET or device.type != "cuda":
        return False
    return tuple(_device.capability(_device.device_index(device))) >= (8, 9)


def min_dot_k(fp8_dot: bool) -> int:
    """The smallest K of ``tl.dot`` on the GPU: 32 for e4m3 operands, 16 for the upcast ones.
    It bounds the key tile (P·V's K) and the padded head dim (Q·K^T's K)."""
    return 32 if fp8_dot else 16


def _tiles(head_dim: int, head_dim_v: int, kv_block: int,
           fp8_dot: bool) -> Tuple[int, int, int, int]:
    """(BLOCK_M, BLOCK_N, num_warps, num_stages); BLOCK_N never straddles a kv scale block (one
    V descale per key tile), so kv scale blocks below the GPU's smallest dot K are refused."""
    if INTERPRET:
        return 16, min(16, kv_block), 4, 1
    if kv_block < min_dot_k(fp8_dot):
        raise ValueError(f"FP8 attention on this GPU needs K / V scale blocks of at least "
                         f"{min_dot_k(fp8_dot)} keys (block_n of flashattn.fp8.quantize), got "
                         f"{kv_block}")
    # register use on sm90 (AOT, ptxas): d 64 (128, 128) 221 regs; d 128 (128, 128) spills
    # 104 bytes non-causal, (128, 64) 171; d 256 (128, 64) 255, no spill
    d = max(head_dim, head_dim_v)
    bm, bn, warps, stages = (128, 128, 8, 3) if d <= 64 else (128, 64, 8, 3)
    return bm, min(bn, kv_block), warps, stages


def _launch(q8, k8, v8, out, lse, scales: Fp8Scales, strides, n_seqs, seqlen_q, seqlen_k,
            lse_stride_h, seqlens, *, softmax_scale, window_left, window_right, softcap):
    nheads, head_dim = q8.shape[-2], q8.shape[-1]
    nheads_k, head_dim_v = k8.shape[-2], v8.shape[-1]
    varlen = seqlens is not None
    cu_q, cu_k, seqused_k = seqlens if varlen else (lse, lse, None)
    has_seqused = seqused_k is not None
    kv_block = 1 << min(scales.kv_block_shift, 30)
    fp8_dot = fp8_dot_supported(q8.device)
    bm, bn, warps, stages = _tiles(head_dim, head_dim_v, kv_block, fp8_dot)
    min_d = 16 if INTERPRET else min_dot_k(fp8_dot)
    axis0 = bh_on_axis0(n_seqs * nheads, varlen)
    grid = ((n_seqs * nheads, cdiv(seqlen_q, bm)) if axis0
            else (cdiv(seqlen_q, bm), n_seqs * nheads))
    _fwd_fp8_kernel[grid](
        q8, k8, v8, out, lse, scales.q_descale, scales.k_descale, scales.v_descale,
        cu_q, cu_k, seqused_k if has_seqused else cu_k,
        *strides[0], *strides[1], *strides[2], *strides[3],
        nheads, nheads_k, seqlen_q, seqlen_k, nheads // nheads_k, lse_stride_h, k8.shape[0],
        scales.q_descale.shape[2], scales.k_descale.shape[2],
        min(scales.q_block_shift, 31), min(scales.kv_block_shift, 31),
        float(softmax_scale), float(softcap), int(window_left), int(window_right),
        HEAD_DIM=head_dim, HEAD_DIM_V=head_dim_v,
        BLOCK_D=max(min_d, next_pow2(head_dim)), BLOCK_DV=max(16, next_pow2(head_dim_v)),
        BLOCK_M=bm, BLOCK_N=bn,
        HAS_LEFT=window_left >= 0, HAS_RIGHT=window_right >= 0, HAS_SOFTCAP=softcap > 0.0,
        FP8_DOT=fp8_dot, VARLEN=varlen, HAS_SEQUSED=has_seqused,
        BH_AXIS0=axis0, num_warps=warps, num_stages=stages)


def flash_fwd_fp8(q8: torch.Tensor, k8: torch.Tensor, v8: torch.Tensor, scales: Fp8Scales, *,
                  softmax_scale: float, window_left: int, window_right: int, softcap: float,
                  out_dtype: torch.dtype) -> Tuple[torch.Tensor, torch.Tensor]:
    """FP8 attention forward with the portable kernel.

    q8 (b, s_q, h, d), k8 (b, s_k, h_k, d), v8 (b, s_k, h_k, d_v) float8_e4m3fn, last dim of
    q8 / k8 contiguous, v8 with either its head dim or its key axis contiguous; ``scales`` as
    params.Fp8Scales. Returns out (b, s_q, h, d_v) in out_dtype and lse float32 (b, h, s_q)
    (natural log, -inf for rows that see no key).
    """
    batch, seqlen_q, nheads, _ = q8.shape
    seqlen_k, head_dim_v = k8.shape[1], v8.shape[3]
    out = torch.empty((batch, seqlen_q, nheads, head_dim_v), dtype=out_dtype, device=q8.device)
    lse = torch.empty((batch, nheads, seqlen_q), dtype=torch.float32, device=q8.device)
    strides = (q8.stride()[:3], k8.stride()[:3], v8.stride(), out.stride()[:3])
    _launch(q8, k8, v8, out, lse, scales, strides, batch, seqlen_q, seqlen_k, seqlen_q, None,
            softmax_scale=softmax_scale, window_left=window_left, window_right=window_right,
            softcap=softcap)
    return out, lse


def flash_varlen_fwd_fp8(q8: torch.Tensor, k8: torch.Tensor, v8: torch.Tensor,
                         cu_seqlens_q: torch.Tensor, cu_seqlens_k: torch.Tensor,
                         seqused_k: Optional[torch.Tensor], max_seqlen_q: int,
                         max_seqlen_k: int, scales: Fp8Scales, *, softmax_scale: float,
                         window_left: int, window_right: int, softcap: float,
                         out_dtype: torch.dtype) -> Tuple[torch.Tensor, torch.Tensor]:
    """Packed varlen FP8 forward: q8 (total_q, h, d), k8 / v8 (total_k, h_k, d / d_v);
    ``scales`` with (b, h, 1) / (b, h_k, 1) descales (one per sequence and head). Returns out
    (total_q, h, d_v) in out_dtype (0 outside every sequence) and lse (h, total_q)."""
    total_q, nheads, _ = q8.shape
    head_dim_v = v8.shape[-1]
    batch = cu_seqlens_q.shape[0] - 1
    out = torch.zeros((total_q, nheads, head_dim_v), dtype=out_dtype, device=q8.device)
    lse = torch.full((nheads, total_q), float("-inf"), dtype=torch.float32, device=q8.device)
    if batch == 0 or total_q == 0 or max_seqlen_q == 0 or k8.shape[0] == 0 or max_seqlen_k == 0:
        return out, lse
    cu_q, cu_k = cu_seqlens_q.contiguous(), cu_seqlens_k.contiguous()
    seqused_k = seqused_k.contiguous() if seqused_k is not None else None
    strides = ((0, *q8.stride()[:2]), (0, *k8.stride()[:2]), (0, *v8.stride()[:3]),
               (0, *out.stride()[:2]))
    _launch(q8, k8, v8, out, lse, scales, strides, batch, max_seqlen_q, max_seqlen_k, total_q,
            (cu_q, cu_k, seqused_k), softmax_scale=softmax_scale, window_left=window_left,
            window_right=window_right, softcap=softcap)
    return out, lse


__all__ = ["flash_fwd_fp8", "flash_varlen_fwd_fp8", "fp8_dot_supported"]
