"""Portable Triton forward kernel: FlashAttention-2 tiling with online softmax.

One program owns BLOCK_M query rows of one (batch, head). Q stays in registers, K/V blocks
stream through; the running max ``m_i`` and sum ``l_i`` rescale the fp32 accumulator
``acc`` and the division by ``l_i`` happens once at the end. The key loop is split in three
ranges (masked front, unmasked middle, masked back) so only blocks that cut the causal /
window diagonal or the sequence end pay for the mask. Output: O once, LSE once.
"""
from __future__ import annotations

import math
from typing import Optional

import torch
import triton
import triton.language as tl

from flashattn.kernels import config
from flashattn.philox import dropout_threshold
from flashattn.kernels.masks import (LN2, LOG2E, dropout_keep, key_range, score_mod,
                                     score_scales, visible_mask)


@triton.jit
def _fwd_inner(acc, l_i, m_i, q, k_base, v_base, k_desc, v_desc, start, end, offs_m, offs_n0, offs_d, offs_dv,
               stride_kn, stride_vn, seqlen_k, diag, window_left, window_right,
               qk_scale, softcap_inv, softcap_log2, slope_log2, seed, bh, drop_threshold,
               HEAD_DIM: tl.constexpr, HEAD_DIM_V: tl.constexpr,
               BLOCK_D: tl.constexpr, BLOCK_DV: tl.constexpr, BLOCK_N: tl.constexpr,
               MASKED: tl.constexpr, HAS_LEFT: tl.constexpr, HAS_RIGHT: tl.constexpr,
               HAS_SOFTCAP: tl.constexpr, HAS_ALIBI: tl.constexpr, HAS_DROPOUT: tl.constexpr,
               UPCAST: tl.constexpr, DOT_PREC: tl.constexpr, USE_TMA: tl.constexpr,
               WARP_SPEC: tl.constexpr):
    """Stream key blocks [start, end) through the online softmax. MASKED applies the
    visibility mask and guards rows whose running max is still -inf. WARP_SPEC lets Triton
    split the loop into TMA-producer and MMA/softmax-consumer warps (sm90+)."""
    for start_n in tl.range(start, end, BLOCK_N, warp_specialize=WARP_SPEC):
        offs_n = start_n + offs_n0
        # K is read transposed: (BLOCK_D, BLOCK_N)
        k_ptrs = k_base + offs_n[None, :].to(tl.int64) * stride_kn + offs_d[:, None]
        v_ptrs = v_base + offs_n[:, None].to(tl.int64) * stride_vn + offs_dv[None, :]
        if USE_TMA:
            # TMA zero-fills rows past s_k and columns past the head dim
            k = tl.trans(k_desc.load([start_n, 0]))
        elif MASKED:
            k = tl.load(k_ptrs, mask=(offs_n[None, :] < seqlen_k) & (offs_d[:, None] < HEAD_DIM),
                        other=0.0)
        elif BLOCK_D != HEAD_DIM:
            k = tl.load(k_ptrs, mask=offs_d[:, None] < HEAD_DIM, other=0.0)
        else:
            k = tl.load(k_ptrs)
        if UPCAST:
            k = k.to(tl.float32)
        qk = tl.dot(q, k, input_precision=DOT_PREC)
        if MASKED or HAS_SOFTCAP or HAS_ALIBI:
            s, _t = score_mod(qk, offs_m[:, None], offs_n[None, :], diag, qk_scale, softcap_inv,
                              softcap_log2, slope_log2, HAS_SOFTCAP, HAS_ALIBI)
        if MASKED:
            vis = visible_mask(offs_m[:, None], offs_n[None, :], seqlen_k, diag,
                               window_left, window_right, HAS_LEFT, HAS_RIGHT)
            s = tl.where(vis, s, float("-inf"))
            m_new = tl.maximum(m_i, tl.max(s, 1))
            # a row with no visible key so far keeps m = -inf: subtract 0 instead (no NaN)
            m_sub = tl.where(m_new == float("-inf"), 0.0, m_new)
            p = tl.exp2(s - m_sub[:, None])
        elif HAS_SOFTCAP or HAS_ALIBI:
            m_new = tl.maximum(m_i, tl.max(s, 1))
            m_sub = m_new
            p = tl.exp2(s - m_sub[:, None])
        else:
            # plain scores: scale and subtract the max in one FMA per element
            m_new = tl.maximum(m_i, tl.max(qk, 1) * qk_scale)
            m_sub = m_new
            p = tl.exp2(qk * qk_scale - m_sub[:, None])
        alpha = tl.exp2(m_i - m_sub)
        l_i = l_i * alpha + tl.sum(p, 1)
        acc = acc * alpha[:, None]
        if HAS_DROPOUT:
            keep = dropout_keep(seed, offs_m[:, None], offs_n[None, :], bh, drop_threshold)
            p = tl.where(keep, p, 0.0)
        if USE_TMA:
            v = v_desc.load([start_n, 0])
        elif MASKED:
            v = tl.load(v_ptrs, mask=(offs_n[:, None] < seqlen_k) & (offs_dv[None, :] < HEAD_DIM_V),
                        other=0.0)
        elif BLOCK_DV != HEAD_DIM_V:
            v = tl.load(v_ptrs, mask=offs_dv[None, :] < HEAD_DIM_V, other=0.0)
        else:
            v = tl.load(v_ptrs)
        if UPCAST:
            v = v.to(tl.float32)
        acc = tl.dot(p.to(v.dtype), v, acc, input_precision=DOT_PREC)
        m_i = m_new
    return acc, l_i, m_i


@triton.jit
def _write_softmax(P, stride_pb, stride_ph, stride_pm, off_b, off_h, q, k_base, lo, hi,
                   offs_m, offs_n0, offs_d, stride_kn, seqlen_q, seqlen_k, diag,
                   window_left, window_right, lse2, qk_scale, softcap_inv, softcap_log2,
                   slope_log2, seed, bh, drop_threshold,
                   HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_N: tl.constexpr,
                   HAS_LEFT: tl.constexpr, HAS_RIGHT: tl.constexpr, HAS_SOFTCAP: tl.constexpr,
                   HAS_ALIBI: tl.constexpr, HAS_DROPOUT: tl.constexpr, UPCAST: tl.constexpr,
                   DOT_PREC: tl.constexpr):
    """Debug output (return_attn_probs): normalised P, negated where dropout dropped it."""
    p_base = P + off_b.to(tl.int64) * stride_pb + off_h.to(tl.int64) * stride_ph
    for start_n in range(lo, hi, BLOCK_N):
        offs_n = start_n + offs_n0
        k_ptrs = k_base + offs_n[None, :].to(tl.int64) * stride_kn + offs_d[:, None]
        k = tl.load(k_ptrs, mask=(offs_n[None, :] < seqlen_k) & (offs_d[:, None] < HEAD_DIM),
                    other=0.0)
        if UPCAST:
            k = k.to(tl.float32)
        qk = tl.dot(q, k, input_precision=DOT_PREC)
        s, _t = score_mod(qk, offs_m[:, None], offs_n[None, :], diag, qk_scale, softcap_inv,
                          softcap_log2, slope_log2, HAS_SOFTCAP, HAS_ALIBI)
        vis = visible_mask(offs_m[:, None], offs_n[None, :], seqlen_k, diag,
                           window_left, window_right, HAS_LEFT, HAS_RIGHT)
        p = tl.where(vis, tl.exp2(s - lse2[:, None]), 0.0)
        if HAS_DROPOUT:
            keep = dropout_keep(seed, offs_m[:, None], offs_n[None, :], bh, drop_threshold)
            p = tl.where(keep, p, -p)
        p_ptrs = p_base + offs_m[:, None].to(tl.int64) * stride_pm + offs_n[None, :]
        tl.store(p_ptrs, p.to(P.dtype.element_ty),
                 mask=(offs_m[:, None] < seqlen_q) & (offs_n[None, :] < seqlen_k))


@triton.jit
def _fwd_kernel(Q, K, V, Out, Lse, Alibi, P,
                stride_qb, stride_qm, stride_qh,
                stride_kb, stride_kn, stride_kh,
                stride_vb, stride_vn, stride_vh,
                stride_ob, stride_om, stride_oh,
                stride_ab, stride_ah,
                stride_pb, stride_ph, stride_pm,
                nheads, seqlen_q, seqlen_k, group, seq_bucket,
                sm_scale, softcap, window_left, window_right,
                drop_threshold, drop_scale, seed,
                HEAD_DIM: tl.constexpr, HEAD_DIM_V: tl.constexpr,
                BLOCK_D: tl.constexpr, BLOCK_DV: tl.constexpr,
                BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                HAS_LEFT: tl.constexpr, HAS_RIGHT: tl.constexpr,
                HAS_SOFTCAP: tl.constexpr, HAS_ALIBI: tl.constexpr,
                HAS_DROPOUT: tl.constexpr, RETURN_P: tl.constexpr,
                UPCAST: tl.constexpr, DOT_PREC: tl.constexpr, USE_TMA: tl.constexpr,
                WARP_SPEC: tl.constexpr):
    # Heavy causal rows (high m) are scheduled first: program 0 takes the last query block.
    pid_m = tl.num_programs(0) - 1 - tl.program_id(0)
    pid_bh = tl.program_id(1)
    off_b = pid_bh // nheads
    off_h = pid_bh % nheads
    off_hk = off_h // group
    diag = seqlen_k - seqlen_q

    m_start = pid_m * BLOCK_M
    m_end = tl.minimum(m_start + BLOCK_M, seqlen_q)
    offs_m = m_start + tl.arange(0, BLOCK_M)
    offs_n0 = tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, BLOCK_D)
    offs_dv = tl.arange(0, BLOCK_DV)

    # 64-bit base offsets: b * stride_b can exceed 2**31 on long sequences.
    q_base = Q + off_b.to(tl.int64) * stride_qb + off_h.to(tl.int64) * stride_qh
    k_base = K + off_b.to(tl.int64) * stride_kb + off_hk.to(tl.int64) * stride_kh
    v_base = V + off_b.to(tl.int64) * stride_vb + off_hk.to(tl.int64) * stride_vh
    k_desc = None
    v_desc = None
    if USE_TMA:
        # 2-D (s_k, d) views of this (batch, kv head): TMA streams the K/V tiles
        k_desc = tl.make_tensor_descriptor(k_base, shape=[seqlen_k, HEAD_DIM], strides=[stride_kn, 1],
                                           block_shape=[BLOCK_N, BLOCK_D])
        v_desc = tl.make_tensor_descriptor(v_base, shape=[seqlen_k, HEAD_DIM_V], strides=[stride_vn, 1],
                                           block_shape=[BLOCK_N, BLOCK_DV])
    q_ptrs = q_base + offs_m[:, None].to(tl.int64) * stride_qm + offs_d[None, :]
    q = tl.load(q_ptrs, mask=(offs_m[:, None] < seqlen_q) & (offs_d[None, :] < HEAD_DIM), other=0.0)
    if UPCAST:
        q = q.to(tl.float32)

    qk_scale, softcap_inv, softcap_log2 = score_scales(sm_scale, softcap, HAS_SOFTCAP)
    slope_log2 = 0.0
    if HAS_ALIBI:
        slope_log2 = tl.load(Alibi + off_b * stride_ab + off_h * stride_ah) * LOG2E

    m_i = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
    acc = tl.zeros([BLOCK_M, BLOCK_DV], dtype=tl.float32)

    lo, mid_lo, mid_hi, hi = key_range(m_start, m_end, seqlen_k, diag, window_left, window_right,
                                       BLOCK_N, HAS_LEFT, HAS_RIGHT)
    # masked front (sliding window's left edge)
    acc, l_i, m_i = _fwd_inner(acc, l_i, m_i, q, k_base, v_base, k_desc, v_desc, lo, mid_lo, offs_m, offs_n0,
                               offs_d, offs_dv, stride_kn, stride_vn, seqlen_k, diag,
                               window_left, window_right, qk_scale, softcap_inv, softcap_log2,
                               slope_log2, seed, pid_bh, drop_threshold,
                               HEAD_DIM, HEAD_DIM_V, BLOCK_D, BLOCK_DV, BLOCK_N, True,
                               HAS_LEFT, HAS_RIGHT, HAS_SOFTCAP, HAS_ALIBI, HAS_DROPOUT,
                               UPCAST, DOT_PREC, USE_TMA, False)
    # unmasked middle: the bulk of the work
    acc, l_i, m_i = _fwd_inner(acc, l_i, m_i, q, k_base, v_base, k_desc, v_desc, mid_lo, mid_hi, offs_m, offs_n0,
                               offs_d, offs_dv, stride_kn, stride_vn, seqlen_k, diag,
                               window_left, window_right, qk_scale, softcap_inv, softcap_log2,
                               slope_log2, seed, pid_bh, drop_threshold,
                               HEAD_DIM, HEAD_DIM_V, BLOCK_D, BLOCK_DV, BLOCK_N, False,
                               HAS_LEFT, HAS_RIGHT, HAS_SOFTCAP, HAS_ALIBI, HAS_DROPOUT,
                               UPCAST, DOT_PREC, USE_TMA, WARP_SPEC)
    # masked back (causal diagonal, window's right edge, ragged end of K)
    acc, l_i, m_i = _fwd_inner(acc, l_i, m_i, q, k_base, v_base, k_desc, v_desc, mid_hi, hi, offs_m, offs_n0,
                               offs_d, offs_dv, stride_kn, stride_vn, seqlen_k, diag,
                               window_left, window_right, qk_scale, softcap_inv, softcap_log2,
                               slope_log2, seed, pid_bh, drop_threshold,
                               HEAD_DIM, HEAD_DIM_V, BLOCK_D, BLOCK_DV, BLOCK_N, True,
                               HAS_LEFT, HAS_RIGHT, HAS_SOFTCAP, HAS_ALIBI, HAS_DROPOUT,
                               UPCAST, DOT_PREC, USE_TMA, False)

    # epilogue: one division, one write of O and of the LSE
    empty = l_i == 0.0
    l_safe = tl.where(empty, 1.0, l_i)
    inv_l = 1.0 / l_safe
    if HAS_DROPOUT:
        inv_l = inv_l * drop_scale
    acc = acc * inv_l[:, None]
    lse2 = tl.where(empty, float("-inf"), m_i + tl.log2(l_safe))
    lse_ptrs = Lse + pid_bh.to(tl.int64) * seqlen_q + offs_m
    tl.store(lse_ptrs, lse2 * LN2, mask=offs_m < seqlen_q)
    o_base = Out + off_b.to(tl.int64) * stride_ob + off_h.to(tl.int64) * stride_oh
    o_ptrs = o_base + offs_m[:, None].to(tl.int64) * stride_om + offs_dv[None, :]
    tl.store(o_ptrs, acc.to(Out.dtype.element_ty),
             mask=(offs_m[:, None] < seqlen_q) & (offs_dv[None, :] < HEAD_DIM_V))

    if RETURN_P:
        _write_softmax(P, stride_pb, stride_ph, stride_pm, off_b, off_h, q, k_base, lo, hi,
                       offs_m, offs_n0, offs_d, stride_kn, seqlen_q, seqlen_k, diag,
                       window_left, window_right, lse2, qk_scale, softcap_inv, softcap_log2,
                       slope_log2, seed, pid_bh, drop_threshold,
                       HEAD_DIM, BLOCK_D, BLOCK_N, HAS_LEFT, HAS_RIGHT, HAS_SOFTCAP,
                       HAS_ALIBI, HAS_DROPOUT, UPCAST, DOT_PREC)


_fwd_autotuned = config.autotune_fwd(_fwd_kernel)


def flash_fwd(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, softmax_scale: float,
              causal: bool, window_left: int, window_right: int, softcap: float,
              alibi_slopes: Optional[torch.Tensor], dropout_p: float, philox_seed: int,
              return_softmax: bool):
    """Attention forward with the portable Triton kernel.

    q (b, s_q, h, d), k (b, s_k, h_k, d), v (b, s_k, h_k, d_v); fp16/bf16/fp32, last dim
    contiguous. Returns out (b, s_q, h, d_v) in q's dtype, lse float32 (b, h, s_q) and, when
    ``return_softmax``, S_dmask (b, h, s_q, s_k) in q's dtype (else None).
    Parameters are the normalised ones of docs/internals.md.
    """
    batch, seqlen_q, nheads, head_dim = q.shape
    _, seqlen_k, nheads_k, head_dim_v = v.shape
    out = torch.empty((batch, seqlen_q, nheads, head_dim_v), dtype=q.dtype, device=q.device)
    lse = torch.empty((batch, nheads, seqlen_q), dtype=torch.float32, device=q.device)
    p_mat = None
    if return_softmax:
        p_mat = torch.zeros((batch, nheads, seqlen_q, seqlen_k), dtype=q.dtype, device=q.device)
    if out.numel() == 0 or batch == 0 or seqlen_q == 0:
        if seqlen_q and batch:
            lse.fill_(float("-inf"))
        return out, lse, p_mat
    p_arg = p_mat if p_mat is not None else out
    p_strides = p_mat.stride()[:3] if p_mat is not None else (0, 0, 0)
    alibi_arg = alibi_slopes if alibi_slopes is not None else lse
    alibi_strides = alibi_slopes.stride() if alibi_slopes is not None else (0, 0)
    has_dropout = dropout_p > 0.0
    drop_threshold = dropout_threshold(dropout_p)
    drop_scale = 1.0 / (1.0 - dropout_p) if has_dropout else 1.0

    def grid(meta):
        return (triton.cdiv(seqlen_q, meta["BLOCK_M"]), batch * nheads)

    config.install_allocator()
    _fwd_autotuned[grid](
        q, k, v, out, lse, alibi_arg, p_arg,
        q.stride(0), q.stride(1), q.stride(2),
        k.stride(0), k.stride(1), k.stride(2),
        v.stride(0), v.stride(1), v.stride(2),
        out.stride(0), out.stride(1), out.stride(2),
        alibi_strides[0], alibi_strides[1],
        p_strides[0], p_strides[1], p_strides[2],
        nheads, seqlen_q, seqlen_k, nheads // nheads_k, config.seq_bucket(seqlen_q, seqlen_k),
        float(softmax_scale), float(softcap), int(window_left), int(window_right),
        drop_threshold, drop_scale, int(philox_seed) if has_dropout else 0,
        HEAD_DIM=head_dim, HEAD_DIM_V=head_dim_v,
        BLOCK_D=config.block_dim(head_dim), BLOCK_DV=config.block_dim(head_dim_v),
        HAS_LEFT=window_left >= 0, HAS_RIGHT=window_right >= 0,
        HAS_SOFTCAP=softcap > 0.0, HAS_ALIBI=alibi_slopes is not None,
        HAS_DROPOUT=has_dropout, RETURN_P=return_softmax,
        UPCAST=config.upcast_dots(q), DOT_PREC=config.dot_precision(q),
        USE_TMA=config.use_tma(k, v),
    )
    return out, lse, p_mat
