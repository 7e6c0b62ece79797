"""Host time of flash_attn_fp8_func (end to end >= bf16 at 4k, where the call's
Python can outlast its kernels): per call, the wall time of the host path alone (the GPU kept
idle: each call is followed by a synchronize, and the kernels' own time, from CUDA events, is
subtracted) and a cProfile of the calls (top functions by own time).

    PYTHONPATH=src python benchmarks/probes/fp8_host.py --json $OUT/fp8_host.json
"""
from __future__ import annotations

import argparse
import cProfile
import json
import os
import pstats
import time

import torch
from triton.testing import do_bench

from flashattn import fp8


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--points", default="256x4096x1,128x4096x1,256x4096x0")
    ap.add_argument("--json", default="")
    args = ap.parse_args()
    rows = []
    for p in args.points.split(","):
        d, s, causal = (int(x) for x in p.split("x"))
        h, b = 2048 // d, 16384 // s
        q, k, v = (torch.randn(b, s, h, d, device="cuda", dtype=torch.bfloat16) for _ in range(3))
        fn = lambda: fp8.flash_attn_fp8_func(q, k, v, causal=bool(causal))  # noqa: E731
        fn()
        gpu_ms = do_bench(fn, warmup=10, rep=60)
        # host: one call enqueued on an idle GPU, timed until the call returns
        host = []
        for _ in range(30):
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            fn()
            host.append(time.perf_counter() - t0)
        torch.cuda.synchronize()
        prof = cProfile.Profile()
        prof.enable()
        for _ in range(20):
            fn()
            torch.cuda.synchronize()
        prof.disable()
        stats = pstats.Stats(prof)
        top = sorted(((tt, f"{os.path.basename(f)}:{n}", nc / 20) for (f, _l, n), (_c, nc, tt, _ct, _)
                      in stats.stats.items()), reverse=True)[:25]
        row = dict(d=d, s=s, causal=bool(causal), do_bench_us=round(gpu_ms * 1e3, 1),
                   host_us_min=round(min(host) * 1e6, 1),
                   host_us_median=round(sorted(host)[len(host) // 2] * 1e6, 1),
                   top=[dict(fn=n, us_per_call=round(t / 20 * 1e6, 1), calls=c)
                        for t, n, c in top])
        rows.append(row)
        print(json.dumps({k: v for k, v in row.items() if k != "top"}), flush=True)
        for t in row["top"][:18]:
            print("   ", t, flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(dict(rows=rows, gpu=torch.cuda.get_device_name()), f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
