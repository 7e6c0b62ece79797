"""Host overhead probe: microseconds per call at a tiny shape, where the GPU work is a few
microseconds and the Python path decides the time.

Layers timed (each ``--calls`` back-to-back calls, one synchronisation at the end, median of
``--reps`` such loops):
    flash_attn_func      the public API: validation, normalisation, torch.library op, autograd
    ops.attention        the registered op alone (no validation / normalisation)
    dispatch.dense.forward     the backend call without the op (what the op's body runs)
    forward_family       dispatch's choice of kernel family alone
    flash_fwd            the portable forward's host function (allocations + one launch)
    autotuner.run        the launch through Triton's autotuner (cached winner), args recorded
    jit.run              the same launch straight to the JIT function with the winner's config
    sdpa-flash           torch's SDPA flash backend, for scale
and with a backward: the API, dispatch.dense.backward, the portable backward and SDPA. On sm90 also
the Gluon path's layers: flash_fwd_hopper, its launch_args (Python argument building), the
launch alone with prebuilt arguments (binder, TMA descriptor encoding, launcher) and
flash_bwd_hopper.

    python benchmarks/probes/overhead_probe.py --out $OUT/overhead.json
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from typing import Callable, Dict, List

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

sys.path.append(os.path.join(os.path.dirname(__file__), "..", "..", "src"))
import flashattn  # noqa: E402
from flashattn import ops  # noqa: E402
from flashattn.dispatch import dense as dispatch_dense  # noqa: E402
from flashattn.dispatch import select as dispatch_select  # noqa: E402


def per_call_us(fn: Callable[[], object], calls: int, reps: int) -> float:
    for _ in range(10):  # compile, autotune, allocator warm-up
        fn()
    torch.cuda.synchronize()
    times: List[float] = []
    for _ in range(reps):
        t0 = time.perf_counter()
        for _ in range(calls):
            fn()
        torch.cuda.synchronize()
        times.append((time.perf_counter() - t0) / calls * 1e6)
    return statistics.median(times)


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--shape", default="1,128,8,64", help="b,s,h,d")
    ap.add_argument("--calls", type=int, default=200)
    ap.add_argument("--reps", type=int, default=7)
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    b, s, h, d = (int(x) for x in args.shape.split(","))
    q, k, v = (torch.randn(b, s, h, d, device="cuda", dtype=torch.bfloat16) for _ in range(3))
    scale = d ** -0.5
    params = dict(softmax_scale=scale, causal=True, window_left=-1, window_right=0, softcap=0.0,
                  alibi_slopes=None, dropout_p=0.0, philox_seed=0, return_softmax=False)
    qt, kt, vt = (x.transpose(1, 2).contiguous() for x in (q, k, v))

    def sdpa():
        with sdpa_kernel([SDPBackend.FLASH_ATTENTION]):
            return F.scaled_dot_product_attention(qt, kt, vt, is_causal=True)

    fns: Dict[str, Callable[[], object]] = {
        "fwd flash_attn_func": lambda: flashattn.flash_attn_func(q, k, v, causal=True),
        "fwd ops.attention": lambda: ops.attention(q, k, v, None, None, scale, True, -1, 0, 0.0,
                                                   0.0, False, False),
        "fwd dispatch.dense.forward": lambda: dispatch_dense.forward(q, k, v, **params),
        "fwd sdpa-flash": sdpa,
    }
    from flashattn.backends.triton import fwd as kfwd

    fns["fwd forward_family"] = lambda: dispatch_select.forward_family(q, k, v, **params)
    fns["fwd flash_fwd"] = lambda: kfwd.flash_fwd(q, k, v, **params)
    recorded = {}
    tuner = kfwd._fwd_autotuned
    original_run = tuner.run

    def recording_run(*a, **kw):
        recorded.setdefault("call", (a, kw))
        return original_run(*a, **kw)

    tuner.run = recording_run
    kfwd.flash_fwd(q, k, v, **params)
    tuner.run = original_run
    rec_args, rec_kwargs = recorded["call"]
    best = tuner.best_config
    fns["fwd autotuner.run"] = lambda: tuner.run(*rec_args, **rec_kwargs)
    fns["fwd jit.run"] = lambda: tuner.fn.run(*rec_args, **rec_kwargs, **best.all_kwargs())
    out, lse, _ = dispatch_dense.forward(q, k, v, **params)
    dout = torch.randn_like(out)
    bparams = {**{n: params[n] for n in params if n != "return_softmax"}, "deterministic": False}
    fns["bwd dispatch.dense.backward"] = lambda: dispatch_dense.backward(dout, q, k, v, out, lse,
                                                                         **bparams)
    from flashattn.backends.triton import bwd as kbwd

    fns["bwd flash_bwd (portable)"] = lambda: kbwd.flash_bwd(dout, q, k, v, out, lse, **bparams)
    qg, kg, vg = (x.detach().clone().requires_grad_() for x in (q, k, v))
    qtg, ktg, vtg = (x.detach().clone().requires_grad_() for x in (qt, kt, vt))

    def api_fwd_bwd():
        flashattn.flash_attn_func(qg, kg, vg, causal=True).sum().backward()

    def sdpa_fwd_bwd():
        with sdpa_kernel([SDPBackend.FLASH_ATTENTION]):
            F.scaled_dot_product_attention(qtg, ktg, vtg, is_causal=True).sum().backward()

    if dispatch_select.hopper_reason(q) is None:  # sm90: the Gluon path's host layers as well
        from flashattn.backends.sm90 import bwd as hbwd, fwd as hfwd
        from flashattn.backends.sm90.config import fwd_config
        from flashattn.backends.triton.config import sm_count
        from flashattn.runtime.launch import launch_jit

        fns["fwd flash_fwd_hopper"] = lambda: hfwd.flash_fwd_hopper(q, k, v, **params)
        h_out = torch.empty_like(q)
        h_lse = torch.empty((b, h, s), dtype=torch.float32, device=q.device)
        h_kw = dict(softmax_scale=scale, window_left=-1, window_right=0, softcap=0.0)
        cfg = fwd_config(d)
        fns["fwd hopper launch_args"] = lambda: hfwd.launch_args(
            q, k, v, h_out, h_lse, cfg, num_sms=sm_count(q.device), **h_kw)
        h_args, h_const, h_opts, h_grid = hfwd.launch_args(q, k, v, h_out, h_lse, cfg,
                                                           num_sms=sm_count(q.device), **h_kw)
        # the launch alone (binder, TMA descriptor encoding, launcher), arguments prebuilt;
        # the causal tile-queue counter is reused, so only the timing is meaningful here
        fns["fwd hopper launch_jit"] = lambda: launch_jit(hfwd.attn_fwd_kernel, (h_grid,), h_args,
                                                          {**h_const, **h_opts})
        fns["bwd flash_bwd_hopper"] = lambda: hbwd.flash_bwd_hopper(dout, q, k, v, out, lse,
                                                                     **bparams)
    fns["fwd+bwd flash_attn_func"] = api_fwd_bwd
    fns["fwd+bwd sdpa-flash"] = sdpa_fwd_bwd
    rows = []
    for name, fn in fns.items():
        us = per_call_us(fn, args.calls, args.reps)
        rows.append(dict(name=name, us_per_call=round(us, 1), shape=[b, s, h, d]))
        print(f"{name:28s} {us:8.1f} us/call")
    if args.out:
        meta = dict(gpu=torch.cuda.get_device_name(), torch=torch.__version__,
                    date=time.strftime("%Y-%m-%d"))
        with open(args.out, "w") as f:
            json.dump({"meta": meta, "rows": rows}, f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
