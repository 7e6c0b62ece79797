"""What the same-run A/B probes of one kernel switch share (bwd_dq_order_probe.py,
fwd_rowmax_probe.py): the largest elementwise difference, comma-separated integer lists, and
the timing of two or more variants in interleaved rounds.

Interleaving: round r runs the variants in their given order when r is even and reversed when
r is odd, so that clock and thermal drift over a run lands on both sides; each variant's
fastest round is the one compared (run-to-run noise on these machines is 5-10 % on single
points, benchmarks/NOTES.md).
"""
from __future__ import annotations

import json
import os
from typing import Any, Callable, Dict, List, Sequence

import torch
import triton


def max_abs(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a.double() - b.double()).abs().max())


def int_list(spec: str) -> List[int]:
    return [int(x) for x in spec.split(",") if x]


def interleaved_ms(fns: Dict[str, Callable[[], Any]], rounds: int, warmup: int,
                   rep: int) -> Dict[str, List[float]]:
    """Median milliseconds (triton.testing.do_bench) of each variant per round."""
    names = list(fns)
    ms: Dict[str, List[float]] = {name: [] for name in names}
    for r in range(rounds):
        for name in (names if r % 2 == 0 else names[::-1]):
            ms[name].append(triton.testing.do_bench(fns[name], warmup=warmup, rep=rep,
                                                    return_mode="median"))
    return ms


def write_rows(path: str, rows: Sequence[Dict[str, Any]], meta: Dict[str, Any]) -> None:
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    with open(path, "w") as f:
        json.dump({"rows": list(rows), **meta}, f, indent=1)
