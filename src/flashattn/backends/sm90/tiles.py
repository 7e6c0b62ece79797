"""Tile geometry shared by the Hopper kernels: which key blocks a query tile visits, whether a
key block needs the visibility mask, and the persistent tile scheduler.

A *query tile* is BLOCK_M rows of one (batch, head); the two consumer warpgroups each own half
of it (HALF_M = BLOCK_M // 2 rows). Key blocks are BLOCK_N columns. Visibility is the rule of
docs/internals.md: key j is visible from query i iff j < s_k and
``i + diag - window_left <= j <= i + diag + window_right`` (a negative side is unbounded),
with ``diag = s_k - s_q`` (bottom-right alignment).
"""
from __future__ import annotations

from triton.experimental import gluon
from triton.experimental.gluon import language as gl


@gluon.jit
def key_block_range(m_start, seqlen_q, seqlen_k, window_left, window_right,
                    BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr,
                    HAS_LEFT: gl.constexpr, HAS_RIGHT: gl.constexpr):
    """First key block and number of key blocks that query rows [m_start, m_start + BLOCK_M)
    can see (0 blocks when the whole tile sees no key)."""
    diag = seqlen_k - seqlen_q
    m_last = gl.minimum(m_start + BLOCK_M, seqlen_q) - 1
    hi = seqlen_k
    if HAS_RIGHT:
        hi = gl.minimum(hi, m_last + diag + window_right + 1)
    lo = 0
    if HAS_LEFT:
        lo = gl.maximum(lo, m_start + diag - window_left)
    lo_blk = lo // BLOCK_N
    hi_blk = (hi + BLOCK_N - 1) // BLOCK_N
    n_blocks = gl.maximum(hi_blk - lo_blk, 0)
    if hi <= lo:
        n_blocks = 0
    return lo_blk, n_blocks


@gluon.jit
def block_needs_mask(n_start, m_start, seqlen_q, seqlen_k, window_left, window_right,
                     BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr,
                     HAS_LEFT: gl.constexpr, HAS_RIGHT: gl.constexpr):
    """True when some (row, key) of the tile x key block is invisible (conservative over the
    whole BLOCK_M tile, so both warpgroups take the same branch)."""
    diag = seqlen_k - seqlen_q
    m_last = m_start + BLOCK_M - 1
    n_last = n_start + BLOCK_N - 1
    need = n_last >= seqlen_k
    if HAS_RIGHT:
        need = need | (n_last > m_start + diag + window_right)
    if HAS_LEFT:
        need = need | (n_start < m_last + diag - window_left)
    return need


@gluon.jit
def tile_coords(tile, n_m_blocks, n_heads, n_bh, heads_per_group, LONGEST_FIRST: gl.constexpr):
    """(batch, head, m_block) of linear tile index ``tile``.

    Tiles are grouped by ``heads_per_group`` consecutive (batch, head) pairs so that the CTAs
    running at the same time share K/V in L2. Inside a group, the m blocks go last-to-first
    when LONGEST_FIRST (causal: the bottom tiles see the most keys, so they start first and
    the short ones fill the tail); otherwise the heads of a group advance together.
    """
    group_tiles = heads_per_group * n_m_blocks
    group = tile // group_tiles
    # every group but the last is full; the last holds the remaining (batch, head) pairs
    heads_here = gl.minimum(heads_per_group, n_bh - group * heads_per_group)
    r = tile - group * group_tiles
    m_idx = r // heads_here
    bh = group * heads_per_group + (r - m_idx * heads_here)
    if LONGEST_FIRST:
        m_block = n_m_blocks - 1 - m_idx
    else:
        m_block = m_idx
    b = bh // n_heads
    h = bh - b * n_heads
    return b, h, m_block


@gluon.jit
def clamped_load(ptr, i, upper):
    """ptr[i] clamped to [0, upper]: an offset read from a device tensor never addresses
    memory outside the tensor it indexes, whatever the tensor holds."""
    return gl.minimum(gl.maximum(gl.load(ptr + i), 0), upper)


@gluon.jit
def varlen_span(cu_ptr, seq, total):
    """(offset, length) of packed sequence ``seq`` from its int32 cu_seqlens (clamped to
    [0, total]; a length is never negative)."""
    start = clamped_load(cu_ptr, seq, total)
    return start, gl.maximum(clamped_load(cu_ptr, seq + 1, total) - start, 0)


@gluon.jit
def used_keys(used_ptr, seq, len_k):
    """Sequence ``seq``'s key length under seqused_k (int32 (n_seqs,) at ``used_ptr``):
    seqused_k[seq] clamped to [0, len_k], its slot's length."""
    return gl.minimum(gl.maximum(gl.load(used_ptr + seq), 0), len_k)


@gluon.jit
def varlen_slot(slot, cu_ptr, n_seqs, total, BLOCK: gl.constexpr):
    """(sequence, block index inside it) of tile slot ``slot`` over packed sequences cut in
    blocks of BLOCK rows. Sequence b owns the slots from b + cu[b] // BLOCK up to the next
    sequence's first: at least cdiv(len, BLOCK) of them, at most two more (their block index
    lies past the sequence's end: the caller skips them). The host then knows the number of
    slots, n_seqs + total // BLOCK, without reading the device tensor; b is found by binary
    search over cu (the slot starts are non-decreasing in b)."""
    lo = gl.to_tensor(0)
    hi = gl.to_tensor(n_seqs - 1)
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if mid + clamped_load(cu_ptr, mid, total) // BLOCK <= slot:
            lo = mid
        else:
            hi = mid - 1
    return lo, slot - (lo + clamped_load(cu_ptr, lo, total) // BLOCK)


@gluon.jit
def key_block_coords(tile, key_grid, n_heads_k, LONGEST_FIRST: gl.constexpr,
                     DESCENDING: gl.constexpr = 0):
    """(batch, KV head, key block) of backward tile ``tile`` (a program id, or a persistent CTA's
    next tile) of n_key_blocks * n_bh_k, key_grid = (n_key_blocks, n_bh_k, heads_per_group).
    The backward's grid is 1-D: b * h_k may pass the 65535 limit of grid axis 1.

    Default: key blocks of one (batch, KV head) after another, the order of the former 2-D grid
    (cdiv(s_k, BLOCK_N), b * h_k): the CTAs running together share that head's Q / dO in L2.
    LONGEST_FIRST: ``tile_coords``'s grouped order, key blocks ascending across
    ``heads_per_group`` heads at a time (under a causal mask the first key blocks see the most
    query rows: they start first and the short ones fill the tail).
    DESCENDING (the deterministic backward's orders: a tile's dQ turn waits only on higher
    key blocks of its head, which these hand out earlier): 1, key-block major: the last key
    block of every (batch, KV head), then the one before it, ... (few key blocks of any one
    head run together: short turn chains, but every head's Q / dO / dQ at once in L2);
    2, head major: one head's key blocks from the last down, then the next head's.
    """
    n_key_blocks, n_bh_k, heads_per_group = key_grid
    if DESCENDING == 1:
        idx = tile // n_bh_k
        bh_k = tile - idx * n_bh_k
        n_block = n_key_blocks - 1 - idx
        b = bh_k // n_heads_k
        h_k = bh_k - b * n_heads_k
    elif DESCENDING == 2:
        bh_k = tile // n_key_blocks
        n_block = n_key_blocks - 1 - (tile - bh_k * n_key_blocks)
        b = bh_k // n_heads_k
        h_k = bh_k - b * n_heads_k
    elif LONGEST_FIRST:
        b, h_k, n_block = tile_coords(tile, n_key_blocks, n_heads_k, n_bh_k, heads_per_group,
                                      False)
    else:
        bh_k = tile // n_key_blocks
        n_block = tile - bh_k * n_key_blocks
        b = bh_k // n_heads_k
        h_k = bh_k - b * n_heads_k
    return b, h_k, n_block


@gluon.jit
def split_key_coords(tile, key_grid, n_heads_k, group_size, split_blocks):
    """Backward tile ``tile`` of a call whose first ``split_blocks`` key blocks of every
    (batch, KV head) run as two tiles each (BwdConfig.tile_split; GQA, ``group_size`` >= 2):
    (batch, KV head, key block, first query head of the group, query heads, part).

    Per (batch, KV head) there are n_key_blocks + split_blocks tiles, walked in
    ``tile_coords``' grouped order (key_grid = (n_key_blocks, n_bh_k, heads_per_group)):
    tile t < 2 * split_blocks is part t % 2 of key block t // 2, part 0 over query heads
    [0, g - g // 2) of the group, part 1 over [g - g // 2, g) (g = group_size; an odd group's
    extra head goes to part 0); tile t >= 2 * split_blocks is key block t - split_blocks over
    all of them, part -1. Under a causal mask the first key blocks see the most query rows:
    cutting them shortens the tiles that would otherwise end the call last
    (tile_order.split_key_blocks)."""
    n_key_blocks, n_bh_k, heads_per_group = key_grid
    b, h_k, t = tile_coords(tile, n_key_blocks + split_blocks, n_heads_k, n_bh_k,
                            heads_per_group, False)
    cut = (t < 2 * split_blocks).to(gl.int32)  # 1: a part of a cut key block
    n_block = cut * (t // 2) + (1 - cut) * (t - split_blocks)
    part = cut * (t - 2 * (t // 2) + 1) - 1
    half = group_size // 2  # part 1's query heads
    first = group_size - half  # part 0's
    g0 = cut * part * first
    n_g = group_size - cut * (part * (first - half) + half)
    return b, h_k, n_block, g0, n_g, part


@gluon.jit
def varlen_key_tile(tile, varlen, key_grid, n_heads_k, total_q, total_k,
                    BLOCK_N: gl.constexpr, LONGEST_FIRST: gl.constexpr):
    """Backward over packed sequences: (KV head, key block inside the sequence, q offset,
    q length, k offset, k length, sequence) of tile ``tile``, key_grid = (slots per KV head,
    n_heads_k, heads_per_group) in key_block_coords' order, varlen = (cu_seqlens_q,
    cu_seqlens_k, n_seqs, seqused_k or None). With seqused_k the sequence's key length is
    min(seqused_k[seq], its slot). A slot past its sequence's keys (varlen_slot) gets q length
    0: no query block, nothing stored."""
    cu_q_ptr, cu_k_ptr, n_seqs, used_ptr = varlen
    _, h_k, slot = key_block_coords(tile, key_grid, n_heads_k, LONGEST_FIRST)
    seq, n_block = varlen_slot(slot, cu_k_ptr, n_seqs, total_k, BLOCK_N)
    k_off, len_k = varlen_span(cu_k_ptr, seq, total_k)
    if used_ptr is not None:
        len_k = used_keys(used_ptr, seq, len_k)
    q_off, len_q = varlen_span(cu_q_ptr, seq, total_q)
    if n_block * BLOCK_N >= len_k:
        len_q = len_q * 0
    return h_k, n_block, q_off, len_q, k_off, len_k, seq


@gluon.jit
def key_tile_geometry(tile, varlen, key_grid, n_heads_k, seqlen_q, seqlen_k,
                      BLOCK_N: gl.constexpr, LONGEST_FIRST: gl.constexpr,
                      DETERMINISTIC: gl.constexpr, VARLEN: gl.constexpr):
    """(batch, KV head, key block, q offset, q length, k offset, k length, sequence) of
    backward tile ``tile``, the same in the producer and the consumers: key_block_coords' over
    (b, s, h, d) tensors (offsets 0, the call's lengths, sequence = batch), or with VARLEN
    varlen_key_tile's over packed sequences (batch 0; seqlen_q / seqlen_k are then total_q /
    total_k)."""
    if VARLEN:
        h_k, n_block, q_off, len_q, k_off, len_k, seq = varlen_key_tile(
            tile, varlen, key_grid, n_heads_k, seqlen_q, seqlen_k, BLOCK_N, LONGEST_FIRST)
        b = h_k * 0
    else:
        b, h_k, n_block = key_block_coords(tile, key_grid, n_heads_k, LONGEST_FIRST,
                                           DETERMINISTIC)
        seq = b
        q_off = 0
        k_off = 0
        len_q = seqlen_q
        len_k = seqlen_k
    return b, h_k, n_block, q_off, len_q, k_off, len_k, seq


@gluon.jit
def key_tile_work(tile, varlen, key_grid, n_heads_k, group_size, split_blocks, seqlen_q,
                  seqlen_k, BLOCK_N: gl.constexpr, LONGEST_FIRST: gl.constexpr,
                  DETERMINISTIC: gl.constexpr, VARLEN: gl.constexpr, SPLIT: gl.constexpr):
    """What backward tile ``tile`` covers, the same in the producer and the consumers:
    key_tile_geometry's (batch, KV head, key block, q offset, q length, k offset, k length)
    and the tile's query heads of the GQA group (first, count) and part (-1: the whole key
    block); with SPLIT (padded calls), split_key_coords' tile of a call cutting
    ``split_blocks`` key blocks per KV head."""
    if SPLIT:
        b, h_k, n_block, g0, n_g, part = split_key_coords(tile, key_grid, n_heads_k, group_size,
                                                          split_blocks)
        q_off = 0
        k_off = 0
        len_q = seqlen_q
        len_k = seqlen_k
    else:
        b, h_k, n_block, q_off, len_q, k_off, len_k, _ = key_tile_geometry(
            tile, varlen, key_grid, n_heads_k, seqlen_q, seqlen_k, BLOCK_N, LONGEST_FIRST,
            DETERMINISTIC, VARLEN)
        g0 = 0
        n_g = group_size
        part = -1
    return b, h_k, n_block, q_off, len_q, k_off, len_k, g0, n_g, part


# Backward geometry (transposed tiles: rows are keys, columns queries)
@gluon.jit
def query_block_range(n_start, seqlen_q, seqlen_k, window_left, window_right,
                      BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr,
                      HAS_LEFT: gl.constexpr, HAS_RIGHT: gl.constexpr):
    """First query block and number of query blocks that see some key of
    [n_start, n_start + BLOCK_N) (query i sees key j iff i + diag - left <= j <= i + diag + right,
    diag = s_k - s_q)."""
    diag = seqlen_k - seqlen_q
    n_last = gl.minimum(n_start + BLOCK_N, seqlen_k) - 1
    lo = 0
    if HAS_RIGHT:
        lo = gl.maximum(lo, n_start - diag - window_right)
    hi = seqlen_q
    if HAS_LEFT:
        hi = gl.minimum(hi, n_last - diag + window_left + 1)
    lo_blk = lo // BLOCK_M
    hi_blk = (hi + BLOCK_M - 1) // BLOCK_M
    n_blocks = gl.maximum(hi_blk - lo_blk, 0)
    if hi <= lo:
        n_blocks = 0
    return lo_blk, n_blocks


@gluon.jit
def block_needs_mask_t(n_start, m_start, seqlen_q, seqlen_k, window_left, window_right,
                       BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr,
                       HAS_LEFT: gl.constexpr, HAS_RIGHT: gl.constexpr,
                       Q_BOUND: gl.constexpr = False):
    """True when some (key, query) pair of the BLOCK_N x BLOCK_M tile is invisible (keys past
    s_k included; queries past s_q need no mask: their lse2 is +inf, so P = 0; with Q_BOUND,
    packed sequences, they are the next sequence's rows and need the mask)."""
    diag = seqlen_k - seqlen_q
    m_last = m_start + BLOCK_M - 1
    n_last = n_start + BLOCK_N - 1
    need = n_last >= seqlen_k
    if Q_BOUND:
        need = need | (m_last >= seqlen_q)
    if HAS_RIGHT:
        need = need | (n_last > m_start + diag + window_right)
    if HAS_LEFT:
        need = need | (n_start < m_last + diag - window_left)
    return need


@gluon.jit
def visible_t(key0, m_start, seqlen_q, seqlen_k, window_left, window_right,
              LAYOUT: gl.constexpr, HALF_N: gl.constexpr, BLOCK_M: gl.constexpr,
              HAS_LEFT: gl.constexpr, HAS_RIGHT: gl.constexpr, Q_BOUND: gl.constexpr = False):
    """Visibility of the transposed tile: rows = keys key0 + [0, HALF_N), columns = queries
    m_start + [0, BLOCK_M); bool (HALF_N, BLOCK_M) in LAYOUT. Q_BOUND: queries past s_q are
    invisible too (packed sequences: see block_needs_mask_t)."""
    keys = key0 + gl.arange(0, HALF_N, layout=gl.SliceLayout(1, LAYOUT))
    # query rows shifted onto the key axis (bottom-right alignment)
    qpos = m_start + (seqlen_k - seqlen_q) + gl.arange(0, BLOCK_M, layout=gl.SliceLayout(0, LAYOUT))
    k2 = gl.expand_dims(keys, 1)
    q2 = gl.expand_dims(qpos, 0)
    vis = k2 < seqlen_k
    if Q_BOUND:
        vis = vis & (q2 < seqlen_k)  # (q2 is shifted by s_k - s_q: query < s_q)
    if HAS_RIGHT:
        vis = vis & (k2 <= q2 + window_right)
    if HAS_LEFT:
        vis = vis & (k2 >= q2 - window_left)
    return vis
