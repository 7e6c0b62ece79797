"""Where a kernel's warps stall, by kind of instruction and by warp role, from the
per-instruction SASS page that `ncu_side_by_side.sh` exports (``<case>_sass.csv.gz``).

    python benchmarks/probes/ncu_stall_categories.py bwd_d128_8192_causal_ours_sass.csv.gz \
        attn_bwd_kernel [--top 30]

Warp roles are read off the register reallocations: a consumer warpgroup's code runs from a
``USETMAXREG`` to >= 240 registers up to the next ``USETMAXREG`` (the producer's 24-register
code and the padding warps, which wait at the end barrier as ``NOP`` all call long, are left
out). Each consumer region's stall samples are split into: GEMM issue / wait (``HGMMA``,
``WARPGROUP.*``), mbarrier wait loops (``SYNCS`` and the branch of a try-wait loop, stalled
on its long scoreboard), fences and CTA barriers, shared-memory loads / stores, spills, fp
math and the rest. ``--top N`` also lists the N instructions with the most samples anywhere,
with their two main stall reasons.
"""
from __future__ import annotations

import argparse
import collections
import csv
import gzip
import io
import re

SAMPLES = "Warp Stall Sampling (All Samples)"


def load_kernel(path: str, kernel: str) -> list:
    """The rows (one per SASS instruction) of the first kernel whose name contains
    ``kernel``."""
    text = gzip.open(path, "rt").read()
    for part in re.split(r'^"Kernel Name","', text, flags=re.M)[1:]:
        if kernel in part.split('"', 1)[0]:
            return list(csv.DictReader(io.StringIO(part.split("\n", 1)[1])))
    raise SystemExit(f"{path}: no kernel named like {kernel!r}")


def consumer_regions(rows: list, min_len: int = 300) -> list:
    """[start, end) row ranges of code that runs with >= 240 registers (consumer warpgroups)."""
    regions, start = [], None
    for i, row in enumerate(rows):
        m = re.search(r"USETMAXREG\.(?:TRY_ALLOC|DEALLOC)\.CTAPOOL (?:UP\d, )?0x([0-9a-f]+)",
                      row["Source"])
        if m:
            if start is not None:
                regions.append((start, i))
                start = None
            if int(m.group(1), 16) >= 0xF0:
                start = i
    if start is not None:
        regions.append((start, len(rows)))
    return [(a, b) for a, b in regions if b - a >= min_len]


def category(row: dict) -> str:
    src = row["Source"].strip()
    words = src.split()
    op = words[1] if words and words[0].startswith("@") and len(words) > 1 else (words or [""])[0]
    samples = int(row[SAMPLES])
    if op.startswith(("HGMMA", "WARPGROUP")):
        return "GEMM issue / wait"
    if op.startswith("SYNCS") or (op == "BRA" and int(row["stall_long_sb"]) > samples / 2):
        return "mbarrier wait loop"
    if op.startswith(("FENCE", "BAR")):
        return "fence / bar.sync"
    if op.startswith(("LDL", "STL")):
        return "local memory (spills)"
    if op.startswith(("LDS", "STS", "LDSM", "STSM")):
        return "shared load / store"
    if op.startswith(("MUFU", "FFMA", "FADD", "FMUL", "FMNMX", "F2FP", "FSEL", "FSETP")):
        return "fp math"
    return "other"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("sass_csv_gz")
    ap.add_argument("kernel")
    ap.add_argument("--top", type=int, default=0)
    args = ap.parse_args()
    rows = load_kernel(args.sass_csv_gz, args.kernel)
    total = sum(int(r[SAMPLES]) for r in rows)
    print(f"{args.kernel}: {total} stall samples, {len(rows)} instructions")
    overall = collections.Counter()
    for a, b in consumer_regions(rows):
        counts = collections.Counter()
        for row in rows[a:b]:
            counts[category(row)] += int(row[SAMPLES])
        overall.update(counts)
        part = sum(counts.values())
        print(f"  consumer code [{a}, {b}): {100 * part / total:.1f} % of all samples: "
              + ", ".join(f"{k} {100 * v / part:.1f}" for k, v in counts.most_common()))
    part = sum(overall.values())
    if part:
        print(f"  consumers together ({100 * part / total:.1f} %): "
              + ", ".join(f"{k} {100 * v / part:.1f}" for k, v in overall.most_common()))
    if args.top:
        reasons = [c for c in rows[0] if c.startswith("stall_") and "Not Issued" not in c]
        top = sorted(range(len(rows)), key=lambda i: -int(rows[i][SAMPLES]))[:args.top]
        for i in sorted(top):
            row = rows[i]
            main_reasons = sorted(((c[6:], int(row[c])) for c in reasons if int(row[c])),
                                  key=lambda x: -x[1])[:2]
            print(f"  {i:5d} {100 * int(row[SAMPLES]) / total:5.1f} % "
                  f"{row['Source'].strip()[:64]:64s} {main_reasons}")


if __name__ == "__main__":
    main()
