"""Same-run A/B of two source trees of flashattn (e.g. before / after a restructuring).

The two trees cannot share a process (both are the package ``flashattn``), so each round runs
one child process per tree, alternating (A, B, A, B, ...): every child measures every point,
and the report gives each tree's median over the rounds and the ratio B / A.

Points (H100 defaults):
- ``fwd`` / ``bwd`` d=128 s=16k (b=1, h=16, bf16, causal and not): TFLOP/s, do_bench median;
- ``tiny`` (b1 s128 h16 d128, causal and not): microseconds per eager call, wall time of
  back-to-back calls then one synchronise, fastest of 15 batches (host time: what a small
  call costs);
- ``decode`` (flash_attn_with_kvcache, GQA 32/8, d128, b1, L16k, one new token, eager):
  microseconds per step, measured the same way.
- ``--points fp8``: ``flash_attn_fp8_func`` end to end beside bf16 ``flash_attn_func`` at b1
  h16 d128, s 1k / 4k / 8k (:func:`fp8_rows`).
- ``--points varlen``: the Hopper varlen forward (forced) on varlen_probe.py's ragged batches,
  d 64 / 128 / 256, mean lengths 256 / 1024 (:func:`varlen_rows`).

    python benchmarks/probes/ab_probe.py --a /tmp/old/src --b src --rounds 3 --out ab.json
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from typing import Dict, List


def _per_call_us(fn, calls: int, reps: int) -> float:
    """Microseconds per call: the fastest of ``reps`` batches of ``calls`` back-to-back calls
    (then one synchronise). The fastest batch: host time is what is compared, and a shared
    host's scheduling noise only ever adds to it."""
    import torch

    for _ in range(10):
        fn()
    torch.cuda.synchronize()
    times: List[float] = []
    for _ in range(reps):
        t0 = time.perf_counter()
        for _ in range(calls):
            fn()
        torch.cuda.synchronize()
        times.append((time.perf_counter() - t0) / calls * 1e6)
    return min(times)


def fp8_rows() -> Dict[str, float]:
    """``flash_attn_fp8_func`` end to end beside our bf16 ``flash_attn_func`` (b1, h16, d128:
    2048 hidden; s 1k / 4k / 8k, causal and not): microseconds per call, back-to-back calls
    (host-bound where the call's Python outlasts its kernels), and do_bench medians."""
    import torch
    from triton.testing import do_bench

    import flashattn
    from flashattn import fp8

    rows: Dict[str, float] = {}
    for s in (1024, 4096, 8192):
        q, k, v = (torch.randn(1, s, 16, 128, device="cuda", dtype=torch.bfloat16)
                   for _ in range(3))
        for causal in (False, True):
            tag = f"b1_s{s // 1024}k_d128_{'causal' if causal else 'dense'}"
            e2e = lambda: fp8.flash_attn_fp8_func(q, k, v, causal=causal)  # noqa: E731
            bf16 = lambda: flashattn.flash_attn_func(q, k, v, causal=causal)  # noqa: E731
            calls = 200 if s <= 1024 else 50
            rows[f"fp8_e2e_{tag}_us"] = _per_call_us(e2e, calls, 15)
            rows[f"bf16_{tag}_us"] = _per_call_us(bf16, calls, 15)
            if s >= 4096:
                rows[f"fp8_e2e_{tag}_bench_us"] = do_bench(e2e, warmup=50, rep=200) * 1e3
                rows[f"bf16_{tag}_bench_us"] = do_bench(bf16, warmup=50, rep=200) * 1e3
    return rows


def varlen_rows() -> Dict[str, float]:
    """``flash_attn_varlen_func`` forward with the Hopper kernels forced (auto sends means
    under 512 keys to the portable kernels), bf16, no grad: varlen_probe.py's ragged batches
    (16k tokens, hidden 2048: h = 2048 / d), d 64 / 128 / 256 x mean length 256 / 1024 x
    causal and not; do_bench medians in microseconds."""
    import torch
    from triton.testing import do_bench

    import flashattn

    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from varlen_probe import _cu, ragged_lengths

    rows: Dict[str, float] = {}
    with flashattn.use_backend("hopper"):
        for d in (64, 128, 256):
            for mean in (256, 1024):
                lengths = ragged_lengths(mean)
                cu, total, h = _cu(lengths, "cuda"), sum(lengths), 2048 // d
                q, k, v = (torch.randn(total, h, d, device="cuda", dtype=torch.bfloat16)
                           for _ in range(3))
                for causal in (False, True):
                    fn = lambda: flashattn.flash_attn_varlen_func(  # noqa: E731
                        q, k, v, cu, cu, max(lengths), max(lengths), causal=causal)
                    fn()
                    key = f"varlen_d{d}_mean{mean}_{'causal' if causal else 'dense'}_us"
                    rows[key] = do_bench(fn, warmup=10, rep=50) * 1e3
    return rows


def child(points: str) -> Dict[str, float]:
    """Measure the points with the flashattn on sys.path[0]; print one JSON line."""
    import torch
    from triton.testing import do_bench

    import flashattn

    if points == "fp8":
        return fp8_rows()
    if points == "varlen":
        return varlen_rows()
    rows: Dict[str, float] = {}
    dt = torch.bfloat16
    b, s, h, d = 1, 16384, 16, 128
    for causal in ((False, True) if points == "all" else ()):
        q, k, v = (torch.randn(b, s, h, d, device="cuda", dtype=dt, requires_grad=True)
                   for _ in range(3))
        flops = 4 * b * s * s * h * d / (2 if causal else 1)
        fwd = lambda: flashattn.flash_attn_func(q, k, v, causal=causal)  # noqa: E731
        out = fwd()
        dout = torch.randn_like(out)
        ms = do_bench(fwd, warmup=100, rep=500)
        rows[f"fwd_d128_16k_{'causal' if causal else 'dense'}_tflops"] = flops / ms / 1e9
        bwd = lambda: torch.autograd.grad(out, (q, k, v), dout, retain_graph=True)  # noqa: E731
        ms = do_bench(bwd, warmup=100, rep=500)
        rows[f"bwd_d128_16k_{'causal' if causal else 'dense'}_tflops"] = 2.5 * flops / ms / 1e9
        del q, k, v, out, dout
    q, k, v = (torch.randn(1, 128, 16, 128, device="cuda", dtype=dt) for _ in range(3))
    for causal in (False, True):
        rows[f"tiny_b1_s128_{'causal' if causal else 'dense'}_us"] = _per_call_us(
            lambda: flashattn.flash_attn_func(q, k, v, causal=causal), 200, 15)
    L = 16384
    qd = torch.randn(1, 1, 32, 128, device="cuda", dtype=dt)
    kc, vc = (torch.randn(1, L, 8, 128, device="cuda", dtype=dt) for _ in range(2))
    seqlens = torch.full((1,), L, dtype=torch.int32, device="cuda")
    rows["decode_b1_16k_eager_us"] = _per_call_us(
        lambda: flashattn.flash_attn_with_kvcache(qd, kc, vc, cache_seqlens=seqlens), 200, 15)
    rows["decode_b1_16k_lse_eager_us"] = _per_call_us(
        lambda: flashattn.flash_attn_with_kvcache(qd, kc, vc, cache_seqlens=seqlens,
                                                  return_softmax_lse=True), 200, 15)
    rows["dense_sq1_b1_16k_eager_us"] = _per_call_us(
        lambda: flashattn.flash_attn_func(qd, kc, vc, causal=True), 200, 15)
    # the same step through SDPA's cuDNN backend in this process: the host's speed in this
    # child (single runs of the H100 host move 1.5-2x), to read each tree against
    # (the backend is selected once, outside the timed calls: entering sdpa_kernel per call
    # costs tens of µs of its own, which a first version of this row included)
    from torch.nn.attention import SDPBackend, sdpa_kernel
    qt, kt, vt = qd.transpose(1, 2), kc.transpose(1, 2), vc.transpose(1, 2)
    with sdpa_kernel([SDPBackend.CUDNN_ATTENTION]):
        rows["cudnn_b1_16k_eager_us"] = _per_call_us(
            lambda: torch.nn.functional.scaled_dot_product_attention(qt, kt, vt,
                                                                    enable_gqa=True), 200, 15)
    return rows


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--a", required=True, help="src dir of tree A (the baseline)")
    ap.add_argument("--b", required=True, help="src dir of tree B")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--points", choices=("all", "host", "fp8", "varlen"), default="all",
                    help="all points, the host-time ones only (tiny calls, decode), "
                         "flash_attn_fp8_func beside bf16 (fp8_rows), or the Hopper varlen "
                         "forward (varlen_rows)")
    ap.add_argument("--out", default="")
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        print("AB " + json.dumps(child(args.points)), flush=True)
        return 0
    results: Dict[str, List[Dict[str, float]]] = {"a": [], "b": []}
    for r in range(args.rounds):
        for tag in ("a", "b"):
            src = os.path.abspath(getattr(args, tag))
            env = dict(os.environ, PYTHONPATH=src)
            proc = subprocess.run([sys.executable, os.path.abspath(__file__), "--a", "-", "--b",
                                   "-", "--child", "--points", args.points], env=env,
                                  capture_output=True, text=True, cwd="/tmp")
            line = [x for x in proc.stdout.splitlines() if x.startswith("AB ")]
            if proc.returncode != 0 or not line:
                print(f"round {r} tree {tag} failed:\n{proc.stderr[-3000:]}", file=sys.stderr)
                return 1
            rows = json.loads(line[-1][3:])
            results[tag].append(rows)
            print(f"round {r} {tag}: " + ", ".join(f"{k}={v:.1f}" for k, v in rows.items()),
                  flush=True)
    summary = {}
    for key in results["a"][0]:
        a = statistics.median(x[key] for x in results["a"])
        b = statistics.median(x[key] for x in results["b"])
        summary[key] = dict(a=round(a, 2), b=round(b, 2), b_over_a=round(b / a, 4))
        print(f"{key:34s} A {a:9.2f}  B {b:9.2f}  B/A {b / a:.3f}")
    anchor = "cudnn_b1_16k_eager_us"
    if anchor in results["a"][0]:  # host-bound rows against the same process's cuDNN step
        for key in results["a"][0]:
            if key.endswith("_us") and key != anchor:
                a, b = (statistics.median(x[key] / x[anchor] for x in results[t]) for t in "ab")
                summary[key].update(a_over_cudnn=round(a, 3), b_over_cudnn=round(b, 3))
                print(f"{key:34s} / cuDNN in the same child: A {a:.3f}  B {b:.3f}")
    if args.out:
        with open(args.out, "w") as f:
            json.dump(dict(a=args.a, b=args.b, rounds=args.rounds, summary=summary,
                           raw=results), f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
