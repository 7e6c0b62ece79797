"""A/B of the Hopper varlen (packed) calls under config overrides: the forward's FwdConfig
(sm90/fwd.py flash_fwd_hopper_varlen's config_overrides) or, with ``--mode bwd``, the
backward's BwdConfig (sm90/bwd.py flash_bwd_hopper_varlen), on the packed batches of
varlen_probe.py (16k tokens, hidden 2048: h = 2048 / ``--d``).

    python benchmarks/probes/varlen_ab.py --means 1024,4096 --ab '{"dynamic": false}' [--equal]
    python benchmarks/probes/varlen_ab.py --mode bwd --d 64 --ab '{"block_m": 128, "dq_rows": true}'

Prints ms and useful TFLOP/s per (mean, causal) for the default config and each override,
interleaved round by round (--rounds) so that machine drift hits both alike. In bwd mode each
override's dk / dv are compared bitwise with the default's and dq by its largest difference
(the fp32 reduce order differs between runs).
"""
from __future__ import annotations

import argparse
import json
import os
import sys

import torch
import triton

sys.path.append(os.path.join(os.path.dirname(__file__), "..", "..", "src"))
sys.path.insert(0, os.path.dirname(__file__))
from flashattn.backends.sm90.bwd import flash_bwd_hopper_varlen  # noqa: E402
from flashattn.backends.sm90.fwd import flash_fwd_hopper_varlen  # noqa: E402
from varlen_probe import TOKENS, _cu, ragged_lengths  # noqa: E402

HIDDEN = 2048


def _flops(lengths, h: int, d: int, causal: bool, mode: str) -> float:
    """Useful FLOPs of a packed call (4 n^2 h d per document, halved causal; bwd 2.5x)."""
    f = sum(4.0 * n * n * h * d for n in lengths) * (0.5 if causal else 1.0)
    return f * (2.5 if mode == "bwd" else 1.0)


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--means", default="1024,4096")
    ap.add_argument("--mode", choices=("fwd", "bwd"), default="fwd")
    ap.add_argument("--d", type=int, default=128, help="head dim (h = 2048 / d)")
    ap.add_argument("--ab", action="append", default=[],
                    help="JSON FwdConfig (fwd) or BwdConfig (bwd) overrides")
    ap.add_argument("--equal", action="store_true")
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()
    variants = [None] + [json.loads(x) for x in args.ab]
    d, h = args.d, HIDDEN // args.d
    for mean in (int(m) for m in args.means.split(",")):
        lengths = [mean] * (TOKENS // mean) if args.equal else ragged_lengths(mean)
        cu, total = _cu(lengths, "cuda"), sum(lengths)
        q, k, v = (torch.randn(total, h, d, device="cuda", dtype=torch.bfloat16)
                   for _ in range(3))
        for causal in (False, True):
            opts = dict(softmax_scale=d ** -0.5, causal=causal, window_left=-1,
                        window_right=0 if causal else -1, softcap=0.0)
            fns = {}
            if args.mode == "fwd":
                for i, ov in enumerate(variants):
                    fns[i] = (lambda ov=ov: flash_fwd_hopper_varlen(  # noqa: E731
                        q, k, v, cu, cu, config_overrides=ov, **opts))
            else:
                out, lse, _ = flash_fwd_hopper_varlen(q, k, v, cu, cu, **opts)
                dout = torch.randn_like(out)
                for i, ov in enumerate(variants):
                    fns[i] = (lambda ov=ov: flash_bwd_hopper_varlen(  # noqa: E731
                        dout, q, k, v, out, lse, cu, cu, config_overrides=ov, **opts))
                base = fns[0]()
                for i in range(1, len(variants)):
                    got = fns[i]()
                    same = all(torch.equal(a, b) for a, b in zip(got[1:], base[1:]))
                    dq_diff = (got[0].float() - base[0].float()).abs().max().item()
                    print(f"mean {mean:5d} causal={int(causal)} {json.dumps(variants[i])}: "
                          f"dk/dv bitwise {same}, dq max diff {dq_diff:.2e}")
            times = {i: [] for i in range(len(variants))}
            for _ in range(args.rounds):
                for i in range(len(variants)):
                    times[i].append(triton.testing.do_bench(fns[i], warmup=10, rep=40))
            for i, ov in enumerate(variants):
                ms = sorted(times[i])[len(times[i]) // 2]
                tf = _flops(lengths, h, d, causal, args.mode) / ms * 1e-9
                print(f"{args.mode} d {d} mean {mean:5d} causal={int(causal)} "
                      f"{json.dumps(ov):36s} {ms:7.3f} ms {tf:6.1f} TFLOP/s  "
                      f"rounds {[round(t, 3) for t in times[i]]}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
