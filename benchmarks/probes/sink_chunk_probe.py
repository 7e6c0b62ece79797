"""Cost of a learnable sink and speed of chunked local attention, H100.

b=1, h=16, d=128, bf16, 16k tokens (the grid's point). Timings are do_bench medians (ms),
the plain and the feature call interleaved three times (the min of the three medians is kept).

- sink: flash_attn_func with and without ``learnable_sink``, forward and forward + backward,
  causal and not; ratio = sink / plain (the issue's target: <= 1.03).
- chunk: causal with ``attention_chunk`` 8192 / 4096 (the dense fast path: equal lengths, a
  multiple of the chunk) and 16000 tokens with chunk 4096 (the varlen-segment path), beside
  plain causal attention of the same length. The chunked call does a fraction of the plain
  call's work (each query sees at most one chunk), so it should be faster.

    python benchmarks/probes/sink_chunk_probe.py --json $OUT/sink_chunk.json
"""
from __future__ import annotations

import argparse
import json
import os
import sys

import torch
from triton.testing import do_bench

sys.path.append(os.path.join(os.path.dirname(__file__), "..", "..", "src"))
import flashattn  # noqa: E402


def best_of(fns, rounds=3):
    out = {name: float("inf") for name in fns}
    for _ in range(rounds):
        for name, fn in fns.items():
            out[name] = min(out[name], do_bench(fn, warmup=10, rep=60))
    return out


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--json", default="")
    args = ap.parse_args()
    dev, dt = "cuda", torch.bfloat16
    rows = []
    s, h, d = 16384, 16, 128
    q, k, v = (torch.randn(1, s, h, d, device=dev, dtype=dt, requires_grad=True)
               for _ in range(3))
    sink = torch.randn(h, device=dev, requires_grad=True)
    g = torch.randn(1, s, h, d, device=dev, dtype=dt)
    for causal in (False, True):
        with torch.no_grad():
            t = best_of({
                "plain": lambda: flashattn.flash_attn_func(q, k, v, causal=causal),
                "sink": lambda: flashattn.flash_attn_func(q, k, v, causal=causal,
                                                          learnable_sink=sink)})
        rows.append(dict(what="sink fwd", causal=causal, **t, ratio=t["sink"] / t["plain"]))
        print(json.dumps(rows[-1]), flush=True)

        def fb(**kw):
            def run():
                out = flashattn.flash_attn_func(q, k, v, causal=causal, **kw)
                torch.autograd.grad(out, (q, k, v, sink) if kw else (q, k, v), g)
            return run
        t = best_of({"plain": fb(), "sink": fb(learnable_sink=sink)})
        rows.append(dict(what="sink fwd+bwd", causal=causal, **t, ratio=t["sink"] / t["plain"]))
        print(json.dumps(rows[-1]), flush=True)
    # the Hopper kernel alone with and without the sink folded into its epilogue, and the
    # plain kernel followed by the separate pass (5 interleaved rounds)
    from flashattn import ops
    from flashattn.backends.sm90.fwd import flash_fwd_hopper
    with torch.no_grad():
        for causal in (False, True):
            kw = dict(softmax_scale=d ** -0.5, causal=causal, window_left=-1,
                      window_right=0 if causal else -1, softcap=0.0)
            t = best_of({
                "kernel": lambda: flash_fwd_hopper(q, k, v, **kw),
                "kernel_sink": lambda: flash_fwd_hopper(q, k, v, **kw, sink=sink),
                "kernel_then_pass": lambda: ops.sink_apply(
                    *flash_fwd_hopper(q, k, v, **kw)[:2], sink, False)}, rounds=5)
            rows.append(dict(what="hopper kernel A/B", causal=causal, **t,
                             fused_ratio=t["kernel_sink"] / t["kernel"],
                             pass_ratio=t["kernel_then_pass"] / t["kernel"]))
            print(json.dumps(rows[-1]), flush=True)
    # the sink pass alone, by launch config, beside a plain copy of the same bytes
    from flashattn.backends.triton import sink as sink_mod
    with torch.no_grad():
        out, lse, _ = flashattn.flash_attn_func(q, k, v, return_attn_probs=True)
        t = {"clone": do_bench(lambda: out.clone(), warmup=10, rep=60),
             "sink_apply": do_bench(lambda: sink_mod.sink_apply(out, lse, sink, False),
                                    warmup=10, rep=60),
             "sink_grad": do_bench(lambda: sink_mod.sink_grad(g, out, lse, sink, False),
                                   warmup=10, rep=60)}
        n_rows = out.numel() // d
        for block_r, warps in ((16, 4), (32, 4), (64, 8), (128, 8), (256, 8)):
            o2, l2 = torch.empty_like(out), torch.empty_like(lse)
            grid = ((n_rows + block_r - 1) // block_r,)
            t[f"apply_r{block_r}_w{warps}"] = do_bench(
                lambda: sink_mod._sink_apply_kernel[grid](out, lse, sink, o2, l2, n_rows, h, s,
                                                          HEAD_DIM_V=d, BLOCK_R=block_r,
                                                          BLOCK_D=d, num_warps=warps),
                warmup=10, rep=60)
        rows.append(dict(what="sink pass alone (ms)", **t))
        print(json.dumps(rows[-1]), flush=True)
    with torch.no_grad():
        for length, chunk in ((16384, 8192), (16384, 4096), (16000, 4096)):
            qc, kc, vc = (x[:, :length].detach() for x in (q, k, v))
            t = best_of({
                "plain": lambda: flashattn.flash_attn_func(qc, kc, vc, causal=True),
                "chunk": lambda: flashattn.flash_attn_func(qc, kc, vc, causal=True,
                                                           attention_chunk=chunk)})
            rows.append(dict(what="chunk fwd", s=length, attention_chunk=chunk, **t,
                             ratio=t["chunk"] / t["plain"]))
            print(json.dumps(rows[-1]), flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(dict(rows=rows, gpu=torch.cuda.get_device_name(), torch=torch.__version__,
                           note="ms, min over 3 interleaved rounds of do_bench medians"),
                      f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
