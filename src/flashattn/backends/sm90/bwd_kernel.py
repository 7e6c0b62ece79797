"""FlashAttention-3-style backward for sm90, written in Gluon.

One CTA per (key block of BLOCK_N = 128 keys, batch, KV head), on a 1-D grid. K_j and V_j are
loaded once into shared memory; the query blocks (BLOCK_M rows) of every query head of the GQA
group stream past them. Three warp-specialised partitions (four with DETERMINISTIC,
below):

    producer   1 warp: TMA loads of K_j, V_j (once) and of Q_i, dO_i into NUM_STAGES ring
               slots (separate ready / empty mbarriers for Q and dO), plus the row statistics
               lse2_i, delta_i (plain loads into shared memory, their own ready barrier).
    consumer0  warpgroup (default partition): keys [0, HALF_N) of the block
    consumer1  warpgroup (worker partition):  keys [HALF_N, BLOCK_N)

Each consumer, per query block i (everything transposed: rows are keys, columns queries):

    S^T  = K_w Q_i^T                  wgmma, A = K_w (smem), B = Q_i^T (permuted smem view)
    dP^T = V_w dO_i^T                 wgmma, issued together with S^T
    P^T  = exp2(S^T * scale_log2 - lse2_i)  (mask on boundary / diagonal blocks only)
    dS^T = P^T * (dP^T - delta_i)     (* (1 - tanh^2) with softcap)
    dV  += P^T dO_i                   wgmma, A = P^T from registers
    dK  += dS^T Q_i                   wgmma, A = dS^T from registers
    dQ_i += dS K                      dS^T goes to shared memory (both halves), then each
                                      consumer computes HEAD_DIM / 2 columns of dQ_i over all
                                      BLOCK_N keys (A = dS, the permuted smem view; B = a
                                      column half of K) and adds them to an fp32 workspace.

The two halves of dS^T meet in shared memory: a 2-slot buffer with ds_ready / ds_free
mbarriers (count 2: one arrive per consumer). dQ reaches the (b, h, s_q_pad, D_PAD) fp32
workspace (already scaled) by a TMA bulk reduce-add: with DQ_ASYNC through a per-consumer
staging tile that the copy engine reads while the consumer goes on (waited for one block
later), else straight from registers (Triton's lowering stages and waits), or with fp32
atomics (DQ_TMA off). The host casts the workspace to dq. dK (times softmax_scale) and dV are
stored once at the end.

DETERMINISTIC (deterministic=True; a fourth partition, the 1-warp dQ writer, _dq_writer,
takes the consumers' dQ tiles from shared memory and does the ordered adds, so the
consumers never wait on global memory): the key tiles of one (batch, KV head) add into each
query block's dQ in descending key-block order, so the fp32 sums, and dq, are bitwise
repeatable. Each (batch, head, query block, column half) has an int32 turn counter. A
counter starts at -(the last key block that visits its query block: bwd.dq_turn_starts),
and the writer waits until it reads -(its own key block) before it issues that block's
reduce-add: every higher key block that visits the query block has added. It raises the
counter (release) once the reduce has completed. Tiles run in a key_block_coords DESCENDING
order (1: key-block major across heads, for masked calls; 2: head major, unmasked). A tile
waits only on higher key blocks of its head, which come earlier in either order, so the
persistent grid cannot deadlock (the static stride when unmasked, the ticket queue when
masked: both hand out tiles in order). Every key block from 0 to the last visits the query
block (no left window: host check). Measured in benchmarks/NOTES.md (2026-11-23).

Schedule switches (constexpr, measured in benchmarks/probes/hopper_probe.py --mode bwd):
    DQ_TMA     TMA reduce-add instead of atomics (d=128 16k: 496 vs 431 TFLOP/s)
    DQ_ASYNC   asynchronous reduce (d=128 16k: 568 vs 496)
    PIPELINE   the next block's S^T / dP^T issued before this block's dQ reduction: slower
               (more registers live; 519 vs 568), off
    KV_PER_BLOCK the K / V views of the wgmmas rebuilt every query block through a run-time
               index that is always 0 (it >> 30), as bwd_wide_kernel does: with a constant
               address the compiler hoists every K-step descriptor of K and V out of the
               block loop and keeps them, 64-bit each, in vector registers beside dK / dV,
               where they spill and return through LDL and R2UR before each GEMM (Nsight
               Compute, H100 2026-12-07: R2UR waiting on LDL at d = 64). sm_90 AOT: spills
               d 64 128 -> 72 bytes, d 128 causal 40 -> 0, dense 88 -> 0; R2UR 72 -> 25.
               Measured 0.99-1.07x at d = 64 (on there), 0.97-1.03x at d = 128 (off;
               H100, 2026-12-07)
    DQ_ROWS    (not a flag: read off the dQ box, [BLOCK_M // 2, D_PAD]; BwdConfig.dq_rows,
               BLOCK_M >= 128) each consumer computes dQ for its half of the query rows over
               every column (A = its rows of dS, B = all of K: half the wgmmas, each twice as
               wide, and half of dS read per consumer) instead of its column half over every
               row. On for padded d = 64 calls (bwd_config): 1.02-1.10x (H100, 2026-12-06)
"""
from __future__ import annotations

from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import (fence_async_shared, mbarrier, tma,
                                                               warpgroup_mma, warpgroup_mma_wait)

from flashattn.runtime.gluon_api import cta_barrier, tma_load, tma_store  # noqa: F401 (version names)

from flashattn.runtime.gluon_builtins import tma_reduce_add, tma_reduce_add_from_shared
from flashattn.backends.sm90.bwd_epilogue import store_kv_grads
from flashattn.backends.sm90.bwd_producer import alloc_query_streams, producer, read_tile
from flashattn.backends.sm90.ptx import per_thread_ptx
from flashattn.backends.sm90.row_guard import padding_follows, zero_keys_past, zero_rows_from
from flashattn.backends.sm90.softmax import ds_t, probs_t
from flashattn.backends.sm90.tiles import (block_needs_mask_t, key_tile_work, query_block_range,
                                           visible_t)


@gluon.jit
def _add_dq_async(dq_desc, row, col, dq, dq_buf):
    """dq (BLOCK_M, HALF_D) fp32 into the workspace at (row, col) through this consumer's
    staging buffer: the reduce runs on the copy engine while the consumer moves on; the next
    call (or the epilogue) waits until it has read the buffer."""
    tma.store_wait(0)
    cta_barrier()  # no thread overwrites the buffer before the previous reduce read it
    dq_buf.store(dq)
    fence_async_shared()
    cta_barrier()  # every thread's part is in shared memory before the one-thread issue
    tma_reduce_add_from_shared(dq_desc, [row, col], dq_buf)


@gluon.jit
def _dq_turns(tile_counter):
    """DETERMINISTIC: the dQ turn counters, one per (batch, head, query block), after the tile
    queue in tile_counter."""
    return tile_counter + 1 + gl.num_programs(0)


@gluon.jit
def _hand_dq_to_writer(dq, dq_buf, handoff, it, row, turn, WG: gl.constexpr):
    """DETERMINISTIC, consumer side: this consumer's dQ piece of a query block (its column
    half) fp32 into its staging buffer for the dQ writer, with the block's workspace row and
    turn (consumer 0 writes them: both consumers' are the same). ``it`` counts the handoffs (one
    per query block, across tiles): the buffer is free once the writer has read handoff
    it - 1. The consumer never waits on global memory: the writer takes the turn."""
    dq_full, dq_empty, meta_smem = handoff
    mbarrier.wait(dq_empty, (it & 1) ^ 1)
    dq_buf.store(dq)
    if WG == 0:
        _write_meta(meta_smem, row, turn)
    fence_async_shared()
    cta_barrier()  # every thread's part is in shared memory before the one-thread arrive
    mbarrier.arrive(dq_full)


@gluon.jit
def _write_meta(meta_smem, row, turn):
    """(row, turn) into the 2-int32 handoff slot (every thread writes the same values)."""
    layout: gl.constexpr = gl.BlockedLayout([1], [32], [4], [0])
    idx = gl.arange(0, 2, layout=layout)
    meta_smem.store(gl.where(idx == 0, row, turn))


@gluon.jit
def _read_meta(meta_smem):
    """The writer's (one warp) view of _write_meta's slot: (row, turn) as scalars."""
    layout: gl.constexpr = gl.BlockedLayout([1], [32], [1], [0])
    idx = gl.arange(0, 2, layout=layout)
    meta = meta_smem.load(layout)
    return gl.sum(gl.where(idx == 0, meta, 0), axis=0), gl.sum(gl.where(idx == 1, meta, 0),
                                                               axis=0)


@gluon.jit
def _end_dq_writer(handoff, it, WG: gl.constexpr):
    """DETERMINISTIC, consumer side, after its last tile: handoff ``it`` carries row -1, which
    stops the writer."""
    dq_full, dq_empty, meta_smem = handoff
    mbarrier.wait(dq_empty, (it & 1) ^ 1)
    if WG == 0:
        _write_meta(meta_smem, -1, 0)
    cta_barrier()
    mbarrier.arrive(dq_full)


@gluon.jit
def _dq_writer(dq_desc, dq_smem, handoff, tile_counter):
    """The dQ writer warp (DETERMINISTIC). Per handoff (both consumers' column halves of one
    query block, from workspace row ``row``): wait for the block's turn (its counter reads
    ``turn``: every higher key block that visits the query block has added; acquire), issue
    the two TMA reduce-adds of rows [row, row + BLOCK_M), release the staging buffers once the
    copy engine has read them, then wait until the reduces have completed (writes included)
    and pass the turn (+= 1, release). The consumers go on computing meanwhile: only this
    warp waits on the copy engine and on the turns. Row -1 stops the warp.

    tma.store_wait lowers to cp.async.bulk.wait_group.read (source read); the completion wait
    and the proxy fences are inline PTX (Gluon has no op for them)."""
    dq_full, dq_empty, meta_smem = handoff
    BLOCK_M: gl.constexpr = dq_desc.block_type.shape[0]  # (the box: every row, half the columns)
    HALF_D: gl.constexpr = dq_desc.block_type.shape[1]
    turns = _dq_turns(tile_counter)
    n = 0
    mbarrier.wait(dq_full, 0)
    row, turn = _read_meta(meta_smem)
    while row >= 0:
        block = row // BLOCK_M
        seen = gl.atomic_add(turns + block, 0, sem="acquire", scope="gpu")
        while seen != turn:
            seen = gl.atomic_add(turns + block, 0, sem="acquire", scope="gpu")
        per_thread_ptx("fence.proxy.async.global;", 1)  # the reduces after the acquire
        tma_reduce_add_from_shared(dq_desc, [row, 0], dq_smem.index(0))
        tma_reduce_add_from_shared(dq_desc, [row, HALF_D], dq_smem.index(1))
        tma.store_wait(0)  # both staging tiles read
        cta_barrier()
        mbarrier.arrive(dq_empty)
        per_thread_ptx("cp.async.bulk.wait_group 0;\n\tfence.proxy.async.global;", 1)
        cta_barrier()
        gl.atomic_add(turns + block, 1, sem="release", scope="gpu")
        n += 1
        mbarrier.wait(dq_full, n & 1)
        row, turn = _read_meta(meta_smem)


@gluon.jit
def _add_dq(dq_desc, row, col, dq, dq_ptr, dq_offs, DQ_TMA: gl.constexpr):
    """dq (BLOCK_M, HALF_D) fp32 into the workspace at (row, col): TMA reduce-add, or atomics.
    Rows past s_q add zeros (P = 0 there) into the workspace's padding rows."""
    if DQ_TMA:
        tma_reduce_add(dq_desc, [row, col], dq)
    else:
        D_PAD: gl.constexpr = dq_desc.block_type.shape[1] * 2
        gl.atomic_add(dq_ptr + row.to(gl.int64) * D_PAD + dq_offs, dq, sem="relaxed")


@gluon.jit
def _send_dq(dq, sm_scale, dq_desc, dq_row0, m_start, dq_smem, dq_ptr, dq_offs, handoff, it,
             n_block, WG: gl.constexpr, DQ_TMA: gl.constexpr, DQ_ASYNC: gl.constexpr,
             DETERMINISTIC: gl.constexpr, DQ_ROWS: gl.constexpr = False):
    """This consumer's column half of query block ``m_start``'s dQ (DQ_ROWS: its row half),
    times ``sm_scale``, on its way to the workspace rows from ``dq_row0``: to the writer warp
    (DETERMINISTIC), through the staging tile (DQ_ASYNC), or straight from registers."""
    HALF_D: gl.constexpr = dq_desc.block_type.shape[1]
    if DETERMINISTIC:
        # the block's first row: the writer places both pieces (_dq_writer). The query
        # block's counter starts at -(the last key block that reaches it) and the higher key
        # blocks go first: this one's turn comes at -n_block
        _hand_dq_to_writer(dq * sm_scale, dq_smem.index(WG), handoff, it,
                           dq_row0 + m_start, -n_block, WG)
    elif DQ_ROWS:  # rows [WG * DQ_M, (WG + 1) * DQ_M) of the block, every column
        DQ_M: gl.constexpr = dq_desc.block_type.shape[0]
        _add_dq_async(dq_desc, dq_row0 + m_start + WG * DQ_M, 0, dq * sm_scale,
                      dq_smem.index(WG))
    elif DQ_ASYNC:
        _add_dq_async(dq_desc, dq_row0 + m_start, WG * HALF_D, dq * sm_scale,
                      dq_smem.index(WG))
    else:
        _add_dq(dq_desc, dq_row0 + m_start, WG * HALF_D, dq * sm_scale, dq_ptr, dq_offs,
                DQ_TMA)


@gluon.jit
def _issue_s_dp(k_mine, v_mine, q_smem, do_smem, q_ready, do_ready, s_zero, it, total,
                BLOCK_M: gl.constexpr, D_PAD: gl.constexpr, dq_desc=None, dq_row=0, dq_col=0,
                dq=None, dq_ptr=None, dq_offs=None, dq_buf=None, DQ_TMA: gl.constexpr = True,
                DQ_ASYNC: gl.constexpr = False):
    """S^T = K_w Q_it^T and dP^T = V_w dO_it^T for block ``it`` (zeros when it >= total);
    when ``dq`` is given, the previous block's dQ is added while the GEMMs run."""
    NUM_STAGES: gl.constexpr = q_smem.shape[0]
    if it < total:
        stage = it % NUM_STAGES
        phase = (it // NUM_STAGES) & 1
        q_view = q_smem.index(stage).reshape([BLOCK_M, D_PAD])
        do_view = do_smem.index(stage).reshape([BLOCK_M, D_PAD])
        mbarrier.wait(q_ready.index(stage), phase)
        s_tok = warpgroup_mma(k_mine, q_view.permute((1, 0)), s_zero, use_acc=False,
                              is_async=True)
        mbarrier.wait(do_ready.index(stage), phase)
        dp_tok = warpgroup_mma(v_mine, do_view.permute((1, 0)), s_zero, use_acc=False,
                               is_async=True)
        if dq is not None:
            if DQ_ASYNC:
                _add_dq_async(dq_desc, dq_row, dq_col, dq, dq_buf)
            else:
                _add_dq(dq_desc, dq_row, dq_col, dq, dq_ptr, dq_offs, DQ_TMA)
        s, dp = warpgroup_mma_wait(0, deps=(s_tok, dp_tok))
    else:
        if dq is not None:
            if DQ_ASYNC:
                _add_dq_async(dq_desc, dq_row, dq_col, dq, dq_buf)
            else:
                _add_dq(dq_desc, dq_row, dq_col, dq, dq_ptr, dq_offs, DQ_TMA)
        s = s_zero
        dp = s_zero
    return s, dp

@gluon.jit
def _kv_operands(k_all, v_all, WG: gl.constexpr, DQ_ROWS: gl.constexpr):
    """This consumer's views of the resident K / V tiles (BLOCK_N x D_PAD in shared memory):
    its key rows of K and V (A of S^T and of dP^T) and the B of its dQ piece (all of K for
    its query rows with DQ_ROWS, else its column half of K)."""
    HALF_N: gl.constexpr = k_all.shape[0] // 2
    HALF_D: gl.constexpr = k_all.shape[1] // 2
    k_mine = k_all.slice(WG * HALF_N, HALF_N, dim=0)
    v_mine = v_all.slice(WG * HALF_N, HALF_N, dim=0)
    if DQ_ROWS:
        k_cols = k_all
    else:
        k_cols = k_all.slice(WG * HALF_D, HALF_D, dim=1)
    return k_mine, v_mine, k_cols


@gluon.jit
def _consumer(WG: gl.constexpr, descs, smem, bars, problem, window, scales, ptrs, schedule,
              BLOCK_M: gl.constexpr, HEAD_DIM: gl.constexpr, HAS_LEFT: gl.constexpr,
              HAS_RIGHT: gl.constexpr, HAS_SOFTCAP: gl.constexpr, DQ_TMA: gl.constexpr,
              PIPELINE: gl.constexpr, DQ_ASYNC: gl.constexpr, LONGEST_FIRST: gl.constexpr,
              PERSISTENT: gl.constexpr, DYNAMIC: gl.constexpr,
              DETERMINISTIC: gl.constexpr = False, handoff=None, varlen=None,
              VARLEN: gl.constexpr = False, SPLIT: gl.constexpr = False,
              KV_PER_BLOCK: gl.constexpr = False):
    """One consumer warpgroup: keys [WG * HALF_N, (WG + 1) * HALF_N) of each key block (tile)
    it processes (one; with PERSISTENT every num_programs-th, or with DYNAMIC those the
    producer publishes). DETERMINISTIC: dQ goes to the writer warp through
    ``handoff``, and a last handoff stops it. SPLIT (one tile per CTA): tiles.split_key_coords' tiles."""
    q_desc, k_desc, v_desc, do_desc, dq_desc = descs
    k_smem = smem[0]
    v_smem = smem[1]
    n_key_blocks, n_bh_k = schedule[0], schedule[1]
    BLOCK_N: gl.constexpr = k_desc.block_type.shape[1]
    HALF_N: gl.constexpr = BLOCK_N // 2
    D_PAD: gl.constexpr = q_desc.block_type.shape[3]
    HALF_D: gl.constexpr = D_PAD // 2

    # this consumer's dQ piece: the column half (BLOCK_M x HALF_D) or, with BwdConfig.dq_rows
    # (read off the dQ box, bwd._dq_desc), the row half (BLOCK_M / 2 x D_PAD)
    DQ_M: gl.constexpr = dq_desc.block_type.shape[0]
    DQ_N: gl.constexpr = dq_desc.block_type.shape[1]
    DQ_ROWS: gl.constexpr = DQ_M != BLOCK_M
    # wgmma layouts of one warpgroup: S^T / dP^T (HALF_N x BLOCK_M) and the dQ piece
    # (DQ_M x DQ_N); dK / dV (HALF_N x D_PAD) in _key_tile
    S_LAYOUT: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                       instr_shape=[16, BLOCK_M, 16])
    DQ_LAYOUT: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                        instr_shape=[16, DQ_N, 16])

    gl.static_assert(not (PERSISTENT and PIPELINE))  # PIPELINE's block count is per tile
    gl.static_assert(PERSISTENT or not DETERMINISTIC)  # waits only on live lower tiles
    gl.static_assert(not SPLIT or not (PERSISTENT or VARLEN or DETERMINISTIC or PIPELINE))
    k_mine, v_mine, k_cols = _kv_operands(k_smem.reshape([BLOCK_N, D_PAD]),
                                          v_smem.reshape([BLOCK_N, D_PAD]), WG, DQ_ROWS)
    s_zero = gl.zeros([HALF_N, BLOCK_M], gl.float32, S_LAYOUT)
    dq_zero = gl.zeros([DQ_M, DQ_N], gl.float32, DQ_LAYOUT)
    # (the atomic adds' offsets: DQ_TMA off, never with DQ_ROWS)
    dq_rows = gl.arange(0, DQ_M, layout=gl.SliceLayout(1, DQ_LAYOUT))
    dq_cols = WG * HALF_D + gl.arange(0, DQ_N, layout=gl.SliceLayout(0, DQ_LAYOUT))
    dq_offs = gl.expand_dims(dq_rows * D_PAD, 1) + gl.expand_dims(dq_cols, 0)

    consts = (k_mine, v_mine, k_cols, s_zero, dq_zero, dq_offs)
    if PERSISTENT:
        n_tiles = n_key_blocks * n_bh_k
        it_base = 0  # query blocks consumed in earlier tiles (ring and dS slot phases continue)
        tile_iter = 0
        tile_counter = schedule[4]
        kv_ready = bars[0]
        if DYNAMIC:
            mbarrier.wait(kv_ready, 0)
            tile = read_tile(tile_counter)
        else:
            tile = gl.program_id(0)
        while tile < n_tiles:
            it_base = _key_tile(WG, tile, tile_iter, it_base, descs, smem, bars, problem, window,
                                scales, ptrs, schedule, consts, BLOCK_M, HEAD_DIM, HAS_LEFT,
                                HAS_RIGHT, HAS_SOFTCAP, DQ_TMA, PIPELINE, DQ_ASYNC,
                                LONGEST_FIRST, PERSISTENT, handoff, DETERMINISTIC,
                                KV_PER_BLOCK=KV_PER_BLOCK)
            tile_iter += 1
            if DYNAMIC:
                # the producer publishes the next index once both consumers have released
                # this tile's K / V, so the slot cannot change again before both read it
                mbarrier.wait(kv_ready, tile_iter & 1)
                tile = read_tile(tile_counter)
            else:
                tile += gl.num_programs(0)
    else:  # one tile per CTA: no loop around the body (it costs ptxas registers)
        it_base = _key_tile(WG, gl.program_id(0), 0, gl.to_tensor(0), descs, smem, bars,
                            problem, window, scales, ptrs, schedule, consts, BLOCK_M, HEAD_DIM,
                            HAS_LEFT, HAS_RIGHT, HAS_SOFTCAP, DQ_TMA, PIPELINE, DQ_ASYNC,
                            LONGEST_FIRST, PERSISTENT, handoff, False, varlen, VARLEN, SPLIT,
                            KV_PER_BLOCK)
    if DETERMINISTIC:
        _end_dq_writer(handoff, it_base, WG)
    elif DQ_ASYNC:
        tma.store_wait(0)  # the last dQ reduce has read its staging buffer


@gluon.jit
def _key_tile(WG: gl.constexpr, tile, tile_iter, it_base, descs, smem, bars, problem, window,
              scales, ptrs, schedule, consts, BLOCK_M: gl.constexpr, HEAD_DIM: gl.constexpr,
              HAS_LEFT: gl.constexpr, HAS_RIGHT: gl.constexpr, HAS_SOFTCAP: gl.constexpr,
              DQ_TMA: gl.constexpr, PIPELINE: gl.constexpr, DQ_ASYNC: gl.constexpr,
              LONGEST_FIRST: gl.constexpr, PERSISTENT: gl.constexpr, handoff=None,
              DETERMINISTIC: gl.constexpr = False, varlen=None, VARLEN: gl.constexpr = False,
              SPLIT: gl.constexpr = False, KV_PER_BLOCK: gl.constexpr = False):
    """One consumer's work on key tile ``tile`` (the ``tile_iter``-th of this CTA): dK / dV over
    its query blocks, then stored. Returns the query-block count to continue from. VARLEN:
    the tile's sequence from tiles.varlen_key_tile (packed (1, total, h, d) tensors). SPLIT:
    the tile from tiles.split_key_coords; a part of a cut key block (half the group's query
    heads) stores its fp32 partial dK / dV into the split workspace (schedule[6]: (2, 2, b,
    split_blocks * BLOCK_N, h_k, HEAD_DIM), dK / dV by part), which the host sums."""
    q_desc, k_desc, v_desc, do_desc, dq_desc = descs
    kv_ready = bars[0]
    seqlen_q, seqlen_k, n_heads, n_heads_k, group_size, seqlen_q_pad = problem
    window_left, window_right = window
    sm_scale = scales[1]
    dk_ptr, dv_ptr = ptrs[3], ptrs[4]
    n_key_blocks, n_bh_k, heads_per_group, kv_empty = (schedule[0], schedule[1], schedule[2],
                                                       schedule[3])
    k_mine, v_mine, k_cols, s_zero, dq_zero, dq_offs = consts
    BLOCK_N: gl.constexpr = k_desc.block_type.shape[1]
    HALF_N: gl.constexpr = BLOCK_N // 2
    D_PAD: gl.constexpr = q_desc.block_type.shape[3]
    KV_LAYOUT: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                        instr_shape=[16, D_PAD, 16])
    b, h_k, n_block, q_off, len_q, k_off, len_k, g0, n_g, part = key_tile_work(
        tile, varlen, (n_key_blocks, n_bh_k, heads_per_group), n_heads_k, group_size,
        schedule[5] if SPLIT else 0, seqlen_q, seqlen_k, BLOCK_N, LONGEST_FIRST, DETERMINISTIC,
        VARLEN, SPLIT)
    n_start = n_block * BLOCK_N
    key0 = n_start + WG * HALF_N
    lo_blk, n_blocks = query_block_range(n_start, len_q, len_k, window_left, window_right,
                                         BLOCK_M, BLOCK_N, HAS_LEFT, HAS_RIGHT)
    dk = gl.zeros([HALF_N, D_PAD], gl.float32, KV_LAYOUT)
    dv = gl.zeros([HALF_N, D_PAD], gl.float32, KV_LAYOUT)
    if VARLEN:  # (its loads' latency hides behind the K / V wait)
        guard = padding_follows(varlen, q_off + len_q, k_off + len_k, seqlen_q, seqlen_k)
    mbarrier.wait(kv_ready, tile_iter & 1)
    total = n_g * n_blocks  # (query head of the group, query block) pairs, in order
    if VARLEN:
        # the last sequence's rows are followed by rows of no sequence (padding, which may hold
        # Inf / NaN): its tiles zero those rows in shared memory (row_guard.py) through a copy
        # of the block loop with the guard; the other sequences' tiles read the next
        # sequence's rows, masked, through the loop without it
        if guard:
            # (dQ = dS K reads every row of K, dP^T = V dO^T this consumer's rows of V)
            zero_keys_past(smem[0].reshape([BLOCK_N, D_PAD]), smem[1].reshape([BLOCK_N, D_PAD]),
                           n_start, len_k)
            it_base, dk, dv = _consume_key_tile(
                WG, descs, smem, bars, problem, scales, ptrs, b, h_k, n_start, key0, lo_blk,
                n_blocks, total, it_base, dk, dv, k_mine, v_mine, k_cols, s_zero, dq_zero,
                dq_offs, window, BLOCK_M, HAS_LEFT, HAS_RIGHT, HAS_SOFTCAP, DQ_TMA, PIPELINE,
                DQ_ASYNC, n_block, handoff, DETERMINISTIC, (q_off, len_q, len_k), VARLEN, True,
                KV_PER_BLOCK=KV_PER_BLOCK)
        else:
            if varlen[3] is not None:  # seqused_k: keys past it are unused cache slots
                zero_keys_past(smem[0].reshape([BLOCK_N, D_PAD]),
                               smem[1].reshape([BLOCK_N, D_PAD]), n_start, len_k)
            it_base, dk, dv = _consume_key_tile(
                WG, descs, smem, bars, problem, scales, ptrs, b, h_k, n_start, key0, lo_blk,
                n_blocks, total, it_base, dk, dv, k_mine, v_mine, k_cols, s_zero, dq_zero,
                dq_offs, window, BLOCK_M, HAS_LEFT, HAS_RIGHT, HAS_SOFTCAP, DQ_TMA, PIPELINE,
                DQ_ASYNC, n_block, handoff, DETERMINISTIC, (q_off, len_q, len_k), VARLEN, False,
                KV_PER_BLOCK=KV_PER_BLOCK)
    else:
        it_base, dk, dv = _consume_key_tile(
            WG, descs, smem, bars, problem, scales, ptrs, b, h_k, n_start, key0, lo_blk,
            n_blocks, total, it_base, dk, dv, k_mine, v_mine, k_cols, s_zero, dq_zero, dq_offs,
            window, BLOCK_M, HAS_LEFT, HAS_RIGHT, HAS_SOFTCAP, DQ_TMA, PIPELINE, DQ_ASYNC,
            n_block, handoff, DETERMINISTIC, g0=g0, KV_PER_BLOCK=KV_PER_BLOCK)
    if PERSISTENT:
        mbarrier.arrive(kv_empty)  # every GEMM reading this K / V has completed
    # ---- epilogue: dK (times softmax_scale) and dV of this consumer's keys
    # (VARLEN: keys past the sequence's end are the next sequence's: not stored)
    if SPLIT:
        if part >= 0:
            # (2, 2, b, rows, h_k, HEAD_DIM) fp32: [0, part] dK, [1, part] dV
            rows = schedule[5] * BLOCK_N
            part_size = gl.to_tensor(n_bh_k).to(gl.int64) * rows * HEAD_DIM
            dk_part = schedule[6] + part * part_size
            store_kv_grads(dk, dv, dk_part, dk_part + 2 * part_size, key0, 0, rows, b, h_k,
                           n_heads_k, sm_scale, HEAD_DIM)
        else:
            store_kv_grads(dk, dv, dk_ptr, dv_ptr, key0, 0, len_k, b, h_k, n_heads_k,
                           sm_scale, HEAD_DIM)
    else:
        store_kv_grads(dk, dv, dk_ptr, dv_ptr, k_off + key0, 0, k_off + len_k, b, h_k,
                       n_heads_k, sm_scale, HEAD_DIM)
    return it_base


@gluon.jit
def _consume_key_tile(WG: gl.constexpr, descs, smem, bars, problem, scales, ptrs, b, h_k, n_start,
                      key0, lo_blk, n_blocks, total, it_base, dk, dv, k_mine, v_mine, k_cols,
                      s_zero, dq_zero, dq_offs, window, BLOCK_M: gl.constexpr,
                      HAS_LEFT: gl.constexpr, HAS_RIGHT: gl.constexpr,
                      HAS_SOFTCAP: gl.constexpr, DQ_TMA: gl.constexpr, PIPELINE: gl.constexpr,
                      DQ_ASYNC: gl.constexpr, n_block=0, handoff=None,
                      DETERMINISTIC: gl.constexpr = False, span=None,
                      VARLEN: gl.constexpr = False, GUARD: gl.constexpr = False, g0=0,
                      KV_PER_BLOCK: gl.constexpr = False):
    """The ``total`` query blocks of one key tile for one consumer: dK / dV accumulated in
    registers (returned), dQ added to the workspace. Ring slots and dS slots continue from
    ``it_base``; returns (it_base + total, dk, dv). DETERMINISTIC: dQ goes to the writer warp
    (_dq_writer) through ``handoff`` = (dq_full, dq_empty, meta_smem) with this tile's turn,
    ``-n_block``. ``span`` (VARLEN): (q offset, q length, k length) of the tile's sequence:
    masks by its lengths, queries past its end included (they are the next sequence's rows,
    with finite lse), dQ rows from its offset. GUARD (the last sequence: padding may follow):
    the rows of a query block past the sequence's end are zeroed in Q and dO first. ``g0``: the
    first query head of the group the tile covers (a cut key block's part, SPLIT)."""
    q_desc, k_desc, v_desc, do_desc, dq_desc = descs
    k_smem, v_smem, q_smem, do_smem, ds_smem, lse_smem, delta_smem, dq_smem = smem[:8]
    k_ring, v_ring = smem[8], smem[9]  # K / V as one-slot rings (KV_PER_BLOCK)
    kv_ready, q_ready, q_empty, do_ready, do_empty, ds_ready, ds_free, stats_ready = bars
    seqlen_q, seqlen_k, n_heads, n_heads_k, group_size, seqlen_q_pad = problem
    window_left, window_right = window
    qk_scale, sm_scale, softcap_inv, softcap_log2 = scales
    lse2_ptr, delta_ptr, dq_ptr, dk_ptr, dv_ptr = ptrs
    BLOCK_N: gl.constexpr = k_desc.block_type.shape[1]
    HALF_N: gl.constexpr = BLOCK_N // 2
    D_PAD: gl.constexpr = q_desc.block_type.shape[3]
    HALF_D: gl.constexpr = D_PAD // 2
    NUM_STAGES: gl.constexpr = q_smem.shape[0]
    dtype: gl.constexpr = q_desc.dtype
    S_LAYOUT: gl.constexpr = s_zero.type.layout
    KV_LAYOUT: gl.constexpr = dk.type.layout
    A_LAYOUT: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=KV_LAYOUT, k_width=2)
    COL_S: gl.constexpr = gl.SliceLayout(0, S_LAYOUT)
    # BwdConfig.dq_rows, read off the dQ box (bwd._dq_desc): [BLOCK_M // 2, D_PAD]
    DQ_M: gl.constexpr = dq_desc.block_type.shape[0]
    DQ_ROWS: gl.constexpr = DQ_M != BLOCK_M
    if DETERMINISTIC:
        gl.static_assert(DQ_ASYNC and not PIPELINE and not HAS_LEFT)
    if DQ_ROWS:
        gl.static_assert(DQ_ASYNC and not PIPELINE and not DETERMINISTIC)
    if VARLEN:
        q_off, len_q, len_k = span
    else:
        q_off = 0
        len_q = seqlen_q
        len_k = seqlen_k

    if PIPELINE:
        # S^T / dP^T of the first block; later ones are issued before the previous block's dQ
        # reduction, so the copy engine and the tensor cores work at the same time. (PIPELINE
        # runs without persistence: it_base == 0, so a block's ring index is its index j.)
        s, dp = _issue_s_dp(k_mine, v_mine, q_smem, do_smem, q_ready, do_ready, s_zero, 0,
                            total, BLOCK_M, D_PAD)
    else:
        s = s_zero
        dp = s_zero
    for j in range(total):
        it = it_base + j
        g = j // n_blocks
        h = h_k * group_size + g0 + g
        # dQ workspace (b, h, s_q_pad, D_PAD) fp32, seen as (b * h * s_q_pad, D_PAD) rows
        dq_row0 = (b * n_heads + h) * seqlen_q_pad + q_off
        stage = it % NUM_STAGES
        phase = (it // NUM_STAGES) & 1
        m_start = (lo_blk + j - g * n_blocks) * BLOCK_M
        q_view = q_smem.index(stage).reshape([BLOCK_M, D_PAD])
        do_view = do_smem.index(stage).reshape([BLOCK_M, D_PAD])
        if KV_PER_BLOCK:
            # K / V through a run-time index that is always 0 (it < 2^30): the wgmma
            # descriptors are rebuilt here (uniform-register adds) instead of being hoisted
            # out of the loop into vector registers that spill (module docstring)
            zero = it >> 30
            k_mine, v_mine, k_cols = _kv_operands(
                k_ring.index(zero).reshape([BLOCK_N, D_PAD]),
                v_ring.index(zero).reshape([BLOCK_N, D_PAD]), WG, DQ_ROWS)

        if not PIPELINE:
            # ---- S^T and dP^T (both async)
            mbarrier.wait(q_ready.index(stage), phase)
            if GUARD:  # the query rows past the sequence's end (row_guard.py)
                if m_start + BLOCK_M > len_q:
                    zero_rows_from(q_view, len_q - m_start)
            s_tok = warpgroup_mma(k_mine, q_view.permute((1, 0)), s_zero, use_acc=False,
                                  is_async=True)
            mbarrier.wait(do_ready.index(stage), phase)
            if GUARD:
                if m_start + BLOCK_M > len_q:
                    zero_rows_from(do_view, len_q - m_start)
            dp_tok = warpgroup_mma(v_mine, do_view.permute((1, 0)), s_zero, use_acc=False,
                                   is_async=True)
            s = warpgroup_mma_wait(1, deps=(s_tok,))
        # lse2 = lse * log2(e), +inf for rows with no visible key and rows past s_q (P = 0)
        mbarrier.wait(stats_ready.index(stage), phase)
        lse2 = lse_smem.index(stage).load(COL_S)
        p, t = probs_t(s, lse2, qk_scale, softcap_inv, softcap_log2, HAS_SOFTCAP)
        if block_needs_mask_t(n_start, m_start, len_q, len_k, window_left, window_right,
                              BLOCK_M, BLOCK_N, HAS_LEFT, HAS_RIGHT, VARLEN):
            vis = visible_t(key0, m_start, len_q, len_k, window_left, window_right,
                            S_LAYOUT, HALF_N, BLOCK_M, HAS_LEFT, HAS_RIGHT, VARLEN)
            p = gl.where(vis, p, 0.0)
        if not PIPELINE:
            dp = warpgroup_mma_wait(0, deps=(dp_tok,))
        delta = delta_smem.index(stage).load(COL_S)
        # dS before any accumulating GEMM is issued: fp32 P and dP^T die here, so the
        # in-flight dV / dK / dQ accumulators never share the registers with them
        ds = ds_t(p, dp, delta, t, HAS_SOFTCAP)
        ds_lp = ds.to(dtype)
        p_op = gl.convert_layout(p.to(dtype), A_LAYOUT)
        dv_tok = warpgroup_mma(p_op, do_view, dv, is_async=True)
        ds_op = gl.convert_layout(ds_lp, A_LAYOUT)
        dk_tok = warpgroup_mma(ds_op, q_view, dk, is_async=True)

        # ---- dS^T of both consumers into shared memory, then this consumer's dQ half
        ds_slot = it % 2
        ds_phase = (it // 2) & 1
        mbarrier.wait(ds_free.index(ds_slot), ds_phase ^ 1)
        ds_buf = ds_smem.index(ds_slot)
        ds_buf.slice(WG * HALF_N, HALF_N, dim=0).store(ds_lp)
        fence_async_shared()
        cta_barrier()  # every thread's dS^T is in smem before the single-thread arrive
        mbarrier.arrive(ds_ready.index(ds_slot))
        mbarrier.wait(ds_ready.index(ds_slot), ds_phase)
        if DQ_ROWS:  # A = this consumer's query rows of dS, B = all of K
            ds_a = ds_buf.slice(WG * DQ_M, DQ_M, dim=1).permute((1, 0))
        else:  # A = every query row of dS, B = this consumer's column half of K
            ds_a = ds_buf.permute((1, 0))
        dq_tok = warpgroup_mma(ds_a, k_cols, dq_zero, use_acc=False, is_async=True)
        dv, dk, dq = warpgroup_mma_wait(0, deps=(dv_tok, dk_tok, dq_tok))
        mbarrier.arrive(ds_free.index(ds_slot))
        mbarrier.arrive(q_empty.index(stage))
        mbarrier.arrive(do_empty.index(stage))

        if PIPELINE:
            # next block's S^T / dP^T go to the tensor cores before this block's dQ leaves
            s, dp = _issue_s_dp(k_mine, v_mine, q_smem, do_smem, q_ready, do_ready, s_zero,
                                it + 1, total, BLOCK_M, D_PAD, dq_desc, dq_row0 + m_start,
                                WG * HALF_D, dq * sm_scale, dq_ptr, dq_offs,
                                dq_smem.index(WG), DQ_TMA, DQ_ASYNC)
        else:
            _send_dq(dq, sm_scale, dq_desc, dq_row0, m_start, dq_smem, dq_ptr, dq_offs,
                     handoff, it, n_block, WG, DQ_TMA, DQ_ASYNC, DETERMINISTIC, DQ_ROWS)

    return it_base + total, dk, dv


@gluon.jit
def attn_bwd_kernel(q_desc, k_desc, v_desc, do_desc, dq_desc, lse2_ptr, delta_ptr, dq_ptr, dk_ptr,
                    dv_ptr, tile_counter, seqlen_q, seqlen_k, n_heads, n_heads_k, group_size, seqlen_q_pad,
                    n_key_blocks, n_bh_k, heads_per_group,
                    window_left, window_right, qk_scale, sm_scale, softcap_inv, softcap_log2,
                    cu_q_ptr, cu_k_ptr, n_seqs, seqused_ptr, split_blocks, split_ws,
                    BLOCK_M: gl.constexpr, NUM_STAGES: gl.constexpr, HEAD_DIM: gl.constexpr,
                    HAS_LEFT: gl.constexpr, HAS_RIGHT: gl.constexpr, HAS_SOFTCAP: gl.constexpr,
                    DQ_TMA: gl.constexpr, PIPELINE: gl.constexpr, DQ_ASYNC: gl.constexpr,
                    CONSUMER_REGS: gl.constexpr,
                    PRODUCER_REGS: gl.constexpr, LONGEST_FIRST: gl.constexpr = False,
                    PERSISTENT: gl.constexpr = False, DYNAMIC: gl.constexpr = False,
                    DETERMINISTIC: gl.constexpr = False, VARLEN: gl.constexpr = False,
                    SPLIT: gl.constexpr = False, KV_PER_BLOCK: gl.constexpr = False):
    """Warp-specialised attention backward (see module docstring).

    Descriptors are rank 4 over (batch, seq, head, dim): q/do boxes [1, BLOCK_M, 1, D_PAD],
    k/v boxes [1, BLOCK_N, 1, D_PAD] (D_PAD = HEAD_DIM rounded up to a power of two; TMA
    zero-fills past s and d). lse2_ptr / delta_ptr: float32 (b, h, s_q_pad) contiguous,
    s_q_pad = s_q rounded up to BLOCK_M: lse * log2(e) (+inf for rows that see no key and for
    padding rows) and rowsum(dO * O) (0 on padding rows). dq_ptr: float32
    (b, h, s_q_pad, D_PAD) zeros, receives softmax_scale * dS K (columns past HEAD_DIM get
    zeros), through dq_desc (2-D over (b * h * s_q_pad, D_PAD), box [BLOCK_M, D_PAD // 2])
    by TMA reduce-add when DQ_TMA, else by fp32 atomics from registers.
    dk_ptr / dv_ptr: (b, s_k, h_k, HEAD_DIM)
    contiguous, q's dtype. tile_counter: int32 zeros (1 + grid,), PERSISTENT + DYNAMIC only:
    [0] the tile queue, [1 + program id] that CTA's current tile (any pointer otherwise:
    unused); DETERMINISTIC (needs PERSISTENT): (1 + grid + b * h * s_q_pad / BLOCK_M * 2,),
    the dQ turn counters after the queue.
    Grid (n_key_blocks * n_bh_k,) = (cdiv(s_k, BLOCK_N) * b * h_k,), in the order of
    tiles.key_block_coords (LONGEST_FIRST: grouped by heads_per_group KV heads, key blocks
    ascending; DETERMINISTIC: key-block major, descending), or with PERSISTENT fewer CTAs (e.g. one per SM) that take tiles program id,
    + num_programs, ... (DYNAMIC: program id, then tickets from tile_counter, in the same
    order); num_warps = 4 (the default partition is consumer 0).
    VARLEN (one CTA per tile, not deterministic): packed sequences; descriptors over
    (1, total, h, d) views, seqlen_q / seqlen_k = total_q / total_k, n_bh_k = h_k,
    n_key_blocks = the key-block slots per KV head (n_seqs + total_k // BLOCK_N,
    tiles.varlen_slot), s_q_pad >= total_q + BLOCK_M (lse2 / delta (h, s_q_pad): a query block
    of the last sequence may read BLOCK_M rows past total_q), cu_q_ptr / cu_k_ptr int32
    (n_seqs + 1,); dk / dv (1, total_k, h_k, d) zeroed by the host (keys of no sequence);
    seqused_ptr None or int32 (n_seqs,) seqused_k (keys past it take no part: zeroed in shared
    memory, their dk / dv left 0). cu_q_ptr / cu_k_ptr / seqused_ptr None and n_seqs 0
    otherwise.
    SPLIT (one CTA per tile, LONGEST_FIRST, GQA; BwdConfig.tile_split): the
    first ``split_blocks`` key blocks of every (batch, KV head) run as two tiles each, over
    half the group's query heads (tiles.split_key_coords: the grid has (n_key_blocks +
    split_blocks) * n_bh_k CTAs), their dK * softmax_scale / dV fp32 into ``split_ws``
    (2, 2, b, split_blocks * BLOCK_N, h_k, HEAD_DIM): [0, part] dK, [1, part] dV; the host
    adds the two parts into dk / dv (bwd_postprocess.add_split_parts). split_blocks 0 and
    split_ws any pointer otherwise.
    """
    BLOCK_N: gl.constexpr = k_desc.block_type.shape[1]
    # K and V with a leading dimension of 1, so the consumers can index it at run time
    # (KV_PER_BLOCK); the loads and everything else use slot 0
    k_ring = gl.allocate_shared_memory(k_desc.dtype, [1] + k_desc.block_type.shape,
                                       k_desc.layout)
    v_ring = gl.allocate_shared_memory(v_desc.dtype, [1] + v_desc.block_type.shape,
                                       v_desc.layout)
    k_smem = k_ring.index(0)
    v_smem = v_ring.index(0)
    streams, stream_bars = alloc_query_streams(q_desc, do_desc, NUM_STAGES, BLOCK_M)
    q_smem, do_smem, lse_smem, delta_smem = streams
    kv_ready, q_ready, q_empty, do_ready, do_empty, stats_ready, kv_empty = stream_bars
    DS_LAYOUT: gl.constexpr = gl.NVMMASharedLayout.get_default_for([BLOCK_N, BLOCK_M],
                                                                   q_desc.dtype)
    ds_smem = gl.allocate_shared_memory(q_desc.dtype, [2, BLOCK_N, BLOCK_M], DS_LAYOUT)
    ds_ready = gl.allocate_shared_memory(gl.int64, [2, 1], mbarrier.MBarrierLayout())
    ds_free = gl.allocate_shared_memory(gl.int64, [2, 1], mbarrier.MBarrierLayout())
    for i in gl.static_range(2):
        mbarrier.init(ds_ready.index(i), count=2)
        mbarrier.init(ds_free.index(i), count=2)
    fence_async_shared()

    descs = (q_desc, k_desc, v_desc, do_desc, dq_desc)
    if DQ_ASYNC:
        # one fp32 dQ staging tile per consumer (the async TMA reduce reads it)
        dq_smem = gl.allocate_shared_memory(gl.float32, [2] + dq_desc.block_type.shape,
                                            dq_desc.layout)
    else:
        dq_smem = ds_smem  # unused
    smem = (k_smem, v_smem, q_smem, do_smem, ds_smem, lse_smem, delta_smem, dq_smem, k_ring,
            v_ring)
    bars = (kv_ready, q_ready, q_empty, do_ready, do_empty, ds_ready, ds_free, stats_ready)
    problem = (seqlen_q, seqlen_k, n_heads, n_heads_k, group_size, seqlen_q_pad)
    window = (window_left, window_right)
    scales = (qk_scale, sm_scale, softcap_inv, softcap_log2)
    ptrs = (lse2_ptr, delta_ptr, dq_ptr, dk_ptr, dv_ptr)
    schedule = (n_key_blocks, n_bh_k, heads_per_group, kv_empty, tile_counter, split_blocks,
                split_ws)
    gl.static_assert(not VARLEN or not (PERSISTENT or DETERMINISTIC or PIPELINE))
    if VARLEN:
        varlen = (cu_q_ptr, cu_k_ptr, n_seqs, seqused_ptr)
    else:
        varlen = scales  # (unread)
    if DETERMINISTIC:
        # the consumers -> dQ writer handoff: both staging tiles of a query block (dq_full,
        # one arrive per consumer), released once the copy engine has read them (dq_empty),
        # and the block's (workspace row, turn)
        dq_full = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())
        dq_empty = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())
        mbarrier.init(dq_full, count=2)
        mbarrier.init(dq_empty, count=1)
        meta_smem = gl.allocate_shared_memory(gl.int32, [2],
                                              gl.SwizzledSharedLayout(1, 1, 1, [0]))
        fence_async_shared()
        handoff = (dq_full, dq_empty, meta_smem)
        gl.warp_specialize([
            (_consumer, (0, descs, smem, bars, problem, window, scales, ptrs, schedule, BLOCK_M,
                         HEAD_DIM, HAS_LEFT, HAS_RIGHT, HAS_SOFTCAP, DQ_TMA, PIPELINE, DQ_ASYNC,
                         LONGEST_FIRST, PERSISTENT, DYNAMIC, DETERMINISTIC, handoff, varlen,
                         VARLEN, SPLIT, KV_PER_BLOCK)),
            (_consumer, (1, descs, smem, bars, problem, window, scales, ptrs, schedule, BLOCK_M,
                         HEAD_DIM, HAS_LEFT, HAS_RIGHT, HAS_SOFTCAP, DQ_TMA, PIPELINE, DQ_ASYNC,
                         LONGEST_FIRST, PERSISTENT, DYNAMIC, DETERMINISTIC, handoff, varlen,
                         VARLEN, SPLIT, KV_PER_BLOCK)),
            (producer, (descs, smem, bars, problem, window, ptrs, schedule, BLOCK_M, HAS_LEFT,
                         HAS_RIGHT, LONGEST_FIRST, PERSISTENT, DYNAMIC, DETERMINISTIC, varlen,
                         VARLEN, SPLIT)),
            (_dq_writer, (dq_desc, dq_smem, handoff, tile_counter)),
        ], [4, 1, 1], [CONSUMER_REGS, PRODUCER_REGS, 32])
    else:
        gl.warp_specialize([
            # constexpr flags one by one (in a tuple they would reach the workers as i1 values)
            (_consumer, (0, descs, smem, bars, problem, window, scales, ptrs, schedule, BLOCK_M,
                         HEAD_DIM, HAS_LEFT, HAS_RIGHT, HAS_SOFTCAP, DQ_TMA, PIPELINE, DQ_ASYNC,
                         LONGEST_FIRST, PERSISTENT, DYNAMIC, False, None, varlen, VARLEN,
                         SPLIT, KV_PER_BLOCK)),
            (_consumer, (1, descs, smem, bars, problem, window, scales, ptrs, schedule, BLOCK_M,
                         HEAD_DIM, HAS_LEFT, HAS_RIGHT, HAS_SOFTCAP, DQ_TMA, PIPELINE, DQ_ASYNC,
                         LONGEST_FIRST, PERSISTENT, DYNAMIC, False, None, varlen, VARLEN,
                         SPLIT, KV_PER_BLOCK)),
            (producer, (descs, smem, bars, problem, window, ptrs, schedule, BLOCK_M, HAS_LEFT,
                         HAS_RIGHT, LONGEST_FIRST, PERSISTENT, DYNAMIC, False, varlen,
                         VARLEN, SPLIT)),
        ], [4, 1], [CONSUMER_REGS, PRODUCER_REGS])
