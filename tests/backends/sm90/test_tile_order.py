"""tile_order: the list-schedule model that sizes the longest-first orders' head groups
(host arithmetic only; what it predicts is checked on the GPU by the config A/Bs)."""
from __future__ import annotations

import heapq
import itertools
import random

from flashattn.backends.sm90.tile_order import (backward_level_costs, forward_level_costs,
                                                makespan, modelled_group, split_key_blocks,
                                                split_levels)


def _brute_makespan(costs, n_sms):
    """Greedy list schedule written out: each tile to the SM that frees first."""
    free = [0.0] * n_sms
    for c in costs:
        t = heapq.heappop(free)
        heapq.heappush(free, t + c)
    return max(free)


def test_makespan_is_the_greedy_schedule_of_tile_coords_order():
    rng = random.Random(0)
    for _ in range(50):
        levels = [float(rng.randint(1, 40)) for _ in range(rng.randint(1, 12))]
        n_pairs, group, n_sms = rng.randint(1, 20), rng.randint(1, 8), rng.randint(1, 16)
        order = []
        for first in range(0, n_pairs, group):  # tiles.tile_coords: levels across the group
            for c in levels:
                order += [c] * min(group, n_pairs - first)
        assert makespan(levels, n_pairs, group, n_sms) == _brute_makespan(order, n_sms)


def test_level_costs_follow_the_masks():
    """Causal, square: query block m sees m + 1 key blocks (last block first); key block j is
    seen by the query blocks from j on. Plus one per tile. Bottom-right alignment shifts them
    when s_k > s_q, windows cut them."""
    assert forward_level_costs(512, 512, 128, 128, -1, 0) == (5.0, 4.0, 3.0, 2.0)
    assert forward_level_costs(512, 512, 128, 64, -1, 0) == (9.0, 7.0, 5.0, 3.0)
    assert forward_level_costs(256, 512, 128, 128, -1, 0) == (5.0, 4.0)  # keys 0..511 / 0..383
    assert forward_level_costs(512, 512, 128, 128, 128, 0) == (3.0, 3.0, 3.0, 2.0)
    assert forward_level_costs(300, 300, 128, 128, -1, -1) == (4.0, 4.0, 4.0)  # unmasked
    assert backward_level_costs(512, 512, 64, 128, -1, 0) == (9.0, 7.0, 5.0, 3.0)
    assert backward_level_costs(512, 512, 128, 128, 128, 0) == (3.0, 3.0, 3.0, 2.0)
    assert backward_level_costs(256, 512, 64, 128, -1, 0) == (5.0, 5.0, 5.0, 3.0)


def test_modelled_group_stays_within_the_budget_and_beats_the_budget_alone():
    """Within [1, budget]; never a longer modelled schedule than the budget's own group; the
    budget itself where no tile can leave a tail worth modelling (long calls)."""
    for (s, bm, bn), n_pairs in itertools.product(
            ((2048, 128, 64), (8192, 128, 64), (8192, 128, 128), (2048, 192, 128)),
            (5, 16, 40, 64)):
        costs = forward_level_costs(s, s, bm, bn, -1, 0)
        for budget in (1, 3, 12):
            g = modelled_group(costs, n_pairs, budget, 132)
            assert 1 <= g <= min(budget, n_pairs)
            assert (makespan(costs, n_pairs, g, 132)
                    <= makespan(costs, n_pairs, min(budget, n_pairs), 132))
    long_call = forward_level_costs(131072, 131072, 128, 128, -1, 0)
    assert modelled_group(long_call, 32, 1, 132) == 1
    # the search stops at the largest size within 1 % of the lower bound (work / SMs): the
    # d = 64 causal 2k backward's budget of 48 pairs (of 256) is one already
    costs = backward_level_costs(2048, 2048, 128, 128, -1, 0)
    assert makespan(costs, 256, 48, 132) <= 1.01 * sum(costs) * 256 / 132
    assert modelled_group(costs, 256, 48, 132) == 48
    assert modelled_group(forward_level_costs(8192, 8192, 128, 64, -1, 0), 16, 3, 132) == 2


def test_head_group_modes():
    """head_groups 1: the budget; 0: every pair; 2: modelled_group, or the budget where the
    costs are not known on the host (packed calls pass None)."""
    from flashattn.backends.sm90.tile_order import head_group

    costs = forward_level_costs(8192, 8192, 128, 64, -1, 0)
    assert head_group(1, 16, 3, lambda: costs, 132) == 3
    assert head_group(0, 16, 3, lambda: costs, 132) == 16
    assert head_group(2, 16, 3, lambda: costs, 132) == modelled_group(costs, 16, 3, 132) == 2
    assert head_group(2, 16, 3, None, 132) == 3


def test_split_levels_cut_the_first_key_blocks_by_query_heads():
    """A cut key block becomes two tiles of half the group's query blocks, each with its own
    prologue and the fp32 epilogue's extra; the rest keep every query head's blocks."""
    costs = backward_level_costs(512, 512, 64, 128, -1, 0)  # key blocks see 8, 6, 4, 2 blocks
    assert costs == (9.0, 7.0, 5.0, 3.0)
    assert split_levels(costs, 4, 0) == (33.0, 25.0, 17.0, 9.0)
    assert split_levels(costs, 4, 2) == (18.5, 18.5, 14.5, 14.5, 17.0, 9.0)
    whole, cut = split_levels(costs, 8, 0), split_levels(costs, 8, 4)
    assert sum(cut) - sum(whole) == 4 * (1.0 + 2 * 1.5)  # a prologue more, two extras
    # an odd group: the first part takes the extra head; at d = 128 (width 2) the extras double
    assert split_levels(costs, 3, 1) == (8.0 * 2 + 2.5, 8.0 + 2.5, 19.0, 13.0, 7.0)
    assert split_levels(costs, 4, 1, width=2.0)[:2] == (8.0 * 2 + 4.0, 8.0 * 2 + 4.0)


def test_split_key_blocks_cuts_only_where_the_tail_is_long():
    """Causal GQA 4:1 at d = 128, 16k tokens per call, 132 SMs: at 8k the first key blocks of
    8 KV heads are half an SM's share each, and cutting them ends the schedule much earlier;
    at 16k (4 pairs, 128 key blocks) there is no tail to cut; an odd group (3:1) cuts as an
    even one does, in parts of two heads and one; MHA never cuts."""
    def plan(s, group_size, n_pairs, budget):
        return split_key_blocks(backward_level_costs(s, s, 64, 128, -1, 0), group_size, n_pairs,
                                budget, 132)

    split, group = plan(8192, 4, 8, 1)
    assert 0 < split <= 64 and group == 1
    costs = backward_level_costs(8192, 8192, 64, 128, -1, 0)
    whole = split_levels(costs, 4, 0)
    ideal = sum(whole) * 8 / 132
    before = makespan(whole, 8, 1, 132)
    after = makespan(split_levels(costs, 4, split), 8, 1, 132) + 4.0 * split * 8 / 132
    assert before > 1.15 * ideal and after < 0.9 * before
    assert plan(16384, 4, 4, 1)[0] == 0
    assert 0 < plan(8192, 3, 8, 1)[0] <= 64 and plan(8192, 1, 8, 1)[0] == 0
    # the group it returns stays within the budget
    for s in (2048, 4096):
        split, group = plan(s, 8, 16384 // s * 2, 3)
        assert 1 <= group <= 3
