"""A/B of the Hopper forward's varlen mode under FwdConfig overrides (sm90/fwd.py
flash_fwd_hopper_varlen's config_overrides), on the packed batches of varlen_probe.py.

    python benchmarks/probes/varlen_ab.py --means 1024,4096 --ab '{"dynamic": false}' [--equal]

Prints ms and useful TFLOP/s per (mean, causal) for the default config and each override,
interleaved round by round (--rounds) so that machine drift hits both alike.
"""
from __future__ import annotations

import argparse
import json
import os
import sys

import torch
import triton

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "src"))
sys.path.insert(0, os.path.dirname(__file__))
from flashattn.backends.sm90.fwd import flash_fwd_hopper_varlen  # noqa: E402
from varlen_probe import D, H, TOKENS, _cu, ragged_lengths, useful_flops  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--means", default="1024,4096")
    ap.add_argument("--ab", action="append", default=[], help="JSON FwdConfig overrides")
    ap.add_argument("--equal", action="store_true")
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()
    variants = [None] + [json.loads(x) for x in args.ab]
    for mean in (int(m) for m in args.means.split(",")):
        lengths = [mean] * (TOKENS // mean) if args.equal else ragged_lengths(mean)
        cu, total = _cu(lengths, "cuda"), sum(lengths)
        q, k, v = (torch.randn(total, H, D, device="cuda", dtype=torch.bfloat16)
                   for _ in range(3))
        for causal in (False, True):
            times = {i: [] for i in range(len(variants))}
            for _ in range(args.rounds):
                for i, ov in enumerate(variants):
                    fn = lambda: flash_fwd_hopper_varlen(  # noqa: E731
                        q, k, v, cu, cu, softmax_scale=D ** -0.5, causal=causal,
                        window_left=-1, window_right=0 if causal else -1, softcap=0.0,
                        config_overrides=ov)
                    times[i].append(triton.testing.do_bench(fn, warmup=10, rep=40))
            for i, ov in enumerate(variants):
                ms = sorted(times[i])[len(times[i]) // 2]
                tf = useful_flops(lengths, causal, "fwd") / ms * 1e-9
                print(f"mean {mean:5d} causal={int(causal)} {json.dumps(ov):28s} "
                      f"{ms:7.3f} ms {tf:6.1f} TFLOP/s  rounds {[round(t, 3) for t in times[i]]}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
