"""MLA decode probe: FlashAttention-3's ``qv`` through ``flashattn.fa3.flash_attn_with_kvcache``.

DeepSeek's decode shape: 128 query heads over one latent KV head, q 64 wide, qv / v_cache 512
wide, pages of 64 (``--page``; shuffled), one new token per step (no append here: attention
only), bf16 or an FP8 (e4m3) latent cache. Two rates per row, CUDA-graph replays (``triton.testing.do_bench``
median): bandwidth = bytes of the K / V cache read once (b * s_k * (64 + 512) * element size)
/ time, and TFLOP/s = 2 * b * 128 * s_k * (64 + 512 + 512) / time (scores and PV). With 128
heads over one latent head a key costs ~242 FLOP per byte of bf16 cache (~480 for FP8), near
or past the H100's ridge point, so the FLOP rate is the one to watch.
Launch-config variants: ``--configs "32,8,2,0;16,8,2,0"`` (FLASHATTN_DECODE_CONFIG:
BLOCK_N, warps, stages, TMA) times ``--block-m 64,32`` (the packed query tile; patched into
the decode wrapper for this probe only). Each variant's output is checked against a float32
torch computation once. ``--families hopper,portable``: the default routing (the Hopper MLA
decode kernel where it covers the call) and ``use_backend("portable")`` (the portable decode
kernel), points interleaved; the launch-config variants apply to the portable kernel only.
``--dense``: beside each bf16 point, the same problem through the dense entry
(``fa3.flash_attn_func(q, k, v, qv=qv)``, contiguous keys) and our dense bf16 forward with the
128 heads' query rows packed into one sequence over the one KV head (not causal: s_q of 1-8
rows hides at most 7 of the keys) at d 256 / d_v 512 (the widest q / k our dense kernels take)
and at d 128 / d_v 128; each rate over that call's own FLOPs.

    python benchmarks/probes/mla_decode_probe.py --out $OUT/mla.json
"""
from __future__ import annotations

import argparse
import json
import os
import sys

import torch
import triton

sys.path.append(os.path.join(os.path.dirname(__file__), "..", "..", "src"))

import flashattn  # noqa: E402
from flashattn import fa3  # noqa: E402
from flashattn.runtime.env import override  # noqa: E402
from flashattn.backends.triton import decode as _decode  # noqa: E402
from flashattn.backends.sm90 import latent as _latent  # noqa: E402

H, H_K, D, D_V, PAGE = 128, 1, 64, 512, 64


def _graphed(fn):
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(3):
            fn()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        fn()
    return graph.replay


def _inputs(b: int, s_k: int, fp8: bool, s_q: int = 1, page: int = PAGE):
    dev, bf = "cuda", torch.bfloat16
    n_pages = s_k // page
    k = torch.randn(b * n_pages, page, H_K, D, device=dev, dtype=bf)
    v = torch.randn(b * n_pages, page, H_K, D_V, device=dev, dtype=bf)
    table = torch.randperm(b * n_pages, device=dev).view(b, n_pages).to(torch.int32)
    x = dict(q=torch.randn(b, s_q, H, D, device=dev, dtype=bf),
             qv=torch.randn(b, s_q, H, D_V, device=dev, dtype=bf),
             k_cache=k, v_cache=v, page_table=table,
             cache_seqlens=torch.full((b,), s_k, dtype=torch.int32, device=dev))
    if fp8:
        x["k_cache"], x["v_cache"] = k.to(torch.float8_e4m3fn), v.to(torch.float8_e4m3fn)
        x["k_descale"] = torch.ones(b, H_K, device=dev)
        x["v_descale"] = torch.ones(b, H_K, device=dev)
    return x


def _unpaged(x: dict):
    """The paged K / V caches of ``x`` as contiguous (b, s_k, 1, d) / (b, s_k, 1, d_v)."""
    b, n_pages = x["page_table"].shape
    rows = x["page_table"].long()
    s_k = n_pages * x["k_cache"].shape[1]
    return (x["k_cache"][rows].reshape(b, s_k, H_K, D),
            x["v_cache"][rows].reshape(b, s_k, H_K, D_V))


def _check(out: torch.Tensor, x: dict) -> float:
    """max |out - float32 torch| over the batch (the absorbed MLA formula, no paging)."""
    k, v = (t.float().flatten(2) for t in _unpaged(x))
    s = (torch.einsum("bqhd,bkd->bhqk", x["q"].float(), k)
         + torch.einsum("bqhd,bkd->bhqk", x["qv"].float(), v)) * (D + D_V) ** -0.5
    if x.get("causal"):  # (bottom-right: query row i sees keys <= i + s_k - s_q)
        s_q, s_k = s.shape[2], s.shape[3]
        hidden = torch.arange(s_k, device=s.device) > (torch.arange(s_q, device=s.device)
                                                       + s_k - s_q)[:, None]
        s = s.masked_fill(hidden, float("-inf"))
    ref = torch.einsum("bhqk,bkd->bqhd", torch.softmax(s, dim=-1), v)
    return (out.float() - ref).abs().max().item()


def _dense_rows(x: dict, b: int, s_k: int, s_q: int) -> list:
    """The same MLA problem through the dense entry, and packed dense bf16 forwards at its
    shape: rows of (impl, ms, TFLOP/s over the call's own FLOPs)."""
    k, v = _unpaged(x)
    calls = [("fa3_dense_qv", lambda: fa3.flash_attn_func(x["q"], k, v, qv=x["qv"],
                                                          causal=s_q > 1),
              2 * b * s_q * H * s_k * (D + 2 * D_V))]
    for d, d_v in ((256, 512), (128, 128)):
        qd = torch.randn(b, s_q * H, 1, d, device="cuda", dtype=torch.bfloat16)
        kd = torch.randn(b, s_k, 1, d, device="cuda", dtype=torch.bfloat16)
        vd = torch.randn(b, s_k, 1, d_v, device="cuda", dtype=torch.bfloat16)
        calls.append((f"dense_packed_d{d}_dv{d_v}",
                      lambda qd=qd, kd=kd, vd=vd: flashattn.flash_attn_func(qd, kd, vd),
                      2 * b * s_q * H * s_k * (d + d_v)))
    out = []
    for impl, fn, flops in calls:  # (_graphed warms each call up before its capture)
        ms = triton.testing.do_bench(_graphed(fn), warmup=25, rep=100, return_mode="median")
        out.append(dict(b=b, s_k=s_k, s_q=s_q, fp8=False, family=impl, ms=round(ms, 4),
                        tflops=round(flops / ms / 1e9, 1)))
    return out


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--points", default="4x8192,32x8192,4x32768,64x4096")
    ap.add_argument("--configs", default="")
    ap.add_argument("--block-m", default="64")
    ap.add_argument("--fp8", default="0,1")
    ap.add_argument("--families", default="hopper,portable")
    ap.add_argument("--splits", default="0", help="num_splits values (0: the heuristic's)")
    ap.add_argument("--s-q", type=int, default=1, help="query rows per sequence (causal when > 1)")
    ap.add_argument("--page", type=int, default=PAGE, help="keys per page (default 64)")
    ap.add_argument("--knob", default="",
                    help="NAME=v1,v2: the Hopper kernel's module-level switch "
                         "(backends/sm90/latent.py, e.g. NUM_STAGES=2,3) at each value, "
                         "interleaved")
    ap.add_argument("--dense", action="store_true",
                    help="also time the dense entry with qv and packed dense bf16 forwards")
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    rows = []
    default_block_m = _decode.block_m_for
    defaults = {k: v for k, v in vars(_latent).items() if k.isupper()}
    for point in args.points.split(","):
        b, s_k = (int(t) for t in point.split("x"))
        for fp8 in (bool(int(f)) for f in args.fp8.split(",")):
            x = _inputs(b, s_k, fp8, args.s_q, args.page)
            if args.s_q > 1:  # (speculative decoding: the new rows see the keys before them)
                x["causal"] = True
            elem = 1 if fp8 else 2
            nbytes = b * s_k * H_K * (D + D_V) * elem
            flops = 2 * b * args.s_q * H * s_k * (D + 2 * D_V)
            knob, values = (args.knob.split("=") + [""])[:2] if args.knob else ("", "")
            settings = [int(v) for v in values.split(",") if v.strip()] or [None]
            splits = [int(t) for t in args.splits.split(",")]
            variants = ([("hopper", "", 64, v, n) for v in settings for n in splits]
                        if "hopper" in args.families else [])
            if "portable" in args.families:
                variants += [("portable", cfg, bm, None, n) for n in splits
                             for cfg in [""] + [c for c in args.configs.split(";") if c.strip()]
                             for bm in (int(t) for t in args.block_m.split(","))]
            for family, cfg, bm, value, n_splits in variants:
                if value is not None:  # (recorded launches carry the old constants)
                    setattr(_latent, knob, type(defaults[knob])(value))
                    _latent._PLANS.clear()
                _decode.block_m_for = lambda rows, d_v=0, bm=bm: max(16, min(
                    bm, triton.next_power_of_2(max(1, rows))))
                _decode._launch_plan.cache_clear()
                backend = "auto" if family == "hopper" else "portable"
                with override(decode_config=cfg), flashattn.use_backend(backend):
                    fn = lambda: fa3.flash_attn_with_kvcache(**x, num_splits=n_splits)  # noqa: E731
                    err = _check(fn(), x)
                    ms = triton.testing.do_bench(_graphed(fn), warmup=25, rep=100,
                                                 return_mode="median")
                row = dict(b=b, s_k=s_k, s_q=args.s_q, page=args.page, fp8=fp8, family=family,
                           splits=n_splits,
                           knob=f"{knob}={getattr(_latent, knob)}" if knob else "",
                           config=cfg or "default",
                           block_m=bm, ms=round(ms, 4), tbps=round(nbytes / ms / 1e9, 3),
                           tflops=round(flops / ms / 1e9, 1), max_err=round(err, 5))
                print(json.dumps(row), flush=True)
                rows.append(row)
            if args.dense and not fp8:
                for row in _dense_rows(x, b, s_k, args.s_q):
                    print(json.dumps(row), flush=True)
                    rows.append(row)
    _decode.block_m_for = default_block_m
    for k, v in defaults.items():
        setattr(_latent, k, v)
    if args.out:
        meta = dict(device=torch.cuda.get_device_name(), torch=torch.__version__,
                    triton=triton.__version__)
        with open(args.out, "w") as f:
            json.dump(dict(meta=meta, rows=rows), f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
