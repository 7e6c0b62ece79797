"""FP8 attention accuracy, the FlashAttention-3 paper's way (its section 4.3), on any device.

Inputs: entries of Q, K, V drawn from N(0, 1) + N(0, 100) · Bernoulli(0.001) (0.1% of entries
with std 10), or plain N(0, 1) (``--dist normal``). RMSE of the output against exact
attention in float64, for:

- ``bf16``: our attention on bf16 inputs (``flash_attn_func``);
- ``fp8 per-tensor``: one scale per tensor, no incoherent processing (the paper's baseline);
- ``fp8 block``: ``flashattn.fp8.quantize(incoherent=False)``;
- ``fp8 block + incoherent``: ``flashattn.fp8.quantize(incoherent=True)``.

The FP8 rows compute attention over the quantized tensors with ``reference.attention_fp8_ref``
(exact products of the fp8 values, P cast to e4m3 after scaling by 2^8): the accuracy the FP8
kernels must reach, measured before they exist.

    python benchmarks/probes/fp8_accuracy.py --seqlens 1024,2048 --heads 4 --d 64,128,256
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
from flashattn.backends.cpu.fp8 import E4M3_MAX  # noqa: E402
from flashattn.reference import attention_fp8_ref, attention_ref  # noqa: E402


def outlier_inputs(shape, dist: str, gen: torch.Generator) -> torch.Tensor:
    x = torch.randn(shape, generator=gen, dtype=torch.float64)
    if dist == "outliers":
        mask = torch.rand(shape, generator=gen, dtype=torch.float64) < 1e-3
        x = x + torch.randn(shape, generator=gen, dtype=torch.float64) * 10.0 * mask
    return x


def per_tensor(x: torch.Tensor):
    """One scale for the whole tensor: (x8, descale broadcast to the block layout, block)."""
    b, s, h, _ = x.shape
    amax = x.abs().amax().float()
    descale = amax / E4M3_MAX
    x8 = (x.float() / descale).to(torch.float8_e4m3fn)
    return x8, descale.expand(b, h, 1).contiguous(), s


def rmse(out: torch.Tensor, ref: torch.Tensor) -> float:
    return (out.double() - ref).pow(2).mean().sqrt().item()


def measure(b: int, s: int, h: int, d: int, dist: str, causal: bool, seed: int) -> dict:
    gen = torch.Generator().manual_seed(seed)
    q, k, v = (outlier_inputs((b, s, h, d), dist, gen) for _ in range(3))
    ref = attention_ref(q, k, v, causal=causal)[0]
    row = dict(b=b, s=s, h=h, d=d, dist=dist, causal=causal)
    with flashattn.use_backend("cpu"):
        out = flashattn.flash_attn_func(q.bfloat16(), k.bfloat16(), v.bfloat16(), causal=causal)
    row["bf16"] = rmse(out, ref)
    (q8, qs, bq), (k8, ks, bk), (v8, vs, _) = per_tensor(q), per_tensor(k), per_tensor(v)
    row["fp8 per-tensor"] = rmse(attention_fp8_ref(q8, k8, v8, qs, ks, vs, bq, bk,
                                                   causal=causal), ref)
    for name, incoherent in (("fp8 block", False), ("fp8 block + incoherent", True)):
        r = fp8.quantize(q.float(), k.float(), v.float(), incoherent=incoherent, seed=seed)
        out = attention_fp8_ref(r.q, r.k, r.v, r.q_descale, r.k_descale, r.v_descale,
                                r.block_m, r.block_n, causal=causal)
        row[name] = rmse(out, ref)
    row["gain vs per-tensor"] = row["fp8 per-tensor"] / row["fp8 block + incoherent"]
    return row


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seqlens", default="1024,2048")
    ap.add_argument("--heads", type=int, default=4)
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--d", default="64,128,256")
    ap.add_argument("--dist", choices=("outliers", "normal"), default="outliers")
    ap.add_argument("--causal", action="store_true")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--json", default="")
    args = ap.parse_args()
    rows = []
    cols = ["bf16", "fp8 per-tensor", "fp8 block", "fp8 block + incoherent",
            "gain vs per-tensor"]
    print(f"{'d':>4} {'s':>6} " + " ".join(f"{c:>22}" for c in cols))
    for d in (int(x) for x in args.d.split(",")):
        for s in (int(x) for x in args.seqlens.split(",")):
            row = measure(args.batch, s, args.heads, d, args.dist, args.causal, args.seed)
            rows.append(row)
            print(f"{d:>4} {s:>6} " + " ".join(f"{row[c]:>22.3e}" for c in cols), flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(dict(rows=rows, torch=torch.__version__), f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
