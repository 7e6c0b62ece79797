"""What the same-run A/B probes of one kernel switch share (bwd_config_ab.py,
fwd_config_ab.py): the largest elementwise difference, comma-separated integer lists, and
the timing of two or more variants in interleaved rounds.

Interleaving: round r runs the variants in their given order when r is even and reversed when
r is odd, so that clock and thermal drift over a run lands on both sides; each variant's
fastest round is the one compared (run-to-run noise on these machines is 5-10 % on single
points, benchmarks/NOTES.md).
"""
from __future__ import annotations

import argparse
import json
import os
from typing import Any, Callable, Dict, List, Sequence

import torch
import triton


def add_common_arguments(ap: argparse.ArgumentParser) -> None:
    """The options every A/B probe takes: the call size (``--tokens`` per call, ``--hidden``
    = heads x d), the interleaved rounds and do_bench's warmup / rep, and ``--out``."""
    ap.add_argument("--tokens", type=int, default=16384, help="batch = tokens / s")
    ap.add_argument("--hidden", type=int, default=2048, help="heads = hidden / d")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--warmup", type=int, default=25)
    ap.add_argument("--rep", type=int, default=100)
    ap.add_argument("--out", default=None, help="write the rows as JSON here")


def add_override_argument(ap: argparse.ArgumentParser, config: str, example: str) -> None:
    """``--override FIELD=INT`` (repeatable): the config fields of the variant side."""
    ap.add_argument("--override", action="append", default=[], metavar="FIELD=INT",
                    help=f"a {config} field of the variant (repeatable), e.g. {example}")


def parse_overrides(ap: argparse.ArgumentParser, args: argparse.Namespace) -> Dict[str, int]:
    """``args.override`` as a dict, FIELD -> int; at least one is required."""
    if not args.override:
        ap.error("--override FIELD=INT: the variant's config field(s)")
    return {k.strip(): int(v) for k, v in (o.split("=", 1) for o in args.override)}


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


def run_points(points: Sequence[tuple], run_point: Callable[..., Dict[str, Any]],
               header: str, line: Callable[[Dict[str, Any]], str],
               out: str = "") -> List[Dict[str, Any]]:
    """Run ``run_point(*p)`` for every point, printing each row as a JSON line as it comes,
    then a summary table (``header``, then ``line(row)`` per row) and the device metadata;
    with ``out``, write the rows and metadata there. Returns the rows."""
    import time

    rows: List[Dict[str, Any]] = []
    t0 = time.time()
    for p in points:
        row = run_point(*p)
        torch.cuda.empty_cache()  # (the point's tensors are gone with its frame)
        rows.append(row)
        print(json.dumps({k: (round(v, 6) if isinstance(v, float) else v)
                          for k, v in row.items()}), flush=True)
    print("\n" + header)
    for r in rows:
        print(line(r))
    meta = {"device": torch.cuda.get_device_name(), "torch": torch.__version__,
            "triton": triton.__version__, "seconds": round(time.time() - t0, 1)}
    print(json.dumps(meta))
    if out:
        write_rows(out, rows, meta)
    return rows
