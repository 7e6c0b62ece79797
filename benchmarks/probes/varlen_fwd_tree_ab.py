"""A / B of the Hopper varlen forward between two source trees, interleaved: each round runs
one process per tree that times ``flash_attn_varlen_func`` (FLASHATTN_BACKEND=hopper, no
grad, bf16) on varlen_probe.py's ragged batches (16k tokens, hidden 2048: h = 2048 / d),
do_bench medians in µs, per (d, mean length, causal); the summary keeps each point's best
round per tree.

    python benchmarks/probes/varlen_fwd_tree_ab.py --trees /tmp/old/src,src --json out.json
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys

_CHILD = r"""
import json, sys, torch
from triton.testing import do_bench
sys.path.insert(0, sys.argv[3])
from varlen_probe import ragged_lengths, _cu
from flashattn import flash_attn_varlen_func
res = {}
for d in [int(x) for x in sys.argv[1].split(",")]:
    for mean in [int(x) for x in sys.argv[2].split(",")]:
        lengths = ragged_lengths(mean)
        cu, total, h = _cu(lengths, "cuda"), sum(lengths), 2048 // d
        q, k, v = (torch.randn(total, h, d, device="cuda", dtype=torch.bfloat16)
                   for _ in range(3))
        for causal in (False, True):
            fn = lambda: flash_attn_varlen_func(q, k, v, cu, cu, max(lengths), max(lengths),
                                                causal=causal)
            fn()
            res[f"d{d}_mean{mean}_{'causal' if causal else 'full'}"] = do_bench(
                fn, warmup=10, rep=50) * 1e3
print(json.dumps(res))
"""


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--trees", default="/tmp/old/src,src")
    ap.add_argument("--dims", default="64,128,256")
    ap.add_argument("--means", default="256,1024")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--json", default="")
    args = ap.parse_args()
    trees = args.trees.split(",")
    here = os.path.dirname(os.path.abspath(__file__))
    runs = {t: [] for t in trees}
    for _ in range(args.rounds):
        for tree in trees:
            env = dict(os.environ, PYTHONPATH=os.path.abspath(tree), FLASHATTN_BACKEND="hopper")
            out = subprocess.run([sys.executable, "-c", _CHILD, args.dims, args.means, here],
                                 env=env, capture_output=True, text=True, check=True).stdout
            runs[tree].append(json.loads(out.strip().splitlines()[-1]))
            print(tree, json.dumps(runs[tree][-1]), flush=True)
    summary = {t: {p: round(min(r[p] for r in rs), 1) for p in rs[0]} for t, rs in runs.items()}
    print(json.dumps(summary, indent=1))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(dict(runs=runs, summary=summary), f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
