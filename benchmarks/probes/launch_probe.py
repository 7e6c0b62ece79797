"""Where Triton's per-launch host time goes, kernel by kernel (H100 host).

Each workload runs once to record the last ``JITFunction.run`` call of every kernel it launches
(args, keyword args, grid); then the pieces of that launch are timed in isolation, microseconds
per call (``--calls`` back-to-back, median of ``--reps``):

    jit.run        Triton's whole launch path (``fn.run(..., warmup=False)``)
    binder         argument binding + specialisation (native ``specialize_impl`` per argument)
    cache_key      ``compute_cache_key`` on that specialisation
    launcher       the compiled kernel's launcher alone (pre-bound args; TMA descriptors filled)
    tma_fill       one ``make_tensordesc_arg`` per host TensorDescriptor argument (summed)
    fast           flashattn.runtime.launch.launch_jit (what our kernels call now)
plus the whole public call of the workload (``api``; ``api_triton_launch`` with
FLASHATTN_FAST_LAUNCH off, i.e. every launch through ``fn[grid]``) and a cProfile of it
(``--profile``).

    python benchmarks/probes/launch_probe.py --out $OUT/launch.json [--profile decode]
"""
from __future__ import annotations

import argparse
import cProfile
import io
import json
import os
import pstats
import sys
from typing import Callable, Dict

import torch

sys.path.append(os.path.join(os.path.dirname(__file__), "..", "..", "src"))
import triton  # noqa: E402
from triton.runtime import jit as _jit  # noqa: E402

import flashattn  # noqa: E402
from flashattn.runtime import compat, env  # noqa: E402
from overhead_probe import per_call_us  # noqa: E402  (this folder is on sys.path)

_RECORDED: Dict[str, tuple] = {}
_orig_run = _jit.JITFunction.run


def _recording_run(self, *args, grid, warmup, **kwargs):
    if not warmup:
        _RECORDED[getattr(self, "__name__", repr(self))] = (self, args, grid, dict(kwargs))
    return _orig_run(self, *args, grid=grid, warmup=warmup, **kwargs)


def workloads() -> Dict[str, Callable[[], object]]:
    bf = torch.bfloat16
    dev = "cuda"
    q, k, v = (torch.randn(1, 128, 8, 64, device=dev, dtype=bf) for _ in range(3))
    qd = torch.randn(1, 1, 32, 128, device=dev, dtype=bf)
    kc, vc = (torch.randn(1, 16384, 8, 128, device=dev, dtype=bf) for _ in range(2))
    seqlens = torch.full((1,), 16384, device=dev, dtype=torch.int32)
    qh, kh, vh = (torch.randn(1, 2048, 8, 128, device=dev, dtype=bf, requires_grad=True)
                  for _ in range(3))
    do = torch.randn_like(qh)

    def hopper_fwdbwd():
        out = flashattn.flash_attn_func(qh, kh, vh)
        out.backward(do)

    return {
        "tiny_fwd": lambda: flashattn.flash_attn_func(q, k, v, causal=True),
        "decode_1x16k": lambda: flashattn.flash_attn_with_kvcache(qd, kc, vc,
                                                                   cache_seqlens=seqlens),
        "fwdbwd_2k_d128": hopper_fwdbwd,
    }


def time_pieces(name: str, rec: tuple, calls: int, reps: int) -> Dict[str, float]:
    fn, args, grid, kwargs = rec
    row: Dict[str, float] = {}
    row["jit.run"] = per_call_us(lambda: fn.run(*args, grid=grid, warmup=False, **kwargs),
                                 calls, reps)
    device = triton.runtime.driver.active.get_current_device()
    stream = triton.runtime.driver.active.get_current_stream(device)
    kernel_cache, kernel_key_cache, _target, _backend, binder = fn.device_caches[device]
    kw = dict(kwargs)
    kw["debug"] = kw.get("debug", fn.debug) or triton.knobs.runtime.debug
    kw["instrumentation_mode"] = triton.knobs.compilation.instrumentation_mode
    bound, spec, options = binder(*args, **kw)
    row["binder"] = per_call_us(lambda: binder(*args, **kw), calls, reps)
    row["cache_key"] = per_call_us(
        lambda: _jit.compute_cache_key(kernel_key_cache, spec, options), calls, reps)
    kernel = kernel_cache[_jit.compute_cache_key(kernel_key_cache, spec, options)]
    g = grid(bound) if callable(grid) else grid
    g = tuple(g) + (1,) * (3 - len(g))
    vals = list(bound.values())
    row["launcher"] = per_call_us(
        lambda: kernel.run(g[0], g[1], g[2], stream, kernel.function, kernel.packed_metadata,
                           None, None, None, *vals), calls, reps)
    descs = [a for a in vals if type(a).__name__ == "TensorDescriptor"]
    row["n_args"] = len(vals)
    row["n_tma_desc"] = len(descs)
    if descs:
        from triton.backends.nvidia import driver as _drv
        metas = getattr(kernel.metadata, "tensordesc_meta", None) or [None] * len(descs)
        row["tma_fill"] = per_call_us(
            lambda: [_drv.make_tensordesc_arg(d, m) for d, m in zip(descs, metas)], calls, reps)
    try:
        from flashattn.runtime import launch as _launch
        if hasattr(_launch, "launch_jit"):
            row["fast"] = per_call_us(lambda: _launch.launch_jit(fn, grid, args, kwargs),
                                      calls, reps)
    except Exception as exc:  # report, keep probing the rest
        row["fast_error"] = repr(exc)[:200]
    return row


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--calls", type=int, default=300)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--profile", default="", help="workload name to cProfile (top 25)")
    ap.add_argument("--out", default=os.path.join(os.environ.get("OUT", "."), "launch.json"))
    args = ap.parse_args()
    result: Dict[str, object] = {"torch": torch.__version__, "triton": triton.__version__,
                                 "gpu": torch.cuda.get_device_name()}
    from flashattn.runtime import launch as _launch
    hook = triton.knobs.runtime.launch_enter_hook
    result["fast_launch_state"] = dict(
        FAST_LAUNCH=env.settings().fast_launch, interpret=_launch.INTERPRET,
        jit_run_is_triton=not compat.jit_run_patched(),
        enter_hook=repr(hook), enter_hook_calls=repr(getattr(hook, "calls", None)))
    print(result["fast_launch_state"], flush=True)
    for wname, work in workloads().items():
        _jit.JITFunction.run = _recording_run
        _RECORDED.clear()
        for _ in range(3):
            work()
        torch.cuda.synchronize()
        recorded = dict(_RECORDED)
        _jit.JITFunction.run = _orig_run
        entry: Dict[str, object] = {"api": per_call_us(work, args.calls // 3, args.reps)}
        with env.override(fast_launch=False):
            entry["api_triton_launch"] = per_call_us(work, args.calls // 3, args.reps)

        for kname, rec in recorded.items():
            try:
                entry[kname] = time_pieces(kname, rec, args.calls, args.reps)
            except Exception as exc:
                entry[kname] = {"error": repr(exc)[:300]}
        entry["fast_kernels_cached"] = len(_launch._KERNELS)
        result[wname] = entry
        print(wname, json.dumps(entry, indent=1), flush=True)
        if args.profile == wname:
            prof = cProfile.Profile()
            prof.enable()
            for _ in range(200):
                work()
            torch.cuda.synchronize()
            prof.disable()
            buf = io.StringIO()
            pstats.Stats(prof, stream=buf).sort_stats("tottime").print_stats(25)
            print("\n".join(line[:170] for line in buf.getvalue().splitlines()[4:]))
    with open(args.out, "w") as f:
        json.dump(result, f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
