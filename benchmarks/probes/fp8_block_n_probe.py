"""``flash_attn_fp8_func`` with 128- or 256-key K / V scale blocks at d = 128, causal: accuracy
and end-to-end time. 256-key descales let the Hopper FP8 forward run its long-causal 256-key
tiles (sm90/config.FP8_LONG_CAUSAL: +2-12 % kernel alone at 4k-16k, 2026-11-25), at the cost
of coarser scales; the question is whether ``flash_attn_fp8_func`` should pick them itself.

- accuracy: the FA3 paper's distribution (N(0, 1) + N(0, 100) · Bernoulli(0.001)), b = 1,
  h = 16, RMSE against float64 attention (``fp8_accuracy_gpu.exact_attention``);
- speed: 16k tokens per call (b = 16384 / s, h = 16), do_bench medians of block_n 128 / 256 and
  our bf16 forward, interleaved over ``--rounds`` rounds.

    python benchmarks/probes/fp8_block_n_probe.py --seqlens 4096,16384 --json $OUT/bn.json
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys

import torch
from triton.testing import do_bench

sys.path.insert(0, os.path.dirname(__file__))
sys.path.append(os.path.join(os.path.dirname(__file__), "..", "..", "src"))
import flashattn  # noqa: E402
from flashattn import fp8  # noqa: E402
from fp8_accuracy_gpu import exact_attention  # noqa: E402


def _outliers(shape, gen):
    x = torch.randn(shape, device="cuda", generator=gen)
    spikes = torch.randn(shape, device="cuda", generator=gen) * 10
    return (x + spikes * (torch.rand(shape, device="cuda", generator=gen) < 1e-3)).bfloat16()


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--seqlens", default="4096,16384")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--json", default="")
    args = ap.parse_args()
    d, h = 128, 16
    rows = []
    for s in (int(x) for x in args.seqlens.split(",")):
        gen = torch.Generator(device="cuda").manual_seed(0)
        q, k, v = (_outliers((1, s, h, d), gen) for _ in range(3))
        exact = exact_attention(q, k, v, True)
        acc = {}
        for bn in (128, 256):
            out = fp8.flash_attn_fp8_func(q, k, v, causal=True, block_n=bn)
            acc[bn] = (out.double() - exact).pow(2).mean().sqrt().item()
        del exact
        b = max(1, 16384 // s)
        q, k, v = (torch.randn(b, s, h, d, device="cuda", dtype=torch.bfloat16)
                   for _ in range(3))
        fns = {"fp8_bn128": lambda: fp8.flash_attn_fp8_func(q, k, v, causal=True, block_n=128),
               "fp8_bn256": lambda: fp8.flash_attn_fp8_func(q, k, v, causal=True, block_n=256),
               "bf16": lambda: flashattn.flash_attn_func(q, k, v, causal=True)}
        times = {name: [] for name in fns}
        for fn in fns.values():
            fn()
        for _ in range(args.rounds):
            for name, fn in fns.items():
                times[name].append(do_bench(fn, warmup=25, rep=100) * 1e3)
        row = dict(d=d, s=s, b=b, h=h, causal=True, rmse_bn128=acc[128], rmse_bn256=acc[256],
                   us={name: round(statistics.median(t), 1) for name, t in times.items()},
                   us_rounds={name: [round(x, 1) for x in t] for name, t in times.items()})
        rows.append(row)
        print(json.dumps(row), flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(dict(rows=rows), f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
