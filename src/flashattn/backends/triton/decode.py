"""Split-KV (Flash-Decoding) attention over a KV cache, contiguous or paged.

One program owns one KV head of one batch row and *all* the query rows that read it: the
``G = h // h_k`` query heads of the GQA group times the query positions, packed as rows
``r = i * G + g`` (query position i, head ``h_k_idx * G + g``) of a ``BLOCK_M`` tile. So every
K/V byte crosses HBM once per program, and one ``tl.dot`` serves the whole group.

When ``b * h_k`` programs cannot fill the GPU, the key range is cut into ``num_splits``
equal chunks (axis 2 of the grid). Each chunk's length comes from the sequence's own key
count, read on the device, so no host value is needed (CUDA-graph friendly) and no program
walks keys it does not own. A split writes its normalised partial output and LSE in fp32
(``triton/combine.py`` merges them); with one split the program writes out and lse directly.

Key addressing (absolute cache position ``p = start_k + j`` of local key j):
- contiguous cache (b_cache, s_cache, h_k, d): row ``cache_batch_idx[b]`` (or b), seq p;
  on sm90 through a TMA tensor descriptor over that (s_cache, d) slab when aligned;
- paged cache (num_blocks, page_size, h_k, d): page ``block_table[b, p // page_size]``,
  row ``p % page_size``; every row is gathered with 64-bit offsets (any page size >= 1).
Local key j runs over ``[0, s_k)`` with ``s_k = seqlens_k[b] + seqlen_k_add - start_k``
(``start_k`` = cache_leftpad[b] or 0); visibility (causal / window) and ALiBi are bottom-right
aligned on those local indices, exactly as the dense kernels on a (s_q, s_k) problem;
so are the chunks of chunked local attention (``attention_chunk``, counted from start_k).

FP8 caches (``KV_FP8``: float8_e4m3fn K / V, real value = fp8 * descale with one float32
descale per (batch row, KV head)): the kernel reads the FP8 bytes (16-byte cp.async copies,
contiguous along d) and widens them on chip, which is exact (every e4m3 value is a bf16 and
an fp16 value). K is widened to q's dtype for Q K^T. V is widened to fp16 and P V runs in
fp16 (P is in [0, 1]: fp16 holds it more finely than bf16), fp32 when the math is fp32
(with qv, V is in the math's dtype instead: see multi-head latent attention below). The
descales are the program's scalars, never per-element multiplies: K's multiplies the softmax
scale, V's the finished output, so no dequantized value is rounded.

V is read as int16 byte pairs (``V_PAIRS``; 16-bit math, no qv, V tiles of >= 64 columns):
bytes 2c and 2c + 1 of a V row, its columns 2c and 2c + 1, are one int16, and P V runs as two
dots, over the even and over the odd columns (joined again before the store). The B operand of
P V needs consecutive *keys* per register; an int16 tile gets there as a 16-bit cache's does,
by ``ldmatrix.trans`` straight from the cp.async buffer, and each operand register is then
widened in place (``_e4m3_pair_to_f16``: one ``prmt`` picks the two keys' low or high bytes,
one ``cvt.rn.f16x2.e4m3x2`` widens them, pure inline asm so that Triton moves the layout
conversion above it). The products and their order are the plain tile's: out is bitwise the
same. Before, the e4m3 tile was widened in the loaded layout and the fp16 tile went back
through shared memory for ``ldmatrix.trans`` (an asm conversion with side effects, which Triton
does not move: a plain cast is converted inside the operand layout, gathered from shared memory
one byte at a time, 64 ``ld.shared.b8`` per thread and 64 keys); that chain was what the kernel
waited on (H200, 2026-11-29: 9-11 % faster without it, benchmarks/NOTES.md). That path
(``_e4m3_to_f16``) stays for a V cache whose base is not 16-byte aligned or whose strides are
odd (an int16 load needs an even address), for narrower V tiles and for qv's V tile.

``K_PAIRS`` does the same for K: Q K^T as two dots over K's even and odd columns in fp16, q
split the same way once per program (a bf16 q scaled exactly by a power of two into fp16's
range, the inverse in the score scale), so that K's operand is built by ``ldmatrix`` from the
copy buffer and widened in its registers by the conversion above, instead of e4m3 -> bf16 casts
(two ``F2F`` per pair on the conversion unit; the sm_90 compile of d 128: ``F2F`` 128 -> 0,
same shared memory, 150 registers). H200, 2026-12-02: the e4m3 rows 7-13 % faster than with the
casts (benchmarks/NOTES.md); K caches that are not 16-byte aligned, or whose strides are odd,
keep the casts.

FP8 queries (``Q_FP8``, FlashAttention-3's q_descale, one per (batch row, KV head): the
program's query rows all share it): q is widened to bf16 on load (exact) and its descale
joins K's in the score scale; out is bf16. The dots stay bf16 x bf16 -> fp32 on purpose: a
decode program multiplies each K / V element by at most BLOCK_M (<= 64) query rows, so it is
bound by reading the cache, not by the tensor cores, and FP8 dots would also quantize P.

Varlen queries (``VARLEN_Q``): q / out are one packed (total_q, h, d) batch, the sequence
``b`` owns rows ``[cu_seqlens_q[b], cu_seqlens_q[b + 1])``.

Multi-head latent attention (``HAS_QV``, FlashAttention-3's ``qv``): the score of a key is
``q . k + qv . v``, the latent query (BLOCK_M x d_v, read once per program) against the key's
V row itself. The V tile is loaded before the softmax instead of after it and serves both
products, so the latent part costs one more dot per tile and no extra K / V traffic. With an
FP8 cache ``qv . v8`` is scaled by ``v_descale / k_descale`` before it joins ``q . k8``, whose
``k_descale`` rides in the score scale; there V is widened to qv's dtype (the math's: q's, fp32
when upcast), not always to fp16, since both dots take it and a dot's operands share a dtype.
16-bit math still widens it with ``_e4m3_to_f16`` (then fp16 -> bf16 for a bf16 qv, exact), in
the loaded layout, so that both dots' operands are built from 16-bit values by ldmatrix, not
gathered byte by byte as a plain cast's are (``_v_tile``); fp32 math casts plainly (its FMA
dot takes the operands from registers). An FP8 query with qv is refused by the api
(``Q_FP8`` and ``HAS_QV`` never meet: the kernel asserts it). V head dims past 256 (the latent
cache's 512, with or without qv) take pointer loads (a TMA box is at most 256 elements wide)
and their own launch configuration (``_WIDE_V_CONFIG``).
"""
from __future__ import annotations

import functools
import math
from typing import Callable, Optional, Tuple

import torch
import triton
import triton.language as tl

from flashattn.runtime import env as _env
from flashattn.runtime.buffers import stream_buffer
from flashattn.runtime.launch import LaunchPlan, LaunchPlans
from flashattn.backends.triton import config
from flashattn.backends.triton.combine import combine_launch
from flashattn.backends.triton.mask import (LN2, LOG2E, chunk_start, key_range, score_mod, score_scales,
                                   visible_mask)
from flashattn.backends.triton.prologue import cache_keys, packed_rows, tma_pair


@triton.jit
def _write_empty_rows(Out, Lse, row_lo, row_hi, off_hk, pid_m, m_programs, pid_s,
                      stride_os, stride_om, stride_oh, stride_ls, stride_lh, stride_lm,
                      offs_dv, G: tl.constexpr, HEAD_DIM_V: tl.constexpr,
                      BLOCK_M: tl.constexpr, BLOCK_DV: tl.constexpr):
    """out 0 and lse -inf for packed query rows [row_lo, row_hi) of the KV head's G query
    heads (rows that belong to no sequence), split over the ``m_programs`` programs of one
    (sequence, KV head): program ``pid_m`` takes every m_programs-th tile of BLOCK_M (row,
    head) pairs."""
    n = (row_hi - row_lo) * G
    zeros = tl.zeros([BLOCK_M, BLOCK_DV], dtype=Out.dtype.element_ty)
    for first in tl.range(pid_m * BLOCK_M, n, m_programs * BLOCK_M):
        pair = first + tl.arange(0, BLOCK_M)
        ok = pair < n
        row = (row_lo + pair // G).to(tl.int64)
        head = (off_hk * G + pair % G).to(tl.int64)
        o_row = pid_s.to(tl.int64) * stride_os + row * stride_om + head * stride_oh
        tl.store(Out + o_row[:, None] + offs_dv[None, :], zeros,
                 mask=ok[:, None] & (offs_dv[None, :] < HEAD_DIM_V))
        l_row = pid_s.to(tl.int64) * stride_ls + head * stride_lh + row * stride_lm
        tl.store(Lse + l_row, tl.full([BLOCK_M], float("-inf"), dtype=tl.float32), mask=ok)


@triton.jit
def _v_load(v_desc, v_base, v_rows, n_ok, offs_dv, row, HEAD_DIM_V: tl.constexpr,
            USE_TMA: tl.constexpr):
    """The (BLOCK_N, BLOCK_DV) V tile of keys ``v_rows`` (cache row ``row`` on, by TMA), in
    the cache's dtype."""
    if USE_TMA:
        v = v_desc.load([row, 0])
    else:
        v = tl.load(v_base + v_rows[:, None] + offs_dv[None, :],
                    mask=n_ok[:, None] & (offs_dv[None, :] < HEAD_DIM_V), other=0.0)
    return v


@triton.jit
def _v_tile(qv, v_desc, v_base, v_rows, n_ok, offs_dv, row, HEAD_DIM_V: tl.constexpr,
            USE_TMA: tl.constexpr, KV_FP8: tl.constexpr, UPCAST: tl.constexpr,
            ASM: tl.constexpr):
    """With qv: the V tile in qv's dtype (the math's: q's, fp32 when upcast; an FP8 tile
    widened to it, exact), the one operand of both qv . v^T and P V.

    An FP8 tile goes through ``_e4m3_to_f16`` for a 16-bit qv, so that it is widened in the
    layout it was loaded in and both dots' operands are built from 16-bit values (ldmatrix),
    not gathered from shared memory byte by byte as a plain cast's would be (module doc).
    fp16 -> bf16 is then exact too (e4m3 has 3 mantissa bits and exponents -9..8, inside
    both formats) and cheap (sm_90: through fp32, ``HADD2.F32`` and a ``F2FP`` pack, where
    Triton's own e4m3 -> bf16 takes the conversion unit's ``F2F.BF16.F16``); fp32 math takes
    its FMA operands from registers and casts plainly."""
    v = _v_load(v_desc, v_base, v_rows, n_ok, offs_dv, row, HEAD_DIM_V, USE_TMA)
    if KV_FP8:
        if qv.dtype == tl.float32:
            v = v.to(tl.float32)
        else:
            v = _e4m3_to_f16(v, ASM).to(qv.dtype)
    if UPCAST:
        v = v.to(tl.float32)
    return v


@triton.jit
def _e4m3_to_f16(x, ASM: tl.constexpr):
    """float8_e4m3fn -> float16, exact. ``ASM``: two ``cvt.rn.f16x2.e4m3x2`` per four values,
    as inline asm with side effects, so that Triton converts in the layout x was loaded in
    (see the module doc) instead of hoisting the cast into a dot operand; the interpreter
    (no inline asm) casts."""
    if ASM:
        return tl.inline_asm_elementwise(
            asm="""{
            .reg .b16 lo, hi;
            mov.b32 {lo, hi}, $2;
            cvt.rn.f16x2.e4m3x2 $0, lo;
            cvt.rn.f16x2.e4m3x2 $1, hi;
            }""",
            constraints="=r,=r,r", args=[x], dtype=tl.float16, is_pure=False, pack=4)
    return x.to(tl.float16)


def _e4m3_pair_asm(selector: str) -> tl.constexpr:
    """The inline asm of :func:`_e4m3_pair_to_f16` for one ``prmt`` byte selector: bytes 0 and
    2 of the two packed int16 values (0x0020, their low bytes) or bytes 1 and 3 (0x0031)."""
    return tl.constexpr(f"""{{
    .reg .b32 t;
    .reg .b16 lo, hi;
    prmt.b32 t, $1, 0, {selector};
    mov.b32 {{lo, hi}}, t;
    cvt.rn.f16x2.e4m3x2 $0, lo;
    }}""")


_E4M3_EVEN_ASM = _e4m3_pair_asm("0x0020")
_E4M3_ODD_ASM = _e4m3_pair_asm("0x0031")


@triton.jit
def _e4m3_pair_to_f16(x, HIGH: tl.constexpr, ASM: tl.constexpr):
    """One byte of each int16 of ``x`` (two neighbouring e4m3 values of a V row, read as one
    int16) as float16, exact: the low byte (even d column) or with ``HIGH`` the high one (odd
    column). ``ASM``: per two int16 values one ``prmt`` gathering the chosen bytes and one
    ``cvt.rn.f16x2.e4m3x2``, as *pure* inline asm, so that Triton moves the dot operand's
    layout conversion above it: the int16 tile goes from the cp.async buffer to the operand
    registers by ``ldmatrix.trans`` and is widened there (module doc). The interpreter (no
    inline asm) takes the byte with integer ops and casts."""
    if ASM:
        return tl.inline_asm_elementwise(
            asm=_E4M3_ODD_ASM if HIGH else _E4M3_EVEN_ASM, constraints="=r,r", args=[x],
            dtype=tl.float16, is_pure=True, pack=2)
    byte = (x >> 8) & 0xFF if HIGH else x & 0xFF
    return byte.to(tl.uint8).to(tl.float8e4nv, bitcast=True).to(tl.float16)


@triton.jit
def _decode_kernel(
    Q, K, V, Out, Lse, SeqlensK, LeftPad, BatchIdx, BlockTable, Alibi, CuSeqQ, KDescale,
    VDescale, QV, QDescale,
    stride_qb, stride_qm, stride_qh,
    stride_kb, stride_kn, stride_kh,
    stride_vb, stride_vn, stride_vh,
    stride_os, stride_ob, stride_om, stride_oh,
    stride_ls, stride_lb, stride_lh, stride_lm,
    stride_btb, stride_ab, stride_ah, stride_kdb, stride_kdh, stride_vdb, stride_vdh,
    stride_qvb, stride_qvm, stride_qvh, stride_qdb, stride_qdh,
    seqlen_q, seqlen_k_add, cache_rows, nheads_k, n_bh, n_cache, cache_cap, total_q,
    sm_scale, softcap, window_left, window_right, chunk,
    G: tl.constexpr, HEAD_DIM: tl.constexpr, HEAD_DIM_V: tl.constexpr,
    BLOCK_D: tl.constexpr, BLOCK_DV: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, PAGE_SIZE: tl.constexpr,
    PAGED: tl.constexpr, HAS_LEFTPAD: tl.constexpr, HAS_BATCH_IDX: tl.constexpr,
    VARLEN_Q: tl.constexpr, HAS_LEFT: tl.constexpr, HAS_RIGHT: tl.constexpr,
    HAS_CHUNK: tl.constexpr, HAS_SOFTCAP: tl.constexpr, HAS_ALIBI: tl.constexpr,
    UPCAST: tl.constexpr, DOT_PREC: tl.constexpr, USE_TMA: tl.constexpr,
    KV_FP8: tl.constexpr, HAS_QV: tl.constexpr, Q_FP8: tl.constexpr,
    ASM_CVT: tl.constexpr, V_PAIRS: tl.constexpr, K_PAIRS: tl.constexpr,
):
    # (the api refuses an FP8 q with qv: qv . v^T would need qv in FP8 and its own descale)
    tl.static_assert(not (HAS_QV and Q_FP8), "qv with an FP8 query")
    # (batch, KV head) and query block share grid axis 0, (batch, KV head) fastest: axis 1
    # stops at 65535 blocks, which a long prefill through the kvcache API can pass
    pid = tl.program_id(0)
    pid_bh = pid % n_bh
    pid_m = pid // n_bh
    pid_s = tl.program_id(2)
    n_splits = tl.num_programs(2)
    off_b = pid_bh // nheads_k
    off_hk = pid_bh % nheads_k

    # Metadata read from the device is clamped before it forms an address (no out-of-bounds
    # access for any value; a bad value gives a wrong answer that flashattn.checks() reports):
    # query rows to [0, total_q), key counts to the cache's capacity, cache rows and pages to
    # the cache.
    offs_dv = tl.arange(0, BLOCK_DV)
    if VARLEN_Q:
        q_start, q_end = packed_rows(CuSeqQ, CuSeqQ, off_b, total_q, False)
        s_q = (q_end - q_start).to(tl.int32)
        # Rows before the first sequence and after the last belong to none: out 0, lse -inf,
        # written here by the first / last sequence's programs (in every split: the combine
        # pass then gives 0 / -inf), so the caller runs no fill pass before the kernel.
        n_seqs = n_bh // nheads_k
        if off_b == 0:
            _write_empty_rows(Out, Lse, 0, q_start, off_hk, pid_m, tl.num_programs(0) // n_bh,
                              pid_s, stride_os, stride_om, stride_oh, stride_ls, stride_lh,
                              stride_lm, offs_dv, G, HEAD_DIM_V, BLOCK_M, BLOCK_DV)
        if off_b == n_seqs - 1:
            _write_empty_rows(Out, Lse, q_end, total_q, off_hk, pid_m,
                              tl.num_programs(0) // n_bh, pid_s, stride_os, stride_om,
                              stride_oh, stride_ls, stride_lh, stride_lm, offs_dv, G,
                              HEAD_DIM_V, BLOCK_M, BLOCK_DV)
        q_start = q_start.to(tl.int64)
    else:
        q_start = tl.zeros([], dtype=tl.int64)
        s_q = seqlen_q
    m_first = pid_m * BLOCK_M
    if m_first >= s_q * G:  # varlen: this sequence has fewer rows than the grid's max
        return

    # packed rows: query position i = r // G, query head h_k_idx * G + r % G
    rows = m_first + tl.arange(0, BLOCK_M)
    offs_i = rows // G
    off_h = off_hk * G + rows % G
    row_ok = offs_i < s_q
    offs_d = tl.arange(0, BLOCK_D)

    start_k, seqlen_k = cache_keys(SeqlensK, LeftPad, off_b, seqlen_k_add, cache_cap, HAS_LEFTPAD)
    diag = seqlen_k - s_q

    # keys some row of this tile may see, then this split's equal share of them
    i_lo = m_first // G
    i_hi = tl.minimum((m_first + BLOCK_M - 1) // G, s_q - 1)
    lo, _mid_lo, _mid_hi, hi = key_range(i_lo, i_hi + 1, seqlen_k, diag, window_left,
                                         window_right, BLOCK_N, HAS_LEFT, HAS_RIGHT)
    if HAS_CHUNK:  # the keys of the chunks of this tile's first and last query rows
        lo = tl.maximum(lo, tl.maximum(chunk_start(i_lo + diag, chunk), 0) // BLOCK_N * BLOCK_N)
        hi = tl.maximum(tl.minimum(hi, tl.maximum(chunk_start(i_hi + diag, chunk) + chunk, 0)),
                        lo)
    n_blocks = tl.cdiv(hi - lo, BLOCK_N)
    per_split = tl.cdiv(n_blocks, n_splits)
    start = lo + pid_s * per_split * BLOCK_N
    end = tl.minimum(start + per_split * BLOCK_N, hi)

    # 64-bit offsets throughout: page * page stride and row * row stride pass 2**31 easily
    q_row = off_b.to(tl.int64) * stride_qb + (q_start + offs_i) * stride_qm \
        + off_h.to(tl.int64) * stride_qh
    q = tl.load(Q + q_row[:, None] + offs_d[None, :],
                mask=row_ok[:, None] & (offs_d[None, :] < HEAD_DIM), other=0.0)
    if Q_FP8:  # (every e4m3 value is a bf16 value: exact; a rotated q arrives in bf16 already)
        q = q.to(tl.bfloat16)
    if K_PAIRS:
        # Q K^T over K's even and odd columns in fp16 (module doc): a bf16 q becomes fp16
        # exactly after a scaling by a power of two that puts the tile's largest |q| in
        # [2^14, 2^15) (bf16's 8-bit significand fits fp16's 11; only elements below 2^-24 of
        # that maximum round, into fp16 subnormals); the inverse joins the score scale
        if q.dtype == tl.bfloat16:
            amax = tl.max(tl.max(tl.abs(q.to(tl.float32)), 1), 0)
            biased = (amax.to(tl.int32, bitcast=True) >> 23) & 0xFF
            # 2^(14 - floor(log2 amax)), within 2^-126 .. 2^64 (an all-zero tile takes 2^64)
            q_scale = (tl.minimum(tl.maximum(268 - biased, 1), 191) << 23).to(tl.float32,
                                                                              bitcast=True)
            q = (q.to(tl.float32) * q_scale).to(tl.float16)
            sm_scale = sm_scale / q_scale
        q = q.to(tl.float16)
        q_even, q_odd = tl.split(tl.reshape(q, [BLOCK_M, BLOCK_D // 2, 2]))
        if UPCAST:
            q_even = q_even.to(tl.float32)
            q_odd = q_odd.to(tl.float32)
    if UPCAST:
        q = q.to(tl.float32)
    qv = None
    if HAS_QV:  # the latent query: read once, scored against every V tile
        qv_row = off_b.to(tl.int64) * stride_qvb + (q_start + offs_i) * stride_qvm \
            + off_h.to(tl.int64) * stride_qvh
        qv = tl.load(QV + qv_row[:, None] + offs_dv[None, :],
                     mask=row_ok[:, None] & (offs_dv[None, :] < HEAD_DIM_V), other=0.0)
        if UPCAST:
            qv = qv.to(tl.float32)

    k_head = off_hk.to(tl.int64) * stride_kh
    v_head = off_hk.to(tl.int64) * stride_vh
    if PAGED:
        bt_base = BlockTable + off_b.to(tl.int64) * stride_btb
        k_base = K + k_head
        v_base = V + v_head
    else:
        cache_b = off_b
        if HAS_BATCH_IDX:
            cache_b = tl.minimum(tl.maximum(tl.load(BatchIdx + off_b), 0), n_cache - 1)
        k_base = K + cache_b.to(tl.int64) * stride_kb + k_head
        v_base = V + cache_b.to(tl.int64) * stride_vb + v_head
    # (s_cache, d) slab of this (cache row, kv head); rows past the cache read as zeros
    k_desc = None
    v_desc = None
    if USE_TMA:
        k_desc, v_desc = tma_pair(k_base, v_base, cache_rows, stride_kn, stride_vn,
                                  HEAD_DIM, HEAD_DIM_V, BLOCK_N, BLOCK_D, BLOCK_DV)

    v_descale = 1.0
    qv_descale = 1.0
    if KV_FP8:  # q . (k8 * k_descale) = (q . k8) * k_descale: fold it into the score scale
        k_descale = tl.load(KDescale + off_b.to(tl.int64) * stride_kdb
                            + off_hk.to(tl.int64) * stride_kdh)
        sm_scale = sm_scale * k_descale
        v_descale = tl.load(VDescale + off_b.to(tl.int64) * stride_vdb
                            + off_hk.to(tl.int64) * stride_vdh)
        # qv . (v8 * v_descale) joins q . k8 before that scale, which already holds k_descale
        qv_descale = v_descale / k_descale
    if Q_FP8:  # (q8 * q_descale) . k = (q8 . k) * q_descale: the score scale again
        sm_scale = sm_scale * tl.load(QDescale + off_b.to(tl.int64) * stride_qdb
                                      + off_hk.to(tl.int64) * stride_qdh)
    qk_scale, softcap_inv, softcap_log2 = score_scales(sm_scale, softcap, HAS_SOFTCAP)
    slope_log2 = tl.zeros([BLOCK_M], dtype=tl.float32)
    if HAS_ALIBI:
        slope_log2 = tl.load(Alibi + off_b * stride_ab + off_h * stride_ah, mask=row_ok,
                             other=0.0) * LOG2E

    if K_PAIRS:
        k_pairs = k_base.to(tl.pointer_type(tl.int16), bitcast=True)
        offs_ck = tl.arange(0, BLOCK_D // 2)
    m_i = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
    if V_PAIRS:  # the even and the odd output columns (V read as int16 byte pairs)
        acc = tl.zeros([BLOCK_M, BLOCK_DV // 2], dtype=tl.float32)
        acc_odd = tl.zeros([BLOCK_M, BLOCK_DV // 2], dtype=tl.float32)
        offs_c = tl.arange(0, BLOCK_DV // 2)
        v_pairs = v_base.to(tl.pointer_type(tl.int16), bitcast=True)
    else:
        acc = tl.zeros([BLOCK_M, BLOCK_DV], dtype=tl.float32)
    offs_n0 = tl.arange(0, BLOCK_N)

    for start_n in tl.range(start, end, BLOCK_N):
        offs_n = start_n + offs_n0
        n_ok = offs_n < end
        pos = start_k + offs_n  # absolute cache positions
        if PAGED:
            page = tl.load(bt_base + pos // PAGE_SIZE, mask=n_ok, other=0)
            page = tl.minimum(tl.maximum(page, 0), n_cache - 1).to(tl.int64)
            slot = (pos % PAGE_SIZE).to(tl.int64)
            k_rows = page * stride_kb + slot * stride_kn
            v_rows = page * stride_vb + slot * stride_vn
        else:
            k_rows = pos.to(tl.int64) * stride_kn
            v_rows = pos.to(tl.int64) * stride_vn
        if K_PAIRS:  # (K^T as int16 byte pairs: rows c of the tile are columns 2c, 2c + 1)
            k2 = tl.load(k_pairs + (k_rows // 2)[None, :] + offs_ck[:, None],
                         mask=n_ok[None, :] & (offs_ck[:, None] < HEAD_DIM // 2), other=0)
            k_even = _e4m3_pair_to_f16(k2, False, ASM_CVT)
            k_odd = _e4m3_pair_to_f16(k2, True, ASM_CVT)
            if UPCAST:
                k_even = k_even.to(tl.float32)
                k_odd = k_odd.to(tl.float32)
            qk = tl.dot(q_even, k_even, input_precision=DOT_PREC)
            qk = tl.dot(q_odd, k_odd, qk, input_precision=DOT_PREC)
        else:
            if USE_TMA:
                k = tl.trans(k_desc.load([start_k + start_n, 0]))
            else:
                k = tl.load(k_base + k_rows[None, :] + offs_d[:, None],
                            mask=n_ok[None, :] & (offs_d[:, None] < HEAD_DIM), other=0.0)
            if KV_FP8:  # widened to the math's dtype (q's: bf16 for an FP8 q, fp32 if upcast)
                k = k.to(q.dtype)
            if UPCAST:
                k = k.to(tl.float32)
            qk = tl.dot(q, k, input_precision=DOT_PREC)
        if HAS_QV:
            # multi-head latent attention: the latent query scores against the V tile itself,
            # loaded here (before the softmax) and reused by the PV product below
            v = _v_tile(qv, v_desc, v_base, v_rows, n_ok, offs_dv, start_k + start_n,
                        HEAD_DIM_V, USE_TMA, KV_FP8, UPCAST, ASM_CVT)
            qvv = tl.dot(qv, tl.trans(v), input_precision=DOT_PREC)
            if KV_FP8:
                qvv = qvv * qv_descale
            qk = qk + qvv
        s, _t = score_mod(qk, offs_i[:, None], offs_n[None, :], diag, qk_scale, softcap_inv,
                          softcap_log2, slope_log2[:, None], HAS_SOFTCAP, HAS_ALIBI)
        # keys past this split's end belong to the next split (or do not exist)
        vis = visible_mask(offs_i[:, None], offs_n[None, :], end, diag, window_left,
                           window_right, HAS_LEFT, HAS_RIGHT)
        if HAS_CHUNK:
            c0 = chunk_start(offs_i + diag, chunk)[:, None]
            vis = vis & (offs_n[None, :] >= c0) & (offs_n[None, :] < c0 + chunk)
        s = tl.where(vis, s, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, 1))
        # a row with no visible key so far keeps m = -inf: subtract 0 instead (no NaN)
        m_sub = tl.where(m_new == float("-inf"), 0.0, m_new)
        p = tl.exp2(s - m_sub[:, None])
        alpha = tl.exp2(m_i - m_sub)
        l_i = l_i * alpha + tl.sum(p, 1)
        if V_PAIRS:
            # (loaded late: its latency hides behind the softmax) an e4m3 V row's bytes 2c and
            # 2c + 1 are one int16: P V over the even columns and over the odd ones, each V
            # operand widened in the operand's own registers (module doc)
            v2 = tl.load(v_pairs + (v_rows // 2)[:, None] + offs_c[None, :],
                         mask=n_ok[:, None] & (offs_c[None, :] < HEAD_DIM_V // 2), other=0)
            v_even = _e4m3_pair_to_f16(v2, False, ASM_CVT)
            v_odd = _e4m3_pair_to_f16(v2, True, ASM_CVT)
            if UPCAST:
                v_even = v_even.to(tl.float32)
                v_odd = v_odd.to(tl.float32)
            p16 = p.to(v_even.dtype)
            acc = tl.dot(p16, v_even, acc * alpha[:, None], input_precision=DOT_PREC)
            acc_odd = tl.dot(p16, v_odd, acc_odd * alpha[:, None], input_precision=DOT_PREC)
        else:
            if not HAS_QV:  # (loaded late: its latency hides behind the softmax)
                v = _v_load(v_desc, v_base, v_rows, n_ok, offs_dv, start_k + start_n,
                            HEAD_DIM_V, USE_TMA)
                if KV_FP8:  # fp16 for P V; fp32 when the math is (fp32 q, or upcast dots)
                    if q.dtype == tl.float32:
                        v = v.to(tl.float32)
                    else:
                        v = _e4m3_to_f16(v, ASM_CVT)
                if UPCAST:
                    v = v.to(tl.float32)
            acc = tl.dot(p.to(v.dtype), v, acc * alpha[:, None], input_precision=DOT_PREC)
        m_i = m_new

    if V_PAIRS:  # columns 2c and 2c + 1 side by side again
        acc = tl.reshape(tl.join(acc, acc_odd), [BLOCK_M, BLOCK_DV])
    # epilogue: normalised output and natural-log LSE (-inf and 0 where no key was seen)
    empty = l_i == 0.0
    l_safe = tl.where(empty, 1.0, l_i)
    acc = acc * (v_descale / l_safe)[:, None]
    lse = tl.where(empty, float("-inf"), (m_i + tl.log2(l_safe)) * LN2)
    o_row = pid_s.to(tl.int64) * stride_os + off_b.to(tl.int64) * stride_ob \
        + (q_start + offs_i) * stride_om + off_h.to(tl.int64) * stride_oh
    tl.store(Out + o_row[:, None] + offs_dv[None, :], acc.to(Out.dtype.element_ty),
             mask=row_ok[:, None] & (offs_dv[None, :] < HEAD_DIM_V))
    l_row = pid_s.to(tl.int64) * stride_ls + off_b.to(tl.int64) * stride_lb \
        + off_h.to(tl.int64) * stride_lh + (q_start + offs_i) * stride_lm
    tl.store(Lse + l_row, lse, mask=row_ok)


# ---------------------------------------------------------------------------------------------
# Launch configuration (data, not autotuning: a decode step must be capturable in a CUDA
# graph on its first call, and the choice depends only on shapes)
# ---------------------------------------------------------------------------------------------
# FLASHATTN_DECODE_CONFIG="BLOCK_N,num_warps,num_stages[,tma]" and FLASHATTN_DECODE_WAVES (probes
# only) are read through flashattn.runtime.env


def launch_config(head_dim: int, elem_bytes: int, paged: bool, long_unsplit: bool = False,
                  kv_fp8: bool = False, head_dim_v: int = 0) -> Tuple[int, int, int, bool]:
    """(BLOCK_N, num_warps, num_stages, allow_tma) for the decode kernel; ``elem_bytes``: of
    the math's dtype (q's; bf16 for an FP8 q); ``long_unsplit``: the grid is full without
    splitting and every program streams >= 16k keys; ``kv_fp8``: an e4m3 cache;
    ``head_dim_v``: V's head dim when it passes 256 (multi-head latent attention's 512)."""
    env = _env.settings().decode_config
    if env:
        parts = [p.strip() for p in env.split(",")]
        bn, warps, stages = (int(x) for x in parts[:3])
        tma = len(parts) < 4 or parts[3] not in ("0", "no", "false")
        return bn, warps, stages, tma
    if config.INTERPRET:
        return 16, 4, 1, True
    # d <= 128, 16-bit: from the H100 sweep of 2026-11-23 (benchmarks/NOTES.md; CUDA-graph
    # replays, GQA 32/8, the five decode points). Contiguous: 64 keys x 3 stages over
    # TMA (best at the four split / short points, +1-2 % over the former 64 x 4), and for long
    # unsplit streams 128 keys x 3 stages with 8 warps (+1.3 % at (64, 32k); 64 x 3 loses 7 %
    # there). Paged: 128 keys x 3 stages (3.03 TB/s at (64, 32k) page 16, was 2.55 with the
    # former 64 x 5, within 2 % of the contiguous cache). d = 256 and fp32 were not swept: the
    # compile-report choices (d = 256 halves the tile to stay in shared memory).
    if head_dim_v > 256:
        return _WIDE_V_CONFIG[elem_bytes >= 4]
    d = max(16, config.next_pow2(head_dim))
    if kv_fp8 and elem_bytes == 2 and d <= 128:
        # e4m3 tiles are half the bytes of 16-bit ones: 128 keys per step keep a 16-bit 64-key
        # tile's bytes in flight per stage (a split program is often alone on its SM) and
        # halve the per-key share of the step's fixed work (softmax bookkeeping, the
        # barriers of V's transposition). Pointer loads (16-byte cp.async); the sm_90 compile
        # of d = 128: 150 / 105 / 160 registers, 104 / 104 / 72 KiB shared for these three,
        # no spills. Swept on an H100 on 2026-11-28 (fp8_kvcache_probe.py --configs, CUDA
        # graphs, GQA 32 / 8): long unsplit streams at (64, 32k) 64 x 4 warps x 3 stages 1.54 ms
        # against 1.63 for 128 x 8 x 3 (64 x 4 x 2 1.60, 32 x 4 x 4 1.68, 8 warps 1.83-1.85);
        # split streams at (1, 128k) 128 x 4 x 3 stays (0.118 ms with two waves, below).
        # Paged: 128 x 4 x 3 (H200 sweep of 2026-11-28, decode_ncu.py --sweep, (64, 32k) page
        # 64 at the split count of RESIDENT below: 1.52 ms against 1.55 for
        # 128 x 4 x 2, 1.80 for 64 x 4 x 3 / 4, 2.05 for 128 x 8 x 3, 2.47 for 256 x 8 x 2).
        if paged:
            return (128, 4, 3, False)
        return (64, 4, 3, False) if long_unsplit else (128, 4, 3, False)
    if kv_fp8 and elem_bytes >= 4:
        # fp32 math on an e4m3 cache (a rare pairing): the FMA dot takes the widened operands
        # from registers; 16 keys is the largest tile that does not spill at d <= 128 (sm_90
        # compile: 186 registers; 32 keys spilled 160 bytes). d = 256 spills at every size
        # tried (16 keys, 4-16 warps).
        return (16, 8, 3, False)
    if elem_bytes >= 4:
        # fp32 (exact IEEE dots): the TMA tile layout spills at any size; pointer loads do not
        return (32, 8, 3, False) if d <= 128 else (16, 8, 3, False)
    if d <= 128:
        if paged:
            return (128, 4, 3, True)
        return (128, 8, 3, True) if long_unsplit else (64, 4, 3, True)
    return (32, 4, 5, True) if paged else (32, 4, 4, True)


# V head dim in (256, 512] (DeepSeek's MLA: d 64, d_v 512), 16-bit / fp32: (BLOCK_N, warps,
# stages, TMA). Pointer loads (a TMA box is at most 256 wide). The fp32 accumulator is
# BLOCK_M x 512 and the V tile BLOCK_N x 512 per stage, so 8 warps. 16-bit: 64 keys x 2
# stages, from the H100 sweep of 2026-11-28 (benchmarks/probes/mla_decode_probe.py, 128 heads
# over one latent head, d 64, page 64, CUDA graphs): 1.23-1.35x faster than 32 keys at every
# point (b 4 / 32 / 64, 4k-32k keys; bf16 and FP8 latent caches; 16 keys slower still). Its
# sm_90 compile with qv (bf16): 255 registers, 40 bytes spilled, 216 KiB shared, against 254
# registers, no spill, 144 KiB at 32 keys: the spill costs less than the halved per-key
# share of each step's fixed work. An FP8 cache with qv (bf16) spills at every BLOCK_N tried:
# 392 bytes here (368 with one stage, 312 / 288 at 32 keys, 608 with 16 warps), the same
# whether V is widened by a plain cast or in the loaded layout (_v_tile): wgmma reads both
# operands from shared memory, so this variant had no byte gathers to remove; the widened
# bf16 tile passes through registers on its way back to shared memory, next to the 128
# accumulator registers per thread. 32 query rows do not spill but lose wgmma. fp32: 16 keys
# (with 32 query rows, _launch_plan).
_WIDE_V_CONFIG = {False: (64, 8, 2, False), True: (16, 8, 2, False)}
_TMA_MAX_BOX = 256
# e4m3 V tiles read as int16 byte pairs, P V as two dots over the even / odd columns (module
# doc); a probe may switch it off between calls (it is part of every launch key)
V_PAIRS = True
# the same for K: Q K^T over K's even and odd columns in fp16 (a bf16 q scaled by a power of
# two into fp16's range); switchable the same way
K_PAIRS = True

MAX_SPLITS = 128

# Programs resident per SM of the decode configs whose residency was measured, head dims of
# 65-128 with 16-bit math (keys: (paged, e4m3 cache, BLOCK_N, warps, stages)). Nsight Compute on an H200,
# 2026-11-28 ("Block Limit Registers / Shared Mem"): a paged 16-bit cache 206 registers -> 2;
# a paged e4m3 cache 160 registers and 74 KiB -> 3; a contiguous e4m3 cache on long unsplit
# streams 112 registers and 55 KiB -> 4; its split-stream config (sm_90 compile: 104 KiB) -> 2,
# 3 since V is read as int16 byte pairs (V_PAIRS: no fp16 staging tile, 72 KiB and 152
# registers in the sm_90 compile; not yet read off Nsight Compute).
# Their split counts fill whole waves of these slots (num_splits_heuristic); a CPU test checks
# each entry against its sm_90 compile (programs_per_sm on the pinned Triton). The contiguous
# 16-bit configs (TMA) are not listed: split counts 1-4 at (40 / 48 / 80, 32k) measured within
# 2-5 % of each other there, the unsplit grid among the fastest.
RESIDENT = {(True, False, 128, 4, 3): 2, (True, True, 128, 4, 3): 3,
            (False, True, 64, 4, 3): 4, (False, True, 128, 4, 3): 3}


def programs_per_sm(registers: int, shared: int, num_warps: int) -> int:
    """Programs of a compiled kernel that fit on one sm_90 SM at once, from its registers per
    thread and shared memory per program (bytes): 64 K registers allocated per warp in units
    of 256 (8 per thread), 228 KiB of shared memory with 1 KiB reserved per program, 64 warps,
    32 programs. (How :data:`RESIDENT` is checked against the sm_90 compile in the tests.)"""
    per_warp = -(-registers * 32 // 256) * 256
    by_registers = 65536 // (per_warp * num_warps)
    by_shared = (228 * 1024) // (shared + 1024)
    return max(0, min(by_registers, by_shared, 64 // num_warps, 32))


def resident_programs(paged: bool, kv_fp8: bool, launch: Tuple[int, ...], elem_bytes: int,
                      d: int, d_v: int) -> Optional[int]:
    """Programs of this launch config per SM where measured (:data:`RESIDENT`: 16-bit math,
    head dims padded to 128), else None (registers and shared memory, hence residency,
    change with the head dim)."""
    if elem_bytes != 2 or config.next_pow2(d) != 128 or config.next_pow2(d_v) != 128:
        return None
    return RESIDENT.get((paged, kv_fp8) + tuple(launch[:3]))


def _whole_waves(base: int, sms: int, unsplit: int, split: int, most: int) -> int:
    """The split count in [1, most] whose grid (``base`` programs per split) ends closest to a
    whole number of waves of the resident slots (``unsplit`` / ``split`` programs per SM for
    the launch config of one split / of more): a grid of 1.29 waves runs its last wave a third
    full. Ties go to the smallest count when the waves are >= 90 % full, else to the largest:
    a wave 81 % full leaves some SMs a program short whatever the count, and more, shorter
    programs even that out (paged e4m3 at (40, 32k): 1.14 ms for 1 split, 1.02 for 2 or 4)."""
    def filled(splits: int) -> float:
        waves = base * splits / ((unsplit if splits == 1 else split) * sms)
        return round(waves / math.ceil(waves), 2)
    return max(range(1, max(1, most) + 1),
               key=lambda s: (filled(s), s if filled(s) < 0.9 else -s))


def num_splits_heuristic(batch: int, nheads_k: int, m_blocks: int, max_seqlen_k: int,
                         block_n: int, device: torch.device, paged: bool = False,
                         kv_fp8: bool = False, waves: Optional[float] = None,
                         resident: Optional[Tuple[int, int]] = None) -> int:
    """Splits of the key range so that the grid fills the GPU (from shapes only).

    Programs without a split: ``batch * nheads_k * m_blocks``. When they already cover most
    multiprocessors, one split (no combine pass). Otherwise fill ``waves`` programs per
    multiprocessor (FLASHATTN_DECODE_WAVES; default 1 for a contiguous 16-bit cache, 2 paged
    or FP8: the H100 sweep of 2026-11-23 measured +2-4 % for 1 over 2 contiguous at (1, 16k),
    (1, 128k) and (8, 8k), and -5 to -15 % paged; an e4m3 cache at (1, 128k) took 0.118 ms
    with 2 against 0.139 with 1, 0.145 with 3 and 0.125 with 4 on 2026-11-28: a program
    widens every value it reads, so one program per SM cannot keep the memory busy), never
    giving a split fewer than 4 key blocks (the fixed cost of loading q and writing a partial
    row must stay small next to its K/V stream). ``waves``: the caller's own count (the Hopper
    MLA decode kernel, one CTA per SM: 1). ``resident``: (unsplit, split) programs per SM of
    the launch configs one split and more run (:func:`resident_programs`), where measured:
    the split one is the default for ``waves``, and a grid already full without splitting is
    split into whole waves of those slots (at most 4 splits of >= 16 key blocks each).
    """
    sms = config.sm_count(device)
    base = max(1, batch * nheads_k * m_blocks)
    n_blocks = config.cdiv(max(1, max_seqlen_k), block_n)
    if n_blocks < 8:
        return 1
    if base >= 0.8 * sms:
        if resident is None:
            return 1
        return _whole_waves(base, sms, resident[0], resident[1], min(4, n_blocks // 16))
    # ``waves`` programs per SM are resident at once (shared memory allows 2-3): fill those
    # slots in one round; rounding down keeps the grid from spilling a sliver into a second.
    if waves is None:
        waves = float(_env.settings().decode_waves
                      or (resident[1] if resident else (2 if paged or kv_fp8 else 1)))
    want = int(waves * sms) // base
    return int(max(1, min(want, n_blocks // 4, MAX_SPLITS)))


def block_m_for(rows: int, cap: int = 64) -> int:
    """Rows of the packed query tile: the whole group x positions up to ``cap`` (64; tl.dot
    needs 16)."""
    return max(16, min(cap, config.next_pow2(max(1, rows))))


@functools.lru_cache(maxsize=1024)
def _launch_plan(d: int, d_v: int, elem_bytes: int, paged: bool, g: int, s_q_grid: int,
                 batch: int, nheads_k: int, max_seqlen_k: int, num_splits: int,
                 device: torch.device, env_config: str, env_waves: str, kv_fp8: bool = False,
                 waves: Optional[float] = None
                 ) -> Tuple[int, int, int, bool, int, int, int, int, int]:
    """Every launch decision that depends only on shapes, cached per shape key.

    A decode step runs the same shapes thousands of times; recomputing the heuristic, the
    tile sizes and the multiprocessor count each call was a measurable part of the ~tens of
    microseconds of host time per step. The environment overrides are part of the key so that
    probes changing them between calls still take effect.

    Returns (BLOCK_N, num_warps, num_stages, allow_tma, BLOCK_M, m_blocks, num_splits,
    BLOCK_D, BLOCK_DV).
    """
    block_n, num_warps, num_stages, allow_tma = launch_config(d, elem_bytes, paged,
                                                              kv_fp8=kv_fp8, head_dim_v=d_v)
    # (fp32 with V past 256 wide: a 64-row fp32 accumulator of 512 columns and the fp32 qv
    # tile spill kilobytes at any BLOCK_N (sm_90 compile report); 32 rows spill <= 24 bytes)
    block_m = block_m_for(g * s_q_grid, 32 if (d_v > 256 and elem_bytes >= 4) else 64)
    m_blocks = config.cdiv(g * s_q_grid, block_m)
    full_grid = batch * nheads_k * m_blocks >= 0.8 * config.sm_count(device)
    split_cfg = (block_n, num_warps, num_stages, allow_tma)
    # the config of one split over long streams on a full grid (else the same as split_cfg)
    unsplit_cfg = (launch_config(d, elem_bytes, paged, True, kv_fp8=kv_fp8, head_dim_v=d_v)
                   if full_grid and max_seqlen_k >= 16384 else split_cfg)
    if num_splits <= 0:
        # programs per SM of the configs that one split / more splits run, where measured
        # (not for an overridden config, nor with the caller's own waves)
        resident = None
        if not env_config and waves is None:
            pair = tuple(resident_programs(paged, kv_fp8, c, elem_bytes, d, d_v)
                         for c in (unsplit_cfg, split_cfg))
            resident = pair if None not in pair else None
        num_splits = num_splits_heuristic(batch, nheads_k, m_blocks, max_seqlen_k, block_n,
                                          device, paged, kv_fp8, waves, resident)
    num_splits = max(1, min(int(num_splits), MAX_SPLITS,
                            config.cdiv(max(1, max_seqlen_k), block_n)))
    if num_splits == 1:
        block_n, num_warps, num_stages, allow_tma = unsplit_cfg
    return (block_n, num_warps, num_stages, allow_tma, block_m, m_blocks, num_splits,
            config.block_dim(d), config.block_dim(d_v))


def decode_attention(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                     seqlens_k: torch.Tensor, seqlen_k_add: int, *,
                     softmax_scale: float, window_left: int, window_right: int, softcap: float,
                     alibi_slopes: Optional[torch.Tensor], num_splits: int,
                     max_seqlen_k: int, leftpad: Optional[torch.Tensor] = None,
                     batch_idx: Optional[torch.Tensor] = None,
                     block_table: Optional[torch.Tensor] = None,
                     cu_seqlens_q: Optional[torch.Tensor] = None, max_seqlen_q: int = 0,
                     buffers: Optional[dict] = None, attention_chunk: int = 0,
                     k_descale: Optional[torch.Tensor] = None,
                     v_descale: Optional[torch.Tensor] = None,
                     qv: Optional[torch.Tensor] = None,
                     q_descale: Optional[torch.Tensor] = None,
                     partials: Optional[Callable[..., None]] = None,
                     out_dtype: Optional[torch.dtype] = None,
                     ) -> Tuple[torch.Tensor, torch.Tensor]:
    """Attention of q against a KV cache (Triton). Inputs are validated and normalised.

    q: (b, s_q, h, d), or packed (total_q, h, d) with ``cu_seqlens_q`` (b + 1,) int32.
    k_cache / v_cache: (b_cache, s_cache, h_k, d / d_v), or paged (num_blocks, page_size,
    h_k, d / d_v) with ``block_table`` (b, max_blocks) int32.
    seqlens_k: (b,) int32: end of each row's keys in cache positions, minus ``seqlen_k_add``
    (the kvcache API passes cache_seqlens and s_new); ``leftpad`` (b,) int32 their start.
    alibi_slopes: float32 (b, h) (stride 0 allowed) or None. num_splits: 0 = heuristic.
    max_seqlen_k: an upper bound of the key count from shapes (sizes the split heuristic).
    attention_chunk: 0, or C > 0: chunked local attention (a query at local key position p
    sees only keys j with j // C == floor(p / C), besides the window).
    k_descale / v_descale: float32 (b, h_k), both given exactly when the caches are
    float8_e4m3fn (real value = fp8 * descale); q stays 16/32-bit and sets the math's dtype.
    qv: None, or q's shape with d_v (FlashAttention-3's latent query, multi-head latent
    attention): ``qv . v`` joins the scores (before the scale), against each V tile as it is
    loaded for the PV product.
    q_descale: float32 (b, h_k), given exactly when q is float8_e4m3fn (or its rotated bf16
    copy) over an FP8 cache: the math runs in bf16 and out is bf16.
    buffers: None, or a dict the caller keeps between calls of one shape (a decode plan): the
    outputs and split workspaces are allocated into it on the first call and reused after
    (dense queries only; the returned out / lse are those buffers).
    partials: None, or another kernel family's launcher of the split partials for this call
    (the Hopper MLA decode kernel, chosen by dispatch): it runs instead of the decode kernel
    (:class:`DecodeCall`).

    out_dtype: None, or out's dtype when not the math's (float32: the result unrounded, for
    a pass that still scales it: learnable sinks).

    Returns out like q (dtype of q; bf16 with q_descale; ``out_dtype`` when given) and lse
    float32 (b, h, s_q) (packed: (h, total_q)).
    """
    planned = buffers is not None and cu_seqlens_q is None
    call = None
    if planned:
        # a decode plan fixes everything but the strides and alignments (its run checks the
        # rest): one DecodeCall per stride set, kept in the plan's dict
        sig = ("call",) + tuple(None if t is None else (t.stride(), t.data_ptr() % 16)
                                for t in (q, k_cache, v_cache, seqlens_k, block_table))
        call = buffers.get(sig)
    if call is None:
        call = DecodeCall(q, k_cache, v_cache, seqlens_k, seqlen_k_add,
                          softmax_scale=softmax_scale, window_left=window_left,
                          window_right=window_right, softcap=softcap, alibi_slopes=alibi_slopes,
                          num_splits=num_splits, max_seqlen_k=max_seqlen_k, leftpad=leftpad,
                          batch_idx=batch_idx, block_table=block_table,
                          cu_seqlens_q=cu_seqlens_q, max_seqlen_q=max_seqlen_q,
                          attention_chunk=attention_chunk, plans=buffers,
                          k_descale=k_descale, v_descale=v_descale, qv=qv,
                          q_descale=q_descale, partials=partials, out_dtype=out_dtype)
        if planned:
            buffers[sig] = call
    return call(q, k_cache, v_cache, seqlens_k, leftpad, batch_idx, block_table, alibi_slopes,
                cu_seqlens_q, buffers=buffers, k_descale=k_descale, v_descale=v_descale,
                qv=qv, q_descale=q_descale)


_N_TENSORS = 15  # the kernel's tensor arguments (Q ... VDescale, QV, QDescale): plan slots
# plain (unplanned) calls' launch plans, shared: a repeated call shape replays its launches
_PLAIN_DECODE = LaunchPlans(slots=tuple(range(_N_TENSORS)))
_PLAIN_COMBINE = LaunchPlans(slots=(0, 1, 2, 3))
_ALIGN = 16  # floats between the pieces of the split workspace (64 bytes: Triton's 16 and more)


class DecodeCall:
    """:func:`decode_attention` for one *call signature*, its host work done once.

    Every decision of a decode launch (tile sizes, splits, TMA, grid, the kernel's 42 scalar
    arguments and 24 constexprs, the output shapes) follows from the tensors' shapes, strides,
    dtypes, devices and 16-byte alignment, which optional tensors are given, the scalars and
    the runtime settings. A caller that keys its calls on all of those (the api's fast path per
    call signature, a decode plan per stride set) builds one DecodeCall per key and calls it
    with each call's tensors: after the first call, a call allocates its outputs (two
    allocations: out, and one float32 workspace holding lse and the split partials) and
    replays the recorded launches with the tensors' addresses. That is the decode step's host
    path (tens of microseconds of Python per step were the decisions and the
    argument tuples, rebuilt on every call).

    The constructor takes the first call's tensors (only their metadata is read).
    """

    def __init__(self, q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                 seqlens_k: torch.Tensor, seqlen_k_add: int, *, softmax_scale: float,
                 window_left: int, window_right: int, softcap: float,
                 alibi_slopes: Optional[torch.Tensor], num_splits: int, max_seqlen_k: int,
                 leftpad: Optional[torch.Tensor] = None,
                 batch_idx: Optional[torch.Tensor] = None,
                 block_table: Optional[torch.Tensor] = None,
                 cu_seqlens_q: Optional[torch.Tensor] = None, max_seqlen_q: int = 0,
                 attention_chunk: int = 0, plans: Optional[dict] = None,
                 k_descale: Optional[torch.Tensor] = None,
                 v_descale: Optional[torch.Tensor] = None,
                 qv: Optional[torch.Tensor] = None,
                 q_descale: Optional[torch.Tensor] = None,
                 partials: Optional[Callable[..., None]] = None,
                 out_dtype: Optional[torch.dtype] = None) -> None:
        varlen = cu_seqlens_q is not None
        if varlen:
            _, h, d = q.shape
            batch = cu_seqlens_q.shape[0] - 1
            s_q_grid = max(1, int(max_seqlen_q))
            q_shape4 = (1,) + tuple(q.shape)
        else:
            batch, s_q, h, d = q.shape
            s_q_grid = s_q
            q_shape4 = tuple(q.shape)
        paged = block_table is not None
        nheads_k, d_v = k_cache.shape[2], v_cache.shape[3]
        g = h // nheads_k
        device = q.device
        if device.type == "cuda" and device.index is None:
            device = torch.device("cuda", torch.cuda.current_device())
        # the math's dtype: q's, bf16 for an FP8 q (widened on load); out is in it too
        math_dtype = torch.bfloat16 if q.dtype == torch.float8_e4m3fn else q.dtype
        math_t = torch.empty((), dtype=math_dtype, device="meta")
        (block_n, num_warps, num_stages, allow_tma, block_m, m_blocks, num_splits, block_d,
         block_dv) = _launch_plan(d, d_v, math_t.element_size(), paged, g, s_q_grid, batch,
                                  nheads_k, int(max_seqlen_k), int(num_splits), device,
                                  _env.settings().decode_config,
                                  _env.settings().decode_waves, k_descale is not None,
                                  # the Hopper MLA kernel (one CTA per SM): one wave of splits,
                                  # 1.15-1.28x faster than two on the H200 (NOTES, 2026-11-28)
                                  None if partials is None else 1.0)
        k_strides = k_cache.stride()
        kv_fp8 = k_descale is not None
        # (FP8 caches take pointer loads: the TMA tile path was sized and verified for 16/32-bit
        # elements only)
        self.use_tma = (allow_tma and not paged and not kv_fp8 and k_strides[1] > 0
                        and config.use_tma(k_cache, v_cache)
                        and (d * k_cache.element_size()) % 16 == 0
                        and (d_v * v_cache.element_size()) % 16 == 0
                        and d == block_d and d_v == block_dv
                        # (a TMA box has at most 256 elements a side: wider V tiles use
                        # pointer loads)
                        and block_dv <= _TMA_MAX_BOX)
        # e4m3 V read as int16 byte pairs (module doc): 16-bit math, no qv, and every V offset
        # even, the base 16-byte aligned as every recorded launch checks (an int16 load at an
        # odd byte address would fault); V tiles of 64 columns or more (the sm_90 compiles of
        # 16 / 32 columns took more registers that way: d 32 186 against 82, d 16 8 bytes
        # spilled)
        self.v_pairs = (V_PAIRS and kv_fp8 and qv is None and math_t.element_size() == 2
                        and d_v % 2 == 0 and block_dv >= 64
                        and v_cache.data_ptr() % 16 == 0
                        and all(st % 2 == 0 for st in v_cache.stride()[:3]))
        # e4m3 K read as int16 byte pairs too (K_PAIRS), on the same terms
        self.k_pairs = (K_PAIRS and kv_fp8 and qv is None and math_t.element_size() == 2
                        and d % 2 == 0 and block_d >= 64 and k_cache.data_ptr() % 16 == 0
                        and all(st % 2 == 0 for st in k_strides[:3]))
        # (out in the math's dtype, or ``out_dtype``: the kernels store through its pointer)
        self.varlen, self.num_splits, self.device, self.dtype = (varlen, num_splits, device,
                                                                 out_dtype or math_dtype)
        # another family's kernel for the split partials (the Hopper MLA decode kernel), given
        # this call's tensors and the partial outputs; the combine pass stays this one's
        self.partials, self.seqlen_k_add = partials, int(seqlen_k_add)
        self.grid = (batch * nheads_k * m_blocks, 1, num_splits)
        # outputs: out (q's shape with d_v), lse (b, h, s_q) or packed (h, total_q); with
        # splits the float32 partials (splits, *out) and (splits, *lse4), lse4 = lse as 4-D
        self.out_shape = q_shape4[:-1] + (d_v,)
        self.lse_shape = (h, q.shape[0]) if varlen else (batch, h, s_q_grid)
        lse4_shape = (1,) + self.lse_shape if varlen else self.lse_shape
        self.part_shapes = ((num_splits,) + self.out_shape, (num_splits,) + lse4_shape)
        self.lse_numel = math.prod(self.lse_shape)
        aligned = lambda n: config.cdiv(n, _ALIGN) * _ALIGN  # noqa: E731
        self.offsets = (aligned(self.lse_numel),
                        aligned(self.lse_numel) + aligned(math.prod(self.part_shapes[0])))
        self.ws_numel = self.offsets[1] + math.prod(self.part_shapes[1])
        # (the strides torch gives fresh tensors of these shapes: what the views below have)
        o_strides = _fresh_strides(self.part_shapes[0] if num_splits > 1
                                   else (1,) + self.out_shape)
        l_strides = _fresh_strides(self.part_shapes[1] if num_splits > 1
                                   else (1,) + lse4_shape)
        if num_splits == 1:
            o_strides, l_strides = (0,) + o_strides[1:], (0,) + l_strides[1:]
        if varlen:
            # one packed batch: the sequence offset comes from cu_seqlens, not the batch stride
            o_strides = (o_strides[0], 0) + tuple(o_strides[2:])
            l_strides = (l_strides[0], 0) + tuple(l_strides[2:])
            q_strides = (0, q.stride(0), q.stride(1))
        else:
            q_strides = q.stride()[:3]
        page_size = k_cache.shape[1] if paged else 1
        alibi_strides = alibi_slopes.stride() if alibi_slopes is not None else (0, 0)
        kd_strides = k_descale.stride() if kv_fp8 else (0, 0)
        vd_strides = v_descale.stride() if kv_fp8 else (0, 0)
        qv_strides = (0, 0, 0)
        if qv is not None:  # (packed like q: the sequence offset comes from cu_seqlens)
            qv_strides = (0, qv.stride(0), qv.stride(1)) if varlen else qv.stride()[:3]
        qd_strides = q_descale.stride() if q_descale is not None else (0, 0)
        # the kernel's arguments after its 15 tensors (``Q ... VDescale, QV, QDescale``)
        self.scalars = (
            *q_strides,
            *k_strides[:3], *v_cache.stride()[:3],
            *o_strides[:4], *l_strides,
            block_table.stride(0) if paged else 0, alibi_strides[0], alibi_strides[1],
            *kd_strides, *vd_strides, *qv_strides, *qd_strides,
            s_q_grid, int(seqlen_k_add), k_cache.shape[1], nheads_k, batch * nheads_k,
            # clamp bounds: cache rows / pages, positions per sequence, packed query rows
            k_cache.shape[0],
            block_table.shape[1] * page_size if paged else k_cache.shape[1],
            q.shape[0] if varlen else 0,
            float(softmax_scale), float(softcap), int(window_left), int(window_right),
            max(int(attention_chunk), 1))
        self.kwargs = dict(
            G=g, HEAD_DIM=d, HEAD_DIM_V=d_v,
            BLOCK_D=block_d, BLOCK_DV=block_dv,
            BLOCK_M=block_m, BLOCK_N=block_n, PAGE_SIZE=page_size,
            PAGED=paged, HAS_LEFTPAD=leftpad is not None,
            HAS_BATCH_IDX=batch_idx is not None,
            VARLEN_Q=varlen, HAS_LEFT=window_left >= 0, HAS_RIGHT=window_right >= 0,
            HAS_CHUNK=attention_chunk > 0, HAS_SOFTCAP=softcap > 0.0,
            HAS_ALIBI=alibi_slopes is not None,
            UPCAST=config.upcast_dots(math_t), DOT_PREC=config.dot_precision(math_t),
            USE_TMA=self.use_tma, KV_FP8=kv_fp8, HAS_QV=qv is not None,
            Q_FP8=q_descale is not None, ASM_CVT=not config.INTERPRET,
            V_PAIRS=self.v_pairs, K_PAIRS=self.k_pairs,
            num_warps=num_warps, num_stages=num_stages,
        )
        # the shared plans' key: the launch's every argument but the 15 tensors (the inputs'
        # metadata, the scalars, the constexprs and options) and its grid, whose split count
        # no other part shows (the partials' strides are the same for any count > 1; a key
        # without it replayed another call's split count: wrong results, GPU suite 2026-11-24)
        tensor_meta = tuple(None if t is None else (t.shape, t.stride(), t.dtype) for t in
                            (q, k_cache, v_cache, seqlens_k, leftpad, batch_idx, block_table,
                             alibi_slopes, cu_seqlens_q, k_descale, v_descale, qv,
                             q_descale))
        self.key = (tensor_meta, self.scalars, tuple(self.kwargs.values()), self.grid,
                    self.dtype)
        if plans is not None and not varlen:  # a decode plan's own (dropped with the plan)
            self.plans = (plans.setdefault("decode", LaunchPlans(slots=tuple(range(_N_TENSORS)))),
                          plans.setdefault("combine", LaunchPlans(slots=(0, 1, 2, 3))))
        else:
            self.plans = (_PLAIN_DECODE, _PLAIN_COMBINE)
        self._decode: Optional[LaunchPlan] = None  # recorded by the first call's launch
        self._combine: Optional[LaunchPlan] = None

    def _outputs(self, buffers: Optional[dict], q: torch.Tensor):
        """(out, lse, lse4, out_k, lse_k, workspace): the outputs and, with splits, the
        float32 partials (views of one workspace); from ``buffers`` (a decode plan's, dense
        queries only) when it holds them for this call, else allocated (and kept there)."""
        if buffers is not None and not self.varlen and buffers.get("call") is self:
            return buffers["outputs"]
        device = self.device
        # (packed rows outside every sequence: the kernel writes them, _write_empty_rows)
        ws = torch.empty((self.ws_numel,), dtype=torch.float32, device=device)
        lse = ws[:self.lse_numel].view(self.lse_shape)
        out = torch.empty(self.out_shape, dtype=self.dtype, device=device)
        lse4 = lse.unsqueeze(0) if self.varlen else lse
        if self.num_splits > 1:
            (o0, l0), (po, pl) = self.offsets, self.part_shapes
            out_k = ws[o0:o0 + math.prod(po)].view(po)
            lse_k = ws[l0:l0 + math.prod(pl)].view(pl)
        else:
            out_k, lse_k = out, lse4
        outputs = (out, lse, lse4, out_k, lse_k, ws)
        if buffers is not None and not self.varlen:
            buffers.update(call=self, outputs=outputs)
        return outputs

    def __call__(self, q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                 seqlens_k: torch.Tensor, leftpad: Optional[torch.Tensor],
                 batch_idx: Optional[torch.Tensor], block_table: Optional[torch.Tensor],
                 alibi_slopes: Optional[torch.Tensor], cu_seqlens_q: Optional[torch.Tensor] = None,
                 buffers: Optional[dict] = None, need_lse: bool = True,
                 k_descale: Optional[torch.Tensor] = None,
                 v_descale: Optional[torch.Tensor] = None,
                 qv: Optional[torch.Tensor] = None,
                 q_descale: Optional[torch.Tensor] = None
                 ) -> Tuple[torch.Tensor, Optional[torch.Tensor]]:
        """out like q with d_v, lse float32 (see :func:`decode_attention`), for tensors of the
        signature this call was made for. ``buffers``: a decode plan's dict (outputs reused).
        ``need_lse`` False: the caller drops the LSE, so a replayed call may return None for
        it and keep the LSE and the split partials in the stream's reused workspace
        (``runtime.buffers``) instead of allocating one. ``k_descale`` / ``v_descale``: an FP8
        cache's (b, h_k) float32 descales, ``qv`` the latent query, ``q_descale`` an FP8
        q's (each given exactly when the call was made with it)."""
        if self._decode is not None and (self._combine is not None or self.num_splits == 1):
            replayed = self._replay(q, k_cache, v_cache, seqlens_k, leftpad, batch_idx,
                                    block_table, alibi_slopes, buffers, need_lse,
                                    cu_seqlens_q, k_descale, v_descale, qv, q_descale)
            if replayed is not None:
                return replayed
        out, lse, lse4, out_k, lse_k, _ = self._outputs(buffers, q)
        if self.partials is not None:  # (never recorded: self._decode stays None)
            self.partials(q, qv, k_cache, v_cache, seqlens_k, self.seqlen_k_add, block_table,
                          out_k, lse_k, self.num_splits, k_descale=k_descale,
                          v_descale=v_descale)
            return self._combine_splits(out, lse, lse4, out_k, lse_k)
        if self.use_tma:
            config.install_allocator()
        tensors = _slots(q.unsqueeze(0) if self.varlen else q, k_cache, v_cache, out_k, lse_k,
                         seqlens_k, leftpad, batch_idx, block_table, alibi_slopes, cu_seqlens_q,
                         lse, k_descale, v_descale,
                         None if qv is None else (qv.unsqueeze(0) if self.varlen else qv),
                         q_descale)
        decode_plans = self.plans[0]
        self._decode = decode_plans.launch(
            self.key, tensors,
            lambda: (_decode_kernel, self.grid, tensors + self.scalars, self.kwargs))
        return self._combine_splits(out, lse, lse4, out_k, lse_k)

    def _combine_splits(self, out, lse, lse4, out_k, lse_k):
        """With splits, the combine pass of the partials into out / lse (recorded); the
        call's (out, lse)."""
        if self.num_splits > 1:
            parts = (out_k, lse_k, out, lse4)
            key = tuple((t.shape, t.stride(), t.dtype) for t in parts)
            self._combine = self.plans[1].launch(key, parts, lambda: combine_launch(*parts))
        return (out[0] if self.varlen else out), lse

    def _replay(self, q, k_cache, v_cache, seqlens_k, leftpad, batch_idx, block_table,
                alibi_slopes, buffers, need_lse=True, cu_seqlens_q=None, k_descale=None,
                v_descale=None, qv=None, q_descale=None
                ) -> Optional[Tuple[torch.Tensor, Optional[torch.Tensor]]]:
        """A repeated call: two allocations (none with a plan's buffers, one without the
        LSE) and the recorded launches with the tensors' addresses. None (nothing launched)
        when a plan cannot replay now (fast launches off, a profiler listening, another
        current device)."""
        lse = None
        if buffers is not None:
            out, lse, _, _, _, ws = self._outputs(buffers, q)
        else:
            if need_lse:  # (lse is a view of the workspace)
                ws = torch.empty((self.ws_numel,), dtype=torch.float32, device=self.device)
            else:  # lse and the partials live only until this call's combine has run
                ws = stream_buffer("decode-workspace", 4 * self.ws_numel, self.device.index)
            # (ws, not just its address, is held until the launches are enqueued: during graph
            # capture it is a fresh block of the graph's pool, which out would be given again)
            out = torch.empty(self.out_shape, dtype=self.dtype, device=self.device)
        base = ws.data_ptr()
        if self.num_splits > 1:
            o_k, l_k = base + 4 * self.offsets[0], base + 4 * self.offsets[1]
        else:
            o_k, l_k = out.data_ptr(), base
        if self.use_tma:
            config.install_allocator()
        addr = lambda t: None if t is None else t.data_ptr()  # noqa: E731
        if not self._decode.replay(_slots(
                q.data_ptr(), k_cache.data_ptr(), v_cache.data_ptr(), o_k, l_k,
                seqlens_k.data_ptr(), addr(leftpad), addr(batch_idx), addr(block_table),
                addr(alibi_slopes), addr(cu_seqlens_q), base, addr(k_descale),
                addr(v_descale), addr(qv), addr(q_descale))):
            return None
        if self.num_splits > 1 and not self._combine.replay((o_k, l_k, out.data_ptr(), base)):
            raise RuntimeError("flashattn: the split-KV combine launch could not be replayed "
                               "right after its decode launch")  # (same checks: cannot happen)
        if lse is None and need_lse:
            lse = ws[:self.lse_numel].view(self.lse_shape)
        return (out[0] if self.varlen else out), lse


def _fresh_strides(shape: Tuple[int, ...]) -> Tuple[int, ...]:
    return torch.empty(shape, device="meta").stride()


def _slots(q4, k_cache, v_cache, out_k, lse_k, seqlens_k, leftpad, batch_idx, block_table,
           alibi_slopes, cu_seqlens_q, lse, k_descale=None, v_descale=None, qv=None,
           q_descale=None):
    """The decode kernel's 15 tensor arguments (``Q ... VDescale, QV, QDescale``) in order,
    as tensors (a recorded launch) or as addresses (its replay): absent optional ones stand in
    as the lengths (never read) and, for ALiBi, lse."""
    return (q4, k_cache, v_cache, out_k, lse_k, seqlens_k,
            seqlens_k if leftpad is None else leftpad,
            seqlens_k if batch_idx is None else batch_idx,
            seqlens_k if block_table is None else block_table,
            lse if alibi_slopes is None else alibi_slopes,
            seqlens_k if cu_seqlens_q is None else cu_seqlens_q,
            seqlens_k if k_descale is None else k_descale,
            seqlens_k if v_descale is None else v_descale,
            seqlens_k if qv is None else qv,
            seqlens_k if q_descale is None else q_descale)


def planned_splits(batch: int, seqlen_q: int, max_seqlen_k: int, nheads: int, nheads_k: int,
                   headdim: int, headdim_v: int, dtype: torch.dtype, paged: bool,
                   device: torch.device, waves: Optional[float] = None) -> int:
    """The key splits decode_attention would choose for these shapes (num_splits = 0); an FP8
    ``dtype`` (FlashAttention-3's qkv_dtype) computes in bf16; ``waves`` as the DecodeCall of
    a call with ``partials`` passes it (1: the Hopper MLA decode kernel's one wave)."""
    kv_fp8 = dtype == torch.float8_e4m3fn
    if kv_fp8:
        dtype = torch.bfloat16
    elem = torch.empty((), dtype=dtype).element_size()
    plan = _launch_plan(headdim, headdim_v, elem, paged, nheads // nheads_k, max(1, seqlen_q),
                        batch, nheads_k, int(max_seqlen_k), 0, device,
                        _env.settings().decode_config, _env.settings().decode_waves, kv_fp8,
                        waves)
    return plan[6]


__all__ = ["DecodeCall", "planned_splits", "decode_attention", "num_splits_heuristic",
           "programs_per_sm", "resident_programs",
           "launch_config", "block_m_for", "MAX_SPLITS"]
