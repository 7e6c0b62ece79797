"""Forward TFLOP/s with head_dim != head_dim_v (e.g. 192 / 128, DeepSeek MLA prefill), H100.

    python3 benchmarks/probes/mixed_dims_probe.py --dims 192x128,128x64 --seqlens 2048,8192

Times ``flash_attn_func`` on the Hopper forward and on the portable kernels, and SDPA's cuDNN
backend where it takes the shape, same process, medians of ``do_bench``. bf16, 16k tokens per
call, h * d_v = 2048. FLOPs: 2 * b * h * s_q * s_k * (d + d_v), halved when causal.
"""
from __future__ import annotations

import argparse
import json
import os
import sys

import torch
import torch.nn.functional as F
from triton.testing import do_bench

sys.path.append(os.path.join(os.path.dirname(__file__), "..", "..", "src"))


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--dims", default="192x128")
    ap.add_argument("--seqlens", default="2048,8192")
    ap.add_argument("--causal", default="0,1")
    args = ap.parse_args()
    import flashattn

    rows = []
    for dims in args.dims.split(","):
        d, d_v = (int(x) for x in dims.split("x"))
        for s in (int(x) for x in args.seqlens.split(",")):
            for causal in (bool(int(c)) for c in args.causal.split(",")):
                b, h = max(1, 16384 // s), max(1, 2048 // d_v)
                q, k = (torch.randn(b, s, h, d, device="cuda", dtype=torch.bfloat16) for _ in "qk")
                v = torch.randn(b, s, h, d_v, device="cuda", dtype=torch.bfloat16)
                flops = 2.0 * b * h * s * s * (d + d_v) / (2 if causal else 1)
                row = {"d": d, "d_v": d_v, "s": s, "causal": causal}
                outs = {}
                for name in ("hopper", "portable"):
                    fn = lambda: flashattn.flash_attn_func(q, k, v, causal=causal)  # noqa: E731
                    with flashattn.use_backend(name):
                        outs[name] = fn().float()
                        row[name] = round(flops / do_bench(fn, warmup=10, rep=40) / 1e9, 1)
                row["max_diff"] = (outs["hopper"] - outs["portable"]).abs().max().item()
                try:
                    from torch.nn.attention import SDPBackend, sdpa_kernel
                    qt, kt, vt = (x.transpose(1, 2).contiguous() for x in (q, k, v))

                    def cudnn():
                        with sdpa_kernel([SDPBackend.CUDNN_ATTENTION]):
                            return F.scaled_dot_product_attention(qt, kt, vt, is_causal=causal)
                    cudnn()
                    row["cudnn"] = round(flops / do_bench(cudnn, warmup=10, rep=40) / 1e9, 1)
                except RuntimeError as exc:  # cuDNN declines some (d, d_v) pairs
                    row["cudnn"] = f"n/a: {str(exc).splitlines()[0][:80]}"
                print(json.dumps(row), flush=True)
                rows.append(row)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
