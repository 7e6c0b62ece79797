"""One forward attention call, repeated, for a profiler (``ncu``) to capture.

    ncu --kernel-name regex:attn_fwd --launch-skip 2 --launch-count 1 --set full \
        python3 benchmarks/profile_fwd.py --impl hopper --d 128 --s 16384
``--impl``: hopper | portable (FLASHATTN_BACKEND) | cudnn (SDPA's cuDNN backend). bf16, 16k
tokens per call, h*d = 2048 (the benchmark grid's shapes). Runs ``--calls`` calls (default 3)
so the profiler can skip the first (compile / warm-up) launches.
"""
from __future__ import annotations

import argparse
import os
import sys

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "src"))


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--impl", default="hopper", choices=["hopper", "portable", "cudnn"])
    ap.add_argument("--d", type=int, default=128)
    ap.add_argument("--s", type=int, default=16384)
    ap.add_argument("--causal", action="store_true")
    ap.add_argument("--calls", type=int, default=3)
    args = ap.parse_args()
    b, h = max(1, 16384 // args.s), 2048 // args.d
    q, k, v = (torch.randn(b, args.s, h, args.d, device="cuda", dtype=torch.bfloat16)
               for _ in range(3))
    if args.impl == "cudnn":
        from torch.nn.attention import SDPBackend, sdpa_kernel

        qt, kt, vt = (x.transpose(1, 2).contiguous() for x in (q, k, v))
        with sdpa_kernel([SDPBackend.CUDNN_ATTENTION]):
            for _ in range(args.calls):
                F.scaled_dot_product_attention(qt, kt, vt, is_causal=args.causal)
    else:
        os.environ["FLASHATTN_BACKEND"] = args.impl
        os.environ.setdefault("FLASHATTN_AUTOTUNE", "0")
        import flashattn

        for _ in range(args.calls):
            flashattn.flash_attn_func(q, k, v, causal=args.causal)
    torch.cuda.synchronize()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
