"""A / B of the FP8 quantize pass between two source trees, interleaved: each round
runs one process per tree that times ``triton.fp8_quantize.quantize_qkv`` (allocations and
launches, V in the Hopper key order) with do_bench at 32k tokens, hidden 2048, bf16, where
the kernels (~270 us) outlast the host work.

    python benchmarks/probes/quantize_ab.py --trees bench_old/src,src --json out.json
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
from flashattn.api.fp8_quantize import random_signs
from flashattn.backends.triton.fp8_quantize import quantize_qkv
res = {}
for d in [int(x) for x in sys.argv[1].split(",")]:
    h = 2048 // d
    q, k, v = (torch.randn(2, 16384, h, d, device="cuda", dtype=torch.bfloat16) for _ in range(3))
    signs = random_signs(d, 0, q.device)
    fn = lambda: quantize_qkv(q, k, v, signs, 128, 128, False, True)
    fn()
    res[d] = do_bench(fn, warmup=10, rep=60) * 1e3
print(json.dumps(res))
"""


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--trees", default="bench_old/src,src")
    ap.add_argument("--dims", default="128,64,256")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--json", default="")
    args = ap.parse_args()
    trees = args.trees.split(",")
    runs = {t: [] for t in trees}
    for _ in range(args.rounds):
        for tree in trees:
            env = dict(os.environ, PYTHONPATH=os.path.abspath(tree))
            out = subprocess.run([sys.executable, "-c", _CHILD, args.dims], env=env,
                                 capture_output=True, text=True, check=True).stdout
            runs[tree].append(json.loads(out.strip().splitlines()[-1]))
            print(tree, runs[tree][-1], flush=True)
    moved = lambda d: 2 * 16384 * 2048 * 3 * 3  # noqa: E731  bytes: bf16 in + e4m3 out, q k v
    summary = {t: {d: dict(us=min(r[d] for r in rs), tb_s=round(moved(d) / min(r[d] for r in rs)
                                                                  / 1e6, 2))
                   for d in rs[0]} for t, rs in runs.items()}
    print(json.dumps(summary, indent=1))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(dict(runs=runs, summary=summary), f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
