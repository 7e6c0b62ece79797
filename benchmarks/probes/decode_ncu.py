"""One KV-cache decode step of ours, for Nsight Compute: where the cycles of the split-KV decode
kernel go for a bf16 or an FP8 (e4m3) cache, contiguous or paged, on the serving shape of
``fp8_kvcache_probe.py`` (GQA 32 / 8, d 128, one bf16 query row per sequence, the whole cache
read).

    ncu --profile-from-start off --clock-control none --set full -k regex:decode \\
        python3 benchmarks/probes/decode_ncu.py --cache fp8 --page 64

``--cache bf16|fp8``, ``--page 0`` (contiguous) or a page size (pages in a shuffled order, as
the probe's). Only the last of ``--calls`` calls runs between cudaProfilerStart / Stop; the
ones before compile and record. ``--time`` prints the do_bench median (ms) instead;
``--sweep "BLOCK_N,warps,stages[,tma];..." --splits 0,2,3`` times every (launch config, split
count) pair in CUDA graphs, interleaved over ``--rounds`` rounds (config "" is the default
choice, split 0 the heuristic's), one line each with the fastest round.
"""
from __future__ import annotations

import argparse
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.append(os.path.join(os.path.dirname(__file__), "..", "..", "src"))
from fp8_kvcache_probe import D, H, H_K, paged, quantize_cache  # noqa: E402


def make_inputs(cache: str, page: int, batch: int, keys: int):
    """(q, k, v, cache_seqlens, keyword arguments) of one decode step on a fresh cache."""
    torch.manual_seed(0)
    q = torch.randn(batch, 1, H, D, device="cuda", dtype=torch.bfloat16)
    k = torch.randn(batch, keys, H_K, D, device="cuda", dtype=torch.bfloat16)
    v = torch.randn(batch, keys, H_K, D, device="cuda", dtype=torch.bfloat16)
    lens = torch.full((batch,), keys, dtype=torch.int32, device="cuda")
    kw = {}
    if cache == "fp8":
        k, kd = quantize_cache(k)
        v, vd = quantize_cache(v)
        kw.update(k_descale=kd, v_descale=vd)
    if page:
        n = batch * keys // page
        perm = torch.randperm(n, device="cuda")
        kw["block_table"] = perm.view(batch, keys // page).to(torch.int32)
        k, v = paged(k, page, perm), paged(v, page, perm)
    return q, k, v, lens, kw


def make_call(inputs, splits: int = 0):
    """A zero-argument function running one ``flash_attn_with_kvcache`` decode step."""
    import flashattn

    q, k, v, lens, kw = inputs
    return lambda: flashattn.flash_attn_with_kvcache(q, k, v, cache_seqlens=lens,
                                                     num_splits=splits, **kw)


def sweep(args) -> None:
    """Every (config, splits) pair of ``--sweep`` x ``--splits``, CUDA-graph replays timed by
    do_bench in interleaved rounds; prints ms and TB/s of cache bytes (fastest round)."""
    import triton

    from flashattn.runtime import env
    from fp8_kvcache_probe import _graphed, cache_bytes

    itemsize = 1 if args.cache == "fp8" else 2
    nbytes = cache_bytes(args.batch, args.keys, H_K, D, itemsize)
    inputs = make_inputs(args.cache, args.page, args.batch, args.keys)
    cases = {}
    for cfg in args.sweep.split(";"):
        for sp in (int(x) for x in args.splits.split(",")):
            with env.override(decode_config=cfg.strip()):
                cases[(cfg.strip(), sp)] = _graphed(make_call(inputs, sp))
    best = {key: float("inf") for key in cases}
    for _ in range(args.rounds):
        for key, replay in cases.items():
            best[key] = min(best[key], triton.testing.do_bench(replay, warmup=25, rep=100,
                                                               return_mode="median"))
    for (cfg, sp), ms in best.items():
        print(f"decode {args.cache} page {args.page} ({args.batch}, {args.keys}) "
              f"config '{cfg or 'default'}' splits {sp or 'heuristic'}: {ms:.4f} ms, "
              f"{nbytes / ms * 1e-9:.2f} TB/s")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--cache", choices=("bf16", "fp8"), default="fp8")
    ap.add_argument("--page", type=int, default=0, help="page size (0: contiguous)")
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--keys", type=int, default=32768)
    ap.add_argument("--calls", type=int, default=3)
    ap.add_argument("--time", action="store_true", help="print the do_bench median instead")
    ap.add_argument("--sweep", default="", help="launch configs to time (';'-separated)")
    ap.add_argument("--splits", default="0", help="split counts for --sweep (0: heuristic)")
    ap.add_argument("--rounds", type=int, default=2)
    args = ap.parse_args(argv)
    if not torch.cuda.is_available():
        print("decode_ncu: needs a CUDA GPU")
        return 2
    if args.sweep:
        sweep(args)
        return 0
    fn = make_call(make_inputs(args.cache, args.page, args.batch, args.keys))
    if args.time:
        import triton

        ms = triton.testing.do_bench(fn, warmup=25, rep=100, return_mode="median")
        print(f"decode {args.cache} page {args.page} ({args.batch}, {args.keys}): {ms:.4f} ms")
        return 0
    for _ in range(args.calls - 1):
        fn()
    torch.cuda.synchronize()
    torch.cuda.cudart().cudaProfilerStart()
    fn()
    torch.cuda.synchronize()
    torch.cuda.cudart().cudaProfilerStop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
