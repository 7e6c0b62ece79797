"""FP8 forward TFLOP/s of whichever flashattn PYTHONPATH selects (A/B of two trees, one
process each, alternated by the caller): 16k tokens per batch (--seqlens), hidden 2048, FA3's API with unit descales
(V given as (b, s, h, d): each tree makes its own V^T). Prints one JSON line per point.

    PYTHONPATH=old/src python benchmarks/probes/fp8_ab.py --tag old
"""
from __future__ import annotations

import argparse
import json

import torch
from triton.testing import do_bench

import flashattn


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--tag", default="")
    ap.add_argument("--dims", default="128,256,64")
    ap.add_argument("--seqlens", default="16384", help="comma-separated; batch = 16384 // s")
    args = ap.parse_args()
    points = [(int(s), int(d)) for s in args.seqlens.split(",") for d in args.dims.split(",")]
    for s, d in points:
        b = max(1, 16384 // s)
        h = 2048 // d
        torch.manual_seed(d)
        x8 = [torch.randn(b, s, h, d, device="cuda", dtype=torch.bfloat16).to(torch.float8_e4m3fn)
              for _ in range(3)]
        one = torch.ones(b, h, device="cuda", dtype=torch.float32)
        for causal in (False, True):
            ms = min(do_bench(lambda: flashattn.flash_attn_func(
                *x8, causal=causal, q_descale=one, k_descale=one, v_descale=one),
                warmup=10, rep=60) for _ in range(3))
            tf = 4.0 * b * h * s * s * d * (0.5 if causal else 1.0) / (ms * 1e-3) / 1e12
            print(json.dumps(dict(tag=args.tag, s=s, d=d, causal=causal, ms=round(ms, 4),
                                  tflops=round(tf, 1))), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
