"""FlashAttention-3-style backward for sm90 at head dims 192 / 256 (D_PAD = 256), in Gluon.

Why a second kernel: bwd_kernel.py keeps fp32 dK and dV of 64 keys x D_PAD per consumer
warpgroup in registers, 2 * 64 * 256 / 128 = 256 registers per thread at D_PAD = 256, over the
240 a consumer may have. Here the two consumer warpgroups split the *head dim* of dK / dV
instead of the keys: one CTA per key block of BLOCK_N = 64 keys, consumer w keeps
dK[:, w*128:(w+1)*128] and dV[:, w*128:(w+1)*128] (64 + 64 registers per thread). The
register file (64K registers per SM) holds the fp32 dK + dV of 64 keys x 256 columns with room
for the rest, not of 128 keys: BLOCK_N = 64 is forced.

Per query block i (BLOCK_M = 64 queries; HALF_M = 32 queries per consumer), consumer w
(everything transposed: rows are keys, columns are queries):

    S^T_w  = K Q_w^T            wgmma 64 keys x 32 queries (K = 256), A = K (smem)
    dP^T_w = V dO_w^T           issued together with S^T_w
    P^T_w  = exp2(S^T_w * scale_log2 - lse2_w)    (mask on boundary / diagonal blocks only)
    dS^T_w = P^T_w * (dP^T_w - delta_w)           (* (1 - tanh^2) with softcap)
    P^T_w, dS^T_w -> shared memory (a [64, 32] tile per consumer); both consumers wait for
    all four tiles (p_ready, count 2), then, with j over the two query halves:
    dV_w   += sum_j P^T_j  dO[j, w cols]          wgmma 64 x 128 (K = 32 each)
    dK_w   += sum_j dS^T_j Q[j, w cols]
    dQ^T[w cols, j] = K[:, w cols]^T dS^T_j       wgmma 64 x 32 per 64 head-dim rows
    and the four dQ^T pieces (64 head-dim rows x 32 queries, fp32, already scaled) go to the
    transposed fp32 workspace (b, h, D_PAD, s_q_pad) by TMA reduce-add through a per-consumer
    staging tile (bwd_postprocess.py turns it into dq).

The producer warp is bwd_kernel's (K, V once; Q, dO ring; row statistics).

Where the time goes (H100, d = 256, 16k tokens, measured with switches that break the result,
benchmarks/NOTES.md): without the dQ^T GEMMs and their reduce the rest runs at 650 TFLOP/s
(5-GEMM count); staging and reducing the four dQ^T pieces one after another through the single
8 KiB tile per consumer is what costs (336 as first written). So the schedule hides the staging
behind tensor-core work: the second round of dQ^T GEMMs runs while the first round's pieces are
staged, and with PIPELINE the next block's S^T / dP^T run while the second round's are
(336 -> 360 -> 372 at 16k). A second staging tile or [64, 64] pieces would not fit: shared
memory is full (below).

Shared memory at D_PAD = 256, 16-bit inputs: K + V 64 KiB, Q + dO rings 2 stages x 64 KiB,
P^T / dS^T 16 KiB (one slot), dQ staging 2 x 8 KiB, statistics 1 KiB: 225 KiB of the 227.
"""
from __future__ import annotations

from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import (fence_async_shared, mbarrier, tma,
                                                               warpgroup_mma, warpgroup_mma_wait)

from flashattn.runtime.gluon_api import cta_barrier, tma_load, tma_store  # noqa: F401 (version names)

from flashattn.runtime.gluon_builtins import tma_reduce_add_from_shared
from flashattn.backends.sm90.bwd_epilogue import store_kv_grads
from flashattn.backends.sm90.bwd_producer import alloc_query_streams, producer
from flashattn.backends.sm90.row_guard import padding_follows, zero_keys_past, zero_rows_from
from flashattn.backends.sm90.softmax import ds_t, probs_t
from flashattn.backends.sm90.tiles import block_needs_mask_t, key_tile_geometry, query_block_range, visible_t


@gluon.jit
def _add_dq_piece(dq_desc, row, col, piece, dq_buf):
    """One dQ^T piece (DQ_ROWS head-dim rows x HALF_M queries, fp32) into the transposed
    workspace at (row, col) by TMA reduce-add from this consumer's staging tile, asynchronously:
    the next piece waits until the copy engine has read the tile. (No atomics variant: at
    d = 128 the TMA reduce measured 1.15-1.3x faster, sm90/config.py.)"""
    tma.store_wait(0)
    cta_barrier()  # no thread overwrites the tile before the previous reduce read it
    dq_buf.store(piece)
    fence_async_shared()
    cta_barrier()  # every thread's part is in shared memory before the issue
    tma_reduce_add_from_shared(dq_desc, [row, col], dq_buf)


@gluon.jit
def _issue_s_dp(k_all, v_all, q_smem, do_smem, q_ready, do_ready, s_zero, it,
                WG: gl.constexpr, BLOCK_M: gl.constexpr, D_PAD: gl.constexpr):
    """Issue S^T_w = K Q_w^T and dP^T_w = V dO_w^T of query block ``it`` (asynchronous: the
    caller waits)."""
    NUM_STAGES: gl.constexpr = q_smem.shape[0]
    HALF_M: gl.constexpr = BLOCK_M // 2
    stage = it % NUM_STAGES
    phase = (it // NUM_STAGES) & 1
    q_view = q_smem.index(stage).reshape([BLOCK_M, D_PAD])
    do_view = do_smem.index(stage).reshape([BLOCK_M, D_PAD])
    mbarrier.wait(q_ready.index(stage), phase)
    q_mine_t = q_view.slice(WG * HALF_M, HALF_M, dim=0).permute((1, 0))
    s_tok = warpgroup_mma(k_all, q_mine_t, s_zero, use_acc=False, is_async=True)
    mbarrier.wait(do_ready.index(stage), phase)
    do_mine_t = do_view.slice(WG * HALF_M, HALF_M, dim=0).permute((1, 0))
    dp_tok = warpgroup_mma(v_all, do_mine_t, s_zero, use_acc=False, is_async=True)
    return s_tok, dp_tok


@gluon.jit
def _consumer(WG: gl.constexpr, descs, smem, bars, problem, window, scales, ptrs, schedule,
              BLOCK_M: gl.constexpr, HEAD_DIM: gl.constexpr, HAS_LEFT: gl.constexpr,
              HAS_RIGHT: gl.constexpr, HAS_SOFTCAP: gl.constexpr, PIPELINE: gl.constexpr,
              LONGEST_FIRST: gl.constexpr, varlen, VARLEN: gl.constexpr,
              DQ_SEQ_ALIGN: gl.constexpr):
    """One consumer warpgroup (_consumer_tile) on this CTA's key tile, whose geometry
    (tiles.key_tile_geometry) is found once here. VARLEN: the last sequence's tiles (rows of
    no sequence may follow it: row_guard.padding_follows) run the copy with the guard, the
    others the copy without it (no cost on the common path)."""
    BLOCK_N: gl.constexpr = descs[1].block_type.shape[1]
    geom = key_tile_geometry(gl.program_id(0), varlen, (schedule[0], schedule[1], schedule[2]),
                             problem[3], problem[0], problem[1], BLOCK_N, LONGEST_FIRST, False,
                             VARLEN)
    if VARLEN:
        _, _, _, q_off, len_q, k_off, len_k, _ = geom
        if padding_follows(varlen, q_off + len_q, k_off + len_k, problem[0], problem[1]):
            _consumer_tile(WG, descs, smem, bars, problem, window, scales, ptrs, schedule,
                           geom, BLOCK_M, HEAD_DIM, HAS_LEFT, HAS_RIGHT, HAS_SOFTCAP,
                           PIPELINE, varlen, VARLEN, DQ_SEQ_ALIGN, True)
        else:
            _consumer_tile(WG, descs, smem, bars, problem, window, scales, ptrs, schedule,
                           geom, BLOCK_M, HEAD_DIM, HAS_LEFT, HAS_RIGHT, HAS_SOFTCAP,
                           PIPELINE, varlen, VARLEN, DQ_SEQ_ALIGN, False)
    else:
        _consumer_tile(WG, descs, smem, bars, problem, window, scales, ptrs, schedule, geom,
                       BLOCK_M, HEAD_DIM, HAS_LEFT, HAS_RIGHT, HAS_SOFTCAP, PIPELINE, varlen,
                       VARLEN, DQ_SEQ_ALIGN, False)


@gluon.jit
def _consumer_tile(WG: gl.constexpr, descs, smem, bars, problem, window, scales, ptrs,
                   schedule, geom, BLOCK_M: gl.constexpr, HEAD_DIM: gl.constexpr,
                   HAS_LEFT: gl.constexpr, HAS_RIGHT: gl.constexpr, HAS_SOFTCAP: gl.constexpr,
                   PIPELINE: gl.constexpr, varlen, VARLEN: gl.constexpr,
                   DQ_SEQ_ALIGN: gl.constexpr, GUARD: gl.constexpr):
    """One consumer warpgroup's key tile ``geom`` (tiles.key_tile_geometry's tuple): head-dim
    columns [WG * HALF_D, (WG + 1) * HALF_D) of dK / dV, queries [WG * HALF_M, (WG + 1) *
    HALF_M) of each block for S^T / dP^T. VARLEN: the tile's
    sequence from tiles.varlen_key_tile (packed (1, total, h, d) tensors): masks by its
    lengths, queries past its end masked too (they are the next sequence's rows, with finite
    lse), dK / dV rows from its offset, dQ^T columns from DQ_SEQ_ALIGN * (sequence + q offset
    // DQ_SEQ_ALIGN): the TMA reduce's innermost coordinate must be 16-byte aligned (an
    illegal instruction otherwise, measured), and this start is, for every sequence, past the
    previous sequence's end (bwd_postprocess.dq_from_packed_workspace reads it back).
    GUARD (the last sequence of a packed call): the rows past its end, keys and queries, are
    zeroed in shared memory before the GEMMs read them (row_guard.py), and dS is 0 where P
    is (S^T / dP^T of a block may have read its rows before they were zeroed)."""
    q_desc, k_desc, v_desc, do_desc, dq_desc = descs
    k_smem, v_smem, q_smem, do_smem, pds_smem, lse_smem, delta_smem, dq_smem = smem
    kv_ready, q_ready, q_empty, do_ready, do_empty, p_ready, p_free, stats_ready = bars
    seqlen_q, seqlen_k, n_heads, n_heads_k, group_size, seqlen_q_pad = problem
    window_left, window_right = window
    qk_scale, sm_scale, softcap_inv, softcap_log2 = scales
    lse2_ptr, delta_ptr, dq_ptr, dk_ptr, dv_ptr = ptrs
    BLOCK_N: gl.constexpr = k_desc.block_type.shape[1]
    D_PAD: gl.constexpr = q_desc.block_type.shape[3]
    HALF_D: gl.constexpr = D_PAD // 2
    HALF_M: gl.constexpr = BLOCK_M // 2
    DQ_ROWS: gl.constexpr = dq_desc.block_type.shape[0]  # head-dim rows of one dQ^T piece
    NUM_STAGES: gl.constexpr = q_smem.shape[0]
    dtype: gl.constexpr = q_desc.dtype

    # wgmma layouts of one warpgroup: S^T / dP^T and dQ^T pieces (64 x HALF_M), dK / dV
    # column halves (BLOCK_N x HALF_D)
    S_LAYOUT: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                       instr_shape=[16, HALF_M, 16])
    KV_LAYOUT: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                        instr_shape=[16, HALF_D, 16])
    COL_S: gl.constexpr = gl.SliceLayout(0, S_LAYOUT)

    b, h_k, n_block, q_off, len_q, k_off, len_k, seq = geom
    n_start = n_block * BLOCK_N
    if VARLEN:
        q_col = DQ_SEQ_ALIGN * (seq + q_off // DQ_SEQ_ALIGN)
    else:
        q_col = q_off

    dq_buf = dq_smem.index(WG)

    lo_blk, n_blocks = query_block_range(n_start, len_q, len_k, window_left, window_right,
                                         BLOCK_M, BLOCK_N, HAS_LEFT, HAS_RIGHT)
    dk = gl.zeros([BLOCK_N, HALF_D], gl.float32, KV_LAYOUT)
    dv = gl.zeros([BLOCK_N, HALF_D], gl.float32, KV_LAYOUT)
    s_zero = gl.zeros([BLOCK_N, HALF_M], gl.float32, S_LAYOUT)
    dq_zero = gl.zeros([DQ_ROWS, HALF_M], gl.float32, S_LAYOUT)

    mbarrier.wait(kv_ready, 0)
    if GUARD or (VARLEN and varlen[3] is not None):
        # keys past the sequence's end zeroed: S^T, dP^T and dQ^T read every row of K and V
        # (the last sequence, or any with seqused_k: keys past it are unused cache slots)
        zero_keys_past(k_smem.index(0).reshape([BLOCK_N, D_PAD]),
                       v_smem.index(0).reshape([BLOCK_N, D_PAD]), n_start, len_k)
    total = group_size * n_blocks  # (query head of the group, query block) pairs, in order
    if PIPELINE:
        # S^T / dP^T of the first block; each later one is issued at the end of the previous
        # iteration, before its last dQ^T pieces are staged
        if total > 0:
            k_0 = k_smem.index(0).reshape([BLOCK_N, D_PAD])
            v_0 = v_smem.index(0).reshape([BLOCK_N, D_PAD])
            s_tok, dp_tok = _issue_s_dp(k_0, v_0, q_smem, do_smem, q_ready, do_ready, s_zero, 0,
                                        WG, BLOCK_M, D_PAD)
            s, dp = warpgroup_mma_wait(0, deps=(s_tok, dp_tok))
        else:
            s = s_zero
            dp = s_zero
    for it in range(total):
        g = it // n_blocks
        h = h_k * group_size + g
        stage = it % NUM_STAGES
        phase = (it // NUM_STAGES) & 1
        m_start = (lo_blk + it - g * n_blocks) * BLOCK_M
        # K / V through a run-time index that is always 0 (it < 2^30): with a constant
        # address the compiler hoists all 16 K-step wgmma descriptors of K and of V out of the
        # loop, and 64-bit descriptors in registers beside dK / dV spill
        zero = it >> 30
        k_all = k_smem.index(zero).reshape([BLOCK_N, D_PAD])
        v_all = v_smem.index(zero).reshape([BLOCK_N, D_PAD])
        q_view = q_smem.index(stage).reshape([BLOCK_M, D_PAD])
        do_view = do_smem.index(stage).reshape([BLOCK_M, D_PAD])

        # ---- S^T_w and dP^T_w for this consumer's query half (both async)
        if not PIPELINE:
            s_tok, dp_tok = _issue_s_dp(k_all, v_all, q_smem, do_smem, q_ready, do_ready,
                                        s_zero, it, WG, BLOCK_M, D_PAD)
            s = warpgroup_mma_wait(1, deps=(s_tok,))
        if GUARD:
            # query rows past the sequence's end zeroed before dV / dK read Q and dO; S^T /
            # dP^T may have read them: P and dS are set to 0 there below
            if m_start + BLOCK_M > len_q:
                zero_rows_from(q_view, len_q - m_start)
                zero_rows_from(do_view, len_q - m_start)
        # lse2 = lse * log2(e), +inf for rows with no visible key and rows past s_q (P = 0)
        mbarrier.wait(stats_ready.index(stage), phase)
        lse2 = lse_smem.index(stage).slice(WG * HALF_M, HALF_M).load(COL_S)
        p, t = probs_t(s, lse2, qk_scale, softcap_inv, softcap_log2, HAS_SOFTCAP)
        masked = block_needs_mask_t(n_start, m_start, len_q, len_k, window_left, window_right,
                                    BLOCK_M, BLOCK_N, HAS_LEFT, HAS_RIGHT, VARLEN)
        if masked:
            vis = visible_t(n_start, m_start + WG * HALF_M, len_q, len_k, window_left,
                            window_right, S_LAYOUT, BLOCK_N, HALF_M, HAS_LEFT, HAS_RIGHT,
                            VARLEN)
            p = gl.where(vis, p, 0.0)
        if not PIPELINE:
            dp = warpgroup_mma_wait(0, deps=(dp_tok,))
        delta = delta_smem.index(stage).slice(WG * HALF_M, HALF_M).load(COL_S)
        ds = ds_t(p, dp, delta, t, HAS_SOFTCAP)
        if GUARD:  # (0 x NaN from rows past a sequence's end: dS is 0 where P is)
            if masked:
                ds = gl.where(p > 0.0, ds, 0.0)

        # ---- P^T_w, dS^T_w into shared memory; wait for the other consumer's halves
        p_phase = it & 1
        mbarrier.wait(p_free, p_phase ^ 1)
        pds_smem.index(WG).store(p.to(dtype))
        pds_smem.index(2 + WG).store(ds.to(dtype))
        fence_async_shared()
        cta_barrier()  # every thread's tiles are in smem before the single-thread arrive
        mbarrier.arrive(p_ready)
        mbarrier.wait(p_ready, p_phase)

        # ---- dV_w, dK_w over both query halves; dQ^T pieces of this consumer's columns
        for j in gl.static_range(2):
            do_j = do_view.slice(j * HALF_M, HALF_M, dim=0).slice(WG * HALF_D, HALF_D, dim=1)
            dv = warpgroup_mma(pds_smem.index(j), do_j, dv, is_async=True)
        for j in gl.static_range(2):
            q_j = q_view.slice(j * HALF_M, HALF_M, dim=0).slice(WG * HALF_D, HALF_D, dim=1)
            dk = warpgroup_mma(pds_smem.index(2 + j), q_j, dk, is_async=True)
        # dQ^T in two rounds of two pieces (64 head-dim rows x both query halves): the second
        # round's GEMMs run while the first round's pieces are staged, and with PIPELINE the
        # next block's S^T / dP^T while the second round's are
        k_t0 = k_all.slice(WG * HALF_D, DQ_ROWS, dim=1).permute((1, 0))
        dq0 = warpgroup_mma(k_t0, pds_smem.index(2), dq_zero, use_acc=False, is_async=True)
        dq1 = warpgroup_mma(k_t0, pds_smem.index(3), dq_zero, use_acc=False, is_async=True)
        dv, dk, dq0, dq1 = warpgroup_mma_wait(0, deps=(dv, dk, dq0, dq1))
        mbarrier.arrive(q_empty.index(stage))  # Q and dO are read: the producer may refill
        mbarrier.arrive(do_empty.index(stage))
        k_t1 = k_all.slice(WG * HALF_D + DQ_ROWS, DQ_ROWS, dim=1).permute((1, 0))
        dq2 = warpgroup_mma(k_t1, pds_smem.index(2), dq_zero, use_acc=False, is_async=True)
        dq3 = warpgroup_mma(k_t1, pds_smem.index(3), dq_zero, use_acc=False, is_async=True)
        # dQ^T workspace (b, h, D_PAD, s_q_pad) fp32, seen as (b * h * D_PAD, s_q_pad)
        row0 = (b * n_heads + h) * D_PAD + WG * HALF_D
        col0 = q_col + m_start
        _add_dq_piece(dq_desc, row0, col0, dq0 * sm_scale, dq_buf)
        _add_dq_piece(dq_desc, row0, col0 + HALF_M, dq1 * sm_scale, dq_buf)
        dq2, dq3 = warpgroup_mma_wait(0, deps=(dq2, dq3))
        mbarrier.arrive(p_free)  # this consumer is done reading P^T / dS^T
        if PIPELINE:
            if it + 1 < total:
                s_tok, dp_tok = _issue_s_dp(k_all, v_all, q_smem, do_smem, q_ready, do_ready,
                                            s_zero, it + 1, WG, BLOCK_M, D_PAD)
                _add_dq_piece(dq_desc, row0 + DQ_ROWS, col0, dq2 * sm_scale, dq_buf)
                _add_dq_piece(dq_desc, row0 + DQ_ROWS, col0 + HALF_M, dq3 * sm_scale, dq_buf)
                s, dp = warpgroup_mma_wait(0, deps=(s_tok, dp_tok))
            else:
                _add_dq_piece(dq_desc, row0 + DQ_ROWS, col0, dq2 * sm_scale, dq_buf)
                _add_dq_piece(dq_desc, row0 + DQ_ROWS, col0 + HALF_M, dq3 * sm_scale, dq_buf)
                s = s_zero
                dp = s_zero
        else:
            _add_dq_piece(dq_desc, row0 + DQ_ROWS, col0, dq2 * sm_scale, dq_buf)
            _add_dq_piece(dq_desc, row0 + DQ_ROWS, col0 + HALF_M, dq3 * sm_scale, dq_buf)

    tma.store_wait(0)  # the last dQ reduce has read the staging tile
    # ---- epilogue: dK (times softmax_scale) and dV, this consumer's columns of the key block
    # (VARLEN: keys past the sequence's end are the next sequence's: not stored)
    store_kv_grads(dk, dv, dk_ptr, dv_ptr, k_off + n_start, WG * HALF_D, k_off + len_k, b, h_k,
                   n_heads_k, sm_scale, HEAD_DIM)


@gluon.jit
def attn_bwd_wide_kernel(q_desc, k_desc, v_desc, do_desc, dq_desc, lse2_ptr, delta_ptr, dq_ptr,
                         dk_ptr, dv_ptr, tile_counter, seqlen_q, seqlen_k, n_heads, n_heads_k, group_size,
                         seqlen_q_pad, n_key_blocks, n_bh_k, heads_per_group, window_left,
                         window_right, qk_scale, sm_scale, softcap_inv, softcap_log2,
                         cu_q_ptr, cu_k_ptr, n_seqs, seqused_ptr,
                         BLOCK_M: gl.constexpr, NUM_STAGES: gl.constexpr,
                         HEAD_DIM: gl.constexpr, HAS_LEFT: gl.constexpr, HAS_RIGHT: gl.constexpr,
                         HAS_SOFTCAP: gl.constexpr, PIPELINE: gl.constexpr,
                         CONSUMER_REGS: gl.constexpr, PRODUCER_REGS: gl.constexpr,
                         LONGEST_FIRST: gl.constexpr = False, VARLEN: gl.constexpr = False,
                         DQ_SEQ_ALIGN: gl.constexpr = 4):
    """Warp-specialised attention backward for D_PAD = 256 (see module docstring).

    Descriptors are rank 4 over (batch, seq, head, dim): q/do boxes [1, BLOCK_M, 1, D_PAD],
    k/v boxes [1, BLOCK_N, 1, D_PAD] (TMA zero-fills past s and d). lse2_ptr / delta_ptr:
    float32 (b, h, s_q_pad), as in bwd_kernel.attn_bwd_kernel. dq_ptr: float32
    (b, h, D_PAD, s_q_pad) zeros (dQ *transposed*), receives softmax_scale * (dS K)^T through
    dq_desc (2-D over (b * h * D_PAD, s_q_pad), box [64, BLOCK_M // 2]) by TMA reduce-add.
    dk_ptr / dv_ptr: (b, s_k, h_k, HEAD_DIM) contiguous, q's dtype; tile_counter unused (one tile
    per CTA: the shared producer's queue argument). Grid and program order as
    bwd_kernel.attn_bwd_kernel (1-D, tiles.key_block_coords), num_warps = 4 (the default
    partition is consumer 0).

    VARLEN: packed sequences, attn_bwd_kernel's varlen mode (one CTA per (KV head, key-block
    slot) of tiles.varlen_slot over cu_k_ptr, n_seqs sequences; descriptors over (1, total, h,
    d) views; s_q_pad >= total_q + BLOCK_M; dk / dv zeroed by the caller: keys of no sequence
    get no tile); sequence i's dQ^T columns start at DQ_SEQ_ALIGN * (i + cu_q[i] //
    DQ_SEQ_ALIGN), so the workspace needs s_q_pad >= total_q + DQ_SEQ_ALIGN * n_seqs + BLOCK_M.
    seqused_ptr: None, or int32 (n_seqs,) seqused_k (keys past it take no part; its K / V
    rows are zeroed in shared memory). Else cu_q_ptr / cu_k_ptr / n_seqs / seqused_ptr are
    unread.
    """
    BLOCK_N: gl.constexpr = k_desc.block_type.shape[1]
    HALF_M: gl.constexpr = BLOCK_M // 2
    # K and V with a leading dimension of 1, so the consumers can index it at run time
    k_smem = gl.allocate_shared_memory(k_desc.dtype, [1] + k_desc.block_type.shape,
                                       k_desc.layout)
    v_smem = gl.allocate_shared_memory(v_desc.dtype, [1] + v_desc.block_type.shape,
                                       v_desc.layout)
    streams, stream_bars = alloc_query_streams(q_desc, do_desc, NUM_STAGES, BLOCK_M)
    q_smem, do_smem, lse_smem, delta_smem = streams
    kv_ready, q_ready, q_empty, do_ready, do_empty, stats_ready, kv_empty = stream_bars
    PT_LAYOUT: gl.constexpr = gl.NVMMASharedLayout.get_default_for([BLOCK_N, HALF_M],
                                                                   q_desc.dtype)
    # P^T of query halves 0, 1, then dS^T of query halves 0, 1 ([BLOCK_N keys, HALF_M]): one slot
    pds_smem = gl.allocate_shared_memory(q_desc.dtype, [4, BLOCK_N, HALF_M], PT_LAYOUT)
    p_ready = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())
    p_free = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())
    mbarrier.init(p_ready, count=2)
    mbarrier.init(p_free, count=2)
    fence_async_shared()

    # one fp32 dQ^T staging tile per consumer (the async TMA reduce reads it)
    dq_smem = gl.allocate_shared_memory(gl.float32, [2] + dq_desc.block_type.shape,
                                        dq_desc.layout)
    descs = (q_desc, k_desc, v_desc, do_desc, dq_desc)
    smem = (k_smem, v_smem, q_smem, do_smem, pds_smem, lse_smem, delta_smem, dq_smem)
    smem_producer = (k_smem.index(0), v_smem.index(0), q_smem, do_smem, pds_smem, lse_smem,
                     delta_smem, dq_smem)
    bars = (kv_ready, q_ready, q_empty, do_ready, do_empty, p_ready, p_free, stats_ready)
    problem = (seqlen_q, seqlen_k, n_heads, n_heads_k, group_size, seqlen_q_pad)
    window = (window_left, window_right)
    scales = (qk_scale, sm_scale, softcap_inv, softcap_log2)
    ptrs = (lse2_ptr, delta_ptr, dq_ptr, dk_ptr, dv_ptr)
    if VARLEN:
        varlen = (cu_q_ptr, cu_k_ptr, n_seqs, seqused_ptr)
    else:
        varlen = scales  # (unread)
    # one tile per CTA here: no tile queue (the producer's counter is unused)
    schedule = (n_key_blocks, n_bh_k, heads_per_group, kv_empty, tile_counter)
    gl.warp_specialize([
        # constexpr flags one by one (in a tuple they would reach the workers as i1 values)
        (_consumer, (0, descs, smem, bars, problem, window, scales, ptrs, schedule, BLOCK_M,
                     HEAD_DIM, HAS_LEFT, HAS_RIGHT, HAS_SOFTCAP, PIPELINE, LONGEST_FIRST,
                     varlen, VARLEN, DQ_SEQ_ALIGN)),
        (_consumer, (1, descs, smem, bars, problem, window, scales, ptrs, schedule, BLOCK_M,
                     HEAD_DIM, HAS_LEFT, HAS_RIGHT, HAS_SOFTCAP, PIPELINE, LONGEST_FIRST,
                     varlen, VARLEN, DQ_SEQ_ALIGN)),
        (producer, (descs, smem_producer, bars, problem, window, ptrs, schedule, BLOCK_M,
                     HAS_LEFT, HAS_RIGHT, LONGEST_FIRST, False, False, False, varlen, VARLEN)),
    ], [4, 1], [CONSUMER_REGS, PRODUCER_REGS])
