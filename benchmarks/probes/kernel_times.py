"""Per-kernel GPU time of one API call (torch.profiler, CUDA activity), beside cuDNN's.

Answers "where do the microseconds of this call go": the split kernel vs the combine kernel
of a decode step, or the kernels of a forward/backward, without the host time that eager
timings at small shapes mostly measure.

    python benchmarks/probes/kernel_times.py decode:1:16384 decode:1:131072 fwd:128:0:16384

Cases: ``decode:<batch>:<kv len>`` (flash_attn_with_kvcache, GQA 32/8, d=128, one token;
SDPA cuDNN on the same cache), ``fwd:<d>:<causal>:<s>`` / ``bwd:<d>:<causal>:<s>``
(16k tokens per call, hidden 2048), ``fa3fp8:<d>:<causal>:<s>`` (FA3's FP8 API on e4m3 tensors),
``fp8e2e:<d>:<causal>:<s>`` (``flash_attn_fp8_func`` on the
same bf16 inputs, against our bf16 ``flash_attn_func`` instead of cuDNN). Prints mean device
microseconds per call per kernel, and the mean span from a call's first kernel start to its
last kernel end: span minus the kernels' sum is the GPU's idle time inside the call (launch
gaps), which the per-kernel times do not show.
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

sys.path.append(os.path.join(os.path.dirname(__file__), "..", "..", "src"))
import flashattn  # noqa: E402


def kernel_times(fn, calls: int = 20, flush: bool = True):
    """({kernel name: mean device us per call}, mean span us per call) of ``fn`` (after 3
    warm-up calls). The span needs ``flush`` (its kernel marks where each call starts).

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
    spans, first, last = [], None, None
    events = sorted((ev for ev in prof.events()
                     if ev.device_type == torch.autograd.DeviceType.CUDA),
                    key=lambda ev: ev.time_range.start)
    for ev in events:
        if "bitwise_not" in ev.name:  # a call starts after this: close the previous span
            if first is not None:
                spans.append(last - first)
            first = last = None
            continue
        times[ev.name[:90]] += ev.device_time / calls
        first = ev.time_range.start if first is None else first
        last = ev.time_range.end if last is None else max(last, ev.time_range.end)
    if first is not None:
        spans.append(last - first)
    return dict(times), (sum(spans) / len(spans) if spans and flush else float("nan"))


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


def _fp8e2e(d: int, causal: bool, s: int):
    from flashattn import fp8

    b, h = max(1, 16384 // s), 2048 // d
    q, k, v = (torch.randn(b, s, h, d, device="cuda", dtype=torch.bfloat16) for _ in range(3))
    e2e = lambda: fp8.flash_attn_fp8_func(q, k, v, causal=causal)  # noqa: E731
    bf16 = lambda: flashattn.flash_attn_func(q, k, v, causal=causal)  # noqa: E731
    return e2e, bf16, None


def _fa3fp8(d: int, causal: bool, s: int):
    """FlashAttention-3's FP8 API: ``flash_attn_func`` on float8_e4m3fn q, k, v (keys of v not
    contiguous: the layout a caller's own FP8 tensors have) with (batch, nheads_k) descales."""
    b, h = max(1, 16384 // s), 2048 // d
    q8, k8, v8 = (torch.randn(b, s, h, d, device="cuda", dtype=torch.bfloat16)
                  .to(torch.float8_e4m3fn) for _ in range(3))
    ds = torch.full((b, h), 0.5, device="cuda", dtype=torch.float32)
    q, k, v = (torch.randn(b, s, h, d, device="cuda", dtype=torch.bfloat16) for _ in range(3))
    fa3 = lambda: flashattn.flash_attn_func(q8, k8, v8, causal=causal, q_descale=ds,  # noqa
                                            k_descale=ds, v_descale=ds)
    bf16 = lambda: flashattn.flash_attn_func(q, k, v, causal=causal)  # noqa: E731
    return fa3, bf16, None


def wall_us(fn, calls: int = 50) -> float:
    """Mean wall microseconds per call, back to back, one synchronize at the end (host-bound
    where the host is slower than the GPU)."""
    import time

    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(calls):
        fn()
    torch.cuda.synchronize()
    return (time.perf_counter() - t0) / calls * 1e6


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("cases", nargs="+")
    ap.add_argument("--calls", type=int, default=20)
    ap.add_argument("--no-flush", action="store_true", help="keep L2 warm between calls")
    args = ap.parse_args()
    for case in args.cases:
        kind, *rest = case.split(":")
        names = ("ours", "cudnn")
        if kind == "decode":
            ours, cudnn, nbytes = _decode(int(rest[0]), int(rest[1]))
        elif kind == "fp8e2e":
            names = ("fp8-e2e", "bf16")
            ours, cudnn, nbytes = _fp8e2e(int(rest[0]), bool(int(rest[1])), int(rest[2]))
        elif kind == "fa3fp8":
            names = ("fa3-fp8", "bf16")
            ours, cudnn, nbytes = _fa3fp8(int(rest[0]), bool(int(rest[1])), int(rest[2]))
        else:
            ours, cudnn, nbytes = _dense(kind, int(rest[0]), bool(int(rest[1])), int(rest[2]))
        print(f"== {case}")
        for name, fn in zip(names, (ours, cudnn)):
            times, span = kernel_times(fn, args.calls, flush=not args.no_flush)
            total = sum(times.values())
            bw = f", {nbytes / total / 1e6:.2f} TB/s kernel-only" if nbytes else ""
            print(f"  {name}: {total:.1f} us in {len(times)} kernels, span {span:.1f} us, "
                  f"wall {wall_us(fn):.1f} us per call back to back{bw}")
            for k, t in sorted(times.items(), key=lambda kv: -kv[1]):
                print(f"    {t:9.1f} us  {k}")


if __name__ == "__main__":
    main()
