"""Decode probe: flash_attn_with_kvcache vs SDPA (cuDNN, flash) at the issue's decode grid.

bf16, d=128, 32 query heads / 8 KV heads, one new query token, through
``flash_attn_with_kvcache`` (contiguous and paged caches) and ``flash_attn_func`` (q with seqlen
1 over the full k / v: what transformers calls without padding, row ``flashattn-dense``); bandwidth = bytes of K and V
read / time (``triton.testing.do_bench`` median). Rows for the contiguous cache, the paged
cache (page 16, shuffled page table) and optional launch-config variants
(``--configs "64,4,4;128,8,3"`` -> FLASHATTN_DECODE_CONFIG, ``--waves 1,2,4`` ->
FLASHATTN_DECODE_WAVES). Also checks each variant's output against SDPA once.

    python benchmarks/probes/decode_probe.py --out $OUT/decode.json [--budget 150]
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time

import torch
import torch.nn.functional as F
import triton
from torch.nn.attention import SDPBackend, sdpa_kernel

import flashattn
from flashattn.runtime.env import reload as reload_env

POINTS = ((1, 16384), (1, 131072), (8, 8192), (32, 4096), (64, 32768))
H, H_K, D = 32, 8, 128


GRAPH = False  # --graph: time CUDA-graph replays (what a serving loop runs; no host overhead)


def _graphed(fn):
    """Capture ``fn`` once in a CUDA graph and return its replay (warm-up on a side stream first,
    so lazy initialisation and autotuning happen outside the capture)."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(3):
            fn()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        fn()
    return graph.replay


def _bench(fn) -> float:
    if GRAPH:
        fn = _graphed(fn)
    return float(triton.testing.do_bench(fn, warmup=25, rep=100, return_mode="median"))


def _paged(k_cache: torch.Tensor, v_cache: torch.Tensor, page: int):
    """Scatter contiguous caches (b, s, h_k, d) into shuffled pages of size ``page``."""
    b, s, h_k, d = k_cache.shape
    n = s // page
    perm = torch.randperm(b * n, device=k_cache.device)
    table = perm.view(b, n).to(torch.int32)
    kp = torch.empty(b * n, page, h_k, d, dtype=k_cache.dtype, device=k_cache.device)
    vp = torch.empty_like(kp)
    kp[perm] = k_cache.view(b * n, page, h_k, d)
    vp[perm] = v_cache.view(b * n, page, h_k, d)
    return kp, vp, table


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=os.path.join(os.environ.get("OUT", "."), "decode.json"))
    ap.add_argument("--budget", type=float, default=150.0)
    ap.add_argument("--configs", default="")
    ap.add_argument("--waves", default="")
    ap.add_argument("--points", default="")
    ap.add_argument("--env", default="", help="variants 'NAME=VALUE;...' (one variant each)")
    ap.add_argument("--no-paged", action="store_true")
    ap.add_argument("--graph", action="store_true", help="time CUDA-graph replays (all impls)")
    args = ap.parse_args()
    global GRAPH
    GRAPH = args.graph
    points = POINTS
    if args.points:
        points = tuple(tuple(int(x) for x in p.split("x")) for p in args.points.split(","))
    variants = [("default", {})]
    for c in [c for c in args.configs.split(";") if c.strip()]:
        variants.append((f"cfg={c}", {"FLASHATTN_DECODE_CONFIG": c}))
    for w in [w for w in args.waves.split(",") if w.strip()]:
        variants.append((f"waves={w}", {"FLASHATTN_DECODE_WAVES": w}))
    for e in [e for e in args.env.split(";") if e.strip()]:
        name, _, value = e.partition("=")
        variants.append((e, {name.strip(): value.strip()}))
    t0 = time.monotonic()
    rows = []
    dev = "cuda"
    for b, s in points:
        if time.monotonic() - t0 > args.budget:
            print(f"budget spent; skipping ({b}, {s})")
            continue
        torch.cuda.empty_cache()
        q = torch.randn(b, 1, H, D, device=dev, dtype=torch.bfloat16)
        kc = torch.randn(b, s, H_K, D, device=dev, dtype=torch.bfloat16)
        vc = torch.randn(b, s, H_K, D, device=dev, dtype=torch.bfloat16)
        seqlens = torch.full((b,), s, dtype=torch.int32, device=dev)
        nbytes = 2 * b * s * H_K * D * 2
        qt, kt, vt = q.transpose(1, 2).contiguous(), kc.transpose(1, 2).contiguous(), \
            vc.transpose(1, 2).contiguous()
        ref = None
        for name, backend in (("sdpa-cudnn", SDPBackend.CUDNN_ATTENTION),
                              ("sdpa-flash", SDPBackend.FLASH_ATTENTION)):
            try:
                with sdpa_kernel([backend]):
                    fn = lambda: F.scaled_dot_product_attention(qt, kt, vt, enable_gqa=True)  # noqa: E731
                    o = fn()
                    if ref is None:
                        ref = o.transpose(1, 2).float()
                    ms = _bench(fn)
                rows.append(dict(impl=name, b=b, s=s, ms=ms, tbps=nbytes / ms / 1e9))
            except Exception as e:  # noqa: BLE001
                rows.append(dict(impl=name, b=b, s=s, error=str(e)[:200]))
        del qt, kt, vt
        paged = None if args.no_paged else _paged(kc, vc, 16)
        for vname, env in variants:
            old = {k: os.environ.get(k) for k in env}
            os.environ.update(env)
            reload_env()  # flashattn reads its variables once: re-read them
            try:
                for layout in ("contig", "paged16", "dense"):
                    if layout == "paged16" and paged is None:
                        continue
                    if layout == "dense":  # flash_attn_func(q with seqlen 1, full k / v)
                        fn = lambda: flashattn.flash_attn_func(q, kc, vc, causal=True)  # noqa: E731
                    elif layout == "contig":
                        fn = lambda: flashattn.flash_attn_with_kvcache(q, kc, vc, cache_seqlens=seqlens)  # noqa: E731
                    else:
                        kp, vp, table = paged
                        fn = lambda: flashattn.flash_attn_with_kvcache(  # noqa: E731
                            q, kp, vp, cache_seqlens=seqlens, block_table=table)
                    try:
                        o = fn().float()
                        err = (o - ref).abs().max().item() if ref is not None else None
                        ms = _bench(fn)
                        rows.append(dict(impl=f"flashattn-{layout}", variant=vname, b=b, s=s,
                                         ms=ms, tbps=nbytes / ms / 1e9, max_err_vs_sdpa=err))
                    except Exception as e:  # noqa: BLE001
                        rows.append(dict(impl=f"flashattn-{layout}", variant=vname, b=b, s=s,
                                         error=f"{type(e).__name__}: {str(e)[:300]}"))
            finally:
                for k, v in old.items():
                    if v is None:
                        os.environ.pop(k, None)
                    else:
                        os.environ[k] = v
                reload_env()
        del q, kc, vc, paged
    env = dict(torch=torch.__version__, triton=triton.__version__, cuda_graph=GRAPH,
               gpu=torch.cuda.get_device_name())
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    with open(args.out, "w") as f:
        json.dump({"env": env, "rows": rows}, f, indent=1)
    # short table
    print(f"{'b':>3} {'s':>7} {'impl':<18} {'variant':<18} {'TB/s':>6} {'ms':>8} err")
    for r in rows:
        if "error" in r:
            print(f"{r['b']:>3} {r['s']:>7} {r['impl']:<18} {r.get('variant', ''):<18} ERROR "
                  f"{r['error'][:150]}")
        else:
            e = r.get("max_err_vs_sdpa")
            print(f"{r['b']:>3} {r['s']:>7} {r['impl']:<18} {r.get('variant', ''):<18} "
                  f"{r['tbps']:6.2f} {r['ms']:8.4f} {'' if e is None else f'{e:.1e}'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
