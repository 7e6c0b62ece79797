"""``flash_attn_fp8_func`` end to end against our bf16 ``flash_attn_func`` at the issue's points
("end to end faster than our bf16 forward at s >= 4k"; 16k tokens per call, hidden
2048: b = 16384 / s, h = 2048 / d), the two timed back to back in every round, rounds
interleaved over the points. Reports per point the median and the best of the rounds' ratios
(bf16 time / FP8 time: > 1 means FP8 end to end is faster), and each side's best TFLOP/s.

    PYTHONPATH=src python benchmarks/probes/fp8_e2e.py --rounds 5 --json $OUT/fp8_e2e.json
"""
from __future__ import annotations

import argparse
import json
import statistics

import torch
from triton.testing import do_bench

import flashattn
from flashattn import fp8


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--d", default="64,128,256")
    ap.add_argument("--s", default="4096,16384")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--json", default="")
    args = ap.parse_args()
    points = []
    for d in (int(x) for x in args.d.split(",")):
        for s in (int(x) for x in args.s.split(",")):
            b, h = max(1, 16384 // s), 2048 // d
            q, k, v = (torch.randn(b, s, h, d, device="cuda", dtype=torch.bfloat16)
                       for _ in range(3))
            for causal in (False, True):
                flops = 4.0 * b * h * s * s * d * (0.5 if causal else 1.0)
                e2e = (lambda q=q, k=k, v=v, c=causal:  # noqa: E731
                       fp8.flash_attn_fp8_func(q, k, v, causal=c))
                bf16 = (lambda q=q, k=k, v=v, c=causal:  # noqa: E731
                        flashattn.flash_attn_func(q, k, v, causal=c))
                e2e(), bf16()
                points.append(dict(d=d, s=s, b=b, h=h, causal=causal, flops=flops, e2e=e2e,
                                   bf16=bf16, ratios=[], e2e_ms=[], bf16_ms=[]))
    torch.cuda.synchronize()
    for _ in range(args.rounds):
        for p in points:
            t8 = do_bench(p["e2e"], warmup=25, rep=100)
            t16 = do_bench(p["bf16"], warmup=25, rep=100)
            p["e2e_ms"].append(t8)
            p["bf16_ms"].append(t16)
            p["ratios"].append(t16 / t8)
    rows = []
    for p in points:
        row = dict(d=p["d"], s=p["s"], b=p["b"], h=p["h"], causal=p["causal"],
                   e2e_over_bf16_median=round(statistics.median(p["ratios"]), 4),
                   e2e_over_bf16_min=round(min(p["ratios"]), 4),
                   e2e_tflops_best=round(p["flops"] / min(p["e2e_ms"]) / 1e9, 1),
                   bf16_tflops_best=round(p["flops"] / min(p["bf16_ms"]) / 1e9, 1),
                   ratios=[round(x, 4) for x in p["ratios"]])
        rows.append(row)
        print(json.dumps(row), flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(dict(rows=rows), f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
