"""Kernel-level A/B of the FP8 Hopper forward: V^T prepared once outside the timing (old tree:
keys contiguous; new tree: keys in wgmma order), and the two V preparations timed alone.

    PYTHONPATH=old/src python benchmarks/probes/fp8_kernel_ab.py --tag old
    python benchmarks/probes/fp8_kernel_ab.py --variants '[{}, {"thread_release": false}]'

``--variants``: FwdConfig overrides timed in turn at every point, ``--repeat`` rounds
interleaved (one tree, one process: a same-run A/B of a kernel switch). A variant's
``"block_scales": true`` (or ``--block-scales`` for all) times descale tables of 128-row /
128-key blocks (``flash_attn_fp8_func``'s) instead of one descale per head (FA3's API).
"""
from __future__ import annotations

import argparse
import inspect
import json

import torch
from triton.testing import do_bench

from flashattn import fp8_format
from flashattn.params import Fp8Scales
from flashattn.backends.sm90.fwd import flash_fwd_hopper_fp8


def _time_bf16(args, variants, d, s, b, h) -> None:
    """The variants on the bf16 forward at one point, rounds interleaved, min per variant."""
    from flashattn.backends.sm90.fwd import flash_fwd_hopper

    x = [torch.randn(b, s, h, d, device="cuda", dtype=torch.bfloat16) for _ in range(3)]
    for causal in (False, True):
        times = {i: [] for i in range(len(variants))}
        for _ in range(args.repeat):
            for i, var in enumerate(variants):
                times[i].append(do_bench(lambda: flash_fwd_hopper(
                    *x, softmax_scale=d ** -0.5, causal=causal, window_left=-1,
                    window_right=0 if causal else -1, softcap=0.0,
                    config_overrides=var or None), warmup=10, rep=60))
        for i, var in enumerate(variants):
            ms = min(times[i])
            tf = 4.0 * b * h * s * s * d * (0.5 if causal else 1.0) / (ms * 1e-3) / 1e12
            print(json.dumps(dict(tag=args.tag, dtype="bf16", variant=var, d=d, s=s, b=b,
                                  causal=causal, kernel_ms=round(ms, 4), tflops=round(tf, 1),
                                  all_ms=[round(t, 4) for t in times[i]])), flush=True)


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--tag", default="")
    ap.add_argument("--variants", default="[{}]")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--d", default="128,256,64")
    ap.add_argument("--s", default="16384", help="key lengths; batch = 16384 // s (16k tokens)")
    ap.add_argument("--dtype", default="fp8", choices=["fp8", "bf16"],
                    help="bf16: the same variants on the bf16 Gluon forward (flash_fwd_hopper)")
    ap.add_argument("--block-scales", action="store_true",
                    help="descale tables of 128-row / 128-key blocks (flash_attn_fp8_func's) "
                         "instead of one descale per head (FA3's API)")
    args = ap.parse_args()
    variants = json.loads(args.variants)
    new = "v_in_wgmma_order" in inspect.signature(flash_fwd_hopper_fp8).parameters
    points = [(int(d), int(s)) for s in args.s.split(",") for d in args.d.split(",")]
    for d, s in points:
        b = max(1, 16384 // s)
        h = 2048 // d
        if args.dtype == "bf16":
            _time_bf16(args, variants, d, s, b, h)
            continue
        x8 = [torch.randn(b, s, h, d, device="cuda", dtype=torch.bfloat16).to(torch.float8_e4m3fn)
              for _ in range(3)]
        one = torch.ones(b, h, 1, device="cuda", dtype=torch.float32)
        per_head = Fp8Scales(one, one, one, 31, 31)
        # flash_attn_fp8_func's tables: one descale per 128 rows / keys (values 1, so the
        # outputs are those of per_head)
        table = torch.ones(b, h, -(-s // 128), device="cuda", dtype=torch.float32)
        per_block = Fp8Scales(table, table, table, 7, 7)
        if new:
            from flashattn.backends.sm90.v_layout import wgmma_ordered_vt
            vt = wgmma_ordered_vt(x8[2])
            kw = dict(v_in_wgmma_order=True)
            prep = lambda: wgmma_ordered_vt(x8[2])  # noqa: E731
        else:
            vt = fp8_format.keys_contiguous_empty(x8[2].shape, x8[2].device).copy_(x8[2])
            kw = {}
            prep = lambda: fp8_format.keys_contiguous_empty(  # noqa: E731
                x8[2].shape, x8[2].device).copy_(x8[2])
        prep_ms = do_bench(prep, warmup=5, rep=30)
        for causal in (False, True):
            times = {i: [] for i in range(len(variants))}
            for _ in range(args.repeat):  # rounds: the variants interleaved
                for i, var in enumerate(variants):
                    blocks = bool(var.get("block_scales", args.block_scales))
                    scales = per_block if blocks else per_head
                    overrides = {k: x for k, x in var.items() if k != "block_scales"}
                    if overrides:
                        kw["config_overrides"] = overrides
                    else:
                        kw.pop("config_overrides", None)
                    times[i].append(do_bench(lambda: flash_fwd_hopper_fp8(
                        x8[0], x8[1], vt, scales, softmax_scale=d ** -0.5, window_left=-1,
                        window_right=0 if causal else -1, softcap=0.0,
                        out_dtype=torch.bfloat16, **kw), warmup=10, rep=60))
            for i, var in enumerate(variants):
                ms = min(times[i])
                tf = 4.0 * b * h * s * s * d * (0.5 if causal else 1.0) / (ms * 1e-3) / 1e12
                print(json.dumps(dict(tag=args.tag, variant=var, d=d, s=s, b=b, causal=causal,
                                      block_scales=bool(var.get("block_scales",
                                                                args.block_scales)),
                                      kernel_ms=round(ms, 4), tflops=round(tf, 1),
                                      all_ms=[round(t, 4) for t in times[i]],
                                      v_prep_ms=round(prep_ms, 4))), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
