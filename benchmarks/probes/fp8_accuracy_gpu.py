"""FP8 accuracy of the kernels themselves on the GPU, the FlashAttention-3 paper's way (its
section 4.3): entries N(0, 1) + N(0, 100) · Bernoulli(0.001), RMSE of the output against
exact attention in float64 (computed on the GPU head by head, query chunk by chunk), for

- ``bf16``: ``flash_attn_func`` on the bf16 inputs;
- ``fp8 per-tensor``: one scale per tensor, no rotation, through FA3's descale API;
- ``fp8 block``: ``fp8.flash_attn_fp8_func(incoherent=False)``;
- ``fp8 block + incoherent``: ``fp8.flash_attn_fp8_func()`` (the full method).

    python benchmarks/probes/fp8_accuracy_gpu.py --seqlens 4096,16384 --d 64,128,256 \
        --json $OUT/fp8_accuracy_gpu.json
"""
from __future__ import annotations

import argparse
import json
import os
import sys

import torch

sys.path.append(os.path.join(os.path.dirname(__file__), "..", "..", "src"))
import flashattn  # noqa: E402
from flashattn import fp8  # noqa: E402


def exact_attention(q, k, v, causal: bool, chunk: int = 2048) -> torch.Tensor:
    """float64 softmax(q k^T / sqrt(d)) v, (b, s, h, d), in query chunks per (batch, head)."""
    b, s, h, d = q.shape
    out = torch.empty(q.shape, dtype=torch.float64, device=q.device)
    for bi in range(b):
        for hi in range(h):
            kk, vv = k[bi, :, hi].double(), v[bi, :, hi].double()
            for i in range(0, s, chunk):
                qq = q[bi, i:i + chunk, hi].double() * d ** -0.5
                sc = qq @ kk.T
                if causal:
                    rows = torch.arange(i, i + qq.shape[0], device=q.device)[:, None]
                    sc.masked_fill_(torch.arange(s, device=q.device)[None] > rows, float("-inf"))
                out[bi, i:i + chunk, hi] = torch.softmax(sc, dim=-1) @ vv
    return out


def rmse(a, b) -> float:
    return (a.double() - b).pow(2).mean().sqrt().item()


def measure(b, s, h, d, causal, seed) -> dict:
    g = torch.Generator(device="cuda").manual_seed(seed)

    def draw():
        shape = (b, s, h, d)
        x = torch.randn(shape, device="cuda", generator=g)
        x = x + torch.randn(shape, device="cuda", generator=g) * 10 * (
            torch.rand(shape, device="cuda", generator=g) < 1e-3)
        return x.bfloat16()

    q, k, v = draw(), draw(), draw()
    exact = exact_attention(q, k, v, causal)
    row = dict(b=b, s=s, h=h, d=d, causal=causal)
    row["bf16"] = rmse(flashattn.flash_attn_func(q, k, v, causal=causal), exact)
    amax = [x.float().abs().amax() / 448.0 for x in (q, k, v)]
    x8 = [(x.float() / a).to(torch.float8_e4m3fn) for x, a in zip((q, k, v), amax)]
    ds = [a.expand(b, h).contiguous() for a in amax]
    row["fp8 per-tensor"] = rmse(flashattn.flash_attn_func(
        *x8, causal=causal, q_descale=ds[0], k_descale=ds[1], v_descale=ds[2]), exact)
    row["fp8 block"] = rmse(fp8.flash_attn_fp8_func(q, k, v, causal=causal, incoherent=False),
                            exact)
    row["fp8 block + incoherent"] = rmse(fp8.flash_attn_fp8_func(q, k, v, causal=causal,
                                                                 seed=seed), exact)
    row["gain vs per-tensor"] = row["fp8 per-tensor"] / row["fp8 block + incoherent"]
    return row


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seqlens", default="4096,16384")
    ap.add_argument("--heads", type=int, default=16)
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--d", default="64,128,256")
    ap.add_argument("--causal", action="store_true")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--json", default="")
    args = ap.parse_args()
    cols = ["bf16", "fp8 per-tensor", "fp8 block", "fp8 block + incoherent",
            "gain vs per-tensor"]
    rows = []
    print(f"{'d':>4} {'s':>6} " + " ".join(f"{c:>22}" for c in cols), flush=True)
    for d in (int(x) for x in args.d.split(",")):
        for s in (int(x) for x in args.seqlens.split(",")):
            row = measure(args.batch, s, args.heads, d, args.causal, args.seed)
            rows.append(row)
            print(f"{d:>4} {s:>6} " + " ".join(f"{row[c]:>22.3e}" for c in cols), flush=True)
            if args.json:
                with open(args.json, "w") as f:
                    json.dump(dict(rows=rows, gpu=torch.cuda.get_device_name(),
                                   torch=torch.__version__), f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
