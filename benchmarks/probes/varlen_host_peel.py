"""Host time of a packed (varlen) call, layer by layer (the lean eager path for every
public function): how much of ``flash_attn_varlen_func`` each layer below it costs, forward and
backward, bf16 and FP8, measured by calling each layer directly (no profiler: cProfile inflates
the many small calls).

The call is small on purpose (4 sequences of 512 tokens, h = 16, d = 128: a few tens of µs on
the GPU), so the rows measure the host; the Hopper kernels are forced (``use_backend('hopper')``:
auto routes a mean of 512 keys to them anyway). Rows, µs per call (min / median of 7 batches
of ``--calls``, one synchronise per batch):

forward, no grad: public; the recorded call (api/fastpath.VARLEN's replay.varlen.VarlenRunner, where
the tree has one: what a repeated signature runs below the public function); ops body
(``_varlen_fwd_impl``); dispatch_varlen.varlen_forward; the sm90 host function; three
``torch.empty`` alone.
training: public forward with grad recorded; backward through autograd (retain_graph, one
forward); the recorded backward; ops body (``_varlen_bwd_impl``); dispatch_varlen.varlen_backward;
the sm90 host function.
The dense call's training step on the same tokens (b = seqs), and the autograd floor (a step
around a Function that launches nothing). FP8 (FA3's API, descales (b, h_k)): public; the sm90
host function.
Also the GPU time of the forward and of the backward (CUDA graph replay), and every
synchronising call one training step makes (``torch.cuda.set_sync_debug_mode``).

    python benchmarks/probes/varlen_host_peel.py [--calls 100] [--json $OUT/varlen_host.json]
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import warnings

import torch
import triton

sys.path.append(os.path.join(os.path.dirname(__file__), "..", "..", "src"))
sys.path.insert(0, os.path.dirname(__file__))
import flashattn  # noqa: E402
from flashattn import ops  # noqa: E402
from flashattn.dispatch import varlen as dispatch_varlen  # noqa: E402
from flashattn.api import fastpath  # noqa: E402
from flashattn.params import AttnParams, Fp8Scales  # noqa: E402
from flashattn.backends.sm90 import bwd as sm90_bwd  # noqa: E402
from flashattn.backends.sm90 import fwd as sm90_fwd  # noqa: E402
from plan_probe import per_call_us  # noqa: E402


def graph_us(fn) -> float:
    """GPU time of fn's launches: a CUDA graph of it, replayed (do_bench median)."""
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        fn()
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        fn()
    return triton.testing.do_bench(g.replay, warmup=10, rep=50) * 1e3


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--calls", type=int, default=100)
    ap.add_argument("--seqs", type=int, default=4)
    ap.add_argument("--len", type=int, default=512)
    ap.add_argument("--json", default="")
    args = ap.parse_args()
    n, L, h, d = args.seqs, args.len, 16, 128
    total = n * L
    cu = torch.arange(0, total + 1, L, dtype=torch.int32, device="cuda")
    q, k, v = (torch.randn(total, h, d, device="cuda", dtype=torch.bfloat16) for _ in range(3))
    dout = torch.randn_like(q)
    scale = d ** -0.5
    rows = []

    def row(name, fn):
        lo, med = per_call_us(fn, calls=args.calls)
        rows.append(dict(row=name, min_us=round(lo, 1), median_us=round(med, 1)))
        print(f"{name:58s} {lo:8.1f} {med:8.1f}", flush=True)

    print(f"{'µs per call':58s} {'min':>8s} {'median':>8s}")
    with flashattn.use_backend("hopper"):
        params = AttnParams(scale, False, -1, -1, 0.0, None, 0.0, 0)
        pub = lambda: flashattn.flash_attn_varlen_func(q, k, v, cu, cu, L, L)  # noqa: E731
        row("fwd: public (no grad)", pub)
        varlen_cache = getattr(fastpath, "VARLEN", None)  # (trees before the recorded call)
        runner = (next(e[1] for e in varlen_cache._entries.values())
                  if varlen_cache is not None and varlen_cache._entries else None)
        if runner is not None:
            row("fwd: recorded call (VarlenRunner.forward)",
                lambda: runner.forward(q, k, v, cu, cu, None))
        row("fwd: ops._varlen_fwd_impl", lambda: ops._varlen_fwd_impl(
            q, k, v, cu, cu, None, None, None, None, L, L, scale, False, -1, -1, 0.0, 0.0,
            False, False))
        row("fwd: dispatch_varlen.varlen_forward", lambda: dispatch_varlen.varlen_forward(
            q, k, v, cu, cu, None, None, L, L, params))
        row("fwd: sm90 flash_fwd_hopper_varlen", lambda: sm90_fwd.flash_fwd_hopper_varlen(
            q, k, v, cu, cu, softmax_scale=scale, causal=False, window_left=-1,
            window_right=-1, softcap=0.0))
        row("fwd: 3 x torch.empty", lambda: (
            torch.empty((total, h, d), dtype=q.dtype, device="cuda"),
            torch.empty((h, total), dtype=torch.float32, device="cuda"),
            torch.empty(1, dtype=torch.int32, device="cuda")))
        fwd_gpu = graph_us(pub)

        qg, kg, vg = (t.detach().clone().requires_grad_(True) for t in (q, k, v))
        row("train: public fwd (grad recorded)",
            lambda: flashattn.flash_attn_varlen_func(qg, kg, vg, cu, cu, L, L))
        out = flashattn.flash_attn_varlen_func(qg, kg, vg, cu, cu, L, L)
        row("train: autograd backward (retain_graph)",
            lambda: torch.autograd.grad(out, (qg, kg, vg), dout, retain_graph=True))
        o, lse, _ = ops._varlen_fwd_impl(q, k, v, cu, cu, None, None, None, None, L, L, scale,
                                         False, -1, -1, 0.0, 0.0, False, False)
        if runner is not None:
            row("bwd: recorded call (VarlenRunner.backward)",
                lambda: runner.backward(dout, q, k, v, o, lse, cu, cu, None))
        row("bwd: ops._varlen_bwd_impl", lambda: ops._varlen_bwd_impl(
            dout, q, k, v, o, lse, cu, cu, None, None, None, L, L, scale, False, -1, -1, 0.0,
            0.0, False))
        row("bwd: dispatch_varlen.varlen_backward", lambda: dispatch_varlen.varlen_backward(
            dout, q, k, v, o, lse, cu, cu, None, L, L, params))
        bwd_sm90 = lambda: sm90_bwd.flash_bwd_hopper_varlen(  # noqa: E731
            dout, q, k, v, o, lse, cu, cu, softmax_scale=scale, causal=False, window_left=-1,
            window_right=-1, softcap=0.0)
        row("bwd: sm90 flash_bwd_hopper_varlen", bwd_sm90)
        bwd_gpu = graph_us(bwd_sm90)

        def step():
            o_ = flashattn.flash_attn_varlen_func(qg, kg, vg, cu, cu, L, L)
            torch.autograd.grad(o_, (qg, kg, vg), dout)
        row("train: fwd + bwd step", step)
        syncs = []
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            torch.cuda.set_sync_debug_mode("warn")
            try:
                step()
            finally:
                torch.cuda.set_sync_debug_mode(0)
        syncs = [str(w.message).splitlines()[0] for w in caught
                 if "synchroniz" in str(w.message)]
        print(f"synchronising calls in one training step: {len(syncs)} {syncs[:4]}")

        # the dense call's training step on the same tokens (b = seqs, s = len), and the floor:
        # autograd around a Function that does nothing on the GPU
        qd, kd, vd = (t.detach().view(n, L, h, d).clone().requires_grad_(True)
                      for t in (q, k, v))
        row("dense: public fwd (grad recorded)", lambda: flashattn.flash_attn_func(qd, kd, vd))

        def dense_step():
            o_ = flashattn.flash_attn_func(qd, kd, vd)
            torch.autograd.grad(o_, (qd, kd, vd), dout.view(n, L, h, d))
        row("dense: fwd + bwd step", dense_step)

        class Nothing(torch.autograd.Function):
            @staticmethod
            def forward(ctx, a, b, c):
                return a.view_as(a)

            @staticmethod
            def backward(ctx, g):
                return g, None, None

        def floor_step():
            o_ = Nothing.apply(qg, kg, vg)
            torch.autograd.grad(o_, (qg, kg, vg), dout, allow_unused=True)
        row("floor: autograd step around a no-op Function", floor_step)

        q8, k8, v8 = (t.to(torch.float8_e4m3fn) for t in (q, k, v))
        ones = torch.ones(n, h, device="cuda")
        row("fp8: public (FA3 descales)", lambda: flashattn.flash_attn_varlen_func(
            q8, k8, v8, cu, cu, L, L, q_descale=ones, k_descale=ones, v_descale=ones))
        d1 = torch.ones(n, h, 1, device="cuda")
        scales = Fp8Scales(d1, d1, d1, 31, 31)
        row("fp8: sm90 flash_fwd_hopper_fp8_varlen", lambda: sm90_fwd.flash_fwd_hopper_fp8_varlen(
            q8, k8, v8, cu, cu, L, scales, softmax_scale=scale, window_left=-1,
            window_right=-1, softcap=0.0, out_dtype=torch.bfloat16))
    print(f"GPU (graph replay): forward {fwd_gpu:.1f} µs, backward {bwd_gpu:.1f} µs")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(dict(device=torch.cuda.get_device_name(), seqs=n, len=L, h=h, d=d,
                           rows=rows, fwd_gpu_us=fwd_gpu, bwd_gpu_us=bwd_gpu,
                           syncs_per_step=syncs), f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
