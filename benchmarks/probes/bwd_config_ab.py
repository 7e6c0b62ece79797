"""Same-run A/B of one Hopper backward switch: the BwdConfig fields given by ``--override``
(e.g. ``kv_views_per_block=1``, the K / V views of the wgmmas rebuilt every query block;
``tile_split=1``, the longest key tiles of a GQA call cut in two by query heads: dK / dV then
differ by one fp32 add per cut key block) against the default config. docs/fa4_comparison.md.

Per point (bf16, ``--tokens`` per call: batch = tokens / s; hidden ``--hidden``: h = hidden / d;
GQA groups from ``--groups``):

- exactness: dk and dv of both variants compared bitwise (for the switches above: the same
  GEMMs, accumulated in registers in the same order); dq only up to the order of the fp32
  reduce-adds into the workspace, which differs between two runs of the default config too
  (``dq_noise``: default against itself). Both variants against a float64 reference (flashattn.reference.attention_ref)
  on a slice (batch 0, the first ``--ref-kv-heads`` KV heads and their query heads: the full
  probability tensor of an 8k call does not fit): flash-attn's rule, the error within 3x
  PyTorch's own bf16 error (plus flashattn.check.atol_for) for gradients.
- speed: flash_bwd_hopper (row statistics, kernel, dQ conversion) under do_bench, median per
  round, ``--rounds`` rounds alternating which variant goes first; the fastest round of each.
  TFLOP/s with backward FLOPs = 2.5 x forward (4 b h s^2 d, halved when causal).

One JSON line per point (``ratio`` = variant / default TFLOP/s); ``--out`` writes them all.

    export PYTHONPATH=$PWD/src
    python benchmarks/probes/bwd_config_ab.py --override kv_views_per_block=1 --d 128 --out $OUT/kv.json
"""
from __future__ import annotations

import argparse
import os
import sys
from typing import Any, Dict, Tuple

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from ab_rounds import (add_common_arguments, add_override_argument, int_list,  # noqa: E402
                       interleaved_ms, max_abs, parse_overrides, run_points)
from hopper_probe import _params, _tflops  # noqa: E402

from flashattn.backends.sm90.bwd import (flash_bwd_hopper, padded_config,  # noqa: E402
                                          split_blocks)
from flashattn.backends.sm90.fwd import flash_fwd_hopper  # noqa: E402
from flashattn.check import atol_for  # noqa: E402
from flashattn.reference import attention_ref  # noqa: E402

GRADS = ("dq", "dk", "dv")


def _reference_grads(q, k, v, dout, causal: bool, n_kv: int) -> Tuple[Tuple, Tuple]:
    """(float64, bf16) gradients of attention_ref on batch 0, KV heads [0, n_kv) and their
    query heads (heads of a group are contiguous: query head h reads KV head h // group)."""
    group = q.shape[2] // k.shape[2]
    sl = (slice(0, 1), slice(None))
    qs, dos = q[sl + (slice(0, n_kv * group),)], dout[sl + (slice(0, n_kv * group),)]
    ks, vs = k[sl + (slice(0, n_kv),)], v[sl + (slice(0, n_kv),)]
    out = []
    for upcast in (True, False):
        leaves = [x.detach().clone().double() if upcast else x.detach().clone()
                  for x in (qs, ks, vs)]
        for x in leaves:
            x.requires_grad_()
        o, _ = attention_ref(*leaves, causal=causal, upcast=upcast)
        out.append(torch.autograd.grad(o, leaves, dos.to(o.dtype)))
        del o, leaves
    return out[0], out[1]


def _slice_grads(grads, group: int, n_kv: int) -> Tuple[torch.Tensor, ...]:
    dq, dk, dv = grads
    return dq[:1, :, :n_kv * group], dk[:1, :, :n_kv], dv[:1, :, :n_kv]


def run_point(d: int, causal: bool, s: int, group: int, args) -> Dict[str, Any]:
    b, h = max(1, args.tokens // s), args.hidden // d
    h_k = h // group
    q = torch.randn(b, s, h, d, device="cuda", dtype=torch.bfloat16)
    k, v = (torch.randn(b, s, h_k, d, device="cuda", dtype=torch.bfloat16) for _ in range(2))
    p = _params(d, causal)
    out, lse, _ = flash_fwd_hopper(q, k, v, **p)
    dout = torch.randn_like(out)
    bp = {kk: vv for kk, vv in p.items() if kk != "return_softmax"}

    variants = {"default": None, "variant": args.overrides}

    def bwd(name: str):
        return flash_bwd_hopper(dout, q, k, v, out, lse, deterministic=False,
                                config_overrides=variants[name], **bp)

    row: Dict[str, Any] = {"d": d, "causal": causal, "s": s, "b": b, "h": h, "h_k": h_k,
                           "overrides": args.overrides}
    # the key blocks per KV head each side cuts in two (BwdConfig.tile_split: model's choice)
    for name in variants:
        cfg = padded_config(q, k, bp["window_left"], bp["window_right"], bp["softcap"], False,
                            dict(variants[name] or {}))
        row[f"{name}_split_blocks"] = split_blocks(cfg, q, k, bp["window_left"],
                                                   bp["window_right"])
    # ---- exactness
    base, again, new = bwd("default"), bwd("default"), bwd("variant")
    row["dk_dv_bitwise"] = bool(torch.equal(base[1], new[1]) and torch.equal(base[2], new[2]))
    row["dq_bitwise"] = bool(torch.equal(base[0], new[0]))
    row["dq_diff"] = max_abs(base[0], new[0])
    row["dq_noise"] = max_abs(base[0], again[0])  # the default config against itself
    row["dk_dv_diff"] = max(max_abs(base[1], new[1]), max_abs(base[2], new[2]))
    row["nan"] = bool(any(torch.isnan(x).any().item() for x in base + new))
    n_kv = min(args.ref_kv_heads, h_k)
    ref64, ref_lp = _reference_grads(q, k, v, dout, causal, n_kv)
    atol = atol_for(torch.bfloat16)
    ok = not row["nan"]
    for name, g64, glp, g0, g1 in zip(GRADS, ref64, ref_lp, _slice_grads(base, group, n_kv),
                                      _slice_grads(new, group, n_kv)):
        err_lp, err0, err1 = max_abs(glp, g64), max_abs(g0, g64), max_abs(g1, g64)
        row[f"{name}_err"] = {"bf16_ref": err_lp, "default": err0, "variant": err1}
        ok = ok and err1 <= 3 * err_lp + atol and err0 <= 3 * err_lp + atol
    row["ok"] = bool(ok)
    del base, again, new, ref64, ref_lp
    torch.cuda.empty_cache()
    # ---- speed: interleaved rounds, the fastest round per variant
    ms = interleaved_ms({name: (lambda name=name: bwd(name)) for name in variants},
                        args.rounds, args.warmup, args.rep)
    for name in variants:
        row[f"{name}_ms_rounds"] = [round(x, 4) for x in ms[name]]
        row[f"{name}_tflops"] = 2.5 * _tflops(b, h, s, d, causal, min(ms[name]))
    row["ratio"] = row["variant_tflops"] / row["default_tflops"]
    del q, k, v, out, lse, dout
    torch.cuda.empty_cache()
    return row


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--d", default="64,128")
    ap.add_argument("--causal", default="0,1")
    ap.add_argument("--seqlens", default="2048,8192")
    ap.add_argument("--groups", default="1,4", help="query heads per KV head (1: MHA)")
    ap.add_argument("--ref-kv-heads", type=int, default=1,
                    help="KV heads (batch 0) checked against the float64 reference")
    add_common_arguments(ap)
    add_override_argument(ap, "BwdConfig", "kv_views_per_block=1")
    args = ap.parse_args(argv)
    args.overrides = parse_overrides(ap, args)
    points = [(d, bool(c), s, g) for d in int_list(args.d) for c in int_list(args.causal)
              for s in int_list(args.seqlens) for g in int_list(args.groups)]
    rows = run_points(
        points, lambda d, causal, s, group: run_point(d, causal, s, group, args),
        f"{'d':>4} {'causal':>6} {'s':>6} {'h/h_k':>6} {'default':>8} {'variant':>8} "
        f"{'ratio':>6} {'ok':>3} {'dk/dv==':>7} {'dq diff':>8} {'dq noise':>8}",
        lambda r: (f"{r['d']:>4} {int(r['causal']):>6} {r['s']:>6} {r['h']:>3}/{r['h_k']:<2} "
                   f"{r['default_tflops']:>8.1f} {r['variant_tflops']:>8.1f} "
                   f"{r['ratio']:>6.3f} {int(r['ok']):>3} {int(r['dk_dv_bitwise']):>7} "
                   f"{r['dq_diff']:>8.1e} {r['dq_noise']:>8.1e}"),
        args.out)
    return 0 if all(r["ok"] for r in rows) else 1


if __name__ == "__main__":
    raise SystemExit(main())
