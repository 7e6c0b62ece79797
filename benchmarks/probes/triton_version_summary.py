"""Summarise triton_version_ab.sh's JSON lines: per point, the best TFLOP/s of each Triton
release over all its rounds, and the ratio of the newer release to the image's.

    python3 benchmarks/probes/triton_version_summary.py OUT.jsonl
"""
from __future__ import annotations

import json
import sys
from collections import defaultdict


def main(path: str) -> int:
    best = defaultdict(dict)
    for line in open(path):
        rec = json.loads(line)
        point = (rec.get("dtype", "fp8"), rec["d"], rec["s"], rec["causal"],
                 json.dumps(rec.get("variant", {}), sort_keys=True))
        tf = rec["tflops"]
        best[point][rec["triton"]] = max(tf, best[point].get(rec["triton"], 0.0))
    versions = sorted({v for row in best.values() for v in row})
    print("dtype d s causal variant " + " ".join(versions) + " ratio")
    for point, row in sorted(best.items()):
        vals = [row.get(v) for v in versions]
        ratio = (vals[-1] / vals[0]) if len(vals) == 2 and all(vals) else None
        print(*point, *vals, f"{ratio:.3f}" if ratio else "-")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1]))
