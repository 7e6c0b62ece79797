"""Launch-parameter sweep of the fused FP8 quantize pass (>= 2.5 TB/s): the one launch
over Q, K (rotated, row-major e4m3 out) and V (not rotated, written in the Hopper kernel's key
order), per head dim: warps x programs per SM x stages of the Q / K loops x stages of the V
loop. ncu (probes/fp8_profile.py --impl quantize) showed the d = 128 rotated tile at 186
registers a thread (8 warps): one CTA fits per SM.

    PYTHONPATH=src python benchmarks/probes/quantize_sweep.py --json out.json
    PYTHONPATH=src python benchmarks/probes/quantize_sweep.py --dims 128 \
        --tunings '[{"stages": 4}, {"stages": 5}]' --rounds 3

``--tunings``: only these overrides of the shipped launch parameters, each timed against the
shipped ones in ``--rounds`` interleaved rounds (min per config), instead of the grid
(``{"only": "qk"}`` / ``{"only": "v"}`` time a part of the pass: its TB/s counts that part's
bytes). ``--anchors`` adds two rows to those rounds that move the same bytes: torch's own
bf16 -> e4m3 conversion of q, k and v (three elementwise kernels) and a device-to-device
copy of half the bytes (read + written = the pass's).
"""
from __future__ import annotations

import argparse
import itertools
import json

import torch
from triton.testing import do_bench

from flashattn.api.fp8_quantize import random_signs
from flashattn.fp8_format import wgmma_vt_empty
from flashattn.backends.triton.fp8_quantize import _launch


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--json", default="")
    ap.add_argument("--dims", default="128,64,256")
    ap.add_argument("--quick", action="store_true", help="per_sm 1 / 2 and V stages only")
    ap.add_argument("--tunings", default="", help="JSON list of launch-parameter overrides")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--anchors", action="store_true",
                    help="with --tunings: torch's e4m3 conversion and a copy, same bytes")
    args = ap.parse_args()
    rows = []
    s, block = 16384, 128
    for d in (int(x) for x in args.dims.split(",")):
        h = 2048 // d
        q, k, v = (torch.randn(1, s, h, d, device="cuda", dtype=torch.bfloat16) for _ in range(3))
        signs = random_signs(d, 0, q.device)
        q8, k8 = (torch.empty(x.shape, dtype=torch.float8_e4m3fn, device="cuda") for x in (q, k))
        v8 = wgmma_vt_empty(v.shape, v.device)
        scales = [torch.empty((1, h, s // block), dtype=torch.float32, device="cuda")
                  for _ in range(3)]
        moved = q.numel() * 3 * 3  # bytes: bf16 read + e4m3 write, three tensors

        def time_ms(tuning):  # (tuning None: the shipped launch parameters)
            if tuning == "torch-e4m3":
                fn = lambda: [x.to(torch.float8_e4m3fn) for x in (q, k, v)]  # noqa: E731
                return do_bench(fn, warmup=5, rep=40)
            if tuning == "copy":
                return do_bench(lambda: dst.copy_(src), warmup=5, rep=40)
            fn = lambda: _launch(q, k, v, q8, k8, v8, *scales, signs, block, block, False,  # noqa: E731
                                 True, tuning)
            fn()
            return do_bench(fn, warmup=5, rep=40)

        if args.tunings:  # shipped vs the given overrides, interleaved rounds
            cands = [None] + json.loads(args.tunings)
            if args.anchors:
                cands += ["torch-e4m3", "copy"]
                src = torch.empty(moved // 4, dtype=torch.bfloat16, device="cuda")
                dst = torch.empty_like(src)
            times = [[] for _ in cands]
            for _ in range(args.rounds):
                for i, tuning in enumerate(cands):
                    try:
                        times[i].append(time_ms(tuning))
                    except Exception as exc:  # does not compile / fit
                        times[i].append(float("nan"))
                        print(json.dumps(dict(d=d, tuning=tuning, error=str(exc)[:160])))
            for tuning, ts in zip(cands, times):
                ms = min(ts)
                part = {"qk": 2 / 3, "v": 1 / 3}.get(
                    tuning.get("only") if isinstance(tuning, dict) else None, 1.0)
                row = dict(d=d, tuning=tuning or "shipped", us=round(ms * 1e3, 1),
                           tb_s=round(part * moved / (ms * 1e-3) / 1e12, 2),
                           all_us=[round(x * 1e3, 1) for x in ts])
                rows.append(row)
                print(json.dumps(row), flush=True)
            continue
        shipped_ms = time_ms(None)
        best = None
        warp_counts = (8,) if args.quick else ((8, 16) if d >= 192 else (4, 8))
        stage_counts = (2, 3) if args.quick else (1, 2, 3)
        for warps, per_sm, stages, stages_v in itertools.product(
                warp_counts, (1, 2), stage_counts, (1, 2, 3)):
            tuning = dict(warps=warps, per_sm=per_sm, stages=stages, stages_v=stages_v)
            try:
                ms = time_ms(tuning)
            except Exception as exc:  # a config that does not compile / fit
                print(json.dumps(dict(d=d, **tuning, error=str(exc)[:120])))
                continue
            row = dict(d=d, **tuning, us=round(ms * 1e3, 1),
                       tb_s=round(moved / (ms * 1e-3) / 1e12, 2))
            rows.append(row)
            print(json.dumps(row), flush=True)
            best = row if best is None or row["us"] < best["us"] else best
        shipped = dict(d=d, us=round(shipped_ms * 1e3, 1),
                       tb_s=round(moved / (shipped_ms * 1e-3) / 1e12, 2))
        print("BEST", json.dumps(best), "SHIPPED", json.dumps(shipped), flush=True)
        rows.append(dict(best=best, shipped=shipped))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(dict(rows=rows, gpu=torch.cuda.get_device_name()), f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
