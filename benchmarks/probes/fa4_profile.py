"""One bf16 attention call of ours, FlashAttention-4's or cuDNN's, for Nsight Compute to
capture side by side (where the cycles go in each, on the same shape).

    ncu --profile-from-start off --clock-control none --set full \\
        python3 benchmarks/probes/fa4_profile.py --impl fa4 --mode bwd --d 64 --s 8192

The shape is the bench grid's (``flashattn.bench``: 16k tokens per call, hidden 2048, b =
16384 // s, h = 2048 // d) and the call is the bench's own (``bench.build_attention``), so a
profile matches a ``bench`` row. ``--mode fwd`` profiles the forward; ``--mode bwd`` runs the
forward outside the profiled range and profiles the whole backward (every kernel it launches:
ours and FA4's run a row-statistics pass, the main kernel and a dQ conversion). Only the last
of ``--calls`` calls runs between cudaProfilerStart / Stop; the ones before compile and warm.
``--time`` instead prints the do_bench median (ms) of the call, for a check without ncu.
"""
from __future__ import annotations

import argparse
import os
import sys

import torch

sys.path.append(os.path.join(os.path.dirname(__file__), "..", "..", "src"))


def make_call(impl: str, mode: str, d: int, s: int, causal: bool):
    """A zero-argument function running one forward (mode fwd) or one backward (mode bwd)."""
    from flashattn import bench

    b, h = bench.grid_shape(s, d)
    torch.manual_seed(0)
    grad = mode == "bwd"
    q, k, v = (torch.randn(b, s, h, d, device="cuda", dtype=torch.bfloat16,
                           requires_grad=grad) for _ in range(3))
    name = {"ours": "flashattn", "fa4": bench.FA4, "cudnn": "sdpa-cudnn"}[impl]
    inputs, fn = bench.build_attention(name, q, k, v, causal)
    if mode == "fwd":
        def forward():
            with bench.impl_context(name):  # (single-use context managers)
                return fn(*inputs)
        return forward
    with bench.impl_context(name):
        out = fn(*inputs)
    dout = torch.randn_like(out)

    def backward():  # the forward's graph is kept for the next call
        torch.autograd.grad(out, inputs, dout, retain_graph=True)

    return backward


def profile_last(call, calls: int) -> None:
    """Run ``call`` ``calls`` times; only the last runs between cudaProfilerStart / Stop (the
    range ``ncu --profile-from-start off`` captures): the ones before compile and warm."""
    for i in range(calls):
        if i == calls - 1:
            torch.cuda.synchronize()
            torch.cuda.profiler.start()
        call()
    torch.cuda.synchronize()
    torch.cuda.profiler.stop()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--impl", default="ours", choices=["ours", "fa4", "cudnn"])
    ap.add_argument("--mode", default="fwd", choices=["fwd", "bwd"])
    ap.add_argument("--d", type=int, default=128)
    ap.add_argument("--s", type=int, default=8192)
    ap.add_argument("--causal", action="store_true")
    ap.add_argument("--calls", type=int, default=3)
    ap.add_argument("--time", action="store_true", help="print the do_bench median instead")
    args = ap.parse_args()
    call = make_call(args.impl, args.mode, args.d, args.s, args.causal)
    if args.time:
        from triton.testing import do_bench

        ms = do_bench(call, warmup=25, rep=100, return_mode="median")
        print(f"{args.impl} {args.mode} d={args.d} s={args.s} causal={args.causal}: {ms:.4f} ms")
        return 0
    profile_last(call, args.calls)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
