"""Where a varlen call's time goes (H100): eager do_bench, the same call replayed in a
CUDA graph (GPU time alone), host time per call (launches queued without a sync), and a
cProfile of the host path's top functions. FP8 (FA3's API, unit descales) by default;
``--bf16`` the 16-bit call; ``--train`` (bf16) forward + backward through autograd, as a
packed training step runs it (no graph row: the backward is not captured).

    python benchmarks/probes/varlen_fp8_host.py [--mean 1024] [--causal] [--bf16] [--train]
"""
from __future__ import annotations

import argparse
import cProfile
import os
import pstats
import sys
import time

import torch
import triton

sys.path.append(os.path.join(os.path.dirname(__file__), "..", "..", "src"))
sys.path.insert(0, os.path.dirname(__file__))
import flashattn  # noqa: E402
from varlen_probe import D, H, _cu, ragged_lengths  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--mean", type=int, default=1024)
    ap.add_argument("--causal", action="store_true")
    ap.add_argument("--bf16", action="store_true")
    ap.add_argument("--sort", default="tottime", help="pstats order (tottime, cumulative)")
    ap.add_argument("--top", type=int, default=14)
    ap.add_argument("--train", action="store_true", help="bf16 forward + backward (autograd)")
    args = ap.parse_args()
    if args.train:
        args.bf16 = True
    lengths = ragged_lengths(args.mean)
    cu, m, total = _cu(lengths, "cuda"), max(lengths), sum(lengths)
    x = [torch.randn(total, H, D, device="cuda", dtype=torch.bfloat16) for _ in range(3)]
    kw = dict(causal=args.causal)
    if not args.bf16:
        x = [t.to(torch.float8_e4m3fn) for t in x]
        ones = torch.ones(len(lengths), H, device="cuda")
        kw.update(q_descale=ones, k_descale=ones, v_descale=ones)
    fn = lambda: flashattn.flash_attn_varlen_func(*x, cu, cu, m, m, **kw)  # noqa: E731
    if args.train:
        for t in x:
            t.requires_grad_(True)
        dout = torch.randn_like(x[0])
        fwd = fn
        fn = lambda: torch.autograd.backward(fwd(), dout)  # noqa: E731
    fn()
    eager = triton.testing.do_bench(fn, warmup=10, rep=60)
    if args.train:
        x[0].grad = x[1].grad = x[2].grad = None
        fwd_host, host = _host_ms(fwd), _host_ms(fn)
        print(f"train mean {args.mean} causal={int(args.causal)} ({len(lengths)} seqs): eager "
              f"fwd+bwd {eager:.3f} ms, host: fwd (grad recorded) {fwd_host:.3f} ms/call, "
              f"fwd+bwd {host:.3f} ms/step")
        _profile(fn, args)
        return 0
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        fn()
    torch.cuda.current_stream().wait_stream(s)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        fn()
    gpu = triton.testing.do_bench(graph.replay, warmup=10, rep=60)
    host = _host_ms(fn)
    print(f"{'bf16' if args.bf16 else 'fp8'} mean {args.mean} causal={int(args.causal)} "
          f"({len(lengths)} seqs): eager {eager:.3f} ms, graph replay {gpu:.3f} ms, "
          f"host {host:.3f} ms/call")
    _profile(fn, args)
    return 0


def _host_ms(fn, calls: int = 50) -> float:
    """Host time per call, ms: ``calls`` calls enqueued with no synchronise between them."""
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(calls):
        fn()
    host = (time.perf_counter() - t0) / calls * 1e3
    torch.cuda.synchronize()
    return host


def _profile(fn, args) -> None:
    prof = cProfile.Profile()
    prof.enable()
    for _ in range(20):
        fn()
    prof.disable()
    torch.cuda.synchronize()
    pstats.Stats(prof).sort_stats(args.sort).print_stats(args.top)


if __name__ == "__main__":
    raise SystemExit(main())
