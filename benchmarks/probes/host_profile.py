"""cProfile of the host (Python) side of tiny attention calls: where the microseconds go.

    python benchmarks/probes/host_profile.py [--what fwd|fwdbwd|dispatch] [--calls 300] [--top 30]
A tiny shape (default b=1, s=128, h=8, d=64, bf16, causal) keeps GPU time far below host
time; after a warm-up (compile, autotune), ``--calls`` calls run under cProfile and the
functions with the most own time (and cumulative time) print.
"""
from __future__ import annotations

import argparse
import cProfile
import io
import os
import pstats
import sys

import torch

sys.path.append(os.path.join(os.path.dirname(__file__), "..", "..", "src"))
import flashattn  # noqa: E402
from flashattn.dispatch import dense as dispatch_dense  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--what", default="fwd", choices=["fwd", "fwdbwd", "dispatch"])
    ap.add_argument("--shape", default="1,128,8,64")
    ap.add_argument("--calls", type=int, default=300)
    ap.add_argument("--top", type=int, default=30)
    args = ap.parse_args()
    b, s, h, d = (int(x) for x in args.shape.split(","))
    q, k, v = (torch.randn(b, s, h, d, device="cuda", dtype=torch.bfloat16,
                           requires_grad=args.what == "fwdbwd") for _ in range(3))
    params = dict(softmax_scale=d ** -0.5, causal=True, window_left=-1, window_right=0,
                  softcap=0.0, alibi_slopes=None, dropout_p=0.0, philox_seed=0,
                  return_softmax=False)

    def call():
        if args.what == "dispatch":
            dispatch_dense.forward(q, k, v, **params)
        elif args.what == "fwd":
            flashattn.flash_attn_func(q, k, v, causal=True)
        else:
            flashattn.flash_attn_func(q, k, v, causal=True).sum().backward()

    for _ in range(10):
        call()
    torch.cuda.synchronize()
    prof = cProfile.Profile()
    prof.enable()
    for _ in range(args.calls):
        call()
    torch.cuda.synchronize()
    prof.disable()
    for key in ("tottime", "cumtime"):
        buf = io.StringIO()
        pstats.Stats(prof, stream=buf).sort_stats(key).print_stats(args.top)
        print(f"==== {args.what}: sorted by {key} ({args.calls} calls)")
        print("\n".join(line[:160] for line in buf.getvalue().splitlines()[4:]))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
