"""How many (batch, head) pairs the longest-first tile orders walk at a time.

Causal (and windowed) calls hand out their tiles longest first (``tiles.tile_coords``: the
forward's m blocks last to first, the backward's key blocks first to last), in groups of
pairs whose K / V (forward) or Q / dO (backward) fit an L2 budget
(``descriptors.heads_per_group``), so that the tiles running together share those bytes.
Inside a group the order is longest first, but when a group's longest tiles outlast its
share of the SMs' work, the groups' tails do not interleave and the last group's long tiles
start late: at d = 256 causal 2k / 8k (16k tokens, hidden 2048) the budget's group of 12 / 3
pairs ends at 0.85-0.86 of the ideal time in the model below, groups of 8 / 2 at 0.96-1.00.

The model: every SM takes the next tile when its last one ends (the tile queue of the
persistent kernels, the block dispatcher of one CTA per tile), a greedy list schedule of the
tiles' costs (key or query blocks visited, plus one for the prologue and epilogue).
``modelled_group`` picks, within the budget, the group size whose schedule ends first; it has
no L2 (the budget stands for it). ``FwdConfig.head_groups`` / ``BwdConfig.head_groups``
select it (2: the 16-bit forward's default, and the causal GQA backward's) against the budget
alone (1) and one group of every pair (0; measured slower: L2 misses, benchmarks/NOTES.md,
2026-12-06). benchmarks/probes/tile_order_model.py prints the model on the benchmark grid.
"""
from __future__ import annotations

import functools
import heapq
from typing import Callable, Optional, Sequence, Tuple

# a tile no longer than this share of one SM's work leaves at most this tail in any order
# (Graham's bound for list schedules: makespan <= work / SMs + the longest tile)
_NEGLIGIBLE_TAIL = 0.02
# a group size whose schedule ends within this share of the lower bound (work / SMs, or the
# longest tile) is taken without trying smaller ones: it keeps the search to a few schedules
# on most shapes (the first call of a shape pays for it on the host: 1-20 ms here, against
# 1-80 ms for every candidate) and prefers larger groups, more tiles sharing L2
_GOOD_ENOUGH = 0.01


def makespan(level_costs: Sequence[float], n_pairs: int, group: int, n_sms: int) -> float:
    """The greedy list schedule's end over ``n_sms`` SMs of ``tile_coords``'s order: groups of
    ``group`` pairs (the last one the rest), inside each the levels in the order of
    ``level_costs`` (one tile per pair of the group at each level)."""
    free = [0.0] * n_sms
    for first in range(0, n_pairs, group):
        in_group = min(group, n_pairs - first)
        for cost in level_costs:
            for _ in range(in_group):
                heapq.heapreplace(free, free[0] + cost)
    return max(free)


@functools.lru_cache(maxsize=256)
def modelled_group(level_costs: Tuple[float, ...], n_pairs: int, budget: int,
                   n_sms: int) -> int:
    """A group size in [1, ``budget``] whose list schedule ends first: candidates largest
    first (every size from budget / 2 up, then the powers of two below), the first within
    _GOOD_ENOUGH of the lower bound, else the one that ends first (ties: the larger, more
    tiles sharing L2); ``budget`` itself when no tile can leave a tail worth modelling.
    At most a few dozen schedules of n_pairs x levels tiles; cached per call shape."""
    budget = max(1, min(budget, n_pairs))
    work = sum(level_costs) * n_pairs
    if not level_costs or max(level_costs) <= _NEGLIGIBLE_TAIL * work / n_sms:
        return budget
    good_enough = (1.0 + _GOOD_ENOUGH) * max(work / n_sms, max(level_costs))
    candidates = set(range(max(1, budget // 2), budget + 1))
    candidates.update(1 << i for i in range(budget.bit_length()) if 1 << i <= budget)
    best, best_end = budget, float("inf")
    for group in sorted(candidates, reverse=True):
        end = makespan(level_costs, n_pairs, group, n_sms)
        if end <= good_enough:
            return group
        if end < best_end:
            best, best_end = group, end
    return best


def head_group(mode: int, n_pairs: int, budget: int,
               level_costs: Optional[Callable[[], Tuple[float, ...]]], n_sms: int) -> int:
    """The longest-first order's group size under FwdConfig / BwdConfig.head_groups ``mode``:
    1, ``budget`` (the L2 rule); 0, every pair; 2, :func:`modelled_group` over the costs that
    ``level_costs()`` gives (None where they are not known on the host, packed calls: the
    budget). The one place the three modes are told apart, for both kernels."""
    if mode == 0:
        return n_pairs
    if mode == 1 or level_costs is None:
        return budget
    return modelled_group(level_costs(), n_pairs, budget, n_sms)


def forward_level_costs(seqlen_q: int, seqlen_k: int, block_m: int, block_n: int,
                        window_left: int, window_right: int) -> Tuple[float, ...]:
    """Key blocks (plus one) each query block of a masked forward visits, last block first
    (the LONGEST_FIRST order): causal / windows bottom-right aligned as in the kernel."""
    n_key_blocks = -(-seqlen_k // block_n)
    shift = seqlen_k - seqlen_q
    costs = []
    for m in reversed(range(-(-seqlen_q // block_m))):
        first_row, last_row = m * block_m, min((m + 1) * block_m, seqlen_q) - 1
        hi = (n_key_blocks if window_right < 0
              else min(n_key_blocks, max(0, -(-(last_row + shift + window_right + 1)
                                            // block_n))))
        lo = 0 if window_left < 0 else max(0, (first_row + shift - window_left) // block_n)
        costs.append(float(max(0, hi - lo) + 1))
    return tuple(costs)


def backward_level_costs(seqlen_q: int, seqlen_k: int, block_m: int, block_n: int,
                         window_left: int, window_right: int) -> Tuple[float, ...]:
    """Query blocks (plus one) each key block of a masked backward visits, first key block
    first (the backward's longest-first order)."""
    n_query_blocks = -(-seqlen_q // block_m)
    shift = seqlen_k - seqlen_q
    costs = []
    for j in range(-(-seqlen_k // block_n)):
        first_key, last_key = j * block_n, min((j + 1) * block_n, seqlen_k) - 1
        # query row r sees keys [r + shift - window_left, r + shift + window_right]
        lo = (0 if window_right < 0
              else max(0, (first_key - shift - window_right) // block_m))
        hi = (n_query_blocks if window_left < 0
              else min(n_query_blocks, max(0, -(-(last_key - shift + window_left + 1)
                                               // block_m))))
        costs.append(float(max(0, hi - lo) + 1))
    return tuple(costs)


# BwdConfig.tile_split's model, in the level costs' unit (one query block of one query head
# against the tile's keys: ~10 MFLOP at d = 64 / 128, ~3 us of one SM at 450 TFLOP/s), per
# 64 head-dim columns (the bytes below grow with d): a part of a cut key block pays its own
# prologue (K / V loads, one unit as for every tile) and an fp32 epilogue of twice a whole
# tile's bytes (~1.5 units per 64 columns when every SM stores at once); the host's sum of
# the two parts reads 4 fp32 tiles and writes 2 16-bit ones per cut (key block, KV head)
# (~4 units per 64 columns of SM time), spread over every SM in the model. Measured on the
# H100 (2026-12-07, causal, 16k tokens, hidden 2048, 2k / 4k / 8k): d 64 8:1 1.09 / 1.16 /
# 1.16 against the modelled 1.07 / 1.16 / 1.20; d 128 8:1 1.31 / 1.31 / 1.31 (model 1.22 /
# 1.27 / 1.45), 4:1 0.985 / 1.03 / 1.10 (model with these costs: no cut / 1.10 / 1.17; with
# the d = 64 costs at d = 128 it cut at 2k too, and lost 1.5 %)
_PART_EXTRA = 1.5
_SUM_PER_CUT = 4.0
# cut only where the modelled end moves by more than this share (the model has no L2 and
# overrates what it cannot see; a cut costs real bytes)
_SPLIT_MIN_GAIN = 0.03


def split_levels(level_costs: Sequence[float], group_size: int, split: int,
                 width: float = 1.0) -> Tuple[float, ...]:
    """Tile costs in ``tiles.split_key_coords``' order: ``level_costs`` (per key block, one
    query head's query blocks plus one) scaled to the group's ``group_size`` query heads, the
    first ``split`` key blocks as two tiles of half the heads each (an odd group's extra
    head in the first) (``width``: the padded head dim / 64, what the parts' fp32 epilogue
    scales with)."""
    costs = []
    half = group_size // 2
    for j, cost in enumerate(level_costs):
        visits = cost - 1.0
        if j < split:
            extra = 1.0 + _PART_EXTRA * width
            costs += [visits * (group_size - half) + extra, visits * half + extra]
        else:
            costs.append(visits * group_size + 1.0)
    return tuple(costs)


@functools.lru_cache(maxsize=256)
def split_key_blocks(level_costs: Tuple[float, ...], group_size: int, n_pairs: int,
                     budget: int, n_sms: int, width: float = 1.0) -> Tuple[int, int]:
    """(key blocks to cut, group size) for BwdConfig.tile_split: the first key blocks of each
    (batch, KV head) cut into two tiles over half the GQA group's query heads each, as many
    as make the list schedule end first (the sum pass charged per cut), the group size
    modelled for each candidate as ``modelled_group`` does (an odd group cuts in parts of
    ceil / floor half its heads). No cut (0) unless it gains _SPLIT_MIN_GAIN. Candidates: 0,
    powers of two, and every eighth of the key blocks; ``width``: the padded head dim / 64
    (the cut's bytes scale with it); cached per call shape."""
    whole = split_levels(level_costs, group_size, 0)
    group = modelled_group(whole, n_pairs, budget, n_sms)
    if group_size < 2:
        return 0, group
    n_blocks = len(level_costs)
    base_end = makespan(whole, n_pairs, group, n_sms)
    if base_end <= (1.0 + _SPLIT_MIN_GAIN) * sum(whole) * n_pairs / n_sms:
        return 0, group  # no cut can gain enough
    best = (0, group, base_end)
    candidates = {1 << i for i in range(n_blocks.bit_length()) if 1 << i <= n_blocks}
    candidates.update(max(1, n_blocks * i // 8) for i in range(1, 9))
    for split in sorted(candidates):
        costs = split_levels(level_costs, group_size, split, width)
        g = modelled_group(costs, n_pairs, budget, n_sms)
        end = (makespan(costs, n_pairs, g, n_sms)
               + _SUM_PER_CUT * width * split * n_pairs / n_sms)
        if end < best[2]:
            best = (split, g, end)
    if best[2] > (1.0 - _SPLIT_MIN_GAIN) * base_end:
        return 0, group
    return best[0], best[1]


__all__ = ["backward_level_costs", "forward_level_costs", "head_group", "makespan",
           "modelled_group", "split_key_blocks", "split_levels"]
