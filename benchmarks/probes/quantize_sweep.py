"""Launch-parameter sweep of the fused FP8 quantize pass (issue 18: >= 2.5 TB/s), one tensor at
a time: Q / K (rotated, row-major e4m3 out) and V (not rotated, keys-contiguous out). ncu
(probes/fp8_profile.py --impl quantize) showed the shipped d = 128 launch at 186 registers a
thread: one CTA fits per SM, so its two programs per SM ran as two waves.

    PYTHONPATH=src python benchmarks/probes/quantize_sweep.py --json out.json
"""
from __future__ import annotations

import argparse
import itertools
import json

import torch
from triton.testing import do_bench

from flashattn.api.fp8 import random_signs
from flashattn.fp8_format import keys_contiguous_empty
from flashattn.triton.fp8_quantize import _launch


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--json", default="")
    ap.add_argument("--dims", default="128,64,256")
    args = ap.parse_args()
    rows = []
    s, block = 16384, 128
    for d in (int(x) for x in args.dims.split(",")):
        h = 2048 // d
        x = torch.randn(1, s, h, d, device="cuda", dtype=torch.bfloat16)
        signs = random_signs(d, 0, x.device)
        descale = torch.empty((1, h, s // block), dtype=torch.float32, device=x.device)
        shipped = dict(d=d)
        for kind in ("qk", "v"):
            if kind == "v":
                out = keys_contiguous_empty(x.shape, x.device)
            else:
                out = torch.empty(x.shape, dtype=torch.float8_e4m3fn, device=x.device)
            strides = tuple(out.stride())
            rot = signs if kind == "qk" else None

            def time_ms(tuning):  # (tuning None: the shipped launch parameters)
                fn = lambda: _launch(x, out, strides, descale, block, rot, False, tuning)  # noqa: E731
                fn()
                return do_bench(fn, warmup=5, rep=40)

            best = None
            warp_counts = (4, 8, 16) if d >= 192 else (4, 8)
            for warps, stages, per_sm in itertools.product(warp_counts, (1, 2, 3), (1, 2, 4)):
                tuning = dict(warps=warps, stages=stages, per_sm=per_sm)
                try:
                    ms = time_ms(tuning)
                except Exception as exc:  # a config that does not compile / fit
                    print(json.dumps(dict(d=d, kind=kind, **tuning, error=str(exc)[:120])))
                    continue
                tbs = x.numel() * 3 / (ms * 1e-3) / 1e12  # bf16 read + e4m3 write
                row = dict(d=d, kind=kind, **tuning, us=round(ms * 1e3, 1), tb_s=round(tbs, 2))
                rows.append(row)
                print(json.dumps(row), flush=True)
                best = row if best is None or row["us"] < best["us"] else best
            print("BEST", json.dumps(best), flush=True)
            shipped[kind + "_us"] = round(time_ms(None) * 1e3, 1)
        print("SHIPPED", json.dumps(shipped), flush=True)
        rows.append(dict(shipped=shipped))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(dict(rows=rows, gpu=torch.cuda.get_device_name()), f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
