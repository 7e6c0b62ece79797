"""The deterministic Hopper backward's dQ turns, checked on a model of its schedule (CPU).

The kernel (hopper/bwd_kernel.py, DETERMINISTIC) cannot run here, and a wrong turn count
hangs it on a GPU. So this file replays its rules in Python: which query blocks each key tile
visits (bwd_kernel.query_block_range), the order tiles are handed out (tiles.key_block_coords,
DESCENDING, both orders), the counters' starts (bwd.dq_turn_starts) and the wait (a tile adds to a
query block when the counter reads -its key block). It asserts that every schedule finishes
(no deadlock, static stride or ticket queue, more tiles than CTAs), that each query block's
adds come in one fixed order (descending key blocks), and that every counter ends at 1.
"""
from __future__ import annotations

import itertools

import pytest

from flashattn.backends.sm90.bwd import dq_turn_starts
from flashattn.backends.triton.config import cdiv

BLOCK_M, BLOCK_N = 64, 128


def visited_query_blocks(n_block, seqlen_q, seqlen_k, window_right):
    """query_block_range's rule (no left window), as a range of query blocks."""
    diag = seqlen_k - seqlen_q
    lo = max(0, n_block * BLOCK_N - diag - window_right) if window_right >= 0 else 0
    if seqlen_q <= lo:
        return range(0)
    return range(lo // BLOCK_M, cdiv(seqlen_q, BLOCK_M))


def tile_order(n_key_blocks, n_bh, order):
    """key_block_coords with DESCENDING = order: (bh, key block) of tile 0, 1, ..."""
    tiles = range(n_key_blocks * n_bh)
    if order == 1:  # key-block major
        return [(t % n_bh, n_key_blocks - 1 - t // n_bh) for t in tiles]
    return [(t // n_key_blocks, n_key_blocks - 1 - t % n_key_blocks) for t in tiles]


def run_schedule(seqlen_q, seqlen_k, window_right, n_bh, n_ctas, dynamic, order=1):
    """Steps the CTAs one query block at a time, each running its tiles in turn (static:
    tiles c, c + n_ctas, ...; dynamic: the next ticket when it finishes one); returns the adds
    per (bh, query block) in the order they happened, and the counters at the end."""
    seqlen_q_pad = cdiv(seqlen_q, BLOCK_M) * BLOCK_M
    starts = dq_turn_starts(seqlen_q_pad, seqlen_q, seqlen_k, window_right, BLOCK_M, BLOCK_N)
    counters = {(bh, j): int(starts[j]) for bh in range(n_bh) for j in range(len(starts))}
    adds = {key: [] for key in counters}
    tiles = tile_order(cdiv(seqlen_k, BLOCK_N), n_bh, order)
    tickets = itertools.count()
    queues = [iter(tiles[c::n_ctas]) for c in range(n_ctas)]

    def next_tile(cta):
        if dynamic:
            t = next(tickets)
            return tiles[t] if t < len(tiles) else None
        return next(queues[cta], None)

    running = {}  # cta -> (bh, key block, query blocks left)
    for cta in range(n_ctas):
        tile = next_tile(cta)
        if tile is not None:
            running[cta] = (*tile, list(visited_query_blocks(tile[1], seqlen_q, seqlen_k,
                                                              window_right)))
    while running:
        progressed = False
        for cta, (bh, n_block, blocks) in list(running.items()):
            while blocks and counters[(bh, blocks[0])] == -n_block:
                counters[(bh, blocks[0])] += 1
                adds[(bh, blocks[0])].append(n_block)
                blocks.pop(0)
                progressed = True
            if not blocks:
                tile = next_tile(cta)
                if tile is None:
                    del running[cta]
                else:
                    running[cta] = (*tile, list(visited_query_blocks(
                        tile[1], seqlen_q, seqlen_k, window_right)))
                progressed = True
        assert progressed, "deadlock: every CTA waits for a turn that never comes"
    return adds, counters


@pytest.mark.parametrize("seqlen_q,seqlen_k,window_right", [
    (1000, 1000, 0),      # causal, ragged
    (1024, 1024, -1),     # dense
    (700, 1300, 0),       # causal, s_q < s_k
    (1300, 700, 0),       # causal, s_q > s_k: leading query blocks see no key
    (1024, 1024, 64),     # right window
    (900, 1100, 200),
    (64, 2000, 0),        # one query block, many key tiles
])
@pytest.mark.parametrize("n_bh,n_ctas,dynamic", [(3, 4, True), (3, 4, False), (1, 2, True),
                                                 (5, 32, False)])
@pytest.mark.parametrize("order", [1, 2])
def test_every_schedule_finishes_in_descending_key_order(seqlen_q, seqlen_k, window_right,
                                                         n_bh, n_ctas, dynamic, order):
    adds, counters = run_schedule(seqlen_q, seqlen_k, window_right, n_bh, n_ctas, dynamic,
                                  order)
    n_key_blocks = cdiv(seqlen_k, BLOCK_N)
    for (bh, j), order in adds.items():
        visitors = [n for n in range(n_key_blocks)
                    if j in visited_query_blocks(n, seqlen_q, seqlen_k, window_right)]
        assert order == sorted(visitors, reverse=True)
        if visitors:
            # the start counted exactly the visiting tiles: key block 0 (turn 0) added last
            assert counters[(bh, j)] == 1


def test_turn_starts_follow_the_mask():
    """Causal, s_q = s_k = 512, 128-key tiles: query blocks 0-1 are reached by key block 0
    only, blocks 6-7 by blocks 0-3; dense: every block by the last key block."""
    assert dq_turn_starts(512, 512, 512, 0, 64, 128).tolist() == [0, 0, -1, -1, -2, -2, -3, -3]
    assert dq_turn_starts(512, 500, 300, -1, 64, 128).tolist() == [-2] * 8
