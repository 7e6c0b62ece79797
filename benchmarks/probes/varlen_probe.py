"""Varlen probe: packed ragged batches through ``flash_attn_varlen_func`` vs the anchors that
take packed sequences (FlexAttention with a document mask; SDPA on a jagged nested tensor).

Each batch packs sequences whose lengths are drawn (seeded) around a mean length and sum to
16k tokens; bf16, h=16, d=128 (h*d = 2048 as in the dense grid; ``--headdim`` changes d). TFLOP/s count only the useful
work: sum over sequences of 4 * s_i^2 * h * d (x0.5 causal; x2.5 for the backward). For scale,
the dense call with as many sequences of equal length (16k / count) runs as ``flashattn-dense``.

    python benchmarks/probes/varlen_probe.py --out $OUT/varlen.json [--means 1024,4096] [--budget 200]

``flashattn`` is the auto dispatch; ``flashattn-portable`` / ``flashattn-hopper`` force one
kernel family (the Hopper kernels' varlen modes, forward and backward).
``fp8`` / ``fp8-portable`` / ``fp8-dense``: the same batches cast to e4m3 through FA3's FP8 API
(unit descales; forward only), auto / portable kernels / equal lengths dense.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time
from typing import Callable, Dict, List, Sequence

import torch
import triton

sys.path.append(os.path.join(os.path.dirname(__file__), "..", "..", "src"))
import flashattn  # noqa: E402

TOKENS, H, D = 16384, 16, 128


def ragged_lengths(mean: int, total: int = TOKENS, seed: int = 0) -> List[int]:
    """Lengths uniform in [mean/4, 7*mean/4] (seeded), the last one trimmed so they sum to total."""
    gen = torch.Generator().manual_seed(seed)
    lengths: List[int] = []
    while sum(lengths) < total:
        lengths.append(int(torch.randint(max(1, mean // 4), 7 * mean // 4 + 1, (1,), generator=gen)))
    lengths[-1] -= sum(lengths) - total
    return [n for n in lengths if n > 0]


def useful_flops(lengths: Sequence[int], causal: bool, mode: str) -> float:
    f = sum(4.0 * n * n * H * D for n in lengths) * (0.5 if causal else 1.0)
    return f * (2.5 if mode == "bwd" else 1.0)


def _cu(lengths: Sequence[int], device: str) -> torch.Tensor:
    cu = torch.zeros(len(lengths) + 1, dtype=torch.int32)
    cu[1:] = torch.tensor(lengths).cumsum(0)
    return cu.to(device)


def build(impl: str, lengths: List[int], causal: bool, q, k, v) -> Callable[[], torch.Tensor]:
    """fn() -> out for packed q, k, v (total, h, d)."""
    if impl == "flashattn":
        cu, m = _cu(lengths, "cuda"), max(lengths)
        return lambda: flashattn.flash_attn_varlen_func(q, k, v, cu, cu, m, m, causal=causal)
    if impl in ("flashattn-portable", "flashattn-hopper"):  # one family forced
        cu, m = _cu(lengths, "cuda"), max(lengths)
        name = impl.split("-")[1]

        def forced():
            with flashattn.use_backend(name):
                return flashattn.flash_attn_varlen_func(q, k, v, cu, cu, m, m, causal=causal)
        return forced
    if impl.startswith("fp8"):  # FA3's FP8 API: e4m3 q / k / v, one descale per (seq, head)
        f8 = torch.float8_e4m3fn
        q8, k8, v8 = (x.detach().to(f8) for x in (q, k, v))
        n = len(lengths)
        if impl == "fp8-dense":  # equal lengths at the mean
            s = TOKENS // n
            q8, k8, v8 = (x[: s * n].view(n, s, H, D) for x in (q8, k8, v8))
        ones = torch.ones(n, H, device="cuda")
        kw = dict(causal=causal, q_descale=ones, k_descale=ones, v_descale=ones)
        if impl == "fp8-dense":
            return lambda: flashattn.flash_attn_func(q8, k8, v8, **kw)
        cu, m = _cu(lengths, "cuda"), max(lengths)
        name = "portable" if impl == "fp8-portable" else "auto"

        def fp8_varlen():
            with flashattn.use_backend(name):
                return flashattn.flash_attn_varlen_func(q8, k8, v8, cu, cu, m, m, **kw)
        return fp8_varlen
    if impl == "flashattn-dense":  # equal lengths at the mean: what varlen should approach
        n = TOKENS // len(lengths)
        qd, kd, vd = (x[: n * len(lengths)].view(len(lengths), n, H, D) for x in (q, k, v))
        return lambda: flashattn.flash_attn_func(qd, kd, vd, causal=causal)
    if impl == "flex":
        from torch.nn.attention.flex_attention import create_block_mask, flex_attention

        doc = torch.repeat_interleave(torch.arange(len(lengths), device="cuda"),
                                      torch.tensor(lengths, device="cuda"))
        total = doc.numel()

        def mask_mod(b, h, q_idx, kv_idx):
            same = doc[q_idx] == doc[kv_idx]
            return (same & (kv_idx <= q_idx)) if causal else same

        block_mask = create_block_mask(mask_mod, None, None, total, total, device="cuda")
        compiled = torch.compile(flex_attention, dynamic=False)
        qt, kt, vt = (x.detach().transpose(0, 1).unsqueeze(0).contiguous()
                      .requires_grad_(x.requires_grad) for x in (q, k, v))
        return lambda: compiled(qt, kt, vt, block_mask=block_mask)
    if impl == "sdpa-jagged":
        import torch.nn.functional as F

        offsets = _cu(lengths, "cuda").long()
        nts = [torch.nested.nested_tensor_from_jagged(x, offsets).transpose(1, 2) for x in (q, k, v)]
        return lambda: F.scaled_dot_product_attention(*nts, is_causal=causal)
    raise ValueError(f"impl={impl!r}")


def measure(impl: str, lengths: List[int], causal: bool, mode: str) -> float:
    """Median ms of the forward (mode 'fwd') or of the backward alone (mode 'bwd')."""
    grad = mode == "bwd"
    q, k, v = (torch.randn(TOKENS, H, D, device="cuda", dtype=torch.bfloat16, requires_grad=grad)
               for _ in range(3))
    fn = build(impl, lengths, causal, q, k, v)
    if mode == "fwd":
        return triton.testing.do_bench(fn, warmup=10, rep=40)
    out = fn()
    dout = torch.randn_like(out)  # nested outputs get a nested gradient of the same layout
    inputs = [x for x in (q, k, v)]
    if impl == "flex":
        inputs = None  # grads land on flex's own copies
    # a forced family holds for the backward too (autograd runs it outside build's block)
    name = impl.split("-")[1] if impl in ("flashattn-portable", "flashattn-hopper") else "auto"

    def backward():
        with flashattn.use_backend(name):
            out.backward(dout, retain_graph=True)
    return triton.testing.do_bench(backward, warmup=10, rep=40, grad_to_none=inputs)


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--means", default="1024,4096")
    ap.add_argument("--impls", default="flashattn,flashattn-dense,flex,sdpa-jagged")
    ap.add_argument("--modes", default="fwd,bwd")
    ap.add_argument("--out", default=None)
    ap.add_argument("--budget", type=float, default=200.0)
    ap.add_argument("--headdim", type=int, default=128,
                    help="head dim d; nheads = 2048 / d (hidden 2048, as the dense grid)")
    ap.add_argument("--equal", action="store_true",
                    help="every sequence at the mean length (the varlen mode's own cost: "
                         "compare with flashattn-dense, the same tiles)")
    args = ap.parse_args()
    global H, D  # (read by useful_flops / build / measure at call time)
    D, H = args.headdim, 2048 // args.headdim
    start = time.time()
    rows: List[Dict[str, object]] = []
    for mean in (int(m) for m in args.means.split(",")):
        lengths = [mean] * (TOKENS // mean) if args.equal else ragged_lengths(mean)
        for causal in (False, True):
            for mode in args.modes.split(","):
                for impl in args.impls.split(","):
                    if time.time() - start > args.budget:
                        print("budget spent; stopping")
                        break
                    try:
                        ms = measure(impl, lengths, causal, mode)
                        work = ([TOKENS // len(lengths)] * len(lengths)
                                if impl in ("flashattn-dense", "fp8-dense") else lengths)
                        tf = useful_flops(work, causal, mode) / ms * 1e-9
                        err = None
                    except Exception as exc:  # an anchor that cannot run this shape
                        ms, tf, err = None, None, f"{type(exc).__name__}: {str(exc)[:200]}"
                    row = dict(impl=impl, mode=mode, mean_s=mean, n_seqs=len(lengths),
                               equal=args.equal,
                               causal=causal, h=H, d=D, ms=ms, tflops=tf, error=err)
                    rows.append(row)
                    print(f"mean {mean:5d} ({len(lengths):3d} seqs) causal={int(causal)} {mode} "
                          f"{impl:16s} " + (f"{ms:7.3f} ms {tf:6.1f} TFLOP/s" if ms else err))
                    torch.cuda.empty_cache()
    if args.out:
        meta = dict(gpu=torch.cuda.get_device_name(), torch=torch.__version__,
                    triton=triton.__version__, date=time.strftime("%Y-%m-%d"))
        with open(args.out, "w") as f:
            json.dump({"meta": meta, "rows": rows}, f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
