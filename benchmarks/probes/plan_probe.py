"""Decode step host + device time: flash_attn_with_kvcache vs flashattn.plan_decode(...).run vs
SDPA (cuDNN / flash) on the same cache, eager (median over many calls, wall clock, synchronized
at the end of each batch of calls) and in a CUDA graph (plan.run captured once). GQA 32/8,
d 128, bf16, one query row.

    python benchmarks/probes/plan_probe.py --json $OUT/plan_probe.json
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time

import torch

sys.path.append(os.path.join(os.path.dirname(__file__), "..", "..", "src"))
import flashattn  # noqa: E402


def per_call_us(fn, calls=200, repeats=7):
    fn()
    torch.cuda.synchronize()
    samples = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        for _ in range(calls):
            fn()
        torch.cuda.synchronize()
        samples.append((time.perf_counter() - t0) / calls * 1e6)
    return min(samples), statistics.median(samples)


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--points", default="1x16384,8x8192,64x32768")
    ap.add_argument("--json", default="")
    args = ap.parse_args()
    h, h_k, d = 32, 8, 128
    rows = []
    for pt in args.points.split(","):
        b, L = (int(x) for x in pt.split("x"))
        q = torch.randn(b, 1, h, d, device="cuda", dtype=torch.bfloat16)
        kc = torch.randn(b, L, h_k, d, device="cuda", dtype=torch.bfloat16)
        vc = torch.randn_like(kc)
        lens = torch.full((b,), L, dtype=torch.int32, device="cuda")
        plan = flashattn.plan_decode(b, h, h_k, d, max_seqlen_k=L, dtype=torch.bfloat16)
        row = dict(b=b, L=L)
        row["kvcache_us"] = per_call_us(lambda: flashattn.flash_attn_with_kvcache(
            q, kc, vc, cache_seqlens=lens, causal=True))
        row["plan_run_us"] = per_call_us(lambda: plan.run(q, kc, vc, lens))
        qt = q.transpose(1, 2)
        kt, vt = kc.transpose(1, 2), vc.transpose(1, 2)
        from torch.nn.attention import SDPBackend, sdpa_kernel
        for name, be in (("sdpa_cudnn_us", SDPBackend.CUDNN_ATTENTION),
                         ("sdpa_flash_us", SDPBackend.FLASH_ATTENTION)):
            try:
                with sdpa_kernel([be]):
                    row[name] = per_call_us(lambda: torch.nn.functional.scaled_dot_product_attention(
                        qt, kt, vt, enable_gqa=True))
            except Exception as exc:  # an SDPA backend that refuses the shape
                row[name] = f"{type(exc).__name__}"
        g = torch.cuda.CUDAGraph()
        plan.run(q, kc, vc, lens)
        torch.cuda.synchronize()
        with torch.cuda.graph(g):
            plan.run(q, kc, vc, lens)
        row["plan_graph_us"] = per_call_us(g.replay)
        moved = 2 * b * L * h_k * d * 2
        row["plan_graph_tbps"] = moved / (row["plan_graph_us"][0] * 1e-6) / 1e12
        rows.append(row)
        print(json.dumps(row), flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(dict(rows=rows, gpu=torch.cuda.get_device_name(),
                           note="(min, median) us per call over 7 batches of 200 calls"), f,
                      indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
