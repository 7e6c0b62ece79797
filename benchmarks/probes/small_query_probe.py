"""Few-query calls (seqlen_q <= 16: a decoding step of a model that calls the prefill API,
speculative verification): the split-KV decode kernel vs the prefill kernels.

Each point runs ``flash_attn_func(q (b, s_q, 32, 128), k / v (b, L, 8, 128), causal=True)``
bf16 (``--varlen``: ``flash_attn_varlen_func`` on the same tensors packed, b sequences of s_q
query rows and L keys, ``max_seqlen_q = s_q``) with ``FLASHATTN_SMALL_QUERY`` on (decode
kernel) and off (prefill kernels), interleaved, timed eager (``do_bench``, host time included)
and replayed in a CUDA graph (``do_bench_cudagraph``, the kernels alone). TB/s = bytes of K
and V / time.

    python benchmarks/probes/small_query_probe.py --out $OUT/small_query.json
    python benchmarks/probes/small_query_probe.py --varlen --out $OUT/small_query_varlen.json
"""
from __future__ import annotations

import argparse
import json
import os
import sys

import torch
from triton.testing import do_bench, do_bench_cudagraph

sys.path.append(os.path.join(os.path.dirname(__file__), "..", "..", "src"))
import flashattn  # noqa: E402
from flashattn.runtime import env  # noqa: E402

POINTS = [(1, 1024), (1, 4096), (1, 16384), (1, 65536), (1, 131072), (8, 1024), (8, 8192),
          (32, 4096), (64, 32768)]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--sq", default="1,4,16")
    ap.add_argument("--out", default="")
    ap.add_argument("--varlen", action="store_true",
                    help="flash_attn_varlen_func on the packed tensors")
    ap.add_argument("--points", default="", help="b:L,b:L,... (default: the issue's grid)")
    args = ap.parse_args()
    points = POINTS
    if args.points:
        points = [tuple(int(x) for x in p.split(":")) for p in args.points.split(",")]
    rows = []
    for b, L in points:
        for s_q in (int(x) for x in args.sq.split(",")):
            q = torch.randn(b, s_q, 32, 128, device="cuda", dtype=torch.bfloat16)
            k, v = (torch.randn(b, L, 8, 128, device="cuda", dtype=torch.bfloat16)
                    for _ in range(2))
            nbytes = 2 * k.numel() * k.element_size()
            fn = lambda: flashattn.flash_attn_func(q, k, v, causal=True)  # noqa: E731
            if args.varlen:
                qp, kp, vp = (x.flatten(0, 1) for x in (q, k, v))
                cu_q = torch.arange(0, (b + 1) * s_q, s_q, device="cuda", dtype=torch.int32)
                cu_k = torch.arange(0, (b + 1) * L, L, device="cuda", dtype=torch.int32)
                fn = lambda: flashattn.flash_attn_varlen_func(  # noqa: E731
                    qp, kp, vp, cu_q, cu_k, s_q, L, causal=True)
            row = dict(b=b, L=L, s_q=s_q, api="varlen" if args.varlen else "dense")
            outs = {}
            for tag, on in (("decode", True), ("prefill", False), ("decode2", True)):
                with env.override(small_query=on):
                    outs[tag] = fn()
                    eager = do_bench(fn, warmup=25, rep=100)
                    graph = do_bench_cudagraph(fn, rep=100)
                key = tag.rstrip("2")
                row[f"{key}_eager_us"] = min(row.get(f"{key}_eager_us", 1e9), eager * 1e3)
                row[f"{key}_graph_us"] = min(row.get(f"{key}_graph_us", 1e9), graph * 1e3)
            row["max_diff"] = (outs["decode"].float() - outs["prefill"].float()).abs().max().item()
            row["decode_graph_tbps"] = nbytes / (row["decode_graph_us"] * 1e-6) / 1e12
            row["prefill_graph_tbps"] = nbytes / (row["prefill_graph_us"] * 1e-6) / 1e12
            row["speedup_eager"] = row["prefill_eager_us"] / row["decode_eager_us"]
            row["speedup_graph"] = row["prefill_graph_us"] / row["decode_graph_us"]
            rows.append(row)
            print(json.dumps({k_: (round(v_, 3) if isinstance(v_, float) else v_)
                              for k_, v_ in row.items()}), flush=True)
            del q, k, v
            torch.cuda.empty_cache()
    if args.out:
        with open(args.out, "w") as f:
            json.dump(dict(rows=rows, torch=torch.__version__, gpu=torch.cuda.get_device_name()),
                      f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
