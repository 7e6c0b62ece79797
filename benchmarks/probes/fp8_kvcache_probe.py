"""FP8 KV cache decode speed: our bf16 cache vs our FP8 (e4m3) cache vs cuDNN's bf16 SDPA.

GQA 32 / 8, d 128, one bf16 query row per sequence, the whole cache read (cache_seqlens =
capacity), at (batch 64, 32k keys) and (batch 1, 128k keys); eager calls and CUDA-graph
replays. Each implementation is timed with ``triton.testing.do_bench`` (median) in
``--rounds`` interleaved rounds (every implementation once per round, so clock and thermal
drift hit them alike); a row keeps every round and reports min / median over the rounds.

Numbers per row: ms, cache bytes read per second (K + V bytes that the call must read:
batch * keys * nheads_k * d * 2 * itemsize, itemsize 1 for FP8, 2 for bf16; the query and
output are noise) and, for our FP8 rows, the ratio FP8 / bf16 of the median times. Targets
(H100): ratio <= 0.55, FP8 >= 2.8 TB/s (half the bytes at the bandwidth the bf16 path
reaches). The FP8 cache is the bf16 cache quantized with one descale per (batch, KV head)
(amax / 448); its output is checked against our bf16 call on the dequantized cache.

cuDNN: ``sdpa_kernel(SDPBackend.CUDNN_ATTENTION)`` with ``enable_gqa=True`` over (b, h, s, d)
layouts; where that backend refuses the call, EFFICIENT then FLASH are tried, and the row's
``backend`` says which one ran.

    python benchmarks/probes/fp8_kvcache_probe.py --out $OUT/fp8_kvcache.json
    python benchmarks/probes/fp8_kvcache_probe.py --out $OUT/x.json --page 16 \\
        --configs "128,4,3;128,8,3;64,4,3;256,8,2" --fp8-query     # (more rows, ~2 min more)

``--configs`` times our FP8 cache (contiguous, and paged with ``--page``) under each decode
launch config ("BLOCK_N,num_warps, num_stages", FLASHATTN_DECODE_CONFIG's format) too, as
CUDA-graph rows only (captured under
the override; an eager row would time the settings switch); ``--page N`` adds paged-cache rows (shuffled pages of
N positions); ``--fp8-query`` adds FA3's FP8 query over the FP8 cache. Runs in under three
minutes on one H100 with the defaults; on a machine without CUDA it prints why and exits 2.
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import statistics
import sys
import time
from typing import Callable, Dict, List, Optional, Sequence, Tuple

import torch

sys.path.append(os.path.join(os.path.dirname(__file__), "..", "..", "src"))

H, H_K, D = 32, 8, 128
SHAPES = ((64, 32768), (1, 131072))
E4M3_MAX = 448.0
TARGET_RATIO = 0.55
TARGET_TBPS = 2.8


def cache_bytes(batch: int, keys: int, nheads_k: int, headdim: int, itemsize: int) -> int:
    """Bytes of K and V one decode step must read: every cached key and value once."""
    return batch * keys * nheads_k * headdim * 2 * itemsize


def summarize(times_ms: Sequence[float]) -> Tuple[float, float]:
    """(min, median) of one implementation's per-round medians."""
    return min(times_ms), statistics.median(times_ms)


def quantize_cache(x: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor]:
    """A (b, s, h_k, d) cache -> (float8_e4m3fn cache, float32 descale (b, h_k)): one scale per
    (sequence, KV head), amax / 448 (1 where the slice is all zeros), values saturated and
    rounded to nearest even (the append's rule)."""
    amax = x.abs().amax(dim=(1, 3)).float()
    descale = torch.where(amax > 0, amax / E4M3_MAX, torch.ones_like(amax))
    x8 = (x.float() / descale[:, None, :, None]).clamp(-E4M3_MAX, E4M3_MAX)
    return x8.to(torch.float8_e4m3fn), descale


def dequantize(x8: torch.Tensor, descale: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    return (x8.float() * descale[:, None, :, None]).to(dtype)


def paged(cache: torch.Tensor, page: int, perm: torch.Tensor) -> torch.Tensor:
    """A contiguous (b, s, h_k, d) cache scattered into pages of ``page`` positions in the
    order ``perm`` (block_table = perm.view(b, s // page))."""
    b, s, h_k, d = cache.shape
    out = torch.empty((b * s // page, page, h_k, d), dtype=cache.dtype, device=cache.device)
    out[perm] = cache.reshape(b * s // page, page, h_k, d)
    return out


def _graphed(fn: Callable[[], object]) -> Callable[[], object]:
    """``fn`` captured once in a CUDA graph (warm-up on a side stream first, so compiles and
    the fast path's records happen outside the capture); returns the replay."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(3):
            fn()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        fn()
    torch.cuda.synchronize()
    return graph.replay


def _spin(seconds: float) -> None:
    """Keep the GPU busy before timing (clocks ramp after the set-up's idle moments)."""
    a = torch.randn(4096, 4096, device="cuda", dtype=torch.bfloat16)
    t0 = time.monotonic()
    while time.monotonic() - t0 < seconds:
        for _ in range(20):
            a @ a
        torch.cuda.synchronize()


def _sdpa(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor
          ) -> Tuple[Optional[Callable[[], torch.Tensor]], str, str]:
    """SDPA over (b, h, s, d) with enable_gqa: (fn, backend that ran, errors of the refused)."""
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel

    errors = []
    for name, backend in (("cudnn", SDPBackend.CUDNN_ATTENTION),
                          ("efficient", SDPBackend.EFFICIENT_ATTENTION),
                          ("flash", SDPBackend.FLASH_ATTENTION)):
        def fn(backend=backend):
            with sdpa_kernel([backend]):
                return F.scaled_dot_product_attention(q, k, v, enable_gqa=True)
        try:
            fn()
            torch.cuda.synchronize()
            return fn, name, "; ".join(errors)
        except Exception as e:  # noqa: BLE001
            errors.append(f"{name}: {type(e).__name__}: {str(e)[:160]}")
    return None, "none", "; ".join(errors)


def _modes(name: str, configs: Dict[str, str]) -> Tuple[str, ...]:
    return ("graph",) if name in configs else ("eager", "graph")


def measure_shape(b: int, s: int, args: argparse.Namespace) -> List[dict]:
    import triton

    import flashattn

    dev = "cuda"
    torch.manual_seed(b * 7919 + s)
    q = torch.randn(b, 1, H, D, device=dev, dtype=torch.bfloat16)
    kc = torch.randn(b, s, H_K, D, device=dev, dtype=torch.bfloat16)
    vc = torch.randn(b, s, H_K, D, device=dev, dtype=torch.bfloat16)
    k8, kd = quantize_cache(kc)
    v8, vd = quantize_cache(vc)
    lens = torch.full((b,), s, dtype=torch.int32, device=dev)

    # correctness once: FP8 against our bf16 call on the dequantized cache
    out8 = flashattn.flash_attn_with_kvcache(q, k8, v8, cache_seqlens=lens, k_descale=kd,
                                             v_descale=vd)
    kq, vq = dequantize(k8, kd, torch.bfloat16), dequantize(v8, vd, torch.bfloat16)
    ref = flashattn.flash_attn_with_kvcache(q, kq, vq, cache_seqlens=lens)
    fp8_err = (out8.float() - ref.float()).abs().max().item()
    del kq, vq, ref, out8
    q8, qd = None, None
    if args.fp8_query:
        amax = q.abs().amax(dim=-1).float().view(b, H_K, H // H_K).amax(dim=-1)  # (b, h_k)
        qd = torch.where(amax > 0, amax / E4M3_MAX, torch.ones_like(amax))
        q8 = (q.float() / qd.repeat_interleave(H // H_K, dim=1)[:, None, :, None]).clamp(
            -E4M3_MAX, E4M3_MAX).to(torch.float8_e4m3fn)

    # name -> (fn, itemsize, row metadata); configs: name -> a decode launch config
    impls: Dict[str, Tuple[Callable[[], object], int, dict]] = {}
    configs: Dict[str, str] = {}
    impls["flashattn-bf16"] = (lambda: flashattn.flash_attn_with_kvcache(
        q, kc, vc, cache_seqlens=lens), 2, {})
    impls["flashattn-fp8"] = (lambda: flashattn.flash_attn_with_kvcache(
        q, k8, v8, cache_seqlens=lens, k_descale=kd, v_descale=vd), 1, {})
    if q8 is not None:
        impls["flashattn-fp8-q8"] = (lambda: flashattn.flash_attn_with_kvcache(
            q8, k8, v8, cache_seqlens=lens, q_descale=qd, k_descale=kd, v_descale=vd), 1, {})
    if args.page:
        n = b * s // args.page
        perm = torch.randperm(n, device=dev)
        table = perm.view(b, s // args.page).to(torch.int32)
        kp, vp = paged(kc, args.page, perm), paged(vc, args.page, perm)
        kp8, vp8 = paged(k8, args.page, perm), paged(v8, args.page, perm)
        impls[f"flashattn-bf16-page{args.page}"] = (lambda: flashattn.flash_attn_with_kvcache(
            q, kp, vp, cache_seqlens=lens, block_table=table), 2, {})
        impls[f"flashattn-fp8-page{args.page}"] = (lambda: flashattn.flash_attn_with_kvcache(
            q, kp8, vp8, cache_seqlens=lens, block_table=table, k_descale=kd, v_descale=vd),
            1, {})
    for cfg in [c.strip() for c in args.configs.split(";") if c.strip()]:
        for base in [n for n in ("flashattn-fp8", f"flashattn-fp8-page{args.page}") if n in impls]:
            name = f"{base}[{cfg}]"
            impls[name] = (impls[base][0], 1, dict(config=cfg))
            configs[name] = cfg
    qt = q.transpose(1, 2).contiguous()
    kt, vt = kc.transpose(1, 2).contiguous(), vc.transpose(1, 2).contiguous()
    sdpa_fn, sdpa_backend, sdpa_refused = _sdpa(qt, kt, vt)
    if sdpa_fn is not None:
        impls["sdpa-bf16"] = (sdpa_fn, 2, dict(backend=sdpa_backend, refused=sdpa_refused))

    from flashattn.runtime import env

    runners: Dict[Tuple[str, str], Callable[[], object]] = {}
    errors: Dict[Tuple[str, str], str] = {}
    for name, (fn, _, _) in impls.items():
        for mode in _modes(name, configs):
            try:
                if name in configs:  # (the launch decisions are made, and kept, at capture)
                    with env.override(decode_config=configs[name]):
                        runners[(name, mode)] = _graphed(fn)
                else:
                    runners[(name, mode)] = fn if mode == "eager" else _graphed(fn)
                runners[(name, mode)]()
            except Exception as e:  # noqa: BLE001
                errors[(name, mode)] = f"{type(e).__name__}: {str(e)[:300]}"
                runners.pop((name, mode), None)
    torch.cuda.synchronize()
    _spin(0.5)
    times: Dict[Tuple[str, str], List[float]] = {key: [] for key in runners}
    for _ in range(args.rounds):
        for key, fn in runners.items():
            times[key].append(float(triton.testing.do_bench(
                fn, warmup=args.warmup, rep=args.rep, return_mode="median")))

    rows = []
    meta = dict(b=b, s=s, h=H, h_k=H_K, d=D, torch=torch.__version__,
                triton=triton.__version__, gpu=torch.cuda.get_device_name(),
                date=datetime.date.today().isoformat())
    for name, (_, itemsize, extra) in impls.items():
        for mode in _modes(name, configs):
            key = (name, mode)
            row = dict(impl=name, mode=mode, **meta, **extra)
            if key in errors:
                rows.append(dict(row, error=errors[key]))
                continue
            t_min, t_med = summarize(times[key])
            nbytes = cache_bytes(b, s, H_K, D, itemsize)
            row.update(rounds_ms=times[key], min_ms=t_min, median_ms=t_med,
                       cache_bytes=nbytes, tbps=nbytes / t_med / 1e9)
            # paged FP8 rows against the paged bf16 cache, the rest against the contiguous one
            paged_row = name.startswith(f"flashattn-fp8-page{args.page}")
            bf16 = times.get((f"flashattn-bf16-page{args.page}" if paged_row
                              else "flashattn-bf16", mode))
            if itemsize == 1 and bf16:
                row["ratio_vs_bf16"] = t_med / summarize(bf16)[1]
                row["meets_ratio"] = row["ratio_vs_bf16"] <= TARGET_RATIO
                row["meets_tbps"] = row["tbps"] >= TARGET_TBPS
            if name == "flashattn-fp8":
                row["max_err_vs_bf16_on_dequantized"] = fp8_err
            rows.append(row)
    return rows


def print_rows(rows: List[dict]) -> None:
    print(f"{'b':>3} {'keys':>7} {'impl':<30} {'mode':<6} {'min ms':>8} {'med ms':>8} "
          f"{'TB/s':>6} {'FP8/bf16':>8}  note")
    for r in rows:
        if "error" in r:
            print(f"{r['b']:>3} {r['s']:>7} {r['impl']:<30} {r['mode']:<6} error: {r['error']}")
            continue
        ratio = r.get("ratio_vs_bf16")
        note = []
        if ratio is not None:
            note.append(f"ratio {'ok' if r['meets_ratio'] else 'MISS'} (<= {TARGET_RATIO})")
            note.append(f"TB/s {'ok' if r['meets_tbps'] else 'MISS'} (>= {TARGET_TBPS})")
        if "backend" in r:
            note.append(f"ran {r['backend']}")
        if "max_err_vs_bf16_on_dequantized" in r:
            note.append(f"max err {r['max_err_vs_bf16_on_dequantized']:.2e}")
        print(f"{r['b']:>3} {r['s']:>7} {r['impl']:<30} {r['mode']:<6} {r['min_ms']:>8.4f} "
              f"{r['median_ms']:>8.4f} {r['tbps']:>6.2f} "
              f"{'' if ratio is None else f'{ratio:.3f}':>8}  {', '.join(note)}")


def parse_args(argv: Optional[Sequence[str]] = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", default=os.path.join(os.environ.get("OUT", "."),
                                                  "fp8_kvcache.json"),
                    help="JSON file for the rows")
    ap.add_argument("--shapes", default="64x32768,1x131072",
                    help="batch x keys, comma-separated (default: the two target shapes)")
    ap.add_argument("--rounds", type=int, default=3, help="interleaved rounds (default 3)")
    ap.add_argument("--warmup", type=int, default=25, help="do_bench warm-up ms")
    ap.add_argument("--rep", type=int, default=100, help="do_bench measuring ms")
    ap.add_argument("--configs", default="",
                    help="FP8 launch configs 'BLOCK_N,warps,stages;...' timed as extra rows")
    ap.add_argument("--page", type=int, default=0, help="also time paged caches (page size)")
    ap.add_argument("--fp8-query", action="store_true",
                    help="also time FA3's FP8 query over the FP8 cache")
    return ap.parse_args(argv)


def main(argv: Optional[Sequence[str]] = None) -> int:
    args = parse_args(argv)
    if not torch.cuda.is_available():
        print("fp8_kvcache_probe: needs a CUDA GPU (H100 targets); nothing measured")
        return 2
    shapes = [tuple(int(x) for x in p.split("x")) for p in args.shapes.split(",") if p]
    t0 = time.monotonic()
    rows: List[dict] = []
    for b, s in shapes:
        rows += measure_shape(b, s, args)
        torch.cuda.empty_cache()  # (the shape's caches went with measure_shape's frame)
        print(f"({b}, {s}) done at {time.monotonic() - t0:.0f} s", flush=True)
    print_rows(rows)
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    with open(args.out, "w") as f:
        json.dump(rows, f, indent=1)
    print(f"wrote {len(rows)} rows to {args.out} ({time.monotonic() - t0:.0f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
