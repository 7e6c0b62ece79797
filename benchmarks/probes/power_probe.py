"""SM clock and board power while a kernel runs back to back: is a kernel slower under the
power cap than at ncu's locked clock because the GPU clocks it lower?

Nsight Compute locks the SM clock, and there our d = 128 kernels tie cuDNN (forward) or trail
it by ~4% (backward), while do_bench, at boost clocks under the board's power limit, shows
gaps of 6-11%. This probe runs each implementation alone in a loop for ``--seconds`` while
``nvidia-smi -lms`` samples the SM clock, the power draw and the active clock-event reasons,
and reports the medians beside the TFLOP/s of that loop. Implementations are interleaved
``--repeat`` times so drift hits both.

    python3 benchmarks/probes/power_probe.py --points 128:0:fwd,128:1:bwd --seconds 4 --json $OUT/power.json

Shapes: bf16, 16k tokens per call (batch = 16384 / s), h * d = 2048, layout (b, s, h, d) for
both (cuDNN through SDPA on the transposed views, as hopper_probe.py times it). ``bwd`` times the backward
alone (autograd.grad of one forward, graph retained); FLOPs as in ANCHORS.md.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

import torch
import torch.nn.functional as F

sys.path.append(os.path.join(os.path.dirname(__file__), "..", "..", "src"))


def _step(impl: str, d: int, causal: bool, mode: str, s: int):
    """A closure running one call of ``mode`` (fwd, or the backward of a retained graph)."""
    b, h = max(1, 16384 // s), 2048 // d
    grad = mode == "bwd"
    q, k, v = (torch.randn(b, s, h, d, device="cuda", dtype=torch.bfloat16, requires_grad=grad)
               for _ in range(3))
    if impl == "cudnn":
        from torch.nn.attention import SDPBackend, sdpa_kernel

        def fwd():
            with sdpa_kernel([SDPBackend.CUDNN_ATTENTION]):
                return F.scaled_dot_product_attention(
                    q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2),
                    is_causal=causal).transpose(1, 2)
    else:
        os.environ["FLASHATTN_BACKEND"] = impl
        import flashattn
        from flashattn.runtime.env import reload

        reload()  # flashattn reads its variables once: re-read them

        def fwd():
            return flashattn.flash_attn_func(q, k, v, causal=causal)

    if mode == "fwd":
        return fwd
    out = fwd()
    dout = torch.randn_like(out)
    return lambda: torch.autograd.grad(out, (q, k, v), dout, retain_graph=True)


def _flops(d: int, causal: bool, mode: str, s: int) -> float:
    b, h = max(1, 16384 // s), 2048 // d
    f = 4 * b * s * s * h * d / (2 if causal else 1)
    return f * (2.5 if mode == "bwd" else 1.0)


def _sampled_run(fn, seconds: float, period_ms: int):
    """Run ``fn`` back to back for ``seconds`` under nvidia-smi sampling.
    Returns (calls per second, [(sm MHz, watts, event-reason mask)])."""
    for _ in range(5):  # compile / warm up outside the sampled window
        fn()
    torch.cuda.synchronize()
    smi = subprocess.Popen(
        ["nvidia-smi", "--query-gpu=clocks.sm,power.draw,clocks_event_reasons.active",
         "--format=csv,noheader,nounits", f"-lms={period_ms}", "-i", "0"],
        stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    time.sleep(0.2)
    calls = 0
    t0 = time.perf_counter()
    while time.perf_counter() - t0 < seconds:
        for _ in range(10):
            fn()
        calls += 10
        torch.cuda.synchronize()
    rate = calls / (time.perf_counter() - t0)
    smi.terminate()
    text, _ = smi.communicate(timeout=5)
    return rate, parse_samples(text)


def parse_samples(text: str):
    """nvidia-smi's csv lines 'MHz, W, 0xMASK' -> [(MHz, W, mask)]; other lines (a header,
    '[N/A]' values, a line cut by terminate()) are skipped."""
    samples = []
    for line in text.splitlines():
        parts = [p.strip() for p in line.split(",")]
        try:
            samples.append((float(parts[0]), float(parts[1]), int(parts[2], 16)))
        except (ValueError, IndexError):
            continue
    return samples


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--points", default="128:0:fwd,128:1:fwd,128:0:bwd,128:1:bwd",
                    help="d:causal:mode,... (mode fwd | bwd)")
    ap.add_argument("--s", type=int, default=16384)
    ap.add_argument("--impls", default="hopper,cudnn")
    ap.add_argument("--seconds", type=float, default=4.0)
    ap.add_argument("--repeat", type=int, default=2)
    ap.add_argument("--period-ms", type=int, default=20)
    ap.add_argument("--json", default="")
    args = ap.parse_args()
    os.environ.setdefault("FLASHATTN_AUTOTUNE", "0")
    rows = []
    for point in args.points.split(","):
        d, causal, mode = point.split(":")
        d, causal = int(d), bool(int(causal))
        steps = {impl: _step(impl, d, causal, mode, args.s) for impl in args.impls.split(",")}
        acc = {impl: {"tflops": [], "mhz": [], "watts": [], "capped": []} for impl in steps}
        for _ in range(args.repeat):
            for impl, fn in steps.items():
                rate, samples = _sampled_run(fn, args.seconds, args.period_ms)
                acc[impl]["tflops"].append(rate * _flops(d, causal, mode, args.s) * 1e-12)
                acc[impl]["mhz"] += [x[0] for x in samples]
                acc[impl]["watts"] += [x[1] for x in samples]
                # bit 0x4: SW power cap; 0x20 / 0x40: HW slowdown / thermal
                acc[impl]["capped"] += [bool(x[2] & 0x4) for x in samples]
        for impl, a in acc.items():
            row = dict(d=d, causal=causal, mode=mode, s=args.s, impl=impl,
                       tflops=round(statistics.median(a["tflops"]), 1),
                       sm_mhz=statistics.median(a["mhz"]) if a["mhz"] else None,
                       watts=statistics.median(a["watts"]) if a["watts"] else None,
                       power_capped_share=(round(sum(a["capped"]) / len(a["capped"]), 2)
                                           if a["capped"] else None),
                       samples=len(a["mhz"]))
            if row["tflops"] and row["sm_mhz"]:
                # work per clock: TFLOP/s per GHz, comparable across clocks
                row["tflops_per_ghz"] = round(row["tflops"] / (row["sm_mhz"] / 1000), 1)
            rows.append(row)
            print(json.dumps(row), flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"rows": rows, "device": torch.cuda.get_device_name()}, f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
