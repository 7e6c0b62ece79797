"""V wider than 256 (up to 512) in the dense forward: the portable kernel's one pass against
the same call by V's column slices on the Hopper kernels (``api/wide_v.by_slices``, which
calls that record a gradient take), with the d_v = 256 forward of the same shape beside them.

Per shape (b, s, h, h_k, d, d_v, causal), bf16, interleaved over ``--rounds`` rounds
(``triton.testing.do_bench`` medians, ms): ``one_pass`` (no grad: the portable kernel),
``slices`` (no grad: one Hopper forward per slice), ``narrow`` (d_v = 256, one Hopper
forward), and with ``--backward`` the slices' forward + backward. TFLOP/s count the visible
(query, key) pairs: ``2 b h pairs (d + d_v)`` forward (the slices' recomputed Q K^T not
counted: it is their overhead), ``2.5x`` that for the backward.

    PYTHONPATH=src python benchmarks/probes/wide_v_probe.py --out $OUT/wide_v.json
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time

import torch

sys.path.append(os.path.join(os.path.dirname(__file__), "..", "..", "src"))

import flashattn  # noqa: E402
from flashattn.api import wide_v  # noqa: E402

SHAPES = "2,4096,16,16,64,512,1;2,4096,16,16,128,512,1;2,4096,16,16,128,512,0;1,16384,16,16,64,512,1"


def pairs(s: int, causal: bool) -> int:
    return s * (s + 1) // 2 if causal else s * s


def main() -> None:
    from triton.testing import do_bench

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shapes", default=SHAPES, help="b,s,h,h_k,d,d_v,causal;...")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--backward", type=int, default=1)
    ap.add_argument("--out", default="wide_v.json")
    args = ap.parse_args()
    rows = []
    for spec in args.shapes.split(";"):
        b, s, h, hk, d, dv, causal = (int(x) for x in spec.split(","))
        causal = bool(causal)
        dev, dt = "cuda", torch.bfloat16
        q = torch.randn(b, s, h, d, device=dev, dtype=dt)
        k = torch.randn(b, s, hk, d, device=dev, dtype=dt)
        v = torch.randn(b, s, hk, dv, device=dev, dtype=dt)
        v_narrow = v[..., :256].contiguous()
        run = lambda vv: flashattn.flash_attn_func(q, k, vv, causal=causal)  # noqa: E731
        with torch.no_grad():
            one = run(v)
            sliced = wide_v.by_slices(run, v)
        err = (one.float() - sliced.float()).abs().max().item()
        calls = {
            "one_pass": lambda: run(v),
            "slices": lambda: wide_v.by_slices(run, v),
            "narrow": lambda: run(v_narrow),
        }
        if args.backward:
            qg, kg, vg = (x.detach().requires_grad_() for x in (q, k, v))
            dout = torch.randn(b, s, h, dv, device=dev, dtype=dt)

            def fwd_bwd():
                out = flashattn.flash_attn_func(qg, kg, vg, causal=causal)
                torch.autograd.grad(out, (qg, kg, vg), dout)
            calls["slices_fwd_bwd"] = fwd_bwd
        times = {name: [] for name in calls}
        for _ in range(args.rounds):
            for name, fn in calls.items():
                if name == "slices_fwd_bwd":
                    times[name].append(do_bench(fn, rep=200))
                else:
                    with torch.no_grad():
                        times[name].append(do_bench(fn, rep=200))
        n = pairs(s, causal)
        flops = {"one_pass": 2 * b * h * n * (d + dv), "slices": 2 * b * h * n * (d + dv),
                 "narrow": 2 * b * h * n * (d + 256),
                 "slices_fwd_bwd": 3.5 * 2 * b * h * n * (d + dv)}
        row = dict(b=b, s=s, h=h, h_k=hk, d=d, d_v=dv, causal=causal,
                   max_abs_diff_one_pass_vs_slices=err)
        for name, ts in times.items():
            ms = min(ts)
            row[name + "_ms"] = ms
            row[name + "_rounds_ms"] = ts
            row[name + "_tflops"] = flops[name] / ms / 1e9
        row["slices_over_one_pass"] = row["one_pass_ms"] / row["slices_ms"]
        print(json.dumps(row), flush=True)
        rows.append(row)
    with open(args.out, "w") as f:
        json.dump(dict(gpu=torch.cuda.get_device_name(), date=time.strftime("%Y-%m-%d"),
                       torch=torch.__version__, rows=rows), f, indent=1)


if __name__ == "__main__":
    main()
