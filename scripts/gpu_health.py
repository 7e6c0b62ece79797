"""Is this GPU fit to benchmark? bf16 8192^3 matmul TFLOP/s (ANCHORS.md: 774 on a healthy H100)
and the driver's clock-event reasons. Exits 3 when the matmul is below --min (default 600):
a power-braked or throttled machine gives numbers that say nothing about our kernels."""
import argparse
import subprocess
import sys

import torch
import triton

ap = argparse.ArgumentParser()
ap.add_argument("--min", type=float, default=600.0)
args = ap.parse_args()
a = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
b = torch.randn_like(a)
ms = triton.testing.do_bench(lambda: a @ b, warmup=100, rep=500, return_mode="median")
tflops = 2 * 8192 ** 3 / ms * 1e-9
perf = subprocess.run(["nvidia-smi", "-q", "-d", "PERFORMANCE"], capture_output=True, text=True).stdout
active = [line.split(":")[0].strip() for line in perf.splitlines()
          if line.strip().endswith(": Active") and "Idle" not in line]
print(f"gpu health: matmul 8192^3 bf16 {tflops:.0f} TFLOP/s; clock events active: {active or 'none'}")
sys.exit(0 if tflops >= args.min else 3)
