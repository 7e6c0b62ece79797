"""cuDNN's FP8 SDPA as a same-run anchor for flashattn's FP8 forward.

cuDNN is reached through its Python frontend (``nvidia-cudnn-frontend``, carried to the GPU
machine as a wheel: ``pip install --no-deps --target DIR``, then ``PYTHONPATH=DIR``); it uses
the libcudnn that torch already loaded. cuDNN's FP8 graph on Hopper takes per-tensor
descales and writes an e4m3 output; ours takes FA3's (batch, kv head) descales and writes
bf16. Both see the same e4m3 Q, K, V (quantized once from the same bf16 tensors); the rows
also time our bf16 forward and cuDNN's bf16 SDPA on those bf16 tensors. 16k tokens, hidden
2048 (h = 2048 / d), b = 1; TFLOP/s from do_bench medians, all interleaved (3 rounds, best).

    PYTHONPATH=/tmp/cudnnfe:src python benchmarks/probes/cudnn_fp8_anchor.py --json out.json
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


def tflops(ms: float, b: int, s: int, h: int, d: int, causal: bool) -> float:
    flops = 4.0 * b * h * s * s * d * (0.5 if causal else 1.0)
    return flops / (ms * 1e-3) / 1e12


def cudnn_fp8(q8, k8, v8, causal):
    """A callable running cuDNN's FP8 SDPA forward on (b, s, h, d) e4m3 tensors."""
    import cudnn

    handle = cudnn.create_handle()
    cudnn.set_stream(handle=handle, stream=torch.cuda.current_stream().cuda_stream)
    e4m3, fp32 = cudnn.data_type.FP8_E4M3, cudnn.data_type.FLOAT
    graph = cudnn.pygraph(io_data_type=e4m3, intermediate_data_type=fp32,
                          compute_data_type=fp32, handle=handle)
    b, s, h, d = q8.shape
    dims = (b, h, s, d)  # cuDNN's order; our (b, s, h, d) memory as strides
    strides = (s * h * d, d, h * d, 1)
    qt, kt, vt = (graph.tensor(name=n, dim=dims, stride=strides, data_type=e4m3)
                  for n in ("q", "k", "v"))
    scalar = dict(dim=(1, 1, 1, 1), stride=(1, 1, 1, 1), data_type=fp32)
    names = ("descale_q", "descale_k", "descale_v", "descale_s", "scale_s", "scale_o")
    scales = [graph.tensor(name=n, **scalar) for n in names]
    o, _stats, amax_s, amax_o = graph.sdpa_fp8(
        q=qt, k=kt, v=vt, descale_q=scales[0], descale_k=scales[1], descale_v=scales[2],
        descale_s=scales[3], scale_s=scales[4], scale_o=scales[5], is_inference=True,
        attn_scale=d ** -0.5, use_causal_mask=causal, name="sdpa_fp8")
    o.set_output(True).set_dim(dims).set_stride(strides).set_data_type(e4m3)
    for amax in (amax_s, amax_o):
        amax.set_output(True).set_dim((1, 1, 1, 1)).set_stride((1, 1, 1, 1)).set_data_type(fp32)
    graph.validate()
    graph.build_operation_graph()
    graph.create_execution_plans([cudnn.heur_mode.A, cudnn.heur_mode.FALLBACK])
    graph.check_support()
    graph.build_plans()
    out = torch.empty_like(q8)
    one = torch.ones(1, 1, 1, 1, dtype=torch.float32, device=q8.device)
    # descale_s / scale_s: P is cast to e4m3 in [0, 1]; scale it up by 2^8 (FA3's choice)
    up, down = torch.full_like(one, 256.0), torch.full_like(one, 1 / 256.0)
    amax_bufs = [torch.empty_like(one), torch.empty_like(one)]
    pack = {qt: q8, kt: k8, vt: v8, scales[0]: one, scales[1]: one, scales[2]: one,
            scales[3]: down, scales[4]: up, scales[5]: one, o: out,
            amax_s: amax_bufs[0], amax_o: amax_bufs[1]}
    workspace = torch.empty(graph.get_workspace_size(), dtype=torch.uint8, device=q8.device)

    def run():
        graph.execute(pack, workspace, handle=handle)
    return run, out


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--json", default="")
    ap.add_argument("--dims", default="256,128,64")
    args = ap.parse_args()
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel

    rows = []
    s, b = 16384, 1
    for d in (int(x) for x in args.dims.split(",")):
        h = 2048 // d
        torch.manual_seed(d)
        x = [torch.randn(b, s, h, d, device="cuda", dtype=torch.bfloat16) for _ in range(3)]
        x8 = [t.to(torch.float8_e4m3fn) for t in x]
        one = torch.ones(b, h, device="cuda", dtype=torch.float32)
        for causal in (False, True):
            fns = {
                "ours_fp8": lambda: flashattn.flash_attn_func(
                    *x8, causal=causal, q_descale=one, k_descale=one, v_descale=one),
                "ours_bf16": lambda: flashattn.flash_attn_func(*x, causal=causal),
            }
            xt = [t.transpose(1, 2) for t in x]

            def cudnn_bf16():
                with sdpa_kernel([SDPBackend.CUDNN_ATTENTION]):
                    F.scaled_dot_product_attention(*xt, is_causal=causal)
            fns["cudnn_bf16"] = cudnn_bf16
            err = None
            try:
                run, out8 = cudnn_fp8(*x8, causal)
                run()
                torch.cuda.synchronize()
                fns["cudnn_fp8"] = run
                ours = flashattn.flash_attn_func(*x8, causal=causal, q_descale=one,
                                                 k_descale=one, v_descale=one)
                # cuDNN's O is e4m3 (3 mantissa bits): agreement within its rounding
                err = (out8.float() - ours.float()).abs().max().item()
            except Exception as exc:  # the anchor is optional: say why it is missing
                err = f"{type(exc).__name__}: {str(exc)[:300]}"
            best = {k: float("inf") for k in fns}
            for _ in range(3):
                for name, fn in fns.items():
                    best[name] = min(best[name], do_bench(fn, warmup=10, rep=60))
            row = dict(d=d, h=h, s=s, causal=causal,
                       **{f"{k}_tflops": round(tflops(v, b, s, h, d, causal), 1)
                          for k, v in best.items()},
                       cudnn_fp8_vs_ours_maxabs=err)
            rows.append(row)
            print(json.dumps(row), flush=True)
    if args.json:
        import cudnn
        with open(args.json, "w") as f:
            json.dump(dict(rows=rows, gpu=torch.cuda.get_device_name(), torch=torch.__version__,
                           cudnn=torch.backends.cudnn.version(),
                           cudnn_frontend=getattr(cudnn, "__version__", "?")), f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
