"""FP8 forward tuning on the GPU: the Gluon FP8 kernel under config overrides beside our bf16
forward and cuDNN's (bf16) in the same process, 16k tokens per call, hidden 2048, and the
fused quantize pass alone. TFLOP/s from do_bench medians.

    python benchmarks/probes/fp8_tune.py --d 128 --seqlens 16384 --json $OUT/fp8_tune.json \
        --variants '[{}, {"pingpong": 2}, {"num_stages": 2}]'
"""
from __future__ import annotations

import argparse
import json
import os
import sys

import torch
from triton.testing import do_bench

sys.path.append(os.path.join(os.path.dirname(__file__), "..", "..", "src"))
import flashattn  # noqa: E402
from flashattn import fp8  # noqa: E402
from flashattn.params import Fp8Scales  # noqa: E402
from flashattn.backends.sm90.fwd import flash_fwd_hopper_fp8  # noqa: E402


def tflops(ms, b, s, h, d, causal):
    return 4 * b * s * s * h * d / (2 if causal else 1) / (ms * 1e-3) / 1e12


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--d", default="64,128,256")
    ap.add_argument("--seqlens", default="16384")
    ap.add_argument("--causal", default="0,1")
    ap.add_argument("--variants", default="[{}]")
    ap.add_argument("--anchors", type=int, default=1)
    ap.add_argument("--json", default="")
    ap.add_argument("--rep", type=int, default=100)
    args = ap.parse_args()
    variants = json.loads(args.variants)
    rows = []
    for d in (int(x) for x in args.d.split(",")):
        for s in (int(x) for x in args.seqlens.split(",")):
            b, h = max(1, 16384 // s), 2048 // d
            q, k, v = (torch.randn(b, s, h, d, device="cuda", dtype=torch.bfloat16)
                       for _ in range(3))
            r = fp8.quantize(q, k, v, seed=0)
            ms = do_bench(lambda: fp8.quantize(q, k, v, seed=0), rep=args.rep,
                          return_mode="median")
            moved = 3 * q.numel() * 3
            rows.append(dict(kind="quantize", d=d, s=s, ms=ms, tbps=moved / ms / 1e9))
            print(f"d={d} s={s} quantize {ms:.3f} ms {moved / ms / 1e9:.2f} TB/s", flush=True)
            scales = Fp8Scales(r.q_descale, r.k_descale, r.v_descale, 7, 7)
            for causal in (bool(int(c)) for c in args.causal.split(",")):
                right = 0 if causal else -1
                row = dict(kind="fwd", d=d, s=s, b=b, h=h, causal=causal)
                if args.anchors:
                    from torch.nn.attention import SDPBackend, sdpa_kernel
                    ms = do_bench(lambda: flashattn.flash_attn_func(q, k, v, causal=causal),
                                  rep=args.rep, return_mode="median")
                    row["bf16 ours"] = tflops(ms, b, s, h, d, causal)
                    qt, kt, vt = (x.transpose(1, 2).contiguous() for x in (q, k, v))
                    with sdpa_kernel([SDPBackend.CUDNN_ATTENTION]):
                        ms = do_bench(lambda: torch.nn.functional.scaled_dot_product_attention(
                            qt, kt, vt, is_causal=causal), rep=args.rep, return_mode="median")
                    row["bf16 cudnn"] = tflops(ms, b, s, h, d, causal)
                    ms = do_bench(lambda: fp8.flash_attn_fp8_func(q, k, v, causal=causal),
                                  rep=args.rep, return_mode="median")
                    row["fp8 e2e"] = tflops(ms, b, s, h, d, causal)
                    with flashattn.use_backend("portable"):
                        ms = do_bench(lambda: fp8.attention(r, causal=causal), rep=args.rep,
                                      return_mode="median")
                    row["fp8 portable"] = tflops(ms, b, s, h, d, causal)
                for var in variants:
                    try:
                        ms = do_bench(lambda: flash_fwd_hopper_fp8(
                            r.q, r.k, r.v, scales, softmax_scale=d ** -0.5, window_left=-1,
                            window_right=right, softcap=0.0, out_dtype=torch.bfloat16,
                            config_overrides=var or None), rep=args.rep, return_mode="median")
                        row[f"fp8 {json.dumps(var)}"] = tflops(ms, b, s, h, d, causal)
                    except Exception as exc:  # a variant that does not compile / fit
                        row[f"fp8 {json.dumps(var)}"] = f"{type(exc).__name__}: {str(exc)[:120]}"
                rows.append(row)
                print(json.dumps({k: (round(v, 1) if isinstance(v, float) else v)
                                  for k, v in row.items()}), flush=True)
            if args.json:
                with open(args.json, "w") as f:
                    json.dump(dict(rows=rows, gpu=torch.cuda.get_device_name()), f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
