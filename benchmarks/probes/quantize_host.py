"""Host time of ``fp8.quantize`` called directly (the ``bench --mode quant`` rows read the
host, not the pass): microseconds per call, back-to-back calls with one synchronise per batch,
fastest of 15 batches, beside the pass's do_bench time; 16k tokens, hidden 2048, d 64 / 128 /
256, b = 1. Run once per source tree (``PYTHONPATH=<tree>/src``) for an A/B.

    PYTHONPATH=src python benchmarks/probes/quantize_host.py
"""
from __future__ import annotations

import json
import time

import torch
from triton.testing import do_bench

from flashattn import fp8


def main() -> int:
    for d in (64, 128, 256):
        h = 2048 // d
        q, k, v = (torch.randn(1, 16384, h, d, device="cuda", dtype=torch.bfloat16)
                   for _ in range(3))
        call = lambda: fp8.quantize(q, k, v, seed=0)  # noqa: E731
        for _ in range(10):
            call()
        torch.cuda.synchronize()
        best = float("inf")
        for _ in range(15):
            t0 = time.perf_counter()
            for _ in range(50):
                call()
            torch.cuda.synchronize()
            best = min(best, (time.perf_counter() - t0) / 50 * 1e6)
        ms = do_bench(call, warmup=25, rep=100)
        nbytes = 3 * q.numel() * 2 + 3 * q.numel()  # bf16 read + e4m3 written
        print(json.dumps(dict(d=d, back_to_back_us=round(best, 1), do_bench_us=round(ms * 1e3, 1),
                              tbps_back_to_back=round(nbytes / best / 1e6, 2))), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
