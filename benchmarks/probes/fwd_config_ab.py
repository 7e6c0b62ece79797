"""Same-run A/B of one Hopper forward switch: the FwdConfig fields given by ``--override``
(e.g. ``max_group_heads=1``, the tile order walking one (batch, head) pair's query blocks at
a time, or ``head_groups=0``, one longest-first group of every pair; FwdConfig in
src/flashattn/backends/sm90/config.py) against the default config. Both switches named here
change no arithmetic, so the variants should agree bitwise.

Per point (bf16, ``--tokens`` per call: batch = tokens / s; hidden ``--hidden``: h = hidden / d):

- exactness: out and lse of both variants, compared bitwise (``out_bitwise``): for a switch
  that changes only the order of exact operations, of the waits or of the tiles a difference
  would mean the flagged kernel computes something else.
  Both against a float64 reference (flashattn.reference.attention_ref) on a slice (batch 0,
  the first ``--ref-heads`` heads): flash-attn's rule, out within 2x PyTorch's own bf16 error
  plus flashattn.check.atol_for, lse within 1e-3 (flashattn.check's rule).
- speed: flash_fwd_hopper under do_bench, median per round, ``--rounds`` rounds alternating
  which variant goes first (ab_rounds.interleaved_ms); the fastest round per variant. TFLOP/s
  with forward FLOPs 4 b h s^2 d, halved when causal.

One JSON line per point (``ratio`` = variant / default TFLOP/s); ``--out`` writes them all.
The exit status is 1 when a point fails the reference or (``--bitwise``, the default) the
variants differ.

    export PYTHONPATH=$PWD/src
    python benchmarks/probes/fwd_config_ab.py --override max_group_heads=1 --out $OUT/heads1.json
    python benchmarks/probes/fwd_config_ab.py --override head_groups=0 --causal 1 --out $OUT/g0.json
"""
from __future__ import annotations

import argparse
import os
import sys
from typing import Any, Dict

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from ab_rounds import (add_common_arguments, add_override_argument, int_list,  # noqa: E402
                       interleaved_ms, max_abs, parse_overrides, run_points)
from hopper_probe import _params, _tflops  # noqa: E402

from flashattn.backends.sm90.fwd import flash_fwd_hopper  # noqa: E402
from flashattn.check import atol_for  # noqa: E402
from flashattn.reference import attention_ref  # noqa: E402


def _reference(q, k, v, causal: bool, n_heads: int):
    """(float64, bf16) out and the float64 lse of attention_ref on batch 0, heads [0, n)."""
    qs, ks, vs = (x[:1, :, :n_heads] for x in (q, k, v))
    out64, lse64 = attention_ref(qs.double(), ks.double(), vs.double(), causal=causal)
    out_lp, _ = attention_ref(qs, ks, vs, causal=causal, upcast=False)
    return out64, lse64, out_lp


def _ref_errors(out, lse, out64, lse64, n_heads: int) -> Dict[str, float]:
    o = out[:1, :, :n_heads]
    l_ = lse[:1, :n_heads]
    finite = ~torch.isinf(lse64)
    lse_err = float((l_.double() - lse64)[finite].abs().max()) if finite.any() else 0.0
    return {"out": max_abs(o, out64), "lse": lse_err,
            "lse_inf_ok": bool(torch.equal(torch.isinf(l_), ~finite))}


def run_point(d: int, causal: bool, s: int, args) -> Dict[str, Any]:
    b, h = max(1, args.tokens // s), args.hidden // d
    q, k, v = (torch.randn(b, s, h, d, device="cuda", dtype=torch.bfloat16) for _ in range(3))
    p = _params(d, causal)
    variants = {"default": None, "variant": args.overrides}

    def fwd(name: str):
        return flash_fwd_hopper(q, k, v, config_overrides=variants[name], **p)

    row: Dict[str, Any] = {"d": d, "causal": causal, "s": s, "b": b, "h": h,
                           "overrides": args.overrides}
    # ---- exactness
    (out0, lse0, _), (out1, lse1, _) = fwd("default"), fwd("variant")
    row["out_bitwise"] = bool(torch.equal(out0, out1))
    row["lse_bitwise"] = bool(torch.equal(lse0, lse1))
    row["out_diff"] = max_abs(out0, out1)
    row["lse_diff"] = max_abs(lse0[~torch.isinf(lse0)], lse1[~torch.isinf(lse0)])
    row["nan"] = bool(any(torch.isnan(x).any().item() for x in (out0, lse0, out1, lse1)))
    n_ref = min(args.ref_heads, h)
    out64, lse64, out_lp = _reference(q, k, v, causal, n_ref)
    tol = 2 * max_abs(out_lp, out64) + atol_for(torch.bfloat16)
    ok = not row["nan"]
    for name, (out, lse) in (("default", (out0, lse0)), ("variant", (out1, lse1))):
        err = _ref_errors(out, lse, out64, lse64, n_ref)
        row[f"{name}_err"] = err
        ok = ok and err["out"] <= tol and err["lse"] <= 1e-3 and err["lse_inf_ok"]
    row["out_tol"] = tol
    row["ok"] = bool(ok)
    del out0, lse0, out1, lse1, out64, lse64, out_lp
    torch.cuda.empty_cache()
    # ---- speed: interleaved rounds, the fastest round per variant
    ms = interleaved_ms({name: (lambda name=name: fwd(name)) for name in variants},
                        args.rounds, args.warmup, args.rep)
    for name in variants:
        row[f"{name}_ms_rounds"] = [round(x, 4) for x in ms[name]]
        row[f"{name}_tflops"] = _tflops(b, h, s, d, causal, min(ms[name]))
    row["ratio"] = row["variant_tflops"] / row["default_tflops"]
    return row


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--d", default="64,128,256")
    ap.add_argument("--causal", default="0,1")
    ap.add_argument("--seqlens", default="2048,8192,16384")
    add_override_argument(ap, "FwdConfig", "max_group_heads=1")
    ap.add_argument("--no-bitwise", dest="bitwise", action="store_false",
                    help="the switch changes arithmetic: do not require equal bits")
    ap.add_argument("--ref-heads", type=int, default=1,
                    help="heads (batch 0) checked against the float64 reference")
    add_common_arguments(ap)
    args = ap.parse_args(argv)
    args.overrides = parse_overrides(ap, args)
    points = [(d, bool(c), s) for d in int_list(args.d) for c in int_list(args.causal)
              for s in int_list(args.seqlens)]
    rows = run_points(
        points, lambda d, causal, s: run_point(d, causal, s, args),
        f"{'d':>4} {'causal':>6} {'s':>6} {'h':>3} {'default':>8} {'variant':>8} "
        f"{'ratio':>6} {'ok':>3} {'out==':>5} {'lse==':>5}",
        lambda r: (f"{r['d']:>4} {int(r['causal']):>6} {r['s']:>6} {r['h']:>3} "
                   f"{r['default_tflops']:>8.1f} {r['variant_tflops']:>8.1f} "
                   f"{r['ratio']:>6.3f} {int(r['ok']):>3} {int(r['out_bitwise']):>5} "
                   f"{int(r['lse_bitwise']):>5}"),
        args.out)
    same = (lambda r: r["out_bitwise"] and r["lse_bitwise"]) if args.bitwise else (lambda r: True)
    return 0 if all(r["ok"] and same(r) for r in rows) else 1


if __name__ == "__main__":
    raise SystemExit(main())
