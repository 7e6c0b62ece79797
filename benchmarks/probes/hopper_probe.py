"""GPU probe for the Hopper (Gluon) forward: correctness spot-check, TFLOP/s beside cuDNN SDPA
and our portable kernel in the same run, and the ablation table (each scheduling technique
switched off in turn).

Usage (device machine): PYTHONPATH=src python3 benchmarks/probes/hopper_probe.py
    [--d 64,128,256] [--seqlens 2048,8192,16384] [--causal 0,1] [--ablate 8192,16384]
    [--mode fwd|bwd]   (bwd: the Hopper backward vs cuDNN's and the portable backward;
                        bwd FLOPs = 2.5 x fwd; writes $OUT/hopper_probe_bwd.json)
Config: 16k tokens per call (batch = 16384 / s), hidden 2048 (heads = 2048 / d), bf16.
Writes $OUT/hopper_probe.json when OUT is set.
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

sys.path.append(os.path.join(os.path.dirname(__file__), "..", "..", "src"))
from flashattn.backends.sm90.fwd import flash_fwd_hopper  # noqa: E402
from flashattn.backends.triton.fwd import flash_fwd  # noqa: E402

ABLATIONS = {
    "full": {},
    "pingpong": dict(pingpong=True),  # default is off (measured slower); this turns it on
    "no_intra_overlap": dict(intra_overlap=False),
    "no_persistent": dict(persistent=False),
    "static_sched": dict(dynamic=False),  # persistent, round-robin (causal only differs)
    "no_ws": dict(warp_specialized=False),  # no producer warp: warpgroup 0 issues the loads
    "stages3_o_in_q": dict(num_stages=3, separate_o=False),  # d=128: deeper K/V ring
}


def _parse_extra(spec, config_cls=None):
    """'name=field:value,...;...' -> {name: {field: value}} with the field types of
    ``config_cls`` (FwdConfig by default; BwdConfig for --bwd-variants)."""
    import dataclasses

    from flashattn.backends.sm90.config import FwdConfig

    types = {f.name: {"int": int, "bool": bool}[str(f.type)]
             for f in dataclasses.fields(config_cls or FwdConfig)}
    out = {}
    for item in [x for x in spec.split(";") if x]:
        name, _, kv = item.partition("=")
        ov = {}
        for pair in [p for p in kv.split(",") if p]:
            key, _, val = pair.partition(":")
            ov[key] = val.lower() in ("1", "true", "yes") if types[key] is bool else types[key](val)
        out[name] = ov
    return out


def _params(d, causal):
    return dict(softmax_scale=d ** -0.5, causal=causal, window_left=-1,
                window_right=0 if causal else -1, softcap=0.0, alibi_slopes=None,
                dropout_p=0.0, philox_seed=0, return_softmax=False)


def _tflops(b, h, s, d, causal, ms):
    return 4 * b * s * s * h * d / (2 if causal else 1) / ms * 1e-9


def _bench(fn, warmup, rep):
    return triton.testing.do_bench(fn, warmup=warmup, rep=rep, return_mode="median")


def _bwd_main(args):
    """--mode bwd: time the backward alone (forward outputs computed once per point)."""
    from flashattn.backends.sm90.bwd import flash_bwd_hopper
    from flashattn.backends.triton.bwd import flash_bwd

    rows = []
    t0 = time.time()
    if args.points:
        points = [(int(a), bool(int(b)), int(c)) for a, b, c in
                  (p.split(":") for p in args.points.split(","))]
    else:
        points = [(d, c, s) for d in [int(x) for x in args.d.split(",")]
                  for c in [bool(int(x)) for x in args.causal.split(",")]
                  for s in [int(x) for x in args.seqlens.split(",")]]
    from flashattn.backends.sm90.config import BwdConfig

    variants = {"full": {}, **_parse_extra(args.bwd_variants, BwdConfig)}
    for d, causal, s in points:
        b, h = max(1, 16384 // s), 2048 // d
        q, k, v = (torch.randn(b, s, h, d, device="cuda", dtype=torch.bfloat16) for _ in range(3))
        p = _params(d, causal)
        out, lse, _ = flash_fwd_hopper(q, k, v, **p)
        dout = torch.randn_like(out)
        bp = {kk: vv for kk, vv in p.items() if kk != "return_softmax"}
        row = {"d": d, "causal": causal, "s": s, "b": b, "h": h}
        dq, dk, dv = flash_bwd_hopper(dout, q, k, v, out, lse, deterministic=False, **bp)
        if args.portable:  # spot check against the portable backward (same out / lse)
            rq, rk, rv = flash_bwd(dout, q, k, v, out, lse, deterministic=False, **bp)
            row["max_diff_portable"] = max((a.float() - r.float()).abs().max().item()
                                           for a, r in ((dq, rq), (dk, rk), (dv, rv)))
            del rq, rk, rv
        row["nan"] = bool(any(torch.isnan(x).any().item() for x in (dq, dk, dv)))
        del dq, dk, dv
        for name, ov in variants.items():
            ms = _bench(lambda: flash_bwd_hopper(dout, q, k, v, out, lse, deterministic=False,
                                                 config_overrides=ov or None, **bp),
                        args.warmup, args.rep)
            row["hopper" if name == "full" else f"hopper_{name}"] = 2.5 * _tflops(b, h, s, d, causal, ms)
        qt, kt, vt = (x.transpose(1, 2).detach().requires_grad_() for x in (q, k, v))
        with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
            o = F.scaled_dot_product_attention(qt, kt, vt, is_causal=causal)
            g = dout.transpose(1, 2)
            ms = _bench(lambda: torch.autograd.grad(o, (qt, kt, vt), g, retain_graph=True),
                        args.warmup, args.rep)
            row["cudnn"] = 2.5 * _tflops(b, h, s, d, causal, ms)
            del o
        if args.portable:
            # --portable-det 1: the portable backward as deterministic=True runs it
            ms = _bench(lambda: flash_bwd(dout, q, k, v, out, lse,
                                          deterministic=bool(args.portable_det), **bp),
                        args.warmup, args.rep)
            row["portable"] = 2.5 * _tflops(b, h, s, d, causal, ms)
        row["ratio_cudnn"] = row["hopper"] / row["cudnn"]
        rows.append(row)
        print(json.dumps({k2: (round(v2, 4) if isinstance(v2, float) else v2)
                          for k2, v2 in row.items()}), flush=True)
        del q, k, v, out, lse, dout, qt, kt, vt
    names = [n for n in variants if n != "full"]
    print(f"\nbwd TFLOP/s\n{'d':>4} {'causal':>6} {'s':>6} {'hopper':>7} {'cudnn':>7} {'ratio':>6}"
          f" {'portable':>8} {'diff':>8}  " + " / ".join(names))
    for r in rows:
        extra = " / ".join(f"{r[f'hopper_{n}']:.0f}" for n in names)
        print(f"{r['d']:>4} {int(r['causal']):>6} {r['s']:>6} {r['hopper']:>7.0f} {r['cudnn']:>7.0f}"
              f" {r['ratio_cudnn']:>6.3f} {r.get('portable', 0):>8.0f} {r.get('max_diff_portable', 0):>8.1e}  {extra}")
    print(f"total {time.time() - t0:.0f} s; {torch.cuda.get_device_name()}, torch {torch.__version__},"
          f" triton {triton.__version__}")
    out_dir = os.environ.get("OUT")
    if out_dir:
        with open(os.path.join(out_dir, "hopper_probe_bwd.json"), "w") as f:
            json.dump({"rows": rows, "device": torch.cuda.get_device_name(),
                       "torch": torch.__version__, "triton": triton.__version__}, f, indent=1)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--mode", default="fwd", choices=["fwd", "bwd"])
    ap.add_argument("--bwd-variants", default="",
                    help="bwd: 'name=field:value,...;...' BwdConfig overrides timed beside the default")
    ap.add_argument("--d", default="128,64,256")
    ap.add_argument("--seqlens", default="2048,8192,16384")
    ap.add_argument("--causal", default="0,1")
    ap.add_argument("--ablate", default="8192,16384", help="seqlens for the ablations")
    ap.add_argument("--ablate-d", default="128", help="head dims for the ablations")
    ap.add_argument("--portable", type=int, default=1)
    ap.add_argument("--portable-det", type=int, default=0,
                    help="bwd: time the portable backward with deterministic=True")
    ap.add_argument("--points", default="", help="d:causal:s,... instead of the d x causal x s grid")
    ap.add_argument("--variants", default="", help="comma list of ABLATIONS names to time at every point")
    ap.add_argument("--extra", default="",
                    help="more fwd variants 'name=field:value,...;...' (FwdConfig overrides), "
                         "added to ABLATIONS so --variants can name them")
    ap.add_argument("--repeat", type=int, default=1, help="interleaved timings per variant (median)")
    ap.add_argument("--warmup", type=int, default=10)
    ap.add_argument("--rep", type=int, default=40)
    args = ap.parse_args()
    os.environ.setdefault("FLASHATTN_AUTOTUNE", "0")
    from flashattn.runtime.env import reload

    reload()  # flashattn reads its variables once: re-read them
    if args.mode == "bwd":
        return _bwd_main(args)
    ABLATIONS.update(_parse_extra(args.extra))
    rows = []
    t0 = time.time()
    ablate = [int(x) for x in args.ablate.split(",") if x]
    if args.points:
        points = [(int(a), bool(int(b)), int(c)) for a, b, c in
                  (p.split(":") for p in args.points.split(","))]
    else:
        points = [(d, c, s) for d in [int(x) for x in args.d.split(",")]
                  for c in [bool(int(x)) for x in args.causal.split(",")]
                  for s in [int(x) for x in args.seqlens.split(",")]]
    for d, causal, s in points:
            if True:
                b, h = max(1, 16384 // s), 2048 // d
                q, k, v = (torch.randn(b, s, h, d, device="cuda", dtype=torch.bfloat16)
                           for _ in range(3))
                p = _params(d, causal)
                row = {"d": d, "causal": causal, "s": s, "b": b, "h": h}
                out, lse, _ = flash_fwd_hopper(q, k, v, **p)
                qt, kt, vt = (x.transpose(1, 2) for x in (q, k, v))
                with sdpa_kernel(SDPBackend.MATH):
                    ref = F.scaled_dot_product_attention(
                        qt[:1, :2].float(), kt[:1, :2].float(), vt[:1, :2].float(),
                        is_causal=causal).transpose(1, 2)
                row["max_err"] = (out[:1, :, :2].float() - ref).abs().max().item()
                row["nan"] = bool(torch.isnan(out).any().item())
                del ref
                abl_d = [int(x) for x in args.ablate_d.split(",") if x]
                variants = ABLATIONS if (d in abl_d and s in ablate) else {"full": {}}
                if args.variants:
                    variants = {n: ABLATIONS[n] for n in ["full"] + args.variants.split(",")}
                if not causal:
                    variants = {n: o for n, o in variants.items() if n != "static_sched"}
                if d != 128:
                    variants = {n: o for n, o in variants.items() if n != "stages3_o_in_q"}
                for name, ov in variants.items():  # every variant computes the same thing
                    if ov:
                        o_v, _, _ = flash_fwd_hopper(q, k, v, config_overrides=ov, **p)
                        row[f"diff_{name}"] = (o_v.float() - out.float()).abs().max().item()
                        del o_v
                times = {name: [] for name in variants}
                for _ in range(args.repeat):  # interleaved, so drift hits every variant alike
                    for name, ov in variants.items():
                        times[name].append(_bench(
                            lambda: flash_fwd_hopper(q, k, v, config_overrides=ov or None, **p),
                            args.warmup, args.rep))
                for name, ts in times.items():
                    ms = sorted(ts)[len(ts) // 2]
                    row["hopper" if name == "full" else f"hopper_{name}"] = _tflops(b, h, s, d, causal, ms)
                with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
                    ms = sorted(_bench(lambda: F.scaled_dot_product_attention(qt, kt, vt, is_causal=causal),
                                       args.warmup, args.rep) for _ in range(args.repeat))[args.repeat // 2]
                    row["cudnn"] = _tflops(b, h, s, d, causal, ms)
                if args.portable:
                    ms = _bench(lambda: flash_fwd(q, k, v, **p), args.warmup, args.rep)
                    row["portable"] = _tflops(b, h, s, d, causal, ms)
                row["ratio_cudnn"] = row["hopper"] / row["cudnn"]
                rows.append(row)
                print(json.dumps({k2: (round(v2, 4) if isinstance(v2, float) else v2)
                                  for k2, v2 in row.items()}), flush=True)
                del q, k, v, out, lse
    print(f"\n{'d':>4} {'causal':>6} {'s':>6} {'hopper':>7} {'cudnn':>7} {'ratio':>6} {'portable':>8}"
          f" {'err':>8}  variants (pingpong on / no_intra / no_persistent [/ static_sched] [/ stages3])")
    for r in rows:
        abl = " / ".join(f"{n} {r[f'hopper_{n}']:.0f}" for n in list(ABLATIONS)[1:] if f"hopper_{n}" in r)
        print(f"{r['d']:>4} {int(r['causal']):>6} {r['s']:>6} {r['hopper']:>7.0f} {r['cudnn']:>7.0f}"
              f" {r['ratio_cudnn']:>6.3f} {r.get('portable', 0):>8.0f} {r['max_err']:>8.1e}  {abl}")
    print(f"total {time.time() - t0:.0f} s; {torch.cuda.get_device_name()}, torch {torch.__version__},"
          f" triton {triton.__version__}")
    out_dir = os.environ.get("OUT")
    if out_dir:
        with open(os.path.join(out_dir, "hopper_probe.json"), "w") as f:
            json.dump({"rows": rows, "device": torch.cuda.get_device_name(),
                       "torch": torch.__version__, "triton": triton.__version__}, f, indent=1)


if __name__ == "__main__":
    main()
