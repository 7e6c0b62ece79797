"""Portable Triton forward kernel: FlashAttention-2 tiling with online softmax.

One program owns BLOCK_M query rows of one (batch, head). Q stays in registers, K/V blocks
stream through; the running max ``m_i`` and sum ``l_i`` rescale the fp32 accumulator
``acc`` and the division by ``l_i`` happens once at the end. The key loop is split in three
ranges (masked front, unmasked middle, masked back) so only blocks that cut the causal /
window diagonal or the sequence end pay for the mask. Output: O once, LSE once.

Packed variable-length sequences use the same kernel with the constexpr ``VARLEN``: the batch
index becomes a sequence index whose start row and lengths come from cu_seqlens on the device
(``prologue.seq_bounds``), the grid is sized by max_seqlen_q and programs past their
sequence's end exit (``flash_varlen_fwd``).
"""
from __future__ import annotations

import math
from typing import Optional

import torch
import triton
import triton.language as tl

from flashattn.backends.triton import config
from flashattn.runtime.buffers import stream_buffer
from flashattn.runtime.launch import LaunchPlan, LaunchPlans, launch_tuned_planned
from flashattn.philox import dropout_threshold
from flashattn.backends.triton.mask import (LN2, LOG2E, dropout_keep, key_range, score_mod,
                                     score_scales, visible_mask)
from flashattn.backends.triton.prologue import (key_rows, program_ids, qkv_offsets, query_tile,
                                         row_offset, seq_info, stats_base, tma_pair)


@triton.jit
def _fwd_inner(acc, l_i, m_i, q, k_base, v_base, k_desc, v_desc, start, end, offs_m, offs_n0, offs_d, offs_dv,
               stride_kn, stride_vn, seqlen_k, diag, alibi_diag, window_left, window_right,
               qk_scale, softcap_inv, softcap_log2, slope_log2, seed, bh, drop_threshold,
               HEAD_DIM: tl.constexpr, HEAD_DIM_V: tl.constexpr,
               BLOCK_D: tl.constexpr, BLOCK_DV: tl.constexpr, BLOCK_N: tl.constexpr,
               MASKED: tl.constexpr, HAS_LEFT: tl.constexpr, HAS_RIGHT: tl.constexpr,
               HAS_SOFTCAP: tl.constexpr, HAS_ALIBI: tl.constexpr, HAS_DROPOUT: tl.constexpr,
               UPCAST: tl.constexpr, DOT_PREC: tl.constexpr, USE_TMA: tl.constexpr,
               WARP_SPEC: tl.constexpr):
    """Stream key blocks [start, end) through the online softmax. MASKED applies the
    visibility mask and guards rows whose running max is still -inf. WARP_SPEC lets Triton
    split the loop into TMA-producer and MMA/softmax-consumer warps (sm90+). ``alibi_diag``:
    ALiBi's diagonal (``diag`` plus AttnParams.alibi_shift; the mask keeps ``diag``)."""
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
            s, _t = score_mod(qk, offs_m[:, None], offs_n[None, :], alibi_diag, qk_scale,
                              softcap_inv, softcap_log2, slope_log2, HAS_SOFTCAP, HAS_ALIBI)
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
                   offs_m, offs_n0, offs_d, stride_kn, seqlen_q, seqlen_k, diag, alibi_diag,
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
        s, _t = score_mod(qk, offs_m[:, None], offs_n[None, :], alibi_diag, qk_scale,
                          softcap_inv, softcap_log2, slope_log2, HAS_SOFTCAP, HAS_ALIBI)
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
def _fwd_kernel(Q, K, V, Out, Lse, Alibi, P, CuSeqQ, CuSeqK, SeqUsedK,
                stride_qb, stride_qm, stride_qh,
                stride_kb, stride_kn, stride_kh,
                stride_vb, stride_vn, stride_vh,
                stride_ob, stride_om, stride_oh,
                stride_ab, stride_ah,
                stride_pb, stride_ph, stride_pm,
                nheads, seqlen_q, seqlen_k, group, seq_bucket, lse_stride_h, total_k,
                sm_scale, softcap, window_left, window_right, alibi_shift,
                drop_threshold, drop_scale, seed,
                HEAD_DIM: tl.constexpr, HEAD_DIM_V: tl.constexpr,
                BLOCK_D: tl.constexpr, BLOCK_DV: tl.constexpr,
                BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                HAS_LEFT: tl.constexpr, HAS_RIGHT: tl.constexpr,
                HAS_SOFTCAP: tl.constexpr, HAS_ALIBI: tl.constexpr,
                HAS_DROPOUT: tl.constexpr, RETURN_P: tl.constexpr,
                UPCAST: tl.constexpr, DOT_PREC: tl.constexpr, USE_TMA: tl.constexpr,
                WARP_SPEC: tl.constexpr, VARLEN: tl.constexpr, HAS_SEQUSED: tl.constexpr,
                BH_AXIS0: tl.constexpr):
    # heavy causal rows (high m) first: program 0 takes the last query block
    pid_m, pid_bh, off_b, off_h = program_ids(nheads, BH_AXIS0, True)
    off_hk = off_h // group
    m_start = pid_m * BLOCK_M

    # varlen: off_b is a packed sequence; seqlen_q / seqlen_k (max_seqlen, the grid's size)
    # become its own lengths, and its rows start at q_start / k_start
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
    desc_rows = key_rows(seqlen_k, VARLEN)
    diag = seqlen_k - seqlen_q
    alibi_diag = diag + alibi_shift  # (ALiBi's only: the mask keeps diag)

    m_end, offs_m, offs_n0, offs_d, offs_dv = query_tile(m_start, seqlen_q, BLOCK_M, BLOCK_N,
                                                         BLOCK_D, BLOCK_DV)

    q_base = Q + q_off + off_h.to(tl.int64) * stride_qh
    k_base = K + k_off + off_hk.to(tl.int64) * stride_kh
    v_base = V + v_off + off_hk.to(tl.int64) * stride_vh
    # 2-D (s_k, d) views of this (batch, kv head): TMA streams the K/V tiles
    k_desc = None
    v_desc = None
    if USE_TMA:
        k_desc, v_desc = tma_pair(k_base, v_base, desc_rows, stride_kn, stride_vn,
                                  HEAD_DIM, HEAD_DIM_V, BLOCK_N, BLOCK_D, BLOCK_DV)
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
                               offs_d, offs_dv, stride_kn, stride_vn, seqlen_k, diag, alibi_diag,
                               window_left, window_right, qk_scale, softcap_inv, softcap_log2,
                               slope_log2, seed, pid_bh, drop_threshold,
                               HEAD_DIM, HEAD_DIM_V, BLOCK_D, BLOCK_DV, BLOCK_N, True,
                               HAS_LEFT, HAS_RIGHT, HAS_SOFTCAP, HAS_ALIBI, HAS_DROPOUT,
                               UPCAST, DOT_PREC, USE_TMA, False)
    # unmasked middle: the bulk of the work
    acc, l_i, m_i = _fwd_inner(acc, l_i, m_i, q, k_base, v_base, k_desc, v_desc, mid_lo, mid_hi, offs_m, offs_n0,
                               offs_d, offs_dv, stride_kn, stride_vn, seqlen_k, diag, alibi_diag,
                               window_left, window_right, qk_scale, softcap_inv, softcap_log2,
                               slope_log2, seed, pid_bh, drop_threshold,
                               HEAD_DIM, HEAD_DIM_V, BLOCK_D, BLOCK_DV, BLOCK_N, False,
                               HAS_LEFT, HAS_RIGHT, HAS_SOFTCAP, HAS_ALIBI, HAS_DROPOUT,
                               UPCAST, DOT_PREC, USE_TMA, WARP_SPEC)
    # masked back (causal diagonal, window's right edge, ragged end of K)
    acc, l_i, m_i = _fwd_inner(acc, l_i, m_i, q, k_base, v_base, k_desc, v_desc, mid_hi, hi, offs_m, offs_n0,
                               offs_d, offs_dv, stride_kn, stride_vn, seqlen_k, diag, alibi_diag,
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
    tl.store(lse_base + offs_m, lse2 * LN2, mask=offs_m < seqlen_q)
    # masked by the sequence's own s_q: never writes rows of the next packed sequence
    o_base = Out + o_off + off_h.to(tl.int64) * stride_oh
    o_ptrs = o_base + offs_m[:, None].to(tl.int64) * stride_om + offs_dv[None, :]
    tl.store(o_ptrs, acc.to(Out.dtype.element_ty),
             mask=(offs_m[:, None] < seqlen_q) & (offs_dv[None, :] < HEAD_DIM_V))

    if RETURN_P:
        _write_softmax(P, stride_pb, stride_ph, stride_pm, off_b, off_h, q, k_base, lo, hi,
                       offs_m, offs_n0, offs_d, stride_kn, seqlen_q, seqlen_k, diag, alibi_diag,
                       window_left, window_right, lse2, qk_scale, softcap_inv, softcap_log2,
                       slope_log2, seed, pid_bh, drop_threshold,
                       HEAD_DIM, BLOCK_D, BLOCK_N, HAS_LEFT, HAS_RIGHT, HAS_SOFTCAP,
                       HAS_ALIBI, HAS_DROPOUT, UPCAST, DOT_PREC)


_fwd_autotuned = config.autotune_fwd(_fwd_kernel)


def _launch_fwd(q, k, v, out, lse, p_mat, strides, n_seqs, seqlen_q, seqlen_k, lse_stride_h,
                seqlens, *, softmax_scale, window_left, window_right, softcap, alibi_slopes,
                dropout_p, philox_seed, return_softmax, alibi_shift=0) -> Optional[LaunchPlan]:
    """One launch of the forward kernel, dense or varlen; returns its launch plan (None when
    the autotuned path ran: no winner yet, dropout, the interpreter).

    strides: (b, row, head) strides of q, k, v, out (b unused in varlen mode).
    seqlens: None (dense) or (cu_seqlens_q, cu_seqlens_k, seqused_k | None) int32 tensors;
    then seqlen_q / seqlen_k are the max_seqlen that size the grid and bucket the autotuning.
    """
    nheads, head_dim = q.shape[-2], q.shape[-1]
    nheads_k, head_dim_v = k.shape[-2], v.shape[-1]
    varlen = seqlens is not None
    cu_q, cu_k, seqused_k = seqlens if varlen else (lse, lse, lse)
    has_seqused = varlen and seqused_k is not None
    if not has_seqused:
        seqused_k = cu_k
    p_arg = p_mat if p_mat is not None else out
    p_strides = p_mat.stride()[:3] if p_mat is not None else (0, 0, 0)
    alibi_arg = alibi_slopes if alibi_slopes is not None else lse
    alibi_strides = alibi_slopes.stride() if alibi_slopes is not None else (0, 0)
    has_dropout = dropout_p > 0.0
    drop_threshold = dropout_threshold(dropout_p)
    drop_scale = 1.0 / (1.0 - dropout_p) if has_dropout else 1.0

    bh_axis0 = config.bh_on_axis0(n_seqs * nheads, varlen)

    def grid(meta):
        if bh_axis0:
            return (n_seqs * nheads, config.cdiv(seqlen_q, meta["BLOCK_M"]))
        return (config.cdiv(seqlen_q, meta["BLOCK_M"]), n_seqs * nheads)

    config.install_allocator()
    bucket = config.seq_bucket(seqlen_q, seqlen_k)
    tuned_key = (bucket, q.dtype, k.dtype, v.dtype, alibi_arg.dtype)
    # (dropout's seed changes every call: a plan per call would only churn the cache)
    return launch_tuned_planned(
        None if has_dropout else _FWD_PLANS, _fwd_autotuned, grid, tuned_key,
        q, k, v, out, lse, alibi_arg, p_arg, cu_q, cu_k, seqused_k,
        *strides[0], *strides[1], *strides[2], *strides[3],
        alibi_strides[0], alibi_strides[1],
        p_strides[0], p_strides[1], p_strides[2],
        nheads, seqlen_q, seqlen_k, nheads // nheads_k, bucket,
        lse_stride_h, k.shape[0],  # varlen: total_q (lse is (h, total_q)), total_k
        float(softmax_scale), float(softcap), int(window_left), int(window_right),
        int(alibi_shift), drop_threshold, drop_scale, int(philox_seed) if has_dropout else 0,
        HEAD_DIM=head_dim, HEAD_DIM_V=head_dim_v,
        BLOCK_D=config.block_dim(head_dim), BLOCK_DV=config.block_dim(head_dim_v),
        HAS_LEFT=window_left >= 0, HAS_RIGHT=window_right >= 0,
        HAS_SOFTCAP=softcap > 0.0, HAS_ALIBI=alibi_slopes is not None,
        HAS_DROPOUT=has_dropout, RETURN_P=return_softmax,
        UPCAST=config.upcast_dots(q), DOT_PREC=config.dot_precision(q),
        USE_TMA=config.fwd_use_tma(k, v), VARLEN=varlen, HAS_SEQUSED=has_seqused,
        BH_AXIS0=bh_axis0,
    )


# launch plans of the forward's repeated call shapes (the ten tensor arguments are the slots)
_FWD_PLANS = LaunchPlans(slots=tuple(range(10)))


def flash_fwd(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, softmax_scale: float,
              causal: bool, window_left: int, window_right: int, softcap: float,
              alibi_slopes: Optional[torch.Tensor], dropout_p: float, philox_seed: int,
              return_softmax: bool, plan_out: Optional[list] = None,
              out_dtype: Optional[torch.dtype] = None, alibi_shift: int = 0):
    """Attention forward with the portable Triton kernel.

    q (b, s_q, h, d), k (b, s_k, h_k, d), v (b, s_k, h_k, d_v); fp16/bf16/fp32, last dim
    contiguous. Returns out (b, s_q, h, d_v) in q's dtype, lse float32 (b, h, s_q) and, when
    ``return_softmax``, S_dmask (b, h, s_q, s_k) in q's dtype (else None).
    Parameters are the normalised ones of docs/internals.md. ``plan_out``: None, or a list
    that receives the launch's plan when one was recorded or replayed (FwdCall keeps it).
    ``out_dtype``: out's dtype when not q's (float32: the accumulator unrounded, for a pass
    that still scales it, e.g. learnable sinks). ``alibi_shift``: AttnParams.alibi_shift.
    """
    batch, seqlen_q, nheads, head_dim = q.shape
    _, seqlen_k, nheads_k, head_dim_v = v.shape
    out = torch.empty((batch, seqlen_q, nheads, head_dim_v), dtype=out_dtype or q.dtype,
                      device=q.device)
    lse = torch.empty((batch, nheads, seqlen_q), dtype=torch.float32, device=q.device)
    p_mat = None
    if return_softmax:
        p_mat = torch.zeros((batch, nheads, seqlen_q, seqlen_k), dtype=q.dtype, device=q.device)
    if out.numel() == 0 or batch == 0 or seqlen_q == 0:
        if seqlen_q and batch:
            lse.fill_(float("-inf"))
        return out, lse, p_mat
    strides = tuple(t.stride()[:3] for t in (q, k, v, out))
    plan = _launch_fwd(q, k, v, out, lse, p_mat, strides, batch, seqlen_q, seqlen_k, seqlen_q,
                       None, softmax_scale=softmax_scale, window_left=window_left,
                       window_right=window_right, softcap=softcap, alibi_slopes=alibi_slopes,
                       dropout_p=dropout_p, philox_seed=philox_seed,
                       return_softmax=return_softmax, alibi_shift=alibi_shift)
    if plan_out is not None and plan is not None:
        plan_out.append(plan)  # (FwdCall keeps it)
    return out, lse, p_mat


class FwdCall:
    """:func:`flash_fwd` (no dropout, no S_dmask) for one *call signature*, its host work done
    once: once the first calls have recorded the launch plan (after the autotuner's pick), a
    call allocates out and lse and replays the plan with the tensors' addresses. Everything
    the launch depends on follows from the shapes, strides, dtypes, devices, 16-byte
    alignment, params and settings, which the caller keys (the api's fast path per call
    signature); the tiny dense call spent ~15-20 us of its host time on flash_fwd's
    argument tuples and the plan lookup.

    ``need_lse`` False (the caller drops the LSE): a replayed call writes it into the stream's
    reused buffer (``runtime.buffers``) instead of allocating one, and returns None for it."""

    def __init__(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *,
                 softmax_scale: float, causal: bool, window_left: int, window_right: int,
                 softcap: float, alibi_slopes: Optional[torch.Tensor],
                 need_lse: bool = True) -> None:
        batch, seqlen_q, nheads, _ = q.shape
        self.kwargs = dict(softmax_scale=softmax_scale, causal=causal, window_left=window_left,
                           window_right=window_right, softcap=softcap, alibi_slopes=alibi_slopes,
                           dropout_p=0.0, philox_seed=0, return_softmax=False)
        self.out_shape = (batch, seqlen_q, nheads, v.shape[-1])
        self.lse_shape = (batch, nheads, seqlen_q)
        self.dtype, self.device = q.dtype, q.device
        self.use_tma = config.fwd_use_tma(k, v)
        self.need_lse = need_lse
        self.plan: Optional[LaunchPlan] = None

    def __call__(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor):
        """(out, lse) of q, k, v of the signature this call was made for (lse None from a
        replayed call without ``need_lse``)."""
        plan = self.plan
        if plan is not None:
            if self.need_lse:
                lse = torch.empty(self.lse_shape, dtype=torch.float32, device=self.device)
            else:  # (held until the launch is enqueued: under capture it is a fresh block)
                lse = stream_buffer("fwd-lse", 4 * math.prod(self.lse_shape), self.device.index)
            out = torch.empty(self.out_shape, dtype=self.dtype, device=self.device)
            o, m = out.data_ptr(), lse.data_ptr()
            alibi = self.kwargs["alibi_slopes"]
            a = m if alibi is None else alibi.data_ptr()
            if self.use_tma:
                config.install_allocator()
            # slots: q, k, v, out, lse, alibi | lse, S_dmask | out, and the three length
            # vectors of the varlen mode (lse stands in for them: _launch_fwd's dense call)
            if plan.replay((q.data_ptr(), k.data_ptr(), v.data_ptr(), o, m, a, o, m, m, m)):
                return out, (lse if self.need_lse else None)
        record: list = []
        out, lse, _ = flash_fwd(q, k, v, **self.kwargs, plan_out=record)
        self.plan = record[0] if record else None
        return out, lse


def flash_varlen_fwd(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                     cu_seqlens_q: torch.Tensor, cu_seqlens_k: torch.Tensor,
                     seqused_k: Optional[torch.Tensor], max_seqlen_q: int, max_seqlen_k: int, *,
                     softmax_scale: float, causal: bool, window_left: int, window_right: int,
                     softcap: float, alibi_slopes: Optional[torch.Tensor], dropout_p: float,
                     philox_seed: int, return_softmax: bool,
                     out_dtype: Optional[torch.dtype] = None):
    """Forward over packed variable-length sequences (the kernel's VARLEN mode).

    q (total_q, h, d), k (total_k, h_k, d), v (total_k, h_k, d_v); cu_seqlens_q /
    cu_seqlens_k int32 (b + 1,) on q's device; seqused_k int32 (b,) or None. Sequence b has
    query rows [cu_seqlens_q[b], cu_seqlens_q[b+1]) and keys starting at cu_seqlens_k[b]
    (seqused_k[b] of them if given, else up to cu_seqlens_k[b+1]). Every mask, ALiBi distance
    and dropout counter is local to the sequence (batch index = sequence index).
    No tensor value is read on the host: the grid comes from max_seqlen_q, programs past
    their sequence's end exit (CUDA-graph friendly).

    Returns out (total_q, h, d_v) in q's dtype (``out_dtype`` when given, as in
    :func:`flash_fwd`; 0 on rows outside every sequence), lse float32 (h, total_q) (-inf
    there) and, when ``return_softmax``, S_dmask (b, h, max_seqlen_q, max_seqlen_k) in q's
    dtype, sequence-local and zero-padded.
    """
    total_q, nheads, _ = q.shape
    head_dim_v = v.shape[-1]
    batch = cu_seqlens_q.shape[0] - 1
    # the kernels index the length vectors with unit stride
    cu_seqlens_q, cu_seqlens_k = cu_seqlens_q.contiguous(), cu_seqlens_k.contiguous()
    seqused_k = seqused_k.contiguous() if seqused_k is not None else None
    out = torch.zeros((total_q, nheads, head_dim_v), dtype=out_dtype or q.dtype,
                      device=q.device)
    lse = torch.full((nheads, total_q), float("-inf"), dtype=torch.float32, device=q.device)
    p_mat = None
    if return_softmax:
        p_mat = torch.zeros((batch, nheads, max_seqlen_q, max_seqlen_k), dtype=q.dtype,
                            device=q.device)
    if batch == 0 or total_q == 0 or max_seqlen_q == 0 or k.shape[0] == 0 or max_seqlen_k == 0:
        return out, lse, p_mat  # no query row sees a key
    strides = tuple(t.stride()[:2] for t in (q, k, v, out))
    strides = tuple((0, *st) for st in strides)
    _launch_fwd(q, k, v, out, lse, p_mat, strides, batch, max_seqlen_q, max_seqlen_k, total_q,
                (cu_seqlens_q, cu_seqlens_k, seqused_k),
                softmax_scale=softmax_scale, window_left=window_left, window_right=window_right,
                softcap=softcap, alibi_slopes=alibi_slopes, dropout_p=dropout_p,
                philox_seed=philox_seed, return_softmax=return_softmax)
    return out, lse, p_mat
