"""Portable Triton backward kernels: FlashAttention-2 recomputation.

Three launches:
1. ``_bwd_preprocess``: delta = rowsum(dO * O) per query row (fp32).
2. ``_bwd_dkdv_kernel``: one program per (key block, batch, KV head). dK and dV stay on chip
   while query blocks of every query head in the GQA group stream through; P is recomputed
   from the saved LSE. With ``ATOMIC_DQ`` it also adds dS @ K into an fp32 dQ buffer with
   atomics (fast, not bitwise repeatable).
3. ``_bwd_dq_kernel`` (deterministic path): one program per (query block, batch, head)
   recomputes P and dP and accumulates dQ in registers; no atomics, bitwise repeatable.
Tiles in the dK/dV kernel are transposed (rows = keys) so dV += P^T dO needs no transpose of P.
Packed variable-length sequences: the constexpr ``VARLEN`` in both kernels, as in the forward
(``flash_varlen_bwd``).
"""
from __future__ import annotations

import functools
from typing import Optional

import torch
import triton
import triton.language as tl

from flashattn.backends.triton import config
from flashattn.runtime.launch import launch_jit, launch_tuned
from flashattn.backends.triton.mask import (LOG2E, dropout_keep, key_range, query_range, score_mod,
                                     score_scales, visible_mask)
from flashattn.backends.triton.prologue import (key_rows, program_ids, qkv_offsets, query_tile,
                                         row_offset, seq_info, stats_base, tma_pair)
from flashattn.philox import dropout_threshold


@triton.jit
def _bwd_preprocess(Out, DO, Delta, stride_ob, stride_om, stride_oh,
                    stride_dob, stride_dom, stride_doh, nheads, seqlen_q,
                    HEAD_DIM_V: tl.constexpr, BLOCK_DV: tl.constexpr, BLOCK_M: tl.constexpr):
    # (batch, head) on axis 0: b * h can pass the 65535 limit of grid axis 1
    pid_bh = tl.program_id(0)
    pid_m = tl.program_id(1)
    off_b = pid_bh // nheads
    off_h = pid_bh % nheads
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_dv = tl.arange(0, BLOCK_DV)
    mask = (offs_m[:, None] < seqlen_q) & (offs_dv[None, :] < HEAD_DIM_V)
    o = tl.load(Out + off_b.to(tl.int64) * stride_ob + off_h.to(tl.int64) * stride_oh
                + offs_m[:, None].to(tl.int64) * stride_om + offs_dv[None, :], mask=mask, other=0.0)
    do = tl.load(DO + off_b.to(tl.int64) * stride_dob + off_h.to(tl.int64) * stride_doh
                 + offs_m[:, None].to(tl.int64) * stride_dom + offs_dv[None, :], mask=mask, other=0.0)
    delta = tl.sum(o.to(tl.float32) * do.to(tl.float32), 1)
    tl.store(Delta + pid_bh.to(tl.int64) * seqlen_q + offs_m, delta, mask=offs_m < seqlen_q)


@triton.jit
def _load_lse2(lse_base, offs_m, seqlen_q):
    """LSE in log2 units; rows with no visible key (or past s_q) become +inf so P = 0.
    lse_base points at row 0 of this (batch, head) or (sequence, head)."""
    lse = tl.load(lse_base + offs_m, mask=offs_m < seqlen_q, other=float("inf"))
    return tl.where(lse == float("-inf"), float("inf"), lse * LOG2E)


@triton.jit
def _dkdv_inner(dk, dv, k, v, q_base, do_base, dq_base, q_desc, do_desc, lse_base, delta_base, bh,
                start, end,
                offs_n, offs_m0, offs_d, offs_dv, stride_qm, stride_dom, stride_dqm,
                seqlen_q, seqlen_k, diag, alibi_diag, window_left, window_right,
                sm_scale, qk_scale, softcap_inv, softcap_log2, slope_log2,
                seed, drop_threshold, drop_scale,
                HEAD_DIM: tl.constexpr, HEAD_DIM_V: tl.constexpr,
                BLOCK_D: tl.constexpr, BLOCK_DV: tl.constexpr, BLOCK_M: tl.constexpr,
                MASKED: tl.constexpr, HAS_LEFT: tl.constexpr, HAS_RIGHT: tl.constexpr,
                HAS_SOFTCAP: tl.constexpr, HAS_ALIBI: tl.constexpr, HAS_DROPOUT: tl.constexpr,
                ATOMIC_DQ: tl.constexpr, UPCAST: tl.constexpr, DOT_PREC: tl.constexpr,
                USE_TMA: tl.constexpr):
    """Stream query blocks [start, end) of one head past the resident K/V block.
    ``alibi_diag``: ALiBi's diagonal (the mask keeps ``diag``)."""
    for start_m in range(start, end, BLOCK_M):
        offs_m = start_m + offs_m0
        qT_ptrs = q_base + offs_m[None, :].to(tl.int64) * stride_qm + offs_d[:, None]
        do_ptrs = do_base + offs_m[:, None].to(tl.int64) * stride_dom + offs_dv[None, :]
        if USE_TMA:
            qT = tl.trans(q_desc.load([start_m, 0]))
            do = do_desc.load([start_m, 0])
        elif MASKED:
            qT = tl.load(qT_ptrs, mask=(offs_m[None, :] < seqlen_q) & (offs_d[:, None] < HEAD_DIM),
                         other=0.0)
            do = tl.load(do_ptrs, mask=(offs_m[:, None] < seqlen_q) & (offs_dv[None, :] < HEAD_DIM_V),
                         other=0.0)
        else:
            qT = tl.load(qT_ptrs, mask=offs_d[:, None] < HEAD_DIM, other=0.0)
            do = tl.load(do_ptrs, mask=offs_dv[None, :] < HEAD_DIM_V, other=0.0)
        if UPCAST:
            qT = qT.to(tl.float32)
            do = do.to(tl.float32)
        lse2 = _load_lse2(lse_base, offs_m, seqlen_q)
        delta = tl.load(delta_base + offs_m, mask=offs_m < seqlen_q, other=0.0)

        qkT = tl.dot(k, qT, input_precision=DOT_PREC)  # (BLOCK_N, BLOCK_M)
        sT, tT = score_mod(qkT, offs_m[None, :], offs_n[:, None], alibi_diag, qk_scale,
                           softcap_inv, softcap_log2, slope_log2, HAS_SOFTCAP, HAS_ALIBI)
        pT = tl.exp2(sT - lse2[None, :])
        if MASKED:
            vis = visible_mask(offs_m[None, :], offs_n[:, None], seqlen_k, diag,
                               window_left, window_right, HAS_LEFT, HAS_RIGHT)
            pT = tl.where(vis, pT, 0.0)
        dpT = tl.dot(v, tl.trans(do), input_precision=DOT_PREC)  # (BLOCK_N, BLOCK_M)
        if HAS_DROPOUT:
            keep = dropout_keep(seed, offs_m[None, :], offs_n[:, None], bh, drop_threshold)
            pT_drop = tl.where(keep, pT * drop_scale, 0.0)
            dpT = tl.where(keep, dpT * drop_scale, 0.0)
        else:
            pT_drop = pT
        dv = tl.dot(pT_drop.to(do.dtype), do, dv, input_precision=DOT_PREC)
        dsT = pT * (dpT - delta[None, :])
        if HAS_SOFTCAP:
            dsT = dsT * (1.0 - tT * tT)
        dsT_lp = dsT.to(qT.dtype)
        dk = tl.dot(dsT_lp, tl.trans(qT), dk, input_precision=DOT_PREC)
        if ATOMIC_DQ:
            dq = tl.dot(tl.trans(dsT_lp), k, input_precision=DOT_PREC) * sm_scale
            dq_ptrs = dq_base + offs_m[:, None].to(tl.int64) * stride_dqm + offs_d[None, :]
            tl.atomic_add(dq_ptrs, dq, mask=(offs_m[:, None] < seqlen_q) & (offs_d[None, :] < HEAD_DIM),
                          sem="relaxed")
    return dk, dv


@triton.jit
def _bwd_dkdv_kernel(Q, K, V, DO, Lse, Delta, DK, DV, DQ, Alibi, CuSeqQ, CuSeqK, SeqUsedK,
                     stride_qb, stride_qm, stride_qh,
                     stride_kb, stride_kn, stride_kh,
                     stride_vb, stride_vn, stride_vh,
                     stride_dob, stride_dom, stride_doh,
                     stride_dkb, stride_dkn, stride_dkh,
                     stride_dvb, stride_dvn, stride_dvh,
                     stride_dqb, stride_dqm, stride_dqh,
                     stride_ab, stride_ah,
                     nheads, nheads_k, seqlen_q, seqlen_k, group, seq_bucket, lse_stride_h, total_k,
                     sm_scale, softcap, window_left, window_right, alibi_shift,
                     drop_threshold, drop_scale, seed,
                     HEAD_DIM: tl.constexpr, HEAD_DIM_V: tl.constexpr,
                     BLOCK_D: tl.constexpr, BLOCK_DV: tl.constexpr,
                     BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                     HAS_LEFT: tl.constexpr, HAS_RIGHT: tl.constexpr,
                     HAS_SOFTCAP: tl.constexpr, HAS_ALIBI: tl.constexpr,
                     HAS_DROPOUT: tl.constexpr, ATOMIC_DQ: tl.constexpr,
                     UPCAST: tl.constexpr, DOT_PREC: tl.constexpr, USE_TMA: tl.constexpr,
                     VARLEN: tl.constexpr, HAS_SEQUSED: tl.constexpr, BH_AXIS0: tl.constexpr):
    # (sequence, kv head) x key block; off_hk is the KV head
    pid_n, pid_bhk, off_b, off_hk = program_ids(nheads_k, BH_AXIS0, False)
    n_start = pid_n * BLOCK_N
    # varlen: off_b is a packed sequence (see the forward kernel). dK/dV of keys past its s_k
    # (seqused_k) and of sequences without queries keep the caller's zero fill.
    q_start, k_start, seqlen_q, seqlen_k = seq_info(CuSeqQ, CuSeqK, SeqUsedK, off_b, seqlen_q,
                                                    seqlen_k, lse_stride_h, total_k, VARLEN,
                                                    HAS_SEQUSED)
    if VARLEN:
        if (n_start >= seqlen_k) | (seqlen_q == 0):
            return
    q_off, k_off, v_off = qkv_offsets(off_b, q_start, k_start, stride_qb, stride_qm, stride_kb,
                                      stride_kn, stride_vb, stride_vn, VARLEN)
    do_off = row_offset(off_b, q_start, stride_dob, stride_dom, VARLEN)
    dq_off = row_offset(off_b, q_start, stride_dqb, stride_dqm, VARLEN)
    dk_off = row_offset(off_b, k_start, stride_dkb, stride_dkn, VARLEN)
    dv_off = row_offset(off_b, k_start, stride_dvb, stride_dvn, VARLEN)
    diag = seqlen_k - seqlen_q
    alibi_diag = diag + alibi_shift  # (ALiBi's only: the mask keeps diag)
    n_end = tl.minimum(n_start + BLOCK_N, seqlen_k)
    offs_n = n_start + tl.arange(0, BLOCK_N)
    offs_m0 = tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, BLOCK_D)
    offs_dv = tl.arange(0, BLOCK_DV)

    k_base = K + k_off + off_hk.to(tl.int64) * stride_kh
    v_base = V + v_off + off_hk.to(tl.int64) * stride_vh
    k = tl.load(k_base + offs_n[:, None].to(tl.int64) * stride_kn + offs_d[None, :],
                mask=(offs_n[:, None] < seqlen_k) & (offs_d[None, :] < HEAD_DIM), other=0.0)
    v = tl.load(v_base + offs_n[:, None].to(tl.int64) * stride_vn + offs_dv[None, :],
                mask=(offs_n[:, None] < seqlen_k) & (offs_dv[None, :] < HEAD_DIM_V), other=0.0)
    if UPCAST:
        k = k.to(tl.float32)
        v = v.to(tl.float32)
    dk = tl.zeros([BLOCK_N, BLOCK_D], dtype=tl.float32)
    dv = tl.zeros([BLOCK_N, BLOCK_DV], dtype=tl.float32)

    qk_scale, softcap_inv, softcap_log2 = score_scales(sm_scale, softcap, HAS_SOFTCAP)

    lo, mid_lo, mid_hi, hi = query_range(n_start, n_end, seqlen_q, diag, window_left, window_right,
                                         BLOCK_M, HAS_LEFT, HAS_RIGHT)
    if n_start + BLOCK_N > seqlen_k:
        # ragged last key block: every query block needs the key-bounds mask
        mid_lo = hi
        mid_hi = hi

    # dK/dV of a KV head sum over the query heads of its GQA group
    for g in range(0, group):
        off_h = off_hk * group + g
        bh = off_b * nheads + off_h
        q_base = Q + q_off + off_h.to(tl.int64) * stride_qh
        do_base = DO + do_off + off_h.to(tl.int64) * stride_doh
        dq_base = DQ + dq_off + off_h.to(tl.int64) * stride_dqh
        lse_base = stats_base(Lse, bh, off_h, q_start, lse_stride_h, seqlen_q, VARLEN)
        delta_base = stats_base(Delta, bh, off_h, q_start, lse_stride_h, seqlen_q, VARLEN)
        q_desc = None
        do_desc = None
        if USE_TMA:
            q_desc, do_desc = tma_pair(q_base, do_base, seqlen_q, stride_qm, stride_dom,
                                       HEAD_DIM, HEAD_DIM_V, BLOCK_M, BLOCK_D, BLOCK_DV)
        slope_log2 = 0.0
        if HAS_ALIBI:
            slope_log2 = tl.load(Alibi + off_b * stride_ab + off_h * stride_ah) * LOG2E
        dk, dv = _dkdv_inner(dk, dv, k, v, q_base, do_base, dq_base, q_desc, do_desc, lse_base,
                             delta_base, bh, lo, mid_lo,
                             offs_n, offs_m0, offs_d, offs_dv, stride_qm, stride_dom, stride_dqm,
                             seqlen_q, seqlen_k, diag, alibi_diag, window_left, window_right,
                             sm_scale, qk_scale, softcap_inv, softcap_log2, slope_log2,
                             seed, drop_threshold, drop_scale,
                             HEAD_DIM, HEAD_DIM_V, BLOCK_D, BLOCK_DV, BLOCK_M, True,
                             HAS_LEFT, HAS_RIGHT, HAS_SOFTCAP, HAS_ALIBI, HAS_DROPOUT,
                             ATOMIC_DQ, UPCAST, DOT_PREC, USE_TMA)
        dk, dv = _dkdv_inner(dk, dv, k, v, q_base, do_base, dq_base, q_desc, do_desc, lse_base,
                             delta_base, bh, mid_lo, mid_hi,
                             offs_n, offs_m0, offs_d, offs_dv, stride_qm, stride_dom, stride_dqm,
                             seqlen_q, seqlen_k, diag, alibi_diag, window_left, window_right,
                             sm_scale, qk_scale, softcap_inv, softcap_log2, slope_log2,
                             seed, drop_threshold, drop_scale,
                             HEAD_DIM, HEAD_DIM_V, BLOCK_D, BLOCK_DV, BLOCK_M, False,
                             HAS_LEFT, HAS_RIGHT, HAS_SOFTCAP, HAS_ALIBI, HAS_DROPOUT,
                             ATOMIC_DQ, UPCAST, DOT_PREC, USE_TMA)
        dk, dv = _dkdv_inner(dk, dv, k, v, q_base, do_base, dq_base, q_desc, do_desc, lse_base,
                             delta_base, bh, mid_hi, hi,
                             offs_n, offs_m0, offs_d, offs_dv, stride_qm, stride_dom, stride_dqm,
                             seqlen_q, seqlen_k, diag, alibi_diag, window_left, window_right,
                             sm_scale, qk_scale, softcap_inv, softcap_log2, slope_log2,
                             seed, drop_threshold, drop_scale,
                             HEAD_DIM, HEAD_DIM_V, BLOCK_D, BLOCK_DV, BLOCK_M, True,
                             HAS_LEFT, HAS_RIGHT, HAS_SOFTCAP, HAS_ALIBI, HAS_DROPOUT,
                             ATOMIC_DQ, UPCAST, DOT_PREC, USE_TMA)

    dk = dk * sm_scale
    dk_ptrs = (DK + dk_off + off_hk.to(tl.int64) * stride_dkh
               + offs_n[:, None].to(tl.int64) * stride_dkn + offs_d[None, :])
    dv_ptrs = (DV + dv_off + off_hk.to(tl.int64) * stride_dvh
               + offs_n[:, None].to(tl.int64) * stride_dvn + offs_dv[None, :])
    tl.store(dk_ptrs, dk.to(DK.dtype.element_ty),
             mask=(offs_n[:, None] < seqlen_k) & (offs_d[None, :] < HEAD_DIM))
    tl.store(dv_ptrs, dv.to(DV.dtype.element_ty),
             mask=(offs_n[:, None] < seqlen_k) & (offs_dv[None, :] < HEAD_DIM_V))


@triton.jit
def _dq_inner(dq, q, do, lse2, delta, k_base, v_base, k_desc, v_desc, start, end, offs_m, offs_n0, offs_d, offs_dv,
              stride_kn, stride_vn, seqlen_k, diag, alibi_diag, window_left, window_right,
              qk_scale, softcap_inv, softcap_log2, slope_log2, seed, bh, drop_threshold, drop_scale,
              HEAD_DIM: tl.constexpr, HEAD_DIM_V: tl.constexpr, BLOCK_N: tl.constexpr,
              MASKED: tl.constexpr, HAS_LEFT: tl.constexpr, HAS_RIGHT: tl.constexpr,
              HAS_SOFTCAP: tl.constexpr, HAS_ALIBI: tl.constexpr, HAS_DROPOUT: tl.constexpr,
              UPCAST: tl.constexpr, DOT_PREC: tl.constexpr, USE_TMA: tl.constexpr):
    """Stream key blocks [start, end) past the resident Q/dO block, accumulating dQ."""
    for start_n in range(start, end, BLOCK_N):
        offs_n = start_n + offs_n0
        kT_ptrs = k_base + offs_n[None, :].to(tl.int64) * stride_kn + offs_d[:, None]
        vT_ptrs = v_base + offs_n[None, :].to(tl.int64) * stride_vn + offs_dv[:, None]
        if USE_TMA:
            kT = tl.trans(k_desc.load([start_n, 0]))
            vT = tl.trans(v_desc.load([start_n, 0]))
        elif MASKED:
            kT = tl.load(kT_ptrs, mask=(offs_n[None, :] < seqlen_k) & (offs_d[:, None] < HEAD_DIM),
                         other=0.0)
            vT = tl.load(vT_ptrs, mask=(offs_n[None, :] < seqlen_k) & (offs_dv[:, None] < HEAD_DIM_V),
                         other=0.0)
        else:
            kT = tl.load(kT_ptrs, mask=offs_d[:, None] < HEAD_DIM, other=0.0)
            vT = tl.load(vT_ptrs, mask=offs_dv[:, None] < HEAD_DIM_V, other=0.0)
        if UPCAST:
            kT = kT.to(tl.float32)
            vT = vT.to(tl.float32)
        qk = tl.dot(q, kT, input_precision=DOT_PREC)
        s, t = score_mod(qk, offs_m[:, None], offs_n[None, :], alibi_diag, qk_scale,
                         softcap_inv, softcap_log2, slope_log2, HAS_SOFTCAP, HAS_ALIBI)
        p = tl.exp2(s - lse2[:, None])
        if MASKED:
            vis = visible_mask(offs_m[:, None], offs_n[None, :], seqlen_k, diag,
                               window_left, window_right, HAS_LEFT, HAS_RIGHT)
            p = tl.where(vis, p, 0.0)
        dp = tl.dot(do, vT, input_precision=DOT_PREC)
        if HAS_DROPOUT:
            keep = dropout_keep(seed, offs_m[:, None], offs_n[None, :], bh, drop_threshold)
            dp = tl.where(keep, dp * drop_scale, 0.0)
        ds = p * (dp - delta[:, None])
        if HAS_SOFTCAP:
            ds = ds * (1.0 - t * t)
        dq = tl.dot(ds.to(kT.dtype), tl.trans(kT), dq, input_precision=DOT_PREC)
    return dq


@triton.jit
def _bwd_dq_kernel(Q, K, V, DO, Lse, Delta, DQ, Alibi, CuSeqQ, CuSeqK, SeqUsedK,
                   stride_qb, stride_qm, stride_qh,
                   stride_kb, stride_kn, stride_kh,
                   stride_vb, stride_vn, stride_vh,
                   stride_dob, stride_dom, stride_doh,
                   stride_dqb, stride_dqm, stride_dqh,
                   stride_ab, stride_ah,
                   nheads, seqlen_q, seqlen_k, group, seq_bucket, lse_stride_h, total_k,
                   sm_scale, softcap, window_left, window_right, alibi_shift,
                   drop_threshold, drop_scale, seed,
                   HEAD_DIM: tl.constexpr, HEAD_DIM_V: tl.constexpr,
                   BLOCK_D: tl.constexpr, BLOCK_DV: tl.constexpr,
                   BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                   HAS_LEFT: tl.constexpr, HAS_RIGHT: tl.constexpr,
                   HAS_SOFTCAP: tl.constexpr, HAS_ALIBI: tl.constexpr,
                   HAS_DROPOUT: tl.constexpr, UPCAST: tl.constexpr, DOT_PREC: tl.constexpr,
                   USE_TMA: tl.constexpr, VARLEN: tl.constexpr, HAS_SEQUSED: tl.constexpr,
                   BH_AXIS0: tl.constexpr):
    # heavy causal rows first, as in the forward kernel
    pid_m, pid_bh, off_b, off_h = program_ids(nheads, BH_AXIS0, True)
    off_hk = off_h // group
    m_start = pid_m * BLOCK_M
    # varlen: off_b is a packed sequence (see the forward kernel); dQ rows outside every
    # sequence keep the caller's zero fill.
    q_start, k_start, seqlen_q, seqlen_k = seq_info(CuSeqQ, CuSeqK, SeqUsedK, off_b, seqlen_q,
                                                    seqlen_k, lse_stride_h, total_k, VARLEN,
                                                    HAS_SEQUSED)
    if VARLEN:
        if m_start >= seqlen_q:
            return
    q_off, k_off, v_off = qkv_offsets(off_b, q_start, k_start, stride_qb, stride_qm, stride_kb,
                                      stride_kn, stride_vb, stride_vn, VARLEN)
    do_off = row_offset(off_b, q_start, stride_dob, stride_dom, VARLEN)
    dq_off = row_offset(off_b, q_start, stride_dqb, stride_dqm, VARLEN)
    lse_base = stats_base(Lse, pid_bh, off_h, q_start, lse_stride_h, seqlen_q, VARLEN)
    delta_base = stats_base(Delta, pid_bh, off_h, q_start, lse_stride_h, seqlen_q, VARLEN)
    desc_rows = key_rows(seqlen_k, VARLEN)
    diag = seqlen_k - seqlen_q
    alibi_diag = diag + alibi_shift  # (ALiBi's only: the mask keeps diag)
    m_end, offs_m, offs_n0, offs_d, offs_dv = query_tile(m_start, seqlen_q, BLOCK_M, BLOCK_N,
                                                         BLOCK_D, BLOCK_DV)

    q = tl.load(Q + q_off + off_h.to(tl.int64) * stride_qh
                + offs_m[:, None].to(tl.int64) * stride_qm + offs_d[None, :],
                mask=(offs_m[:, None] < seqlen_q) & (offs_d[None, :] < HEAD_DIM), other=0.0)
    do = tl.load(DO + do_off + off_h.to(tl.int64) * stride_doh
                 + offs_m[:, None].to(tl.int64) * stride_dom + offs_dv[None, :],
                 mask=(offs_m[:, None] < seqlen_q) & (offs_dv[None, :] < HEAD_DIM_V), other=0.0)
    if UPCAST:
        q = q.to(tl.float32)
        do = do.to(tl.float32)
    lse2 = _load_lse2(lse_base, offs_m, seqlen_q)
    delta = tl.load(delta_base + offs_m, mask=offs_m < seqlen_q, other=0.0)
    k_base = K + k_off + off_hk.to(tl.int64) * stride_kh
    v_base = V + v_off + off_hk.to(tl.int64) * stride_vh
    k_desc = None
    v_desc = None
    if USE_TMA:
        k_desc, v_desc = tma_pair(k_base, v_base, desc_rows, stride_kn, stride_vn,
                                  HEAD_DIM, HEAD_DIM_V, BLOCK_N, BLOCK_D, BLOCK_DV)

    qk_scale, softcap_inv, softcap_log2 = score_scales(sm_scale, softcap, HAS_SOFTCAP)
    slope_log2 = 0.0
    if HAS_ALIBI:
        slope_log2 = tl.load(Alibi + off_b * stride_ab + off_h * stride_ah) * LOG2E

    dq = tl.zeros([BLOCK_M, BLOCK_D], dtype=tl.float32)
    lo, mid_lo, mid_hi, hi = key_range(m_start, m_end, seqlen_k, diag, window_left, window_right,
                                       BLOCK_N, HAS_LEFT, HAS_RIGHT)
    dq = _dq_inner(dq, q, do, lse2, delta, k_base, v_base, k_desc, v_desc, lo, mid_lo, offs_m, offs_n0, offs_d,
                   offs_dv, stride_kn, stride_vn, seqlen_k, diag, alibi_diag, window_left,
                   window_right,
                   qk_scale, softcap_inv, softcap_log2, slope_log2, seed, pid_bh, drop_threshold,
                   drop_scale, HEAD_DIM, HEAD_DIM_V, BLOCK_N, True, HAS_LEFT, HAS_RIGHT,
                   HAS_SOFTCAP, HAS_ALIBI, HAS_DROPOUT, UPCAST, DOT_PREC, USE_TMA)
    dq = _dq_inner(dq, q, do, lse2, delta, k_base, v_base, k_desc, v_desc, mid_lo, mid_hi, offs_m, offs_n0, offs_d,
                   offs_dv, stride_kn, stride_vn, seqlen_k, diag, alibi_diag, window_left,
                   window_right,
                   qk_scale, softcap_inv, softcap_log2, slope_log2, seed, pid_bh, drop_threshold,
                   drop_scale, HEAD_DIM, HEAD_DIM_V, BLOCK_N, False, HAS_LEFT, HAS_RIGHT,
                   HAS_SOFTCAP, HAS_ALIBI, HAS_DROPOUT, UPCAST, DOT_PREC, USE_TMA)
    dq = _dq_inner(dq, q, do, lse2, delta, k_base, v_base, k_desc, v_desc, mid_hi, hi, offs_m, offs_n0, offs_d,
                   offs_dv, stride_kn, stride_vn, seqlen_k, diag, alibi_diag, window_left,
                   window_right,
                   qk_scale, softcap_inv, softcap_log2, slope_log2, seed, pid_bh, drop_threshold,
                   drop_scale, HEAD_DIM, HEAD_DIM_V, BLOCK_N, True, HAS_LEFT, HAS_RIGHT,
                   HAS_SOFTCAP, HAS_ALIBI, HAS_DROPOUT, UPCAST, DOT_PREC, USE_TMA)
    dq = dq * sm_scale
    tl.store(DQ + dq_off + off_h.to(tl.int64) * stride_dqh
             + offs_m[:, None].to(tl.int64) * stride_dqm + offs_d[None, :],
             dq.to(DQ.dtype.element_ty),
             mask=(offs_m[:, None] < seqlen_q) & (offs_d[None, :] < HEAD_DIM))


_dkdv_autotuned = config.autotune_bwd_kv(_bwd_dkdv_kernel, reset_to_zero=["DQ"])
_dq_autotuned = config.autotune_bwd_q(_bwd_dq_kernel)


def _preprocess(out, dout, delta, batch, seqlen_q, nheads, head_dim_v):
    """delta (batch, nheads, seqlen_q) = rowsum(dO * O); out/dout (batch, seqlen_q, h, d_v)."""
    pre_block = 64 if not config.INTERPRET else 16
    launch_jit(_bwd_preprocess, (batch * nheads, config.cdiv(seqlen_q, pre_block)), (
        out, dout, delta, out.stride(0), out.stride(1), out.stride(2),
        dout.stride(0), dout.stride(1), dout.stride(2), nheads, seqlen_q), dict(
        HEAD_DIM_V=head_dim_v, BLOCK_DV=config.block_dim(head_dim_v), BLOCK_M=pre_block))


def _row_strides(t: torch.Tensor, varlen: bool):
    """(b, row, head) strides of a (b, s, h, d) tensor, or (0, row, head) of a (total, h, d) one."""
    return (0, t.stride(0), t.stride(1)) if varlen else tuple(t.stride()[:3])


def _bwd_passes(dout, q, k, v, lse, delta, dq, dk, dv, n_seqs, seqlen_q, seqlen_k, lse_stride_h,
                seqlens, *, softmax_scale, window_left, window_right, softcap, alibi_slopes,
                dropout_p, philox_seed, deterministic, alibi_shift=0):
    """The dK/dV pass and the dQ pass (or atomic dQ inside the dK/dV pass), dense or varlen.

    dq, dk, dv are preallocated outputs; returns dq (a new tensor on the atomic path).
    seqlens: None (dense) or (cu_seqlens_q, cu_seqlens_k, seqused_k | None); then
    seqlen_q / seqlen_k are the max_seqlen that size the grids and bucket the autotuning.
    """
    nheads, head_dim = q.shape[-2], q.shape[-1]
    nheads_k, head_dim_v = k.shape[-2], v.shape[-1]
    varlen = seqlens is not None
    cu_q, cu_k, seqused_k = seqlens if varlen else (delta, delta, delta)
    has_seqused = varlen and seqused_k is not None
    if not has_seqused:
        seqused_k = cu_k
    has_dropout = dropout_p > 0.0
    scalars = (float(softmax_scale), float(softcap), int(window_left), int(window_right),
               int(alibi_shift), dropout_threshold(dropout_p), 1.0 / (1.0 - dropout_p) if has_dropout else 1.0,
               int(philox_seed) if has_dropout else 0)
    alibi_arg = alibi_slopes if alibi_slopes is not None else delta
    alibi_strides = alibi_slopes.stride() if alibi_slopes is not None else (0, 0)
    flags = dict(HEAD_DIM=head_dim, HEAD_DIM_V=head_dim_v, BLOCK_D=config.block_dim(head_dim),
                 BLOCK_DV=config.block_dim(head_dim_v), HAS_LEFT=window_left >= 0,
                 HAS_RIGHT=window_right >= 0,
                 HAS_SOFTCAP=softcap > 0.0, HAS_ALIBI=alibi_slopes is not None,
                 HAS_DROPOUT=has_dropout, UPCAST=config.upcast_dots(q),
                 DOT_PREC=config.dot_precision(q), USE_TMA=config.use_tma(q, k, v, dout),
                 VARLEN=varlen, HAS_SEQUSED=has_seqused)
    config.install_allocator()
    bucket = config.seq_bucket(seqlen_q, seqlen_k)
    group = nheads // nheads_k

    atomic_dq = not deterministic and config.atomic_dq_enabled()
    if atomic_dq:
        dq_acc = torch.zeros(q.shape, dtype=torch.float32, device=q.device)
    else:
        dq_acc = dq
    rs = functools.partial(_row_strides, varlen=varlen)

    kv_bh_axis0 = config.bh_on_axis0(n_seqs * nheads_k, varlen)
    q_bh_axis0 = config.bh_on_axis0(n_seqs * nheads, varlen)

    def grid_kv(meta):
        if kv_bh_axis0:
            return (n_seqs * nheads_k, config.cdiv(seqlen_k, meta["BLOCK_N"]))
        return (config.cdiv(seqlen_k, meta["BLOCK_N"]), n_seqs * nheads_k)

    dtypes = (q.dtype, k.dtype, v.dtype, dout.dtype, dq_acc.dtype, alibi_arg.dtype)
    launch_tuned(
        _dkdv_autotuned, grid_kv, (bucket, *dtypes),
        q, k, v, dout, lse, delta, dk, dv, dq_acc, alibi_arg, cu_q, cu_k, seqused_k,
        *rs(q), *rs(k), *rs(v), *rs(dout), *rs(dk), *rs(dv), *rs(dq_acc),
        alibi_strides[0], alibi_strides[1],
        nheads, nheads_k, seqlen_q, seqlen_k, group, bucket, lse_stride_h, k.shape[0], *scalars,
        ATOMIC_DQ=atomic_dq, BH_AXIS0=kv_bh_axis0, **flags)

    if atomic_dq:
        return dq_acc.to(q.dtype)

    def grid_q(meta):
        if q_bh_axis0:
            return (n_seqs * nheads, config.cdiv(seqlen_q, meta["BLOCK_M"]))
        return (config.cdiv(seqlen_q, meta["BLOCK_M"]), n_seqs * nheads)

    launch_tuned(
        _dq_autotuned, grid_q, (bucket, *dtypes),
        q, k, v, dout, lse, delta, dq_acc, alibi_arg, cu_q, cu_k, seqused_k,
        *rs(q), *rs(k), *rs(v), *rs(dout), *rs(dq_acc),
        alibi_strides[0], alibi_strides[1],
        nheads, seqlen_q, seqlen_k, group, bucket, lse_stride_h, k.shape[0], *scalars,
        BH_AXIS0=q_bh_axis0, **flags)
    return dq_acc


def flash_bwd(dout: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
              out: torch.Tensor, lse: torch.Tensor, *, softmax_scale: float, causal: bool,
              window_left: int, window_right: int, softcap: float,
              alibi_slopes: Optional[torch.Tensor], dropout_p: float, philox_seed: int,
              deterministic: bool, alibi_shift: int = 0):
    """Attention backward with the portable Triton kernels.

    dout/out (b, s_q, h, d_v), q (b, s_q, h, d), k (b, s_k, h_k, d), v (b, s_k, h_k, d_v),
    lse float32 (b, h, s_q). Returns dq, dk, dv with the shapes and dtypes of q, k, v.
    dQ is computed in its own pass (bitwise repeatable). The alternative, fp32 atomics inside
    the dK/dV pass, measured slower on H100 (benchmarks/NOTES.md), so it is used only when
    ``deterministic=False`` and ``FLASHATTN_ATOMIC_DQ=1``. ``alibi_shift``:
    AttnParams.alibi_shift.
    """
    batch, seqlen_q, nheads, head_dim = q.shape
    _, seqlen_k, nheads_k, head_dim_v = v.shape
    dk = torch.empty_like(k, memory_format=torch.contiguous_format)
    dv = torch.empty_like(v, memory_format=torch.contiguous_format)
    if batch == 0 or seqlen_q == 0 or seqlen_k == 0:
        return torch.zeros_like(q), dk.zero_(), dv.zero_()
    if dout.stride(-1) != 1:
        dout = dout.contiguous()
    delta = torch.empty((batch, nheads, seqlen_q), dtype=torch.float32, device=q.device)
    _preprocess(out, dout, delta, batch, seqlen_q, nheads, head_dim_v)
    dq = torch.empty_like(q, memory_format=torch.contiguous_format)
    dq = _bwd_passes(dout, q, k, v, lse, delta, dq, dk, dv, batch, seqlen_q, seqlen_k, seqlen_q,
                     None, softmax_scale=softmax_scale, window_left=window_left,
                     window_right=window_right, softcap=softcap, alibi_slopes=alibi_slopes,
                     dropout_p=dropout_p, philox_seed=philox_seed, deterministic=deterministic,
                     alibi_shift=alibi_shift)
    return dq, dk, dv


def flash_varlen_bwd(dout: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                     out: torch.Tensor, lse: torch.Tensor, cu_seqlens_q: torch.Tensor,
                     cu_seqlens_k: torch.Tensor, seqused_k: Optional[torch.Tensor],
                     max_seqlen_q: int, max_seqlen_k: int, *, softmax_scale: float,
                     causal: bool, window_left: int, window_right: int, softcap: float,
                     alibi_slopes: Optional[torch.Tensor], dropout_p: float, philox_seed: int,
                     deterministic: bool):
    """Backward over packed variable-length sequences (the kernels' VARLEN mode).

    dout/out (total_q, h, d_v), q (total_q, h, d), k (total_k, h_k, d), v (total_k, h_k, d_v),
    lse float32 (h, total_q); cu_seqlens_* int32 (b + 1,), seqused_k int32 (b,) or None, as
    for :func:`flashattn.backends.triton.fwd.flash_varlen_fwd`. Returns dq, dk, dv with the shapes and
    dtypes of q, k, v; rows outside every sequence (and keys past seqused_k) get 0.
    No tensor value is read on the host.
    """
    total_q, nheads, _ = q.shape
    head_dim_v = v.shape[-1]
    batch = cu_seqlens_q.shape[0] - 1
    # the kernels index the length vectors with unit stride
    cu_seqlens_q, cu_seqlens_k = cu_seqlens_q.contiguous(), cu_seqlens_k.contiguous()
    seqused_k = seqused_k.contiguous() if seqused_k is not None else None
    # zero fill: programs past a sequence's end exit without writing
    dq = torch.zeros(q.shape, dtype=q.dtype, device=q.device)
    dk = torch.zeros(k.shape, dtype=k.dtype, device=k.device)
    dv = torch.zeros(v.shape, dtype=v.dtype, device=v.device)
    if batch == 0 or total_q == 0 or k.shape[0] == 0 or max_seqlen_q == 0 or max_seqlen_k == 0:
        return dq, dk, dv
    if dout.stride(-1) != 1:
        dout = dout.contiguous()
    # delta shares lse's (h, total_q) layout: the preprocess sees one long batch entry
    delta = torch.empty((nheads, total_q), dtype=torch.float32, device=q.device)
    _preprocess(out.unsqueeze(0), dout.unsqueeze(0), delta.unsqueeze(0), 1, total_q, nheads,
                head_dim_v)
    dq = _bwd_passes(dout, q, k, v, lse, delta, dq, dk, dv, batch, max_seqlen_q, max_seqlen_k,
                     total_q, (cu_seqlens_q, cu_seqlens_k, seqused_k),
                     softmax_scale=softmax_scale, window_left=window_left,
                     window_right=window_right, softcap=softcap, alibi_slopes=alibi_slopes,
                     dropout_p=dropout_p, philox_seed=philox_seed, deterministic=deterministic)
    return dq, dk, dv
