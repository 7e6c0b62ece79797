"""Kernel probe for tuning work on the GPU: correctness spot-check, TFLOP/s of our portable
kernels beside SDPA (flash, cuDNN) in the same run, autotune winners and register/spill counts.

Usage (device machine): python3 benchmarks/probes/probe.py [--d 64,128,256] [--seqlens 2048,16384]
Writes $OUT/probe.json when OUT is set. Not the product benchmark (see flashattn bench).
"""
from __future__ import annotations

import argparse
import json
import os
import sys

import torch
import torch.nn.functional as F
import triton
from torch.nn.attention import SDPBackend, sdpa_kernel

sys.path.append(os.path.join(os.path.dirname(__file__), "..", "..", "src"))
from flashattn.backends.triton import bwd as kbwd  # noqa: E402
from flashattn.backends.triton import fwd as kfwd  # noqa: E402


def _params(causal, d):
    return dict(softmax_scale=d ** -0.5, causal=causal, window_left=-1,
                window_right=0 if causal else -1, softcap=0.0, alibi_slopes=None,
                dropout_p=0.0, philox_seed=0)


def _tflops(b, h, s, d, causal, ms, mode):
    f = 4 * b * s * s * h * d / (2 if causal else 1) * (2.5 if mode == "bwd" else 1.0)
    return f / ms * 1e-9


def _compiled_report(jit_fn):
    rows = []
    for cache in jit_fn.device_caches.values():
        for kern in cache[0].values():
            rows.append({"name": kern.name, "regs": getattr(kern, "n_regs", None), "spills": getattr(kern, "n_spills", None),
                         "shared": kern.metadata.shared, "warps": kern.metadata.num_warps})
    return rows


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--d", default="64,128,256")
    ap.add_argument("--seqlens", default="2048,16384")
    ap.add_argument("--causal", default="0,1")
    args = ap.parse_args()
    rows = []
    for d in [int(x) for x in args.d.split(",")]:
        for causal in [bool(int(x)) for x in args.causal.split(",")]:
            for s in [int(x) for x in args.seqlens.split(",")]:
                b, h = 16384 // s, 2048 // d
                q, k, v = (torch.randn(b, s, h, d, device="cuda", dtype=torch.bfloat16) for _ in range(3))
                do = torch.randn_like(q)
                p = _params(causal, d)
                out, lse, _ = kfwd.flash_fwd(q, k, v, return_softmax=False, **p)
                qt, kt, vt = (x.transpose(1, 2) for x in (q, k, v))
                with sdpa_kernel(SDPBackend.MATH):
                    ref = F.scaled_dot_product_attention(qt[:1, :2].float(), kt[:1, :2].float(), vt[:1, :2].float(),
                                                         is_causal=causal).transpose(1, 2)
                err = (out[:1, :, :2].float() - ref).abs().max().item()
                del ref
                row = {"d": d, "causal": causal, "s": s, "b": b, "h": h, "fwd_err": err}
                ms = triton.testing.do_bench(lambda: kfwd.flash_fwd(q, k, v, return_softmax=False, **p),
                                             return_mode="median")
                row["fwd"] = _tflops(b, h, s, d, causal, ms, "fwd")
                for det in (False, True):
                    ms = triton.testing.do_bench(
                        lambda: kbwd.flash_bwd(do, q, k, v, out, lse, deterministic=det, **p),
                        return_mode="median")
                    row["bwd_det" if det else "bwd"] = _tflops(b, h, s, d, causal, ms, "bwd")
                for name, backend in (("flash", SDPBackend.FLASH_ATTENTION), ("cudnn", SDPBackend.CUDNN_ATTENTION)):
                    try:
                        qg, kg, vg = (x.detach().clone().requires_grad_() for x in (qt, kt, vt))
                        with sdpa_kernel(backend):
                            f = lambda: F.scaled_dot_product_attention(qg, kg, vg, is_causal=causal)  # noqa: E731
                            ms = triton.testing.do_bench(f, return_mode="median")
                            row[name] = _tflops(b, h, s, d, causal, ms, "fwd")
                            o = f()
                            gdo = do.transpose(1, 2)
                            ms = triton.testing.do_bench(
                                lambda: torch.autograd.grad(o, (qg, kg, vg), gdo, retain_graph=True),
                                return_mode="median")
                            row[name + "_bwd"] = _tflops(b, h, s, d, causal, ms, "bwd")
                    except Exception as e:  # an anchor that cannot run is recorded, not fatal
                        row[name] = f"error: {type(e).__name__}"
                row["cfg_fwd"] = str(kfwd._fwd_autotuned.best_config)
                row["cfg_dkdv"] = str(kbwd._dkdv_autotuned.best_config)
                row["cfg_dq"] = str(kbwd._dq_autotuned.best_config)
                rows.append(row)
                print(json.dumps(row), flush=True)
                if os.environ.get("OUT"):
                    with open(os.path.join(os.environ["OUT"], "probe_rows.jsonl"), "a") as fh:
                        fh.write(json.dumps(row) + "\n")
                del q, k, v, do, out, lse, qt, kt, vt
                qg = kg = vg = o = f = None
                torch.cuda.empty_cache()
    report = {"rows": rows, "compiled": {
        "fwd": _compiled_report(kfwd._fwd_kernel), "dkdv": _compiled_report(kbwd._bwd_dkdv_kernel),
        "dq": _compiled_report(kbwd._bwd_dq_kernel)}}
    if os.environ.get("OUT"):
        with open(os.path.join(os.environ["OUT"], "probe.json"), "w") as f:
            json.dump(report, f, indent=1)
    print("\n d  c      s |   fwd  flash  cudnn |   bwd  bwdDet flashB cudnnB | err")
    for r in rows:
        def g(key):
            val = r.get(key)
            return f"{val:6.0f}" if isinstance(val, float) else "   n/a"
        print(f"{r['d']:3d} {int(r['causal'])} {r['s']:6d} |{g('fwd')} {g('flash')} {g('cudnn')} |"
              f"{g('bwd')} {g('bwd_det')} {g('flash_bwd')} {g('cudnn_bwd')} | {r['fwd_err']:.2e}")
    print("spills:", [(k, c["regs"], c["spills"]) for k, v in report["compiled"].items() for c in v])


if __name__ == "__main__":
    main()
