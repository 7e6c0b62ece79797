"""Per-kernel GPU time of one API call (torch.profiler, CUDA activity), beside cuDNN's.

Answers "where do the microseconds of this call go": the split kernel vs the combine kernel
of a decode step, or the kernels of a forward/backward, without the host time that eager
timings at small shapes mostly measure.

    python benchmarks/probes/kernel_times.py decode:1:16384 decode:1:131072 fwd:128:0:16384

Cases: ``decode:<batch>:<kv len>`` (flash_attn_with_kvcache, GQA 32/8, d=128, one token;
SDPA cuDNN on the same cache), ``fwd:<d>:<causal>:<s>`` / ``bwd:<d>:<causal>:<s>``
(16k tokens per call, hidden 2048). bf16. Prints mean device microseconds per call per kernel.
"""
from __future__ import annotations

import argparse
import os
import sys
from collections import defaultdict

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.profiler import ProfilerActivity, profile

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "src"))
import flashattn  # noqa: E402


def kernel_times(fn, calls: int = 20, flush: bool = True):
    """{kernel name: mean device us per call} of ``fn`` (after 3 warm-up calls).

    flush: overwrite a 256 MiB buffer before each call (as ``do_bench`` does), so a call does
    not find its predecessor's K/V in the 50 MB L2; that kernel (a bitwise_not, so the call's
    own fills, e.g. torch.zeros, stay in the times) is left out.
    """
    cache = torch.empty(256 * 2**20, dtype=torch.int8, device="cuda") if flush else None
    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(calls):
            if cache is not None:
                cache.bitwise_not_()
            fn()
        torch.cuda.synchronize()
    times = defaultdict(float)
    for ev in prof.events():
        if ev.device_type == torch.autograd.DeviceType.CUDA and "bitwise_not" not in ev.name:
            times[ev.name[:90]] += ev.device_time / calls
    return dict(times)


def _decode(batch: int, s_k: int):
    h, h_k, d = 32, 8, 128
    q = torch.randn(batch, 1, h, d, device="cuda", dtype=torch.bfloat16)
    kc = torch.randn(batch, s_k, h_k, d, device="cuda", dtype=torch.bfloat16)
    vc = torch.randn_like(kc)
    lens = torch.full((batch,), s_k, dtype=torch.int32, device="cuda")
    ours = lambda: flashattn.flash_attn_with_kvcache(q, kc, vc, cache_seqlens=lens)  # noqa: E731
    qt, kt, vt = (x.transpose(1, 2).contiguous() for x in (q, kc, vc))

    def cudnn():
        with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
            F.scaled_dot_product_attention(qt, kt, vt, enable_gqa=True)
    return ours, cudnn, 2 * batch * s_k * h_k * d * 2


def _dense(mode: str, d: int, causal: bool, s: int):
    b, h = max(1, 16384 // s), 2048 // d
    q, k, v = (torch.randn(b, s, h, d, device="cuda", dtype=torch.bfloat16,
                           requires_grad=mode == "bwd") for _ in range(3))
    qt, kt, vt = (x.detach().transpose(1, 2).requires_grad_(mode == "bwd") for x in (q, k, v))
    if mode == "fwd":
        ours = lambda: flashattn.flash_attn_func(q, k, v, causal=causal)  # noqa: E731

        def cudnn():
            with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
                F.scaled_dot_product_attention(qt, kt, vt, is_causal=causal)
    else:
        o = flashattn.flash_attn_func(q, k, v, causal=causal)
        g = torch.randn_like(o)
        ours = lambda: torch.autograd.grad(o, (q, k, v), g, retain_graph=True)  # noqa: E731
        with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
            ot = F.scaled_dot_product_attention(qt, kt, vt, is_causal=causal)
        gt = g.transpose(1, 2)
        cudnn = lambda: torch.autograd.grad(ot, (qt, kt, vt), gt, retain_graph=True)  # noqa: E731
    return ours, cudnn, None


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("cases", nargs="+")
    ap.add_argument("--calls", type=int, default=20)
    ap.add_argument("--no-flush", action="store_true", help="keep L2 warm between calls")
    args = ap.parse_args()
    for case in args.cases:
        kind, *rest = case.split(":")
        if kind == "decode":
            ours, cudnn, nbytes = _decode(int(rest[0]), int(rest[1]))
        else:
            ours, cudnn, nbytes = _dense(kind, int(rest[0]), bool(int(rest[1])), int(rest[2]))
        print(f"== {case}")
        for name, fn in (("ours", ours), ("cudnn", cudnn)):
            times = kernel_times(fn, args.calls, flush=not args.no_flush)
            total = sum(times.values())
            bw = f", {nbytes / total / 1e6:.2f} TB/s kernel-only" if nbytes else ""
            print(f"  {name}: {total:.1f} us in {len(times)} kernels{bw}")
            for k, t in sorted(times.items(), key=lambda kv: -kv[1]):
                print(f"    {t:9.1f} us  {k}")


if __name__ == "__main__":
    main()
