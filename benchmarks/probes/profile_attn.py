"""One attention call (forward, or forward + backward), repeated, for a profiler to capture.

    ncu --profile-from-start off --section SpeedOfLight \
        python3 benchmarks/probes/profile_attn.py --impl hopper --mode bwd --d 128 --s 16384

``--impl``: hopper | portable (FLASHATTN_BACKEND) | cudnn (SDPA's cuDNN backend). bf16, 16k
tokens per call, h*d = 2048 (the benchmark grid's shapes). ``--calls`` calls (default 3): the
first ones compile and warm up; only the last runs between cudaProfilerStart / Stop, so
``ncu --profile-from-start off`` sees every kernel of exactly one call (for ``--mode bwd``
that is the backward's kernels: the forward runs before the profiled region).
"""
from __future__ import annotations

import argparse
import os
import sys

import torch
import torch.nn.functional as F

sys.path.append(os.path.join(os.path.dirname(__file__), "..", "..", "src"))


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--impl", default="hopper", choices=["hopper", "portable", "cudnn"])
    ap.add_argument("--mode", default="fwd", choices=["fwd", "bwd"])
    ap.add_argument("--d", type=int, default=128)
    ap.add_argument("--s", type=int, default=16384)
    ap.add_argument("--causal", action="store_true")
    ap.add_argument("--calls", type=int, default=3)
    args = ap.parse_args()
    b, h = max(1, 16384 // args.s), 2048 // args.d
    need_grad = args.mode == "bwd"
    q, k, v = (torch.randn(b, args.s, h, args.d, device="cuda", dtype=torch.bfloat16,
                           requires_grad=need_grad) for _ in range(3))
    if args.impl == "cudnn":
        from torch.nn.attention import SDPBackend, sdpa_kernel

        qt, kt, vt = (x.detach().transpose(1, 2).contiguous().requires_grad_(need_grad)
                      for x in (q, k, v))

        inputs = (qt, kt, vt)

        def forward():
            with sdpa_kernel([SDPBackend.CUDNN_ATTENTION]):
                return F.scaled_dot_product_attention(qt, kt, vt, is_causal=args.causal)
    else:
        os.environ["FLASHATTN_BACKEND"] = args.impl
        os.environ.setdefault("FLASHATTN_AUTOTUNE", "0")
        import flashattn

        inputs = (q, k, v)

        def forward():
            return flashattn.flash_attn_func(q, k, v, causal=args.causal)

    for call in range(args.calls):
        last = call == args.calls - 1
        if last and args.mode == "fwd":
            torch.cuda.synchronize()
            torch.cuda.profiler.start()
        out = forward()
        if need_grad:
            grad = torch.ones_like(out)
            if last:
                torch.cuda.synchronize()
                torch.cuda.profiler.start()
            # autograd.grad, not backward(): no accumulation into .grad (an extra add kernel
            # per input in the profiled call)
            torch.autograd.grad(out, inputs, grad)
        if last:
            torch.cuda.synchronize()
            torch.cuda.profiler.stop()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
