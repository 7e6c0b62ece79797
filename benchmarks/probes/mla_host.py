"""Host time of an MLA decode step (FlashAttention-3's ``qv``) on the recorded-call fast path
against the full path, on a call small enough that the host, not the GPU, sets the pace.

``flashattn.fa3.flash_attn_with_kvcache(q, k_cache, v_cache, qv=qv, cache_seqlens=...,
page_table=...)`` at DeepSeek's widths (128 query heads over one latent head, d 64, d_v 512,
pages of 64), ``--batch`` sequences of ``--keys`` cached keys, bf16 and FP8 latent caches. Per
path: the wall time per call over ``--calls`` back-to-back eager calls (one synchronize at the
end: when the host is slower than the kernels, this is the host's time per call), and the
GPU time of the same call replayed from a CUDA graph (no host work). The full path is forced
by making the fast path's cache miss on every call (its ``get`` returns None and ``put`` keeps
nothing), so no recording cost is counted.

    PYTHONPATH=src python benchmarks/probes/mla_host.py --out $OUT/mla_host.json
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time
from unittest import mock

import torch

sys.path.append(os.path.join(os.path.dirname(__file__), "..", "..", "src"))

from flashattn import fa3  # noqa: E402
from flashattn.api import fastpath  # noqa: E402

H, H_K, D, D_V, PAGE = 128, 1, 64, 512, 64


def make_call(batch: int, keys: int, fp8: bool):
    """A zero-argument MLA decode step (no append) over a shuffled paged cache."""
    dev = "cuda"
    pages = batch * keys // PAGE
    kc = torch.randn(pages, PAGE, H_K, D, device=dev, dtype=torch.bfloat16)
    vc = torch.randn(pages, PAGE, H_K, D_V, device=dev, dtype=torch.bfloat16)
    kw = dict(cache_seqlens=torch.full((batch,), keys, dtype=torch.int32, device=dev),
              page_table=torch.randperm(pages, device=dev).view(batch, keys // PAGE).int())
    if fp8:
        kc, vc = kc.to(torch.float8_e4m3fn), vc.to(torch.float8_e4m3fn)
        kw.update(k_descale=torch.ones(batch, H_K, device=dev),
                  v_descale=torch.ones(batch, H_K, device=dev))
    q = torch.randn(batch, 1, H, D, device=dev, dtype=torch.bfloat16)
    qv = torch.randn(batch, 1, H, D_V, device=dev, dtype=torch.bfloat16)
    return lambda: fa3.flash_attn_with_kvcache(q, kc, vc, qv=qv, **kw)


def wall_us(call, calls: int) -> float:
    for _ in range(20):
        call()
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(calls):
        call()
    torch.cuda.synchronize()
    return (time.perf_counter() - t0) / calls * 1e6


def graph_us(call, replays: int = 200) -> float:
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        call()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        call()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    graph.replay()
    start.record()
    for _ in range(replays):
        graph.replay()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) / replays * 1e3


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--keys", type=int, default=512)
    ap.add_argument("--calls", type=int, default=2000)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    rows = []
    for fp8 in (False, True):
        call = make_call(args.batch, args.keys, fp8)
        row = dict(batch=args.batch, keys=args.keys, fp8_latent=fp8, gpu_us=graph_us(call),
                   fast_us=[], full_us=[])
        for _ in range(args.rounds):  # (paths alternating)
            fastpath.KVCACHE.clear()
            row["fast_us"].append(wall_us(call, args.calls))
            with mock.patch.object(fastpath.KVCACHE, "get", lambda key: None), \
                    mock.patch.object(fastpath.KVCACHE, "put", lambda key, value: None):
                row["full_us"].append(wall_us(call, args.calls))
        rows.append(row)
        print(f"fp8 latent {int(fp8)}: GPU {row['gpu_us']:.1f} us, fast path "
              f"{min(row['fast_us']):.1f} us / call, full path {min(row['full_us']):.1f} us / call")
    if args.out:
        meta = dict(gpu=torch.cuda.get_device_name(), torch=torch.__version__)
        with open(args.out, "w") as f:
            json.dump(dict(meta=meta, rows=rows), f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
