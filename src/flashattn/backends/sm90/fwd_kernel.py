"""FlashAttention-3-style forward for sm90, written in Gluon.

One CTA = three warp-specialised partitions sharing a circular shared-memory pipeline:

    producer   1 warp, ~24 registers: TMA loads of Q (once per tile) and of K, V blocks into
               NUM_STAGES ring slots; each slot has a *ready* mbarrier (TMA transaction
               count) and an *empty* mbarrier (both consumers arrive when done reading).
    consumer0  warpgroup (default partition), ~240 registers: rows [0, HALF_M) of the tile
    consumer1  warpgroup (worker partition),  ~240 registers: rows [HALF_M, BLOCK_M)
    (CONSUMERS = 3, used at d = 64: BLOCK_M = 192, a third consumer warpgroup, 160 registers
    each; every K/V block loaded then serves 192 query rows instead of 128)

Each consumer computes S = Q K^T and O += P V with wgmma (Q, K, V from shared memory, P from
registers: the S accumulator converted in registers to the A-operand layout), online softmax
in exp2 with log2(e) folded into the scale, and writes O through shared memory with a TMA
store plus the natural-log LSE (b, h, s_q) float32.

Scheduling knobs (constexpr, for the ablation table in benchmarks/NOTES.md):
    PINGPONG       the two consumers take turns issuing their GEMMs, so one warpgroup's softmax
                   runs while the other's GEMMs use the tensor cores. 0 off; 1 the token passes
                   through two mbarriers (every arrive is a warpgroup bar.sync + one-thread
                   arrive, Triton's lowering); 2 through two hardware named barriers (bar.sync /
                   bar.arrive over 256 threads, as CUTLASS kernels do), in inline PTX, around the
                   steady-state GEMM pairs only. Off by default (config.py): both measured equal
                   or slower here (benchmarks/NOTES.md).
    INTRA_OVERLAP  inside a warpgroup, S_{j+1} = Q K_{j+1}^T and O += P_j V_j are issued together
                   and the softmax of block j+1 runs while P_j V_j is still in flight.
    DYNAMIC        persistent tile queue (global atomic counter) instead of a static
                   round-robin: causal tiles differ in length, so CTAs take the next
                   (longest remaining) tile when they finish one.
    Persistence is a launch choice (grid = #SMs, or one CTA per tile). The producer hands each
    tile index to the consumers through shared memory with Q's barrier.
    NO_WS          ablation only: no producer warp; consumer warpgroup 0 issues the TMA loads
                   between its own GEMMs (static tile order). Measured -35..-45 % at d=128.
    ROWSUM_MMA     the softmax's row sum l as P · ones on the tensor core (one wgmma of N = 8
                   per key block beside P·V, B a tile of ones in shared memory) instead of one
                   FADD per score: the FP8 kernel at d <= 192 is bound by instruction issue,
                   not by the GEMMs (+5-8 % at d = 64 / 128, benchmarks/NOTES.md, 2026-11-24).
                   Each block's sum starts from zero and l adds them in fp32 registers. l then
                   sums the same rounded P that P·V multiplies (FA3 sums the fp32 P).
    BOTTOM_ALIGN   masked calls: query tiles are shifted up by whole warpgroup pieces
                   (_row_shift) so that the last ends within HALF_M rows of seqlen_q: when
                   BLOCK_M does not divide seqlen_q the partial tile is the first, which sees
                   the fewest keys under a causal mask, not the last, which sees them all.
                   A piece of rows < 0 loads rows from 0 (TMA takes no negative coordinate),
                   and its rows are neither stored nor written to the LSE.
    VARLEN         packed variable-length sequences (flash_attn_varlen_func): the tensors are
                   viewed as (1, total, h, d), a tile's rows and keys start at its sequence's
                   offsets (cu_seqlens), and the masks use its lengths. The producer maps each
                   tile to its sequence (_varlen_tile), skips the tiles past a sequence's end
                   and hands the geometry to the consumers with the tile. Keys past the end
                   are never read: the key block that crosses it is loaded ending at the
                   sequence's last key, the keys before its start masked (_last_block_start;
                   a sequence shorter than a block has the V rows before its start zeroed;
                   with seqused_k the consumers zero its V rows past the end instead:
                   row_guard.py); query rows past it are computed but not
                   stored: O pieces that cross the end are stored from registers (_store_rows),
                   since a TMA store would overwrite the next sequence's rows. FP8: V^T
                   holds each sequence's used keys from a whole wgmma key group (32 positions,
                   v_layout.wgmma_ordered_vt_varlen), zeros after them, and the descales are
                   per sequence.

Every Gluon ``mbarrier.arrive`` from a consumer is a warpgroup ``bar.sync`` followed by a
one-thread arrive (Triton's lowering): each K or V release costs one warpgroup barrier, which
is where ncu's "CTA barrier" stalls of this kernel come from. Releasing K and V of a slot with
one arrive after PV was measured slower (K's slot refills a block later: NOTES). So was
THREAD_RELEASE (``_release``: every consumer thread arrives by itself, no ``bar.sync``; 1-7 %
slower, 2026-11-24): the stall is warps waiting for each other, not the barrier instruction.
"""
from __future__ import annotations

from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import (fence_async_shared, mbarrier, tma,
                                                               warpgroup_mma, warpgroup_mma_wait)

from flashattn.runtime.gluon_api import mbarrier_arrive_per_thread
from flashattn.runtime.gluon_api import cta_barrier, tma_load, tma_store  # noqa: F401 (version names)

from flashattn.backends.sm90.ptx import per_thread_ptx
from flashattn.backends.sm90.ring import ring_load
from flashattn.backends.sm90.row_guard import zero_rows_before, zero_rows_from
from flashattn.backends.sm90.softmax import (LN2, LOG2E, P_SCALE_LOG2, apply_softcap, mask_scores,
                                    online_softmax)
from flashattn.backends.sm90.tiles import (block_needs_mask, key_block_range, tile_coords, used_keys,
                                  varlen_slot, varlen_span)


@gluon.jit
def _producer(descs, smem, bars, problem, window, tile_counter, BLOCK_M: gl.constexpr,
              HAS_LEFT: gl.constexpr, HAS_RIGHT: gl.constexpr, HAS_SOFTCAP: gl.constexpr,
              LONGEST_FIRST: gl.constexpr, PINGPONG: gl.constexpr, INTRA_OVERLAP: gl.constexpr,
              SEPARATE_O: gl.constexpr, DYNAMIC: gl.constexpr, BOTTOM_ALIGN: gl.constexpr,
              varlen, VARLEN: gl.constexpr, seqused_ptr):
    """Issue every TMA load of this CTA's tiles, in the order the consumers use them."""
    if VARLEN:
        _producer_varlen(descs, smem, bars, problem, window, tile_counter, varlen, seqused_ptr,
                         BLOCK_M, HAS_LEFT, HAS_RIGHT, LONGEST_FIRST, DYNAMIC)
    else:
        _producer_dense(descs, smem, bars, problem, window, tile_counter, BLOCK_M, HAS_LEFT,
                        HAS_RIGHT, LONGEST_FIRST, DYNAMIC, BOTTOM_ALIGN)


@gluon.jit
def _producer_dense(descs, smem, bars, problem, window, tile_counter, BLOCK_M: gl.constexpr,
                    HAS_LEFT: gl.constexpr, HAS_RIGHT: gl.constexpr, LONGEST_FIRST: gl.constexpr,
                    DYNAMIC: gl.constexpr, BOTTOM_ALIGN: gl.constexpr):
    """The producer over (batch, head, m block) tiles of padded (b, s, h, d) tensors."""
    q_desc, k_desc, v_desc, o_desc = descs
    q_smem, k_smem, v_smem, o_smem, tile_slot, ones_smem = smem
    q_ready, q_empty, k_ready, k_empty, v_ready, v_empty, turn = bars
    seqlen_q, seqlen_k, n_heads, group_size, n_bh, n_m_blocks, n_tiles, heads_per_group = problem
    window_left, window_right = window
    BLOCK_N: gl.constexpr = k_desc.block_type.shape[1]
    m_shift = _row_shift(seqlen_q, n_m_blocks, BLOCK_M, q_desc.block_type.shape[1],
                         q_desc.dtype == gl.float8e4nv, BOTTOM_ALIGN)

    kv_count = 0
    tile_iter = 0
    tile = gl.program_id(0)
    while tile < n_tiles:
        b, h, m_block = tile_coords(tile, n_m_blocks, n_heads, n_bh, heads_per_group, LONGEST_FIRST)
        m_start = m_block * BLOCK_M - m_shift
        h_k = h // group_size
        lo_blk, n_blocks = key_block_range(m_start, seqlen_q, seqlen_k, window_left, window_right,
                                           BLOCK_M, BLOCK_N, HAS_LEFT, HAS_RIGHT)
        # Q of this tile: both halves on one barrier (the slot is free once both consumers
        # released the previous tile's Q). The tile index rides along in shared memory.
        mbarrier.wait(q_empty, (tile_iter & 1) ^ 1)
        _publish_tile(tile_slot, tile)
        _load_q(q_desc, q_smem, q_ready, b, h, m_start)
        if DYNAMIC:
            # next tile from the global queue (tiles are ordered longest first); its latency
            # hides behind this tile's K/V loads
            next_tile = gl.num_programs(0) + gl.atomic_add(tile_counter, 1)
        else:
            next_tile = tile + gl.num_programs(0)
        for j in range(n_blocks):
            n_start = (lo_blk + j) * BLOCK_N
            kv_count = _load_kv(descs, smem, bars, kv_count, b, n_start, h_k, n_start)
        tile_iter += 1
        tile = next_tile
    # no more tiles: tell the consumers (an index >= n_tiles, published like the others)
    mbarrier.wait(q_empty, (tile_iter & 1) ^ 1)
    _publish_tile(tile_slot, tile)
    mbarrier.arrive(q_ready)


@gluon.jit
def _producer_varlen(descs, smem, bars, problem, window, tile_counter, varlen, seqused_ptr,
                     BLOCK_M: gl.constexpr, HAS_LEFT: gl.constexpr, HAS_RIGHT: gl.constexpr,
                     LONGEST_FIRST: gl.constexpr, DYNAMIC: gl.constexpr):
    """The producer over packed sequences (module doc, VARLEN): tiles that lie past their
    sequence's end (at most two per sequence and head, _varlen_tile) are skipped without a
    load or a hand-off, so the consumers only ever see real tiles. ``seqused_ptr``: None, or
    int32 (n_seqs,): sequence b sees only its first seqused[b] keys (clamped to its slot)."""
    q_desc, k_desc, v_desc, o_desc = descs
    q_smem, k_smem, v_smem, o_smem, tile_slot, ones_smem = smem
    q_ready, q_empty, k_ready, k_empty, v_ready, v_empty, turn = bars
    total_q, total_k, n_heads, group_size, n_seqs, n_g, n_tiles, heads_per_group = problem
    window_left, window_right = window
    BLOCK_N: gl.constexpr = k_desc.block_type.shape[1]

    kv_count = 0
    tile_iter = 0
    tile = gl.program_id(0)
    while tile < n_tiles:
        seq, h, m_block, q_off, len_q, k_off, len_k = _varlen_tile(
            tile, varlen, n_seqs, n_g, n_heads, heads_per_group, total_q, total_k, BLOCK_M,
            LONGEST_FIRST)
        if seqused_ptr is not None:  # (masks and key ranges follow it: the consumers get it)
            len_k = used_keys(seqused_ptr, seq, len_k)
        if DYNAMIC:
            next_tile = gl.num_programs(0) + gl.atomic_add(tile_counter, 1)
        else:
            next_tile = tile + gl.num_programs(0)
        if m_block * BLOCK_M < len_q:
            m_start = m_block * BLOCK_M
            h_k = h // group_size
            lo_blk, n_blocks = key_block_range(m_start, len_q, len_k, window_left,
                                               window_right, BLOCK_M, BLOCK_N, HAS_LEFT,
                                               HAS_RIGHT)
            mbarrier.wait(q_empty, (tile_iter & 1) ^ 1)
            _publish_varlen_tile(tile_slot, tile, h, m_block, q_off, len_q, k_off, len_k, seq)
            # rows past the sequence's end load the next sequence's queries (or TMA's zeros
            # past the tensor): computed, never stored
            _load_q(q_desc, q_smem, q_ready, 0, h, q_off + m_start)
            # FP8: V^T (v_layout.wgmma_ordered_vt_varlen) holds sequence b from position
            # 32 * (b + k_off // 32), a whole wgmma key group, with zeros up to the next one;
            # a 16-bit V's keys sit where K's do
            fp8 = v_desc.dtype == gl.float8e4nv
            if fp8:
                v_off = 32 * (seq + k_off // 32)
            else:
                v_off = k_off
            for j in range(n_blocks):
                n_start = (lo_blk + j) * BLOCK_N
                # 16-bit: a block that would cross the sequence's end is loaded ending at its
                # last key (_last_block_start; the consumers mask the keys before n_start):
                # the rows after the end (the next sequence's, padding) are never read, and
                # P = 0 never meets an Inf / NaN there. (With seqused_k the rows before a
                # short sequence are the previous slot's unused keys: the consumers zero the
                # rows past the end instead.)
                n_load = n_start
                if not fp8 and seqused_ptr is None:
                    n_load = _last_block_start(n_start, len_k, BLOCK_N)
                kv_count = _load_kv(descs, smem, bars, kv_count, 0, k_off + n_load, h_k,
                                    v_off + n_load)
            tile_iter += 1
        tile = next_tile
    mbarrier.wait(q_empty, (tile_iter & 1) ^ 1)
    _publish_varlen_tile(tile_slot, tile, 0, 0, 0, 0, 0, 0, 0)
    mbarrier.arrive(q_ready)


@gluon.jit
def _varlen_tile(tile, varlen, n_seqs, n_g, n_heads, heads_per_group, total_q, total_k,
                 BLOCK_M: gl.constexpr, LONGEST_FIRST: gl.constexpr):
    """(sequence, head, m block, q offset, q length, k offset, k length) of varlen tile
    ``tile``; an m block at or past the q length marks a slot to skip.

    A head has n_g tile slots g. Sequence b owns the slots [start(b), start(b + 1)) with
    start(b) = b + cu_seqlens_q[b] // BLOCK_M: no scan of the lengths is needed (the host
    knows n_g = n_seqs + total_q // BLOCK_M without reading the device tensor), and a
    sequence gets at least cdiv(len, BLOCK_M) slots, at most two more, which are skipped.
    b is found by binary search over cu_seqlens_q (start is non-decreasing in b).
    The (head, slot) order is tile_coords' over one batch of n_g "m blocks": heads_per_group
    heads advance together (their K / V shared in L2), and LONGEST_FIRST (causal) walks the
    slots last to first, so every sequence's bottom tiles, which see the most keys, start
    before any sequence's top ones and the schedule ends on short tiles.
    """
    cu_q_ptr, cu_k_ptr, o_ptr, o_row_stride, head_dim_v = varlen
    _, h, g = tile_coords(tile, n_g, n_heads, n_heads, heads_per_group, LONGEST_FIRST)
    seq, m_block = varlen_slot(g, cu_q_ptr, n_seqs, total_q, BLOCK_M)
    q_off, len_q = varlen_span(cu_q_ptr, seq, total_q)
    k_off, len_k = varlen_span(cu_k_ptr, seq, total_k)
    return seq, h, m_block, q_off, len_q, k_off, len_k


@gluon.jit
def _last_block_start(n_start, len_k, BLOCK_N: gl.constexpr):
    """Where a VARLEN 16-bit key block's loads start: n_start, or for the block that crosses
    the sequence's end, len_k - BLOCK_N (keys before n_start, the previous block's or, when the
    sequence is shorter than a block, rows before it, come along masked; rows before the
    tensor's start load as TMA zeros). FP8's packed V^T holds zeros past each sequence
    instead (v_layout.py)."""
    return gl.where(n_start + BLOCK_N > len_k, len_k - BLOCK_N, n_start)


@gluon.jit
def _mask_block(s, row0, n_start, len_q, len_k, window_left, window_right,
                S_LAYOUT: gl.constexpr, HALF_M: gl.constexpr, BLOCK_N: gl.constexpr,
                HAS_LEFT: gl.constexpr, HAS_RIGHT: gl.constexpr, SHIFTED: gl.constexpr):
    """softmax.mask_scores for key block n_start; SHIFTED (VARLEN 16-bit): the block that
    crosses the sequence's end holds keys from _last_block_start, and those before n_start
    are masked too."""
    if SHIFTED:
        n_load = _last_block_start(n_start, len_k, BLOCK_N)
        s = mask_scores(s, row0, n_load, len_q, len_k, window_left, window_right, S_LAYOUT,
                        HALF_M, BLOCK_N, HAS_LEFT, HAS_RIGHT)
        cols = n_load + gl.arange(0, BLOCK_N, layout=gl.SliceLayout(0, S_LAYOUT))
        return gl.where(gl.expand_dims(cols >= n_start, 0), s, float("-inf"))
    return mask_scores(s, row0, n_start, len_q, len_k, window_left, window_right, S_LAYOUT,
                       HALF_M, BLOCK_N, HAS_LEFT, HAS_RIGHT)


# varlen hand-off slot: [tile, head, m block, q offset, q length, k offset, k length, sequence]
VARLEN_SLOT = gl.constexpr(8)


@gluon.jit
def _publish_varlen_tile(tile_slot, tile, h, m_block, q_off, len_q, k_off, len_k, seq):
    """Producer -> consumers (VARLEN): the next tile and its sequence's geometry, found once
    by the producer (its binary search runs ahead of the consumers)."""
    layout: gl.constexpr = gl.BlockedLayout([1], [32], [1], [0])
    idx = gl.arange(0, VARLEN_SLOT, layout)
    zero = gl.zeros([VARLEN_SLOT], gl.int32, layout)
    vals = gl.where(idx == 0, zero + tile, zero)
    vals = gl.where(idx == 1, zero + h, vals)
    vals = gl.where(idx == 2, zero + m_block, vals)
    vals = gl.where(idx == 3, zero + q_off, vals)
    vals = gl.where(idx == 4, zero + len_q, vals)
    vals = gl.where(idx == 5, zero + k_off, vals)
    vals = gl.where(idx == 6, zero + len_k, vals)
    vals = gl.where(idx == 7, zero + seq, vals)
    tile_slot.store(vals)


@gluon.jit
def _slot_entry(vals, idx, i: gl.constexpr):
    """Entry i of the hand-off slot's values (each >= 0)."""
    return gl.max(gl.where(idx == i, vals, -1), axis=0)


# every thread of a consumer warpgroup reads the whole slot: the entries are then picked out
# of its own registers (no shuffle, no cross-warp step)
SLOT_READ = gl.constexpr(gl.BlockedLayout([8], [32], [4], [0]))


@gluon.jit
def _read_varlen_tile(tile_slot):
    """Consumer side of _publish_varlen_tile (after q_ready's wait): (tile, head, m block,
    q offset, q length, k offset, k length, sequence)."""
    layout: gl.constexpr = SLOT_READ
    vals = tile_slot.load(layout)
    idx = gl.arange(0, VARLEN_SLOT, layout)
    return (_slot_entry(vals, idx, 0), _slot_entry(vals, idx, 1), _slot_entry(vals, idx, 2),
            _slot_entry(vals, idx, 3), _slot_entry(vals, idx, 4), _slot_entry(vals, idx, 5),
            _slot_entry(vals, idx, 6), _slot_entry(vals, idx, 7))


@gluon.jit
def _row_shift(seqlen_q, n_m_blocks, BLOCK_M: gl.constexpr, HALF_M: gl.constexpr,
               FP8: gl.constexpr, BOTTOM_ALIGN: gl.constexpr):
    """How far tile m's first row lies before m * BLOCK_M (module doc, BOTTOM_ALIGN): 0, or
    n_m_blocks * BLOCK_M - seqlen_q rounded down to a multiple of HALF_M, so that the last
    tile ends less than HALF_M rows past seqlen_q. Whole warpgroup pieces: each piece of the
    first tile is all rows < 0 or none, and in FP8 each stays inside one Q scale block
    (power-of-two blocks of >= HALF_M rows, support.fp8_unsupported)."""
    m_shift = 0
    if BOTTOM_ALIGN:
        # (a tensor: Triton specialises integer arguments equal to 1 into constants)
        m_shift = (gl.to_tensor(n_m_blocks * BLOCK_M - seqlen_q) // HALF_M) * HALF_M
    return m_shift


@gluon.jit
def _load_q(q_desc, q_smem, q_ready, b, h, m_start):
    """TMA loads of a tile's Q, one HALF_M-row piece per consumer, all on ``q_ready``; the
    caller has waited for ``q_empty``."""
    HALF_M: gl.constexpr = q_desc.block_type.shape[1]
    CONSUMERS: gl.constexpr = q_smem.shape[0]
    mbarrier.expect(q_ready, CONSUMERS * q_desc.block_type.nbytes)
    for i in gl.static_range(CONSUMERS):
        # (BOTTOM_ALIGN: a piece of rows < 0 loads rows from 0 instead, which its consumer
        # neither stores nor writes to the LSE; TMA takes no negative coordinate: measured as
        # an illegal instruction on the H100)
        tma_load(q_desc, [b, gl.maximum(m_start + i * HALF_M, 0), h, 0], q_ready,
                 q_smem.index(i))


@gluon.jit
def _load_kv(descs, smem, bars, kv_count, b, n_start, h_k, v_start):
    """TMA loads of key block ``n_start`` (K, then V from key ``v_start``: the same key, whose
    position differs in a varlen FP8 V^T) into ring slot ``kv_count % NUM_STAGES``, each once
    every consumer has released the slot. Returns ``kv_count + 1``."""
    q_desc, k_desc, v_desc, o_desc = descs
    q_smem, k_smem, v_smem, o_smem, tile_slot, ones_smem = smem
    q_ready, q_empty, k_ready, k_empty, v_ready, v_empty, turn = bars
    NUM_STAGES: gl.constexpr = k_smem.shape[0]
    stage = kv_count % NUM_STAGES
    phase = (kv_count // NUM_STAGES) & 1
    ring_load(k_desc, [b, n_start, h_k, 0], k_smem, k_ready, k_empty, stage, phase)
    if v_desc.dtype == gl.float8e4nv:  # FP8: V^T, (b, h_k, d_v, s_k) keys contiguous
        ring_load(v_desc, [b, h_k, 0, v_start], v_smem, v_ready, v_empty, stage, phase)
    else:
        ring_load(v_desc, [b, v_start, h_k, 0], v_smem, v_ready, v_empty, stage, phase)
    return kv_count + 1


@gluon.jit
def _publish_tile(tile_slot, tile):
    """Producer -> consumers: the next tile index, written before q_ready's arrive (release)."""
    layout: gl.constexpr = gl.BlockedLayout([1], [32], [1], [0])
    tile_slot.store(gl.zeros([1], gl.int32, layout) + tile)


@gluon.jit
def _read_tile(tile_slot):
    """Consumer side of _publish_tile (or the tile of _publish_varlen_tile), after q_ready's
    wait (acquire)."""
    layout: gl.constexpr = gl.BlockedLayout([1], [32], [4], [0])
    if tile_slot.shape[0] == 1:
        tile = gl.max(tile_slot.load(layout), axis=0)
    else:
        tile = _slot_entry(tile_slot.load(SLOT_READ), gl.arange(0, VARLEN_SLOT, SLOT_READ), 0)
    return tile


# The row-sum GEMM's N: wgmma's smallest (l is any one of its equal columns)
ROWSUM_N = gl.constexpr(8)


@gluon.jit
def _fill_ones(ones_smem, WG: gl.constexpr):
    """Consumer ``WG`` writes its ROWSUM_N x BLOCK_N tile of ones (the row-sum GEMM's B operand,
    keys contiguous as K^T's are) once per kernel, visible to its own wgmmas."""
    BLOCK_N: gl.constexpr = ones_smem.shape[2]
    fill: gl.constexpr = gl.BlockedLayout([1, 1], [1, 32], [4, 1], [1, 0])
    ones = gl.full([ROWSUM_N, BLOCK_N], 1.0, gl.float32, fill).to(ones_smem.dtype)
    ones_smem.index(WG).store(ones)
    fence_async_shared()
    cta_barrier()  # every thread's part is written before any wgmma of the warpgroup reads it


@gluon.jit
def _rowsum_issue(p_in, ones_view, l_zero, P_L_LAYOUT: gl.constexpr):
    """Issue one key block's row sum P · ones (ROWSUM_MMA), beside its P·V: from zero, so the
    block's sum never adds into a large accumulator on the tensor core (the caller adds the
    blocks in fp32). P's registers serve as they are: the A operand's layout does not depend on
    N, so the conversion to the N = ROWSUM_N parent moves nothing."""
    return warpgroup_mma(gl.convert_layout(p_in, P_L_LAYOUT), ones_view, l_zero, use_acc=False,
                         is_async=True)


@gluon.jit
def _release(empty_bar, THREAD_RELEASE: gl.constexpr):
    """A consumer warpgroup is done reading a K or V slot: arrive on its *empty* barrier.

    THREAD_RELEASE: every thread arrives by itself once its own wgmma wait has returned
    (``cp.async.mbarrier.arrive.noinc``: with no cp.async of this thread pending it is a plain
    per-thread arrive; the barrier counts 128 per warpgroup). Otherwise Gluon's
    ``mbarrier.arrive``: a warpgroup ``bar.sync`` plus a one-thread arrive. Removing those
    barriers (ncu's top stall of the FP8 forward is "CTA barrier") measured 1-7 % *slower*:
    128 arrives on one barrier word cost more than the bar.sync; off by default
    (FwdConfig.thread_release; NOTES, 2026-11-24)."""
    if THREAD_RELEASE:
        mbarrier_arrive_per_thread(empty_bar)
    else:
        mbarrier.arrive(empty_bar)


# Hardware named-barrier ids of the ping-pong token (PINGPONG == 2): warpgroup WG waits on
# TURN_BARRIER + WG. Triton's own partitions use ids 0-2 (membar's per-partition bar.sync and
# the warp_specialize start-up barrier in this kernel's PTX); 16 exist.
TURN_BARRIER = gl.constexpr(12)


@gluon.jit
def _named_barrier(BAR_ID: gl.constexpr, ARRIVE: gl.constexpr):
    """bar.sync (wait until 256 threads, both consumer warpgroups, have arrived) or bar.arrive
    (count this warpgroup's 128 threads and go on) on named barrier BAR_ID, from every thread of
    one warpgroup (Gluon has no named-barrier op: ptx.per_thread_ptx)."""
    gl.static_assert(BAR_ID == 12 or BAR_ID == 13)
    if ARRIVE:
        if BAR_ID == 12:
            per_thread_ptx("bar.arrive 12, 256;")
        else:
            per_thread_ptx("bar.arrive 13, 256;")
    else:
        if BAR_ID == 12:
            per_thread_ptx("bar.sync 12, 256;")
        else:
            per_thread_ptx("bar.sync 13, 256;")


@gluon.jit
def _turn_start(turn, WG: gl.constexpr, PINGPONG: gl.constexpr):
    """Ping-pong: warpgroup 1 hands the first turn to warpgroup 0 (once per kernel)."""
    if PINGPONG == 1:
        if WG == 1:
            mbarrier.arrive(turn.index(0))
    if PINGPONG == 2:
        if WG == 1:
            _named_barrier(TURN_BARRIER, True)


@gluon.jit
def _turn_end(WG: gl.constexpr, PINGPONG: gl.constexpr):
    """Ping-pong (named): warpgroup 0 consumes warpgroup 1's last hand-off, so no arrival is
    left pending on a hardware barrier when the CTA exits (mbarriers need no such step)."""
    if PINGPONG == 2:
        if WG == 0:
            _named_barrier(TURN_BARRIER, False)


@gluon.jit
def _turn_wait(turn, WG: gl.constexpr, turn_count, PINGPONG: gl.constexpr,
               STEADY: gl.constexpr = False):
    """Ping-pong: wait until the other warpgroup has issued its GEMMs. The named-barrier
    token (PINGPONG == 2) is passed only around the steady-state GEMM pairs (STEADY), the
    same count in both warpgroups for every tile."""
    if PINGPONG == 1:
        mbarrier.wait(turn.index(WG), turn_count & 1)
    if PINGPONG == 2:
        if STEADY:
            _named_barrier(TURN_BARRIER + WG, False)
    return turn_count + 1


@gluon.jit
def _turn_pass(turn, WG: gl.constexpr, PINGPONG: gl.constexpr, STEADY: gl.constexpr = False):
    """Ping-pong: hand the tensor cores to the other warpgroup."""
    if PINGPONG == 1:
        mbarrier.arrive(turn.index(1 - WG))
    if PINGPONG == 2:
        if STEADY:
            _named_barrier(TURN_BARRIER + 1 - WG, True)


@gluon.jit
def _consumer(WG: gl.constexpr, descs, smem, bars, problem, window, scales, fp8_scales, lse_ptr,
              sink_ptr, BLOCK_M: gl.constexpr, HAS_LEFT: gl.constexpr, HAS_RIGHT: gl.constexpr, HAS_SOFTCAP: gl.constexpr,
              LONGEST_FIRST: gl.constexpr, PINGPONG: gl.constexpr, INTRA_OVERLAP: gl.constexpr,
              SEPARATE_O: gl.constexpr, DYNAMIC: gl.constexpr, NO_WS: gl.constexpr,
              THREAD_RELEASE: gl.constexpr, ROWSUM_MMA: gl.constexpr,
              BOTTOM_ALIGN: gl.constexpr, varlen, VARLEN: gl.constexpr,
              USED: gl.constexpr = False):
    """One consumer warpgroup: rows [WG * HALF_M, (WG + 1) * HALF_M) of every tile
    (HALF_M = BLOCK_M // CONSUMERS: the name is from the two-consumer layout).

    NO_WS (ablation only): there is no producer warp; warpgroup 0 issues the TMA loads itself,
    NUM_STAGES key blocks ahead, at the end of each key block (FA2-style software pipelining
    inside the compute warps), and both warpgroups walk the static round-robin tile order."""
    q_desc, k_desc, v_desc, o_desc = descs
    q_smem, k_smem, v_smem, o_smem, tile_slot, ones_smem = smem
    q_ready, q_empty, k_ready, k_empty, v_ready, v_empty, turn = bars
    seqlen_q, seqlen_k, n_heads, group_size, n_bh, n_m_blocks, n_tiles, heads_per_group = problem
    window_left, window_right = window
    qk_scale, softcap_inv, softcap_log2 = scales
    HALF_M: gl.constexpr = q_desc.block_type.shape[1]
    BLOCK_N: gl.constexpr = k_desc.block_type.shape[1]
    NUM_STAGES: gl.constexpr = k_smem.shape[0]

    HEAD_DIM: gl.constexpr = q_desc.block_type.shape[3]  # of Q and K (padded)
    HEAD_DIM_V: gl.constexpr = o_desc.block_type.shape[3]  # of V and O (padded)
    dtype: gl.constexpr = q_desc.dtype
    # FP8 (e4m3 Q, K, V^T; module doc "FP8"): wgmma's K step is 32 and P is an 8-bit A operand
    FP8: gl.constexpr = dtype == gl.float8e4nv
    MMA_K: gl.constexpr = 32 if FP8 else 16
    m_shift = _row_shift(seqlen_q, n_m_blocks, BLOCK_M, HALF_M, FP8, BOTTOM_ALIGN)
    P_K_WIDTH: gl.constexpr = 4 if FP8 else 2
    # wgmma layouts of one warpgroup: S (HALF_M x BLOCK_N) and O (HALF_M x HEAD_DIM_V)
    S_LAYOUT: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                       instr_shape=[16, BLOCK_N, MMA_K])
    O_LAYOUT: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                       instr_shape=[16, HEAD_DIM_V, MMA_K])
    P_LAYOUT: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=O_LAYOUT,
                                                 k_width=P_K_WIDTH)
    ROW_S: gl.constexpr = gl.SliceLayout(1, S_LAYOUT)
    ROW_O: gl.constexpr = gl.SliceLayout(1, O_LAYOUT)

    if HAS_SOFTCAP:
        s_unit = 1.0  # apply_softcap returns log2 units
    else:
        s_unit = qk_scale

    gl.static_assert(WG * HALF_M < BLOCK_M)
    gl.static_assert(not FP8 or SEPARATE_O)
    # ROWSUM_MMA: l = P · ones on the tensor core, one more wgmma (N = ROWSUM_N) per PV; its
    # group is waited with PV's, so the QK^T wait leaves PV_GROUPS groups in flight. Each key
    # block's sum starts from zero and is added to l in fp32 registers: the FP8 tensor core
    # keeps ~14 bits when it adds products to its accumulator, so l (a sum of positives that
    # keeps growing) accumulated there loses the small terms of later blocks; that made the
    # output 2.5x less accurate at 16k keys (H100, benchmarks/NOTES.md, 2026-11-24).
    PV_GROUPS: gl.constexpr = 2 if ROWSUM_MMA else 1
    L_LAYOUT: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                       instr_shape=[16, ROWSUM_N, MMA_K])
    P_L_LAYOUT: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=L_LAYOUT,
                                                   k_width=P_K_WIDTH)
    ROW_L: gl.constexpr = gl.SliceLayout(1, L_LAYOUT)
    if ROWSUM_MMA:
        l_zero = gl.zeros([HALF_M, ROWSUM_N], gl.float32, L_LAYOUT)
        _fill_ones(ones_smem, WG)
        ones_view = ones_smem.index(WG).permute((1, 0))  # (BLOCK_N, ROWSUM_N), keys contiguous
    gl.static_assert(PINGPONG == 0 or BLOCK_M == 2 * HALF_M)  # the turn token passes 0 <-> 1
    _turn_start(turn, WG, PINGPONG)  # warpgroup 0 issues first
    turn_count = 0
    kv_count = 0
    tile_iter = 0
    s_zero = gl.zeros([HALF_M, BLOCK_N], gl.float32, S_LAYOUT)
    q_view = q_smem.index(WG).reshape([HALF_M, HEAD_DIM])
    o_view = o_smem.index(WG).reshape([HALF_M, HEAD_DIM_V])
    load_count = 0  # NO_WS: key blocks whose loads warpgroup 0 has issued
    if NO_WS:
        tile = gl.program_id(0)
    else:
        mbarrier.wait(q_ready, 0)
        tile = _read_tile(tile_slot)
    while tile < n_tiles:
        if VARLEN:  # (this tile's sequence b: its rows start at q_off, its keys at k_off)
            _, h, m_block, q_off, len_q, k_off, len_k, b = _read_varlen_tile(tile_slot)
        else:
            b, h, m_block = tile_coords(tile, n_m_blocks, n_heads, n_bh, heads_per_group,
                                        LONGEST_FIRST)
            len_q = seqlen_q
            len_k = seqlen_k
        m_start = m_block * BLOCK_M - m_shift
        row0 = m_start + WG * HALF_M
        lo_blk, n_blocks = key_block_range(m_start, len_q, len_k, window_left, window_right,
                                           BLOCK_M, BLOCK_N, HAS_LEFT, HAS_RIGHT)
        h_k = h // group_size
        if NO_WS:
            if WG == 0:  # this tile's Q and the first NUM_STAGES key blocks
                mbarrier.wait(q_empty, (tile_iter & 1) ^ 1)
                _load_q(q_desc, q_smem, q_ready, b, h, m_start)
                for i in range(gl.minimum(n_blocks, NUM_STAGES)):
                    n_load = (lo_blk + i) * BLOCK_N
                    load_count = _load_kv(descs, smem, bars, load_count, b, n_load, h_k,
                                          n_load)
            mbarrier.wait(q_ready, tile_iter & 1)
        m_i = gl.full([HALF_M], float("-inf"), gl.float32, ROW_S)
        l_i = gl.zeros([HALF_M], gl.float32, ROW_S)
        acc = gl.zeros([HALF_M, HEAD_DIM_V], gl.float32, O_LAYOUT)
        if ROWSUM_MMA:  # (every column holds the row sum: P · ones, then fp32 adds)
            l_acc = gl.zeros([HALF_M, ROWSUM_N], gl.float32, L_LAYOUT)
        if FP8:  # the first key block's factors (a clamped index when there is none)
            q_unit, kd_base = _fp8_tile_scales(fp8_scales, b, h, h_k, row0, n_heads)
            s_unit_j, softcap_inv_j, vd = _fp8_block_scales(fp8_scales, kd_base,
                                                            lo_blk * BLOCK_N, q_unit, qk_scale,
                                                            softcap_inv, HAS_SOFTCAP)
            vd_prev = vd

        if n_blocks > 0:
            # ---- first key block: S_0, softmax -> P_0 (acc is still zero)
            stage = kv_count % NUM_STAGES
            phase = (kv_count // NUM_STAGES) & 1
            n_start = lo_blk * BLOCK_N
            mbarrier.wait(k_ready.index(stage), phase)
            k_view = k_smem.index(stage).reshape([BLOCK_N, HEAD_DIM]).permute((1, 0))
            turn_count = _turn_wait(turn, WG, turn_count, PINGPONG)
            s_tok = warpgroup_mma(q_view, k_view, s_zero, use_acc=False, is_async=True)
            _turn_pass(turn, WG, PINGPONG)
            s = warpgroup_mma_wait(0, deps=(s_tok,))
            _release(k_empty.index(stage), THREAD_RELEASE)
            if HAS_SOFTCAP:
                if FP8:
                    s = apply_softcap(s, softcap_inv_j, softcap_log2)
                else:
                    s = apply_softcap(s, softcap_inv, softcap_log2)
            if block_needs_mask(n_start, m_start, len_q, len_k, window_left, window_right,
                                BLOCK_M, BLOCK_N, HAS_LEFT, HAS_RIGHT):
                s = _mask_block(s, row0, n_start, len_q, len_k, window_left, window_right,
                                S_LAYOUT, HALF_M, BLOCK_N, HAS_LEFT, HAS_RIGHT,
                                VARLEN and not FP8 and not USED)
            if FP8:
                p, m_i, l_i, alpha = online_softmax(s, m_i, l_i, s_unit_j, P_SCALE_LOG2,
                                                    not ROWSUM_MMA)
            else:
                p, m_i, l_i, alpha = online_softmax(s, m_i, l_i, s_unit, 0.0, not ROWSUM_MMA)
            p_op = _p_carry(p, dtype, P_LAYOUT, HALF_M, BLOCK_N, FP8)
            prev_stage = stage
            prev_phase = phase
            kv_count += 1

            # ---- steady state: block j's S and block j-1's PV
            for j in range(1, n_blocks):
                stage = kv_count % NUM_STAGES
                phase = (kv_count // NUM_STAGES) & 1
                n_start = (lo_blk + j) * BLOCK_N
                k_view = k_smem.index(stage).reshape([BLOCK_N, HEAD_DIM]).permute((1, 0))
                v_prev = _v_operand(v_smem, prev_stage, BLOCK_N, HEAD_DIM_V, FP8)
                p_in = _p_issue(p_op, dtype, P_LAYOUT, HALF_M, BLOCK_N, FP8)
                if FP8:  # (scalar loads: their latency hides behind the GEMMs issued next)
                    s_unit_j, softcap_inv_j, vd = _fp8_block_scales(
                        fp8_scales, kd_base, n_start, q_unit, qk_scale, softcap_inv, HAS_SOFTCAP)
                if INTRA_OVERLAP:
                    mbarrier.wait(k_ready.index(stage), phase)
                    mbarrier.wait(v_ready.index(prev_stage), prev_phase)
                    turn_count = _turn_wait(turn, WG, turn_count, PINGPONG, True)
                    s_tok = warpgroup_mma(q_view, k_view, s_zero, use_acc=False, is_async=True)
                    acc_tok = warpgroup_mma(p_in, v_prev, acc, is_async=True)
                    if ROWSUM_MMA:
                        l_tok = _rowsum_issue(p_in, ones_view, l_zero, P_L_LAYOUT)
                    _turn_pass(turn, WG, PINGPONG, True)
                    s = warpgroup_mma_wait(PV_GROUPS, deps=(s_tok,))
                    _release(k_empty.index(stage), THREAD_RELEASE)
                else:
                    mbarrier.wait(v_ready.index(prev_stage), prev_phase)
                    turn_count = _turn_wait(turn, WG, turn_count, PINGPONG, True)
                    acc_tok = warpgroup_mma(p_in, v_prev, acc, is_async=True)
                    if ROWSUM_MMA:
                        l_tok = _rowsum_issue(p_in, ones_view, l_zero, P_L_LAYOUT)
                        acc, l_blk = warpgroup_mma_wait(0, deps=(acc_tok, l_tok))
                    else:
                        acc = warpgroup_mma_wait(0, deps=(acc_tok,))
                    _release(v_empty.index(prev_stage), THREAD_RELEASE)
                    mbarrier.wait(k_ready.index(stage), phase)
                    s_tok = warpgroup_mma(q_view, k_view, s_zero, use_acc=False, is_async=True)
                    _turn_pass(turn, WG, PINGPONG, True)
                    s = warpgroup_mma_wait(0, deps=(s_tok,))
                    _release(k_empty.index(stage), THREAD_RELEASE)
                if HAS_SOFTCAP:
                    if FP8:
                        s = apply_softcap(s, softcap_inv_j, softcap_log2)
                    else:
                        s = apply_softcap(s, softcap_inv, softcap_log2)
                if block_needs_mask(n_start, m_start, len_q, len_k, window_left,
                                    window_right, BLOCK_M, BLOCK_N, HAS_LEFT, HAS_RIGHT):
                    s = _mask_block(s, row0, n_start, len_q, len_k, window_left,
                                    window_right, S_LAYOUT, HALF_M, BLOCK_N, HAS_LEFT, HAS_RIGHT,
                                    VARLEN and not FP8 and not USED)
                if FP8:
                    p, m_i, l_i, alpha = online_softmax(s, m_i, l_i, s_unit_j, P_SCALE_LOG2,
                                                        not ROWSUM_MMA)
                    alpha_l = alpha
                    # acc holds block j-1's P V in units of its V descale: carry the ratio
                    alpha = alpha * (vd_prev / vd)
                    vd_prev = vd
                else:
                    p, m_i, l_i, alpha = online_softmax(s, m_i, l_i, s_unit, 0.0,
                                                        not ROWSUM_MMA)
                    alpha_l = alpha
                if INTRA_OVERLAP:
                    if ROWSUM_MMA:
                        acc, l_blk = warpgroup_mma_wait(0, deps=(acc_tok, l_tok))
                    else:
                        acc = warpgroup_mma_wait(0, deps=(acc_tok,))
                    _release(v_empty.index(prev_stage), THREAD_RELEASE)
                if NO_WS:
                    if WG == 0:  # block j - 1's slot is free once the other warpgroup agrees
                        if j - 1 + NUM_STAGES < n_blocks:
                            n_load = (lo_blk + j - 1 + NUM_STAGES) * BLOCK_N
                            load_count = _load_kv(descs, smem, bars, load_count, b, n_load,
                                                  h_k, n_load)
                acc = acc * gl.expand_dims(gl.convert_layout(alpha, ROW_O), 1)
                if ROWSUM_MMA:
                    alpha_lo = gl.expand_dims(gl.convert_layout(alpha_l, ROW_L), 1)
                    l_acc = (l_acc + l_blk) * alpha_lo
                p_op = _p_carry(p, dtype, P_LAYOUT, HALF_M, BLOCK_N, FP8)
                prev_stage = stage
                prev_phase = phase
                kv_count += 1

            # ---- last PV
            v_prev = _v_operand(v_smem, prev_stage, BLOCK_N, HEAD_DIM_V, FP8)
            p_in = _p_issue(p_op, dtype, P_LAYOUT, HALF_M, BLOCK_N, FP8)
            mbarrier.wait(v_ready.index(prev_stage), prev_phase)
            if VARLEN and USED and not FP8:
                # seqused_k: a short sequence's only block cannot end at its last used key
                # without reaching the previous slot's unused keys, so the block is loaded
                # where it starts and its V rows past the used keys (cache slots that may hold
                # anything) are zeroed before P · V reads them (row_guard.py)
                n_last = (lo_blk + n_blocks - 1) * BLOCK_N
                if n_last + BLOCK_N > len_k:
                    zero_rows_from(v_prev, len_k - n_last)
            if VARLEN and not USED and not FP8:
                # a sequence shorter than a key block: its one block, loaded ending at its last
                # key (_last_block_start), starts before its first key, in the previous
                # sequence's rows or, for the first sequence, in rows before cu_seqlens_k[0]
                # that belong to no sequence and may hold NaN / Inf. Their scores are masked,
                # but P · V would multiply that 0 by the V rows: zeroed (row_guard.py). (AOT:
                # 8 bytes of spills more at d = 64 / 192 x 128 / 256 causal, measured neutral;
                # done at the tile's first block instead: 24-32 bytes)
                if len_k < BLOCK_N:
                    zero_rows_before(v_prev, BLOCK_N - len_k)
            turn_count = _turn_wait(turn, WG, turn_count, PINGPONG)
            acc_tok = warpgroup_mma(p_in, v_prev, acc, is_async=True)
            if ROWSUM_MMA:
                l_tok = _rowsum_issue(p_in, ones_view, l_zero, P_L_LAYOUT)
            _turn_pass(turn, WG, PINGPONG)
            if ROWSUM_MMA:
                acc, l_blk = warpgroup_mma_wait(0, deps=(acc_tok, l_tok))
                l_acc = l_acc + l_blk
            else:
                acc = warpgroup_mma_wait(0, deps=(acc_tok,))
            _release(v_empty.index(prev_stage), THREAD_RELEASE)

        # ---- epilogue: O / l through shared memory and a TMA store; LSE in natural log
        if SEPARATE_O:
            mbarrier.arrive(q_empty)  # every QK^T of this tile is done: Q's slot may refill
        if ROWSUM_MMA:  # (every column of P · ones is the row sum)
            l_i = gl.convert_layout(gl.max(l_acc, axis=1), ROW_S)
        if sink_ptr is not None:
            # learnable sink (gpt-oss): one more logit of this head in the row's denominator,
            # attending to nothing: l += exp2(sink * log2(e) - m). A row that saw no key
            # (m = -inf, l = 0) takes m = 0: its out stays 0 and its lse becomes the sink.
            sink2 = gl.load(sink_ptr + h).to(gl.float32) * LOG2E
            m_i = gl.where(m_i == float("-inf"), 0.0, m_i)
            l_i = l_i + gl.exp2(sink2 - m_i)
        l_o = gl.convert_layout(l_i, ROW_O)
        if FP8:  # O = acc · v_descale(last block) / l (l and P both carry 2^8)
            inv_l = gl.where(l_o > 0.0, vd_prev / l_o, 0.0)
        else:
            inv_l = gl.where(l_o > 0.0, 1.0 / l_o, 0.0)
        out = (acc * gl.expand_dims(inv_l, 1)).to(o_desc.dtype)
        tma.store_wait(0)  # the previous tile's store has left o_smem
        if VARLEN:
            # a TMA store would also write the rows past the sequence's end, which belong to
            # the next sequence (another CTA's tile): a piece that ends past it stores its
            # rows from registers instead (one piece per sequence and warpgroup at most)
            if row0 + HALF_M <= len_q:
                o_view.store(out)
                fence_async_shared()
                tma_store(o_desc, [0, q_off + row0, h, 0], o_smem.index(WG))
            else:
                _store_rows(out, varlen, q_off + row0, len_q - row0, h, O_LAYOUT, HALF_M,
                            HEAD_DIM_V)
        else:
            o_view.store(out)
            fence_async_shared()
            if BOTTOM_ALIGN:  # (rows < 0: this warpgroup's piece of the first tile holds no row)
                if row0 >= 0:
                    tma_store(o_desc, [b, row0, h, 0], o_smem.index(WG))
            else:
                tma_store(o_desc, [b, row0, h, 0], o_smem.index(WG))

        rows = row0 + gl.arange(0, HALF_M, layout=ROW_S)
        if FP8:
            lse = gl.where(l_i > 0.0, (m_i + gl.log2(l_i) - P_SCALE_LOG2) * LN2, float("-inf"))
        else:
            lse = gl.where(l_i > 0.0, (m_i + gl.log2(l_i)) * LN2, float("-inf"))
        if VARLEN:  # LSE (h, total_q): seqlen_q is total_q here
            lse_off = h.to(gl.int64) * seqlen_q + q_off + rows
            gl.store(lse_ptr + lse_off, lse, mask=rows < len_q)
        else:
            lse_off = (b * n_heads + h).to(gl.int64) * seqlen_q + rows
            if BOTTOM_ALIGN:  # (the first tile's rows < 0 are not rows)
                gl.store(lse_ptr + lse_off, lse, mask=(rows < seqlen_q) & (rows >= 0))
            else:
                gl.store(lse_ptr + lse_off, lse, mask=rows < seqlen_q)
        if not SEPARATE_O:
            tma.store_wait(0)
            mbarrier.arrive(q_empty)  # O went out through Q's slot
        tile_iter += 1
        if NO_WS:
            tile += gl.num_programs(0)
        else:
            mbarrier.wait(q_ready, tile_iter & 1)
            tile = _read_tile(tile_slot)
    _turn_end(WG, PINGPONG)
    tma.store_wait(0)


@gluon.jit
def _store_rows(out, varlen, first_row, n_rows, h, O_LAYOUT: gl.constexpr, HALF_M: gl.constexpr,
                HEAD_DIM_V: gl.constexpr):
    """VARLEN: store rows [0, n_rows) of one warpgroup's O piece (HALF_M, HEAD_DIM_V) at packed
    row ``first_row`` of head h, straight from the wgmma layout (O (total_q, h, d_v)
    contiguous; columns past d_v are the padding of d = 96 / 192)."""
    cu_q_ptr, cu_k_ptr, o_ptr, o_row_stride, head_dim_v = varlen
    r = gl.arange(0, HALF_M, layout=gl.SliceLayout(1, O_LAYOUT))
    c = gl.arange(0, HEAD_DIM_V, layout=gl.SliceLayout(0, O_LAYOUT))
    row_ptr = o_ptr + ((first_row + r).to(gl.int64) * o_row_stride + h * head_dim_v)
    mask = gl.expand_dims(r < n_rows, 1) & gl.expand_dims(c < head_dim_v, 0)
    gl.store(gl.expand_dims(row_ptr, 1) + gl.expand_dims(c, 0), out, mask=mask)


@gluon.jit
def _p_carry(p, dtype: gl.constexpr, P_LAYOUT: gl.constexpr, HALF_M: gl.constexpr,
             BLOCK_N: gl.constexpr, FP8: gl.constexpr):
    """What the loop carries from block j's softmax to P_j V_j's issue: the operand itself, or
    under FP8 the fp32 P, converted by _p_issue in the next iteration. An 8-bit tensor carried
    through the loop is kept one element per register (the loop's block arguments are
    scalars) and repacked into 32-bit operand registers before every wgmma: ~2 PRMT / LOP3
    per score on the ALU pipe, which ncu showed half busy (d = 128: 675 M ALU instructions
    per call against cuDNN's 310 M; 273 M after this change, benchmarks/NOTES.md)."""
    if FP8:
        carried = p
    else:
        carried = _p_operand(p, dtype, P_LAYOUT, HALF_M, BLOCK_N, FP8)
    return carried


@gluon.jit
def _p_issue(p_op, dtype: gl.constexpr, P_LAYOUT: gl.constexpr, HALF_M: gl.constexpr,
             BLOCK_N: gl.constexpr, FP8: gl.constexpr):
    """P·V's A operand from what _p_carry kept, built at the top of the next iteration (in the
    same basic block chain as the wgmma that reads it, before the QK^T issue allocates the
    next S accumulator's registers)."""
    if FP8:
        operand = _p_operand(p_op, dtype, P_LAYOUT, HALF_M, BLOCK_N, FP8)
    else:
        operand = p_op
    return operand


@gluon.jit
def _p_operand(p, dtype: gl.constexpr, P_LAYOUT: gl.constexpr, HALF_M: gl.constexpr,
               BLOCK_N: gl.constexpr, FP8: gl.constexpr):
    """P (HALF_M, BLOCK_N) fp32 in the S accumulator layout -> the A operand of P·V."""
    if FP8:
        p8 = p.to(dtype)
        p8 = gl.reshape(p8, [HALF_M, BLOCK_N // 32, 2, 2, 4, 2])
        p8 = gl.permute(p8, (0, 1, 2, 4, 3, 5))
        p8 = gl.reshape(p8, [HALF_M, BLOCK_N])
        return gl.convert_layout(p8, P_LAYOUT)
    return gl.convert_layout(p.to(dtype), P_LAYOUT)


@gluon.jit
def _v_operand(v_smem, stage, BLOCK_N: gl.constexpr, HEAD_DIM_V: gl.constexpr,
               FP8: gl.constexpr):
    """P·V's B operand (BLOCK_N x HEAD_DIM_V) in ring slot ``stage``: V's own tile, or under
    FP8 the V^T tile (HEAD_DIM_V x BLOCK_N, keys contiguous) viewed transposed, so the keys (the
    GEMM's K) are contiguous: FP8 wgmma reads B K-major only."""
    if FP8:
        return v_smem.index(stage).reshape([HEAD_DIM_V, BLOCK_N]).permute((1, 0))
    else:
        return v_smem.index(stage).reshape([BLOCK_N, HEAD_DIM_V])


@gluon.jit
def _fp8_tile_scales(fp8_scales, b, h, h_k, row0, n_heads):
    """FP8, once per tile: (q_unit, kd_base): Q's descale of rows [row0, row0 + HALF_M) (one
    scale block: the host keeps HALF_M <= the q scale block) and the row offset of this (batch,
    kv head) in the K / V descale tables."""
    qd_ptr, kd_ptr, vd_ptr, n_q_blocks, n_kv_blocks, q_shift, kv_shift, n_heads_k = fp8_scales
    q_blk = gl.minimum(gl.maximum(row0, 0) >> q_shift, n_q_blocks - 1)  # (rows < 0: unused)
    qd = gl.load(qd_ptr + (b * n_heads + h).to(gl.int64) * n_q_blocks + q_blk)
    kd_base = (b * n_heads_k + h_k).to(gl.int64) * n_kv_blocks
    return qd, kd_base


@gluon.jit
def _fp8_block_scales(fp8_scales, kd_base, n_start, qd, qk_scale, softcap_inv,
                      HAS_SOFTCAP: gl.constexpr):
    """FP8, once per key block: (s_unit, softcap_inv_j, v_descale): the factors that turn the
    block's fp8 Q K^T into log2-unit scores (or the softcap's argument) and its V descale (one
    scale block: the host keeps BLOCK_N <= the kv scale block)."""
    qd_ptr, kd_ptr, vd_ptr, n_q_blocks, n_kv_blocks, q_shift, kv_shift, n_heads_k = fp8_scales
    kv_blk = gl.minimum(n_start >> kv_shift, n_kv_blocks - 1)
    qk = qd * gl.load(kd_ptr + kd_base + kv_blk)
    vd = gl.load(vd_ptr + kd_base + kv_blk)
    if HAS_SOFTCAP:  # (tensors in both slots: they are loop-carried)
        return qk * 0.0 + 1.0, softcap_inv * qk, vd
    else:
        return qk_scale * qk, qk * 0.0 + softcap_inv, vd


@gluon.jit
def attn_fwd_kernel(q_desc, k_desc, v_desc, o_desc, lse_ptr, tile_counter,
                    seqlen_q, seqlen_k, n_heads, group_size, n_bh, n_m_blocks, n_tiles,
                    heads_per_group, window_left, window_right,
                    qk_scale, softcap_inv, softcap_log2,
                    qd_ptr, kd_ptr, vd_ptr, n_q_blocks, n_kv_blocks, q_shift, kv_shift, n_heads_k,
                    sink_ptr, cu_q_ptr, cu_k_ptr, o_ptr, o_row_stride, head_dim_v, seqused_ptr,
                    BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr, NUM_STAGES: gl.constexpr,
                    HAS_LEFT: gl.constexpr, HAS_RIGHT: gl.constexpr, HAS_SOFTCAP: gl.constexpr,
                    LONGEST_FIRST: gl.constexpr, PINGPONG: gl.constexpr,
                    INTRA_OVERLAP: gl.constexpr, SEPARATE_O: gl.constexpr, DYNAMIC: gl.constexpr,
                    NO_WS: gl.constexpr, CONSUMER_REGS: gl.constexpr, PRODUCER_REGS: gl.constexpr,
                    CONSUMERS: gl.constexpr = 2, THREAD_RELEASE: gl.constexpr = False,
                    ROWSUM_MMA: gl.constexpr = False, BOTTOM_ALIGN: gl.constexpr = False,
                    VARLEN: gl.constexpr = False):
    """Persistent warp-specialised attention forward (see module docstring).

    Descriptors are rank 4 over (batch, seq, head, dim) with boxes [1, rows, 1, dim_pad] (dim_pad
    of q / k may differ from that of v / o: head_dim_v != head_dim, e.g. 192 / 128):
    q/o boxes have HALF_M = BLOCK_M // CONSUMERS rows (one per consumer warpgroup: 2, or 3
    with BLOCK_M = 192 for small head dims), k/v boxes BLOCK_N rows.
    TMA zero-fills rows past the sequence end and drops stored rows past it.
    FP8 (q/k descriptors of float8e4nv; v_desc over V^T (b, h_k, d_v, s_k) with [1, 1, dim_pad,
    BLOCK_N] boxes): qd_ptr (b, h, n_q_blocks), kd_ptr / vd_ptr (b, h_k, n_kv_blocks) float32
    descales, row i / key j in block min(i >> q_shift, n - 1) / min(j >> kv_shift, n - 1),
    n_heads_k the kv heads; all None (constexpr) otherwise.
    sink_ptr: None, or the learnable sinks (h,) (any float dtype): one more logit per head in
    every row's softmax denominator, folded into l and the LSE in the epilogue.
    VARLEN (module doc): packed sequences. The descriptors are over (1, total, h, d) views,
    cu_q_ptr / cu_k_ptr the int32 (n_seqs + 1,) offsets, o_ptr the contiguous O
    (total_q, h, d_v) with o_row_stride = h * d_v and head_dim_v = d_v (the rows a TMA store
    cannot take: _store_rows); the problem scalars change meaning: seqlen_q / seqlen_k are
    total_q / total_k, n_bh the number of sequences, n_m_blocks the tile slots per head
    (n_seqs + total_q // BLOCK_M, _varlen_tile), lse_ptr (h, total_q); seqused_ptr None or
    int32 (n_seqs,) keys used per sequence. All None otherwise.
    lse_ptr: float32 (b, h, s_q) contiguous. tile_counter: int32 zero (DYNAMIC: the global
    tile queue, CTA i starts with tile i, then takes num_programs + atomic_add(counter, 1)).
    Launch with num_warps=4 (the default partition is consumer 0) and
    grid = min(#SMs, n_tiles) (or n_tiles: not persistent).
    """
    gl.static_assert(BLOCK_M == CONSUMERS * q_desc.block_type.shape[1])
    gl.static_assert(CONSUMERS == 2 or (CONSUMERS == 3 and not NO_WS))
    q_smem = gl.allocate_shared_memory(q_desc.dtype, [CONSUMERS] + q_desc.block_type.shape,
                                       q_desc.layout)
    k_smem = gl.allocate_shared_memory(k_desc.dtype, [NUM_STAGES] + k_desc.block_type.shape,
                                       k_desc.layout)
    v_smem = gl.allocate_shared_memory(v_desc.dtype, [NUM_STAGES] + v_desc.block_type.shape,
                                       v_desc.layout)
    if SEPARATE_O:
        o_smem = gl.allocate_shared_memory(o_desc.dtype, [CONSUMERS] + o_desc.block_type.shape,
                                           o_desc.layout)
    else:
        gl.static_assert(o_desc.block_type.shape[3] == q_desc.block_type.shape[3])  # O in Q's slot
        o_smem = q_smem

    gl.static_assert(not VARLEN or (not NO_WS and not BOTTOM_ALIGN))
    if VARLEN:  # the tile and its sequence's geometry (_publish_varlen_tile)
        tile_slot = gl.allocate_shared_memory(gl.int32, [VARLEN_SLOT],
                                              gl.SwizzledSharedLayout(1, 1, 1, [0]))
    else:
        tile_slot = gl.allocate_shared_memory(gl.int32, [1], gl.SwizzledSharedLayout(1, 1, 1, [0]))
    if ROWSUM_MMA:  # the B operand of the row-sum GEMM, one per consumer (_fill_ones)
        ones_smem = gl.allocate_shared_memory(
            q_desc.dtype, [CONSUMERS, ROWSUM_N, BLOCK_N],
            gl.NVMMASharedLayout.get_default_for([ROWSUM_N, BLOCK_N], q_desc.dtype))
    else:
        ones_smem = tile_slot  # (unread)
    q_ready = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())
    q_empty = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())
    k_ready = gl.allocate_shared_memory(gl.int64, [NUM_STAGES, 1], mbarrier.MBarrierLayout())
    k_empty = gl.allocate_shared_memory(gl.int64, [NUM_STAGES, 1], mbarrier.MBarrierLayout())
    v_ready = gl.allocate_shared_memory(gl.int64, [NUM_STAGES, 1], mbarrier.MBarrierLayout())
    v_empty = gl.allocate_shared_memory(gl.int64, [NUM_STAGES, 1], mbarrier.MBarrierLayout())
    turn = gl.allocate_shared_memory(gl.int64, [2, 1], mbarrier.MBarrierLayout())
    # a K / V slot is free once every consumer thread (THREAD_RELEASE) or warpgroup has released it
    RELEASES: gl.constexpr = CONSUMERS * 128 if THREAD_RELEASE else CONSUMERS
    mbarrier.init(q_ready, count=1)
    mbarrier.init(q_empty, count=CONSUMERS)
    for i in gl.static_range(NUM_STAGES):
        mbarrier.init(k_ready.index(i), count=1)
        mbarrier.init(k_empty.index(i), count=RELEASES)
        mbarrier.init(v_ready.index(i), count=1)
        mbarrier.init(v_empty.index(i), count=RELEASES)
    for i in gl.static_range(2):
        mbarrier.init(turn.index(i), count=1)
    fence_async_shared()

    descs = (q_desc, k_desc, v_desc, o_desc)
    smem = (q_smem, k_smem, v_smem, o_smem, tile_slot, ones_smem)
    bars = (q_ready, q_empty, k_ready, k_empty, v_ready, v_empty, turn)
    problem = (seqlen_q, seqlen_k, n_heads, group_size, n_bh, n_m_blocks, n_tiles, heads_per_group)
    window = (window_left, window_right)
    scales = (qk_scale, softcap_inv, softcap_log2)
    if q_desc.dtype == gl.float8e4nv:
        fp8_scales = (qd_ptr, kd_ptr, vd_ptr, n_q_blocks, n_kv_blocks, q_shift, kv_shift,
                      n_heads_k)
    else:
        fp8_scales = scales  # (unread)
    if VARLEN:
        varlen = (cu_q_ptr, cu_k_ptr, o_ptr, o_row_stride, head_dim_v)
    else:
        varlen = scales  # (unread)
    USED: gl.constexpr = seqused_ptr is not None  # (the consumers' guard of unused keys)
    # constexpr flags go one by one: packed in a tuple they would reach the worker partitions
    # as i1 values, not constants. (The partition lists are written out twice: a function
    # cannot be bound to a variable inside a Gluon kernel.)
    if NO_WS:
        gl.warp_specialize([
            (_consumer, (0, descs, smem, bars, problem, window, scales, fp8_scales, lse_ptr, sink_ptr, BLOCK_M,
                         HAS_LEFT, HAS_RIGHT, HAS_SOFTCAP, LONGEST_FIRST, PINGPONG,
                         INTRA_OVERLAP, SEPARATE_O, DYNAMIC, NO_WS, THREAD_RELEASE,
                         ROWSUM_MMA, BOTTOM_ALIGN, varlen, VARLEN, USED)),
            (_consumer, (1, descs, smem, bars, problem, window, scales, fp8_scales, lse_ptr, sink_ptr, BLOCK_M,
                         HAS_LEFT, HAS_RIGHT, HAS_SOFTCAP, LONGEST_FIRST, PINGPONG,
                         INTRA_OVERLAP, SEPARATE_O, DYNAMIC, NO_WS, THREAD_RELEASE,
                         ROWSUM_MMA, BOTTOM_ALIGN, varlen, VARLEN, USED)),
        ], [4], [CONSUMER_REGS])
    elif CONSUMERS == 2:
        gl.warp_specialize([
            (_consumer, (0, descs, smem, bars, problem, window, scales, fp8_scales, lse_ptr, sink_ptr, BLOCK_M,
                         HAS_LEFT, HAS_RIGHT, HAS_SOFTCAP, LONGEST_FIRST, PINGPONG,
                         INTRA_OVERLAP, SEPARATE_O, DYNAMIC, NO_WS, THREAD_RELEASE,
                         ROWSUM_MMA, BOTTOM_ALIGN, varlen, VARLEN, USED)),
            (_consumer, (1, descs, smem, bars, problem, window, scales, fp8_scales, lse_ptr, sink_ptr, BLOCK_M,
                         HAS_LEFT, HAS_RIGHT, HAS_SOFTCAP, LONGEST_FIRST, PINGPONG,
                         INTRA_OVERLAP, SEPARATE_O, DYNAMIC, NO_WS, THREAD_RELEASE,
                         ROWSUM_MMA, BOTTOM_ALIGN, varlen, VARLEN, USED)),
            (_producer, (descs, smem, bars, problem, window, tile_counter, BLOCK_M, HAS_LEFT,
                         HAS_RIGHT, HAS_SOFTCAP, LONGEST_FIRST, PINGPONG, INTRA_OVERLAP,
                         SEPARATE_O, DYNAMIC, BOTTOM_ALIGN, varlen, VARLEN, seqused_ptr)),
        ], [4, 1], [CONSUMER_REGS, PRODUCER_REGS])
    else:  # three consumer warpgroups (small head dims: more rows per K/V block loaded)
        gl.warp_specialize([
            (_consumer, (0, descs, smem, bars, problem, window, scales, fp8_scales, lse_ptr, sink_ptr, BLOCK_M,
                         HAS_LEFT, HAS_RIGHT, HAS_SOFTCAP, LONGEST_FIRST, PINGPONG,
                         INTRA_OVERLAP, SEPARATE_O, DYNAMIC, NO_WS, THREAD_RELEASE,
                         ROWSUM_MMA, BOTTOM_ALIGN, varlen, VARLEN, USED)),
            (_consumer, (1, descs, smem, bars, problem, window, scales, fp8_scales, lse_ptr, sink_ptr, BLOCK_M,
                         HAS_LEFT, HAS_RIGHT, HAS_SOFTCAP, LONGEST_FIRST, PINGPONG,
                         INTRA_OVERLAP, SEPARATE_O, DYNAMIC, NO_WS, THREAD_RELEASE,
                         ROWSUM_MMA, BOTTOM_ALIGN, varlen, VARLEN, USED)),
            (_consumer, (2, descs, smem, bars, problem, window, scales, fp8_scales, lse_ptr, sink_ptr, BLOCK_M,
                         HAS_LEFT, HAS_RIGHT, HAS_SOFTCAP, LONGEST_FIRST, PINGPONG,
                         INTRA_OVERLAP, SEPARATE_O, DYNAMIC, NO_WS, THREAD_RELEASE,
                         ROWSUM_MMA, BOTTOM_ALIGN, varlen, VARLEN, USED)),
            (_producer, (descs, smem, bars, problem, window, tile_counter, BLOCK_M, HAS_LEFT,
                         HAS_RIGHT, HAS_SOFTCAP, LONGEST_FIRST, PINGPONG, INTRA_OVERLAP,
                         SEPARATE_O, DYNAMIC, BOTTOM_ALIGN, varlen, VARLEN, seqused_ptr)),
        ], [4, 4, 1], [CONSUMER_REGS, CONSUMER_REGS, PRODUCER_REGS])
