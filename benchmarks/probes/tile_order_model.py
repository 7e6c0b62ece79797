"""The list-schedule model of the Hopper kernels' longest-first tile orders on the benchmark
grid (no GPU needed): src/flashattn/backends/sm90/tile_order.py's model, printed per point.

The causal forward hands out its tiles in ``tiles.tile_coords`` order (the persistent tile
queue, or the hardware's block dispatch when masked d = 192 / 256 calls launch one CTA per
tile), and so does the backward with ``BwdConfig.longest_first`` (by default it walks one
(batch, KV head) after another, key block 0 first). Either way each SM takes the next tile
when its last one ends: a greedy list schedule, whose end against the ideal (total work /
SMs) is the efficiency printed. A tile's cost is the number of key (forward) or query
(backward) blocks it visits plus one, with +-``--noise`` uniform jitter averaged over
``--seeds`` draws (the library's own choice, ``modelled_group``, uses the exact costs).

Columns (16k tokens, hidden 2048, causal): ``budget``, the default groups of pairs whose
K / V (Q / dO) fit the L2 budget (``head_groups=1``); ``global``, one group of every pair
(``head_groups=0``); ``modelled``, tile_order.modelled_group's size within the budget
(``head_groups=2``, the forward's default; the size in brackets); backward also
``head-major``, its order for MHA (``longest_first=False``). The model has no L2, which the groups exist for: only a GPU A/B
can weigh it (``fwd_config_ab.py --override head_groups=0``).

    python benchmarks/probes/tile_order_model.py
"""
from __future__ import annotations

import argparse
import os
import random
import sys
from typing import List, Sequence

sys.path.append(os.path.join(os.path.dirname(__file__), "..", "..", "src"))
from flashattn.backends.sm90.config import bwd_config, fwd_config  # noqa: E402
from flashattn.backends.sm90.descriptors import heads_per_group  # noqa: E402
from flashattn.backends.sm90.tile_order import (backward_level_costs,  # noqa: E402
                                                forward_level_costs, makespan, modelled_group)


def efficiency(levels: Sequence[float], n_pairs: int, group: int, sms: int, noise: float,
               seeds: int) -> float:
    """Ideal / modelled end of tile_coords' order, averaged over jittered level costs."""
    total = 0.0
    for seed in range(seeds):
        rng = random.Random(seed)
        jittered: List[float] = [c * (1 + noise * (2 * rng.random() - 1)) for c in levels]
        total += sum(jittered) * n_pairs / sms / makespan(jittered, n_pairs, group, sms)
    return total / seeds


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--sms", type=int, default=132)
    ap.add_argument("--noise", type=float, default=0.08)
    ap.add_argument("--seeds", type=int, default=6)
    ap.add_argument("--seqlens", default="2048,8192,16384")
    ap.add_argument("--groups", type=int, default=1,
                    help="query heads per KV head (the backward's pairs are KV heads)")
    args = ap.parse_args()
    print(f"{'kernel':6} {'d':>3} {'s':>6} {'b*h':>4} {'budget':>12} {'global':>7} "
          f"{'modelled':>13} {'head-major':>10}")
    for d in (64, 128, 256):
        for s in (int(x) for x in args.seqlens.split(",")):
            n_bh = (16384 // s) * (2048 // d)
            n_bh_k = n_bh // args.groups
            # K / V (forward) or the Q / dO of a KV head's query heads (backward), bf16
            budgets = (heads_per_group(n_bh, 2 * s * d * 2),
                       heads_per_group(n_bh_k, 2 * s * d * 2 * args.groups))
            for kernel, cfg, level_costs, n_bh, budget in (
                    ("fwd", fwd_config(d, masked=True), forward_level_costs, n_bh, budgets[0]),
                    ("bwd", bwd_config(d, masked=True, gqa_causal=args.groups > 1),
                     backward_level_costs, n_bh_k, budgets[1])):
                levels = level_costs(s, s, cfg.block_m, cfg.block_n, -1, 0)
                eff = (lambda g: efficiency(levels, n_bh, g, args.sms,  # noqa: E731
                                            args.noise, args.seeds))
                chosen = modelled_group(levels, n_bh, budget, args.sms)
                head_major = f"{eff(1):>10.3f}" if kernel == "bwd" else f"{'':>10}"
                print(f"{kernel:6} {d:>3} {s:>6} {n_bh:>4} {eff(budget):>7.3f} ({budget:>2}) "
                      f"{eff(n_bh):>7.3f} {eff(chosen):>7.3f} ({chosen:>2}) {head_major}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
