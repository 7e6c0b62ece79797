"""Config sweep for tuning the portable kernels on the GPU: the time of EVERY candidate config
of each autotune space at chosen shapes, not just the winner.

It reads the autotuner's own per-config timings (``Autotuner.configs_timings``) after each
tuned call, so what it reports is exactly what autotuning saw. ``--extra`` adds candidate
configs to the spaces for the run (the spaces in ``kernels/config.py`` are dicts of lists that
the pruner reads at call time), so a new candidate can be measured before it is committed.

Usage (device machine):
  python3 benchmarks/probes/sweep.py --shapes 128:0:4096,128:1:8192 --modes fwd,bwd \
      --extra 'fwd:128:128,128,8,4,ws;dkdv:128:64,128,8,1'
Shapes are d:causal:s with b*s = 16k tokens and h*d = 2048. --extra entries are
`space:d_bucket:BM,BN,warps,stages[,ws]` separated by ';' (space in fwd, dkdv, dq).
Writes $OUT/sweep.jsonl (one row per shape x kernel x config) when OUT is set.
"""
from __future__ import annotations

import argparse
import json
import os
import sys

import torch
import triton

sys.path.append(os.path.join(os.path.dirname(__file__), "..", "..", "src"))
from flashattn.backends.triton import bwd as kbwd  # noqa: E402
from flashattn.backends.triton import config  # noqa: E402
from flashattn.backends.triton import fwd as kfwd  # noqa: E402

_SPACES = {"fwd": config._FWD_SPACE, "dkdv": config._BWD_KV_SPACE, "dq": config._BWD_Q_SPACE}


def _add_extra(spec: str) -> None:
    for item in filter(None, (s.strip() for s in spec.split(";"))):
        space, dbucket, cfg = item.split(":")
        parts = cfg.split(",")
        bm, bn, warps, stages = (int(x) for x in parts[:4])
        ws = len(parts) > 4 and parts[4] == "ws"
        c = config._fcfg(bm, bn, warps, stages, ws) if space == "fwd" else config._cfg(bm, bn, warps, stages)
        _SPACES[space][(int(dbucket), 2)].append(c)


def _tflops(b, h, s, d, causal, ms, mode):
    f = 4 * b * s * s * h * d / (2 if causal else 1) * (2.5 if mode == "bwd" else 1.0)
    return f / ms * 1e-9


def _timings(tuner):
    return {str(c): (t[0] if isinstance(t, (list, tuple)) else t)
            for c, t in getattr(tuner, "configs_timings", {}).items()}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--shapes", required=True)
    ap.add_argument("--modes", default="fwd,bwd")
    ap.add_argument("--extra", default="")
    args = ap.parse_args()
    _add_extra(args.extra)
    out_path = os.path.join(os.environ["OUT"], "sweep.jsonl") if os.environ.get("OUT") else None
    for shape in args.shapes.split(","):
        d, causal, s = (int(x) for x in shape.split(":"))
        causal = bool(causal)
        b, h = max(1, 16384 // s), 2048 // d
        q, k, v, do = (torch.randn(b, s, h, d, device="cuda", dtype=torch.bfloat16) for _ in range(4))
        p = dict(softmax_scale=d ** -0.5, causal=causal, window_left=-1, window_right=0 if causal else -1,
                 softcap=0.0, alibi_slopes=None, dropout_p=0.0, philox_seed=0)
        out, lse, _ = kfwd.flash_fwd(q, k, v, return_softmax=False, **p)
        kernels = {"fwd": kfwd._fwd_autotuned}
        rows = []
        for name, tuner in kernels.items():
            for cfg, ms in _timings(tuner).items():
                rows.append({"kernel": name, "cfg": cfg, "ms": ms, "tflops": _tflops(b, h, s, d, causal, ms, "fwd")})
        if "bwd" in args.modes:
            kbwd.flash_bwd(do, q, k, v, out, lse, deterministic=False, **p)
            for name, tuner in (("dkdv", kbwd._dkdv_autotuned), ("dq", kbwd._dq_autotuned)):
                for cfg, ms in _timings(tuner).items():
                    rows.append({"kernel": name, "cfg": cfg, "ms": ms})
            ms = triton.testing.do_bench(lambda: kbwd.flash_bwd(do, q, k, v, out, lse, deterministic=False, **p),
                                         return_mode="median")
            rows.append({"kernel": "bwd-total(best)", "cfg": "", "ms": ms,
                         "tflops": _tflops(b, h, s, d, causal, ms, "bwd")})
        ms = triton.testing.do_bench(lambda: kfwd.flash_fwd(q, k, v, return_softmax=False, **p), return_mode="median")
        rows.append({"kernel": "fwd-total(best)", "cfg": str(kfwd._fwd_autotuned.best_config), "ms": ms,
                     "tflops": _tflops(b, h, s, d, causal, ms, "fwd")})
        print(f"== d={d} causal={int(causal)} s={s} b={b} h={h}")
        for r in rows:
            r.update(d=d, causal=causal, s=s)
            tf = f"{r['tflops']:6.0f}" if "tflops" in r else "      "
            print(f"  {r['kernel']:16s} {r['ms']:8.3f} ms {tf}  {r['cfg']}")
            if out_path:
                with open(out_path, "a") as fh:
                    fh.write(json.dumps(r) + "\n")
        del q, k, v, do, out, lse
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
