"""One decode step over the same keys two ways, same run: ``flash_attn_with_kvcache`` on a
(b, L, 8, 128) cache and ``flash_attn_varlen_func`` (one query row per sequence) over the same
keys packed, which takes the decode kernel with the packed keys as one shared cache row
(dispatch._small_query_varlen). GQA 32 / 8, d 128, bf16, CUDA-graph replays
(``do_bench_cudagraph``), interleaved rounds, min per route. TB/s = bytes of K and V / time.

    python benchmarks/probes/varlen_vs_kvcache_probe.py --points 1:131072,64:32768 --out F.json
"""
from __future__ import annotations

import argparse
import json
import os
import sys

import torch
from triton.testing import do_bench_cudagraph

sys.path.append(os.path.join(os.path.dirname(__file__), "..", "..", "src"))
import flashattn  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--points", default="1:131072,1:16384,64:32768")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--out", default="")
    args = ap.parse_args()
    rows = []
    for point in args.points.split(","):
        b, L = (int(x) for x in point.split(":"))
        q = torch.randn(b, 1, 32, 128, device="cuda", dtype=torch.bfloat16)
        k, v = (torch.randn(b, L, 8, 128, device="cuda", dtype=torch.bfloat16) for _ in range(2))
        lens = torch.full((b,), L, dtype=torch.int32, device="cuda")
        cu_q = torch.arange(b + 1, dtype=torch.int32, device="cuda")
        cu_k = torch.arange(0, (b + 1) * L, L, dtype=torch.int32, device="cuda")
        qp, kp, vp = q.flatten(0, 1), k.flatten(0, 1), v.flatten(0, 1)
        routes = {
            "kvcache": lambda: flashattn.flash_attn_with_kvcache(q, k, v, cache_seqlens=lens,
                                                                 causal=True),
            "varlen": lambda: flashattn.flash_attn_varlen_func(qp, kp, vp, cu_q, cu_k, 1, L,
                                                               causal=True),
        }
        diff = (routes["kvcache"]()[:, 0].float() - routes["varlen"]().float()).abs().max()
        best = {name: float("inf") for name in routes}
        for _ in range(args.rounds):
            for name, fn in routes.items():
                best[name] = min(best[name], do_bench_cudagraph(fn, rep=100) * 1e3)
        nbytes = 2 * k.numel() * k.element_size()
        row = dict(b=b, L=L, max_diff=diff.item(),
                   **{f"{n}_graph_us": t for n, t in best.items()},
                   **{f"{n}_tbps": nbytes / (t * 1e-6) / 1e12 for n, t in best.items()})
        rows.append(row)
        print(json.dumps({k_: (round(v_, 3) if isinstance(v_, float) else v_)
                          for k_, v_ in row.items()}), flush=True)
        del q, k, v, qp, kp, vp, routes
        torch.cuda.empty_cache()
    if args.out:
        with open(args.out, "w") as f:
            json.dump(dict(rows=rows, torch=torch.__version__, gpu=torch.cuda.get_device_name()),
                      f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
