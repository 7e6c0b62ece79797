"""One FP8 kernel call, repeated, for Nsight Compute to capture (which pipe bounds
the FP8 forward at d = 128, and the quantize pass).

    ncu --profile-from-start off --set full python3 benchmarks/probes/fp8_profile.py --impl ours

``--impl``: ours (the Gluon FP8 forward alone, V^T prepared outside the profiled call) |
cudnn (cuDNN's FP8 SDPA via nvidia-cudnn-frontend; probes/cudnn_fp8_anchor.py) | quantize
(flashattn.fp8.quantize of bf16 q, k, v). 16k tokens, hidden 2048 (h = 2048 / d), b = 1. Only
the last of ``--calls`` calls runs between cudaProfilerStart / Stop.
"""
from __future__ import annotations

import argparse
import os
import sys

import torch

HERE = os.path.dirname(__file__)
sys.path.append(os.path.join(HERE, "..", "..", "src"))
sys.path.insert(0, HERE)


from fa4_profile import profile_last  # noqa: E402


def make_call(impl: str, d: int, s: int, causal: bool):
    b, h = 1, 2048 // d
    torch.manual_seed(0)
    x = [torch.randn(b, s, h, d, device="cuda", dtype=torch.bfloat16) for _ in range(3)]
    if impl == "quantize":
        from flashattn import fp8

        return lambda: fp8.quantize(*x, incoherent=True, seed=0)
    x8 = [t.to(torch.float8_e4m3fn) for t in x]
    if impl == "cudnn":
        from cudnn_fp8_anchor import cudnn_fp8

        run, _ = cudnn_fp8(*x8, causal)
        return run
    from flashattn.params import Fp8Scales
    from flashattn.backends.sm90.fwd import flash_fwd_hopper_fp8
    from flashattn.backends.sm90.v_layout import wgmma_ordered_vt

    one = torch.ones(b, h, 1, device="cuda", dtype=torch.float32)
    scales = Fp8Scales(one, one, one, 31, 31)
    vt = wgmma_ordered_vt(x8[2])
    return lambda: flash_fwd_hopper_fp8(
        x8[0], x8[1], vt, scales, softmax_scale=d ** -0.5, window_left=-1,
        window_right=0 if causal else -1, softcap=0.0, out_dtype=torch.bfloat16,
        v_in_wgmma_order=True)


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--impl", default="ours", choices=["ours", "cudnn", "quantize"])
    ap.add_argument("--d", type=int, default=128)
    ap.add_argument("--s", type=int, default=16384)
    ap.add_argument("--causal", action="store_true")
    ap.add_argument("--calls", type=int, default=3)
    args = ap.parse_args()
    call = make_call(args.impl, args.d, args.s, args.causal)
    profile_last(call, args.calls)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
