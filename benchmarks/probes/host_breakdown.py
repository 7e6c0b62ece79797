"""Where the host time of small eager calls goes (the host-profile table).

For each call: wall-clock µs per call without a profiler (min / median of 7 batches of 200,
synchronised per batch; the GPU work of these shapes is far shorter than the host path, so this
is host time), SDPA's cuDNN / flash backends on the same tensors, and a cProfile split of our
call into layers by the file each function's own time is spent in:

- validation: api/validation*, api/kvcache_validation, api/out, api/params, metadata
- api: the rest of flashattn/api (argument plumbing of the public functions)
- dispatch: dispatch.py, ops.py, params.py, runtime/env.py, sm90/support.py
- kernel-host: flashattn/backends/triton/*.py (configs, strides, argument tuples of the launches)
- launch: runtime/launch.py, triton's own Python, the launcher (C)
- alloc: torch.empty / zeros / full / *_like
- torch-other: other torch calls (strides, views, .contiguous, ...)

The split's fractions are of the profiled time (cProfile inflates every function call about
equally); the µs column scales them to the unprofiled wall time.

    python benchmarks/probes/host_breakdown.py --json $OUT/host_breakdown.json
    FLASHATTN_SRC=old/src python benchmarks/probes/host_breakdown.py   # another tree
"""
from __future__ import annotations

import argparse
import cProfile
import json
import os
import pstats
import re
import sys

import torch

# (FLASHATTN_SRC: another tree's src, for same-run A/B; default this tree's)
sys.path.insert(0, os.environ.get("FLASHATTN_SRC")
                or os.path.join(os.path.dirname(__file__), "..", "..", "src"))
import flashattn  # noqa: E402
from plan_probe import per_call_us  # noqa: E402  (this script's folder is on sys.path)

LAYERS = ("validation", "api", "dispatch", "kernel-host", "launch", "alloc", "torch-other",
          "other")
_ALLOC = ("empty", "zeros", "full", "empty_like", "zeros_like", "full_like", "new_empty",
          "new_zeros", "new_full")


def layer_of(filename: str, funcname: str) -> str:
    f = filename.replace(os.sep, "/")
    if "flashattn/" in f:
        tail = f.split("flashattn/")[-1]
        if tail.startswith(("api/validation", "api/kvcache_validation", "api/out", "api/params",
                            "metadata")):
            return "validation"
        if tail.startswith("api/"):
            return "api"
        if tail.startswith(("dispatch", "ops", "params", "runtime/env", "sm90/support")):
            return "dispatch"
        if tail.startswith("runtime/launch"):
            return "launch"
        if tail.startswith("triton/") or tail.startswith("sm90/"):
            return "kernel-host"
        return "other"
    if "/triton/" in f:
        return "launch"
    if filename == "~":  # built-ins: "{built-in method torch.empty}", "{method 'stride' ...}"
        name = funcname.strip("{}")
        if re.search(r"(^|[ .'])(" + "|".join(_ALLOC) + r")($|')", name):
            return "alloc"
        if "launch" in name or "cuLaunch" in name:
            return "launch"
        if "torch" in name or "Tensor" in name or "method '" in name:
            return "torch-other"
        return "other"
    if "/torch/" in f:
        return "torch-other"
    return "other"


def wall_us(fn):
    """(min, median) µs per call: plan_probe's measurement, rounded."""
    return tuple(round(x, 1) for x in per_call_us(fn))


def split(fn, calls=300):
    for _ in range(5):
        fn()
    torch.cuda.synchronize()
    prof = cProfile.Profile()
    prof.enable()
    for _ in range(calls):
        fn()
    prof.disable()
    torch.cuda.synchronize()
    stats = pstats.Stats(prof)
    by = dict.fromkeys(LAYERS, 0.0)
    top = []
    for (filename, _line, funcname), (_cc, ncalls, tottime, _cum, _callers) in \
            stats.stats.items():
        by[layer_of(filename, funcname)] += tottime
        top.append((tottime, f"{os.path.basename(filename)}:{funcname}", ncalls / calls))
    total = sum(by.values()) or 1.0
    top.sort(reverse=True)
    return ({k: v / total for k, v in by.items()},
            [dict(fn=n, share=round(t / total, 3), calls_per_call=round(c, 1))
             for t, n, c in top[:12]])


def sdpa_us(q, k, v, causal):
    from torch.nn.attention import SDPBackend, sdpa_kernel
    res = {}
    qt, kt, vt = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)
    for name, be in (("cudnn", SDPBackend.CUDNN_ATTENTION), ("fa2", SDPBackend.FLASH_ATTENTION)):
        try:
            with sdpa_kernel([be]):
                res[name] = wall_us(lambda: torch.nn.functional.scaled_dot_product_attention(
                    qt, kt, vt, is_causal=causal, enable_gqa=kt.shape[1] != qt.shape[1]))
        except Exception as exc:  # a backend that refuses the shape
            res[name] = type(exc).__name__
    return res


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--json", default="")
    args = ap.parse_args()
    dev, dt = "cuda", torch.bfloat16
    rows = []

    def record(name, fn, anchors):
        us = wall_us(fn)
        frac, top = split(fn)
        row = dict(call=name, us=us, anchors=anchors,
                   layers_us={k: round(v * us[0], 1) for k, v in frac.items() if v > 0.005},
                   top=top)
        rows.append(row)
        print(json.dumps(row), flush=True)

    q, k, v = (torch.randn(1, 128, 16, 128, device=dev, dtype=dt) for _ in range(3))
    for causal in (False, True):
        record(f"tiny dense b1 s128 h16 d128 causal={causal}",
               lambda: flashattn.flash_attn_func(q, k, v, causal=causal),
               sdpa_us(q, k, v, causal))
    h, h_k, d = 32, 8, 128
    for b, L in ((1, 16384), (8, 8192)):
        qd = torch.randn(b, 1, h, d, device=dev, dtype=dt)
        kc = torch.randn(b, L, h_k, d, device=dev, dtype=dt)
        vc = torch.randn_like(kc)
        lens = torch.full((b,), L, dtype=torch.int32, device=dev)
        anchors = sdpa_us(qd, kc, vc, False)
        record(f"kvcache decode b{b} L{L}",
               lambda: flashattn.flash_attn_with_kvcache(qd, kc, vc, cache_seqlens=lens,
                                                         causal=True), anchors)
        plan = flashattn.plan_decode(b, h, h_k, d, max_seqlen_k=L, dtype=dt)
        record(f"plan.run b{b} L{L}", lambda: plan.run(qd, kc, vc, lens), anchors)
        record(f"flash_attn_func s_q=1 b{b} L{L}",
               lambda: flashattn.flash_attn_func(qd, kc, vc, causal=True), anchors)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(dict(rows=rows, gpu=torch.cuda.get_device_name(),
                           torch=torch.__version__,
                           note="us: (min, median) per call, 7 batches of 200; layers_us: "
                                "cProfile shares scaled to the min"), f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
