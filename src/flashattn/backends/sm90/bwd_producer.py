"""The backward kernels' load warp (both bwd_kernel.py and bwd_wide_kernel.py use it).

The producer partition (1 warp) loads K_j and V_j of each key tile once, then streams Q_i and
dO_i of every query block that sees the tile into the NUM_STAGES rings that
:func:`alloc_query_streams` allocates, with the row statistics (lse2_i, delta_i) beside them.
With a tile queue it draws tiles from a global ticket counter and hands each index to the
consumers (:func:`publish_tile` / :func:`read_tile`).
"""
from __future__ import annotations

from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import mbarrier, tma

from flashattn.runtime.gluon_api import cta_barrier, tma_load, tma_store  # noqa: F401 (version names)

from flashattn.backends.sm90.ring import ring_load
from flashattn.backends.sm90.tiles import key_tile_work, query_block_range


@gluon.jit
def producer(descs, smem, bars, problem, window, ptrs, schedule, BLOCK_M: gl.constexpr,
              HAS_LEFT: gl.constexpr, HAS_RIGHT: gl.constexpr, LONGEST_FIRST: gl.constexpr,
              PERSISTENT: gl.constexpr, DYNAMIC: gl.constexpr,
              DETERMINISTIC: gl.constexpr = False, varlen=None, VARLEN: gl.constexpr = False,
              SPLIT: gl.constexpr = False):
    """Per key tile: K_j, V_j once, then Q_i, dO_i and the row statistics (lse2_i, delta_i) of
    every query block of every head of the group. PERSISTENT: tile after tile, the next K_j /
    V_j loaded once both consumers have released the previous ones (kv_empty), while they
    still write the previous dK / dV; the tiles are program id, + num_programs, ... or with
    DYNAMIC program id, then num_programs + an atomic ticket each (a global queue: tiles of
    unequal cost, as under a causal mask, keep every CTA busy and the CTAs running together
    close in tile order, so they share Q / dO in L2). DYNAMIC publishes each tile's index for
    the consumers (publish_tile), and an index >= n_tiles when the queue is empty.
    VARLEN (one CTA per tile): packed sequences, varlen = (cu_seqlens_q, cu_seqlens_k,
    n_seqs) (tiles.varlen_key_tile). SPLIT (one CTA per tile): the tiles of
    tiles.split_key_coords, the number of cut key blocks in schedule[5]."""
    n_key_blocks, n_bh_k, kv_empty, tile_counter = schedule[0], schedule[1], schedule[3], schedule[4]
    kv_ready = bars[0]
    if PERSISTENT:
        n_tiles = n_key_blocks * n_bh_k
        it = 0  # query blocks streamed so far (ring slot and phase), across tiles
        tile_iter = 0
        tile = gl.program_id(0)
        while tile < n_tiles:
            # both consumers are done with the previous tile's K / V
            mbarrier.wait(kv_empty, (tile_iter & 1) ^ 1)
            if DYNAMIC:
                # before kv_ready's expect-arrive in _produce_key_tile (release)
                publish_tile(tile_counter, tile)
                # the ticket's latency hides behind this tile's loads
                next_tile = gl.num_programs(0) + gl.atomic_add(tile_counter, 1)
            else:
                next_tile = tile + gl.num_programs(0)
            it = _produce_key_tile(tile, it, descs, smem, bars, problem, window, ptrs, schedule,
                                   BLOCK_M, HAS_LEFT, HAS_RIGHT, LONGEST_FIRST, DETERMINISTIC)
            tile_iter += 1
            tile = next_tile
        if DYNAMIC:
            # queue empty: the consumers get an index >= n_tiles (kv_ready without loads)
            mbarrier.wait(kv_empty, (tile_iter & 1) ^ 1)
            publish_tile(tile_counter, tile)
            mbarrier.arrive(kv_ready)
    else:
        _produce_key_tile(gl.program_id(0), gl.to_tensor(0), descs, smem, bars, problem,
                          window, ptrs, schedule, BLOCK_M, HAS_LEFT, HAS_RIGHT, LONGEST_FIRST,
                          DETERMINISTIC, varlen, VARLEN, SPLIT)


@gluon.jit
def publish_tile(tile_counter, tile):
    """Producer warp -> consumers: this CTA's next tile index, in global memory at
    tile_counter[1 + program id], stored before the kv_ready arrive that announces the tile.
    (Read back as a scalar load: a shared-memory slot needs a cross-warp reduction to become
    a scalar in Gluon, and that cost the consumers registers: 168 vs 80 spill bytes.)"""
    gl.store(tile_counter + 1 + gl.program_id(0), tile)
    cta_barrier()  # the store is ordered before the single-thread arrive


@gluon.jit
def read_tile(tile_counter):
    """Consumer side of publish_tile, after the kv_ready wait (acquire); volatile: not a
    stale L1 line from this CTA's previous tile."""
    return gl.load(tile_counter + 1 + gl.program_id(0), volatile=True)


@gluon.jit
def _produce_key_tile(tile, it, descs, smem, bars, problem, window, ptrs, schedule,
                      BLOCK_M: gl.constexpr, HAS_LEFT: gl.constexpr, HAS_RIGHT: gl.constexpr,
                      LONGEST_FIRST: gl.constexpr, DETERMINISTIC: gl.constexpr = False,
                      varlen=None, VARLEN: gl.constexpr = False, SPLIT: gl.constexpr = False):
    """The loads of key tile ``tile``: K_j, V_j, then the Q / dO blocks and row statistics of
    every query head of the group (SPLIT: of the tile's part of the group), ring slots
    continuing from ``it``; returns the next ``it``. VARLEN: the tile's sequence starts at
    q_off / k_off of the (1, total, h, d) tensors and of the (h, s_q_pad) statistics."""
    q_desc, k_desc, v_desc, do_desc, dq_desc = descs
    # (the first eight entries: bwd_kernel appends its one-slot K / V rings)
    k_smem, v_smem, q_smem, do_smem, ds_smem, lse_smem, delta_smem, dq_smem = smem[:8]
    kv_ready, q_ready, q_empty, do_ready, do_empty, ds_ready, ds_free, stats_ready = bars
    seqlen_q, seqlen_k, n_heads, n_heads_k, group_size, seqlen_q_pad = problem
    window_left, window_right = window
    lse2_ptr, delta_ptr, dq_ptr, dk_ptr, dv_ptr = ptrs
    n_key_blocks, n_bh_k, heads_per_group = schedule[0], schedule[1], schedule[2]
    BLOCK_N: gl.constexpr = k_desc.block_type.shape[1]
    NUM_STAGES: gl.constexpr = q_smem.shape[0]
    # one warp moves the 2 x BLOCK_M row statistics (lse2, delta) of a query block
    STAT_LAYOUT: gl.constexpr = gl.BlockedLayout([BLOCK_M // 32], [32], [1], [0])

    b, h_k, n_block, q_off, len_q, k_off, len_k, g0, n_g, _ = key_tile_work(
        tile, varlen, (n_key_blocks, n_bh_k, heads_per_group), n_heads_k, group_size,
        schedule[5] if SPLIT else 0, seqlen_q, seqlen_k, BLOCK_N, LONGEST_FIRST, DETERMINISTIC,
        VARLEN, SPLIT)
    n_start = n_block * BLOCK_N
    mbarrier.expect(kv_ready, k_desc.block_type.nbytes + v_desc.block_type.nbytes)
    tma_load(k_desc, [b, k_off + n_start, h_k, 0], kv_ready, k_smem)
    tma_load(v_desc, [b, k_off + n_start, h_k, 0], kv_ready, v_smem)
    lo_blk, n_blocks = query_block_range(n_start, len_q, len_k, window_left, window_right,
                                         BLOCK_M, BLOCK_N, HAS_LEFT, HAS_RIGHT)
    for g in range(g0, g0 + n_g):
        h = h_k * group_size + g
        stats_base = (b * n_heads + h).to(gl.int64) * seqlen_q_pad + q_off
        for i in range(n_blocks):
            stage = it % NUM_STAGES
            phase = (it // NUM_STAGES) & 1
            m_start = (lo_blk + i) * BLOCK_M
            # row statistics first: their (L2) load latency hides behind the TMA issue below
            rows = m_start + gl.arange(0, BLOCK_M, layout=STAT_LAYOUT)
            lse2 = gl.load(lse2_ptr + stats_base + rows)
            delta = gl.load(delta_ptr + stats_base + rows)
            ring_load(q_desc, [b, q_off + m_start, h, 0], q_smem, q_ready, q_empty, stage, phase)
            ring_load(do_desc, [b, q_off + m_start, h, 0], do_smem, do_ready, do_empty, stage,
                      phase)
            # the slot's previous statistics were read before both consumers released Q and dO
            lse_smem.index(stage).store(lse2)
            delta_smem.index(stage).store(delta)
            cta_barrier()  # the whole warp's stores land before the single-thread arrive
            mbarrier.arrive(stats_ready.index(stage))
            it += 1
    return it


@gluon.jit
def alloc_query_streams(q_desc, do_desc, NUM_STAGES: gl.constexpr, BLOCK_M: gl.constexpr):
    """Shared memory and mbarriers of what the producer streams to the consumers, the same in
    both backward kernels: the Q and dO rings (NUM_STAGES slots; ready barriers completed by
    the TMA byte count, empty barriers of count 2, one arrive per consumer), the row statistics
    lse2 / delta per slot (their ready barrier gets the producer warp's arrive) and the
    barrier of the resident K / V tiles. The caller allocates its own exchange buffers and
    fences the barrier inits (fence_async_shared) once all are initialised.

    Also kv_empty (count 2: both consumers are done with the resident K / V; a persistent CTA's
    producer waits for it before loading the next tile's).

    Returns (q_smem, do_smem, lse_smem, delta_smem) and (kv_ready, q_ready, q_empty, do_ready,
    do_empty, stats_ready, kv_empty)."""
    q_smem = gl.allocate_shared_memory(q_desc.dtype, [NUM_STAGES] + q_desc.block_type.shape,
                                       q_desc.layout)
    do_smem = gl.allocate_shared_memory(do_desc.dtype, [NUM_STAGES] + do_desc.block_type.shape,
                                        do_desc.layout)
    STAT_SMEM: gl.constexpr = gl.SwizzledSharedLayout(1, 1, 1, [0])
    lse_smem = gl.allocate_shared_memory(gl.float32, [NUM_STAGES, BLOCK_M], STAT_SMEM)
    delta_smem = gl.allocate_shared_memory(gl.float32, [NUM_STAGES, BLOCK_M], STAT_SMEM)
    kv_ready = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())
    q_ready = gl.allocate_shared_memory(gl.int64, [NUM_STAGES, 1], mbarrier.MBarrierLayout())
    q_empty = gl.allocate_shared_memory(gl.int64, [NUM_STAGES, 1], mbarrier.MBarrierLayout())
    do_ready = gl.allocate_shared_memory(gl.int64, [NUM_STAGES, 1], mbarrier.MBarrierLayout())
    do_empty = gl.allocate_shared_memory(gl.int64, [NUM_STAGES, 1], mbarrier.MBarrierLayout())
    stats_ready = gl.allocate_shared_memory(gl.int64, [NUM_STAGES, 1], mbarrier.MBarrierLayout())
    kv_empty = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())
    mbarrier.init(kv_ready, count=1)
    mbarrier.init(kv_empty, count=2)
    for i in gl.static_range(NUM_STAGES):
        mbarrier.init(q_ready.index(i), count=1)
        mbarrier.init(q_empty.index(i), count=2)
        mbarrier.init(do_ready.index(i), count=1)
        mbarrier.init(do_empty.index(i), count=2)
        mbarrier.init(stats_ready.index(i), count=1)
    return ((q_smem, do_smem, lse_smem, delta_smem),
            (kv_ready, q_ready, q_empty, do_ready, do_empty, stats_ready, kv_empty))
