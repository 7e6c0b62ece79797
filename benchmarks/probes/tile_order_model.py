"""A list-scheduling model of the Hopper kernels' longest-first tile orders (no GPU needed).

The causal forward hands out its tiles in ``tiles.tile_coords`` order (the persistent tile
queue, or the hardware's block dispatch when masked d = 192 / 256 calls launch one CTA per
tile), and so does the backward with ``BwdConfig.longest_first`` (by default it walks one
(batch, KV head) after another, key block 0 first). Either way each SM takes the next tile
when its last one ends: a greedy list schedule. Its makespan against the ideal (total work
/ SMs) is this model's efficiency; a tile's cost is the number of key (forward) or query
(backward) blocks it visits plus one for its prologue and epilogue, with +-``--noise``
uniform jitter averaged over ``--seeds`` draws.

Orders compared, per point of the benchmark grid (16k tokens, hidden 2048, causal):

- ``grouped``: the default forward order, (batch, head) pairs in groups sized by
  descriptors.heads_per_group (their K / V within the L2 budget), longest tiles first inside
  each group (``FwdConfig.l2_head_groups``);
- ``global``: one group of every pair (``l2_head_groups=False``);
- backward: ``head-major`` (the default), ``grouped`` (``longest_first=True``) and
  ``global`` (``longest_first=True, l2_head_groups=False``).

It models neither L2 nor memory bandwidth: the grouped orders exist to keep the running
tiles' K / V (forward) or Q / dO (backward) in L2, which the model cannot weigh; only a GPU
A/B can (``fwd_config_ab.py --override l2_head_groups=0``).

    python benchmarks/probes/tile_order_model.py
"""
from __future__ import annotations

import argparse
import heapq
import math
import random
from typing import List, Sequence

L2_BUDGET = 24 * 2**20  # descriptors._L2_SHARED_BUDGET
FWD_TILES = {64: (192, 128), 128: (128, 128), 256: (128, 64)}  # (block_m, block_n), config.py
BWD_TILES = {64: (128, 128), 128: (64, 128), 256: (64, 64)}


def makespan(costs: Sequence[float], sms: int) -> float:
    """Greedy list schedule: each tile, in order, goes to the SM that frees first."""
    free = [0.0] * sms
    for c in costs:
        heapq.heappush(free, heapq.heappop(free) + c)
    return max(free)


def efficiency(costs: Sequence[float], sms: int, noise: float, seeds: int) -> float:
    """Ideal / modelled makespan, averaged over ``seeds`` jittered copies of ``costs``."""
    total = 0.0
    for seed in range(seeds):
        rng = random.Random(seed)
        jittered = [c * (1 + noise * (2 * rng.random() - 1)) for c in costs]
        total += sum(jittered) / sms / makespan(jittered, sms)
    return total / seeds


def grouped(per_head: List[float], n_bh: int, heads_per_group: int) -> List[float]:
    """tile_coords's order: groups of heads_per_group pairs, the tiles of ``per_head`` (one
    head's, longest first) taken level by level across the group's pairs."""
    costs: List[float] = []
    for first in range(0, n_bh, heads_per_group):
        in_group = min(heads_per_group, n_bh - first)
        for c in per_head:
            costs += [c] * in_group
    return costs


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--sms", type=int, default=132)
    ap.add_argument("--noise", type=float, default=0.08)
    ap.add_argument("--seeds", type=int, default=6)
    ap.add_argument("--seqlens", default="2048,8192,16384")
    args = ap.parse_args()
    eff = (lambda costs: efficiency(costs, args.sms, args.noise, args.seeds))  # noqa: E731
    print(f"{'kernel':8} {'d':>3} {'s':>6} {'b*h':>4} {'group':>5}  "
          f"{'grouped':>8} {'global':>7} {'head-major':>10}")
    for d in (64, 128, 256):
        for s in (int(x) for x in args.seqlens.split(",")):
            n_bh = (16384 // s) * (2048 // d)
            heads = max(1, min(n_bh, L2_BUDGET // (2 * s * d * 2)))  # K and V (Q and dO), bf16
            bm, bn = FWD_TILES[d]
            per_head = [math.ceil(min(s, (m + 1) * bm) / bn) + 1
                        for m in reversed(range(math.ceil(s / bm)))]
            print(f"{'fwd':8} {d:>3} {s:>6} {n_bh:>4} {heads:>5}  "
                  f"{eff(grouped(per_head, n_bh, heads)):>8.3f} "
                  f"{eff(grouped(per_head, n_bh, n_bh)):>7.3f} {'':>10}")
            bm, bn = BWD_TILES[d]
            per_head = [math.ceil((s - j * bn) / bm) + 1 for j in range(math.ceil(s / bn))]
            print(f"{'bwd':8} {d:>3} {s:>6} {n_bh:>4} {heads:>5}  "
                  f"{eff(grouped(per_head, n_bh, heads)):>8.3f} "
                  f"{eff(grouped(per_head, n_bh, n_bh)):>7.3f} "
                  f"{eff(grouped(per_head, n_bh, 1)):>10.3f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
