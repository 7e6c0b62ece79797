"""Ahead-of-time compile of the Hopper kernels for sm_90 on a machine without a GPU.

Gluon cannot run under TRITON_INTERPRET, so CI checks what it can: every shipped variant
compiles for sm_90 with no register spills. ``compile_fwd_variant`` builds exactly the
signature and constexprs a launch would (fwd.launch_args with CPU stand-in tensors).
Compiles with ``triton.compile(GluonASTSource(...), target=GPUTarget("cuda", 90, 32))``
(the Gluon counterpart of ``tools.aot_portable.compile_sm90``: these variants come from the host
code's own ``launch_args``, so the compile sees exactly what a launch would pass).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Dict, Optional

import torch


@dataclass
class CompileReport:
    name: str
    registers: Optional[int]
    spills: Optional[int]
    shared: int
    num_warps: int
    ptx: str

    def __str__(self) -> str:
        return (f"{self.name}: {self.registers} regs, {self.spills} spills, "
                f"{self.shared / 1024:.1f} KiB shared, {self.num_warps} warps")


def _ptxas_report(cubin: bytes) -> Dict[str, int]:
    """Registers and spill bytes of the cubin through cuobjdump --dump-resource-usage."""
    import os
    import re
    import subprocess
    import tempfile

    tool = os.path.join(os.path.dirname(__import__("triton").backends.nvidia.__file__), "bin",
                        "cuobjdump")
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(cubin)
        f.flush()
        txt = subprocess.run([tool, "--dump-resource-usage", f.name], capture_output=True,
                             text=True, check=True).stdout
    reg = re.search(r"REG:(\d+)", txt)
    stack = re.search(r"STACK:(\d+)", txt)
    local = re.search(r"LOCAL:(\d+)", txt)
    return dict(registers=int(reg.group(1)) if reg else None,
                spills=(int(stack.group(1)) if stack else 0) + (int(local.group(1)) if local else 0))


def _compile(kernel_fn, args, constexprs: Dict[str, Any], options: Dict[str, Any],
             tag: str) -> CompileReport:
    """Compile a Gluon kernel for sm_90 with the positional ``args`` and ``constexprs`` a launch
    would pass (CPU stand-in tensors are fine: only their types matter) and report resources."""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.experimental.gluon._runtime import GluonASTSource
    from triton.runtime.jit import mangle_type

    names = list(kernel_fn.arg_names)
    signature = {name: mangle_type(value) for name, value in zip(names, args)}
    signature.update({name: "constexpr" for name in constexprs})
    consts = {(names.index(k),): v for k, v in constexprs.items()}
    # None arguments are constexprs too (e.g. the FP8 descales of a bf16 forward variant)
    consts.update({(i,): None for i, value in enumerate(args) if value is None})
    src = GluonASTSource(kernel_fn, signature, consts)
    kernel = triton.compile(src, target=GPUTarget("cuda", 90, 32), options=options)
    res = _ptxas_report(kernel.asm["cubin"])
    return CompileReport(name=tag, registers=res["registers"], spills=res["spills"],
                         shared=kernel.metadata.shared, num_warps=kernel.metadata.num_warps,
                         ptx=kernel.asm["ptx"])


def _variant_key(head_dim, dtype, causal, window, softcap, overrides) -> str:
    # head_dim: d, or (d, d_v) when they differ ("d192x128")
    dims = "x".join(str(x) for x in head_dim) if isinstance(head_dim, (tuple, list)) else head_dim
    tag = f"fwd_d{dims}_{str(dtype).split('.')[-1]}" + ("_causal" if causal else "")
    if tuple(window) != (-1, -1):
        tag += f"_win{window[0]}_{window[1]}"
    if softcap:
        tag += "_softcap"
    if overrides:
        tag += "_" + "_".join(f"{k}{int(v) if isinstance(v, bool) else v}"
                              for k, v in overrides.items())
    return tag


def compile_fwd_variant(head_dim: int, dtype: torch.dtype = torch.bfloat16, *, causal: bool = False,
                        window: tuple = (-1, -1), softcap: float = 0.0,
                        overrides: Optional[Dict[str, Any]] = None,
                        sink: bool = False) -> CompileReport:
    """Compile one forward variant for sm_90 (no GPU needed) and report its resources.
    ``head_dim``: d, or (d, d_v) for V / O of another head dim; ``sink``: with learnable
    sinks folded into the epilogue."""
    from flashattn.backends.sm90.config import fwd_config
    from flashattn.backends.sm90.fwd import launch_args
    from flashattn.backends.sm90.fwd_kernel import attn_fwd_kernel

    d, d_v = head_dim if isinstance(head_dim, (tuple, list)) else (head_dim, head_dim)
    b, s, h = 2, 1000, 4
    scales = None
    tag_overrides = overrides
    if overrides and "sink" in overrides:  # a variant switch, not a FwdConfig field
        overrides = {k: v for k, v in overrides.items() if k != "sink"}
        sink = sink or bool(tag_overrides["sink"])
    if overrides and "seqlen" in overrides:  # the stand-ins' length (BOTTOM_ALIGN needs a
        s = int(overrides["seqlen"])         # shift of >= one warpgroup piece: 960 at 128)
        overrides = {k: v for k, v in overrides.items() if k != "seqlen"} or None
    # FP8 only: the config of a long causal call with one K / V descale per head
    # (config.FP8_LONG_CAUSAL), a variant switch rather than a FwdConfig field
    long_causal = bool((overrides or {}).get("long_causal"))
    if overrides and "long_causal" in overrides:
        overrides = {k: v for k, v in overrides.items() if k != "long_causal"} or None
    # FP8 only: out_dtype=float32 (O's slot and TMA store in fp32), a variant switch too
    out_f32 = bool((overrides or {}).get("out_f32"))
    if overrides and "out_f32" in overrides:
        overrides = {k: v for k, v in overrides.items() if k != "out_f32"} or None
    # packed sequences (the kernel's VARLEN mode), a variant switch too
    varlen = bool((overrides or {}).get("varlen"))
    seqused = bool((overrides or {}).get("seqused"))  # varlen with seqused_k
    if overrides and ("varlen" in overrides or "seqused" in overrides):
        overrides = {k: v for k, v in overrides.items()
                     if k not in ("varlen", "seqused")} or None
    lse = torch.empty((b, h, s), dtype=torch.float32)
    if dtype == torch.float8_e4m3fn:  # FP8: V keys contiguous, bf16 O, descale tables
        from flashattn.fp8_format import keys_contiguous_empty
        from flashattn.params import Fp8Scales
        from flashattn.backends.sm90.config import fp8_fwd_config

        kv_shift = 31 if long_causal else 7  # one descale per head, or 128-key blocks
        cfg = fp8_fwd_config(d, d_v, softcap > 0.0,
                             masked=causal or window[0] >= 0 or window[1] >= 0,
                             kv_block_keys=1 << kv_shift, long_causal=long_causal,
                             packed=varlen, **(overrides or {}))
        q = torch.empty((b, s, h, d), dtype=dtype)
        v = keys_contiguous_empty((b, s, h, d_v), torch.device("cpu"))
        out = torch.empty((b, s, h, d_v), dtype=torch.float32 if out_f32 else torch.bfloat16)
        table = torch.empty((b, h, 8), dtype=torch.float32)
        scales = Fp8Scales(table, table, table, 7, kv_shift)
    else:
        cfg = fwd_config(d, softcap > 0.0, head_dim_v=d_v if d_v != d else None,
                         masked=causal or window[0] >= 0 or window[1] >= 0, packed=varlen,
                         **(overrides or {}))
        q = torch.empty((b, s, h, d), dtype=dtype)
        v = out = torch.empty((b, s, h, d_v), dtype=dtype)
    window_left, window_right = window
    if causal:
        window_right = 0
    layout = None
    if varlen:  # (1, total, h, d) views, (h, total) LSE, b + 1 offsets
        from flashattn.backends.sm90.fwd import VarlenLayout

        q, out = (t.reshape(1, b * s, h, -1) for t in (q, out))
        lse = lse.reshape(h, b * s)
        cu = torch.zeros(b + 1, dtype=torch.int32)
        layout = VarlenLayout(cu, cu, out[0],
                              torch.zeros(b, dtype=torch.int32) if seqused else None)
        if dtype == torch.float8_e4m3fn:  # packed V^T, one descale per (sequence, head)
            from flashattn.params import ONE_BLOCK_SHIFT
            from flashattn.backends.sm90.v_layout import varlen_vt_positions

            cfg = fp8_fwd_config(d, d_v, softcap > 0.0,
                                 masked=causal or window[0] >= 0 or window[1] >= 0,
                                 kv_block_keys=1 << ONE_BLOCK_SHIFT, packed=True,
                                 **(overrides or {}))
            v = torch.empty((1, h, d_v, varlen_vt_positions(b, b * s)),
                            dtype=dtype).permute(0, 3, 1, 2)
            table = torch.empty((b, h, 1), dtype=torch.float32)
            scales = Fp8Scales(table, table, table, ONE_BLOCK_SHIFT, ONE_BLOCK_SHIFT)
        else:
            v = v.reshape(1, b * s, h, -1)
    args, constexprs, options, _ = launch_args(
        q, q, v, out, lse, cfg, softmax_scale=d ** -0.5, window_left=window_left,
        window_right=window_right, softcap=softcap, num_sms=132, scales=scales,
        sink=torch.empty(h, dtype=torch.float32) if sink else None, varlen=layout)
    return _compile(attn_fwd_kernel, args, constexprs, options,
                    _variant_key(head_dim, dtype, causal, window, softcap, tag_overrides)
                    + ("-sink" if sink and not tag_overrides else ""))


def _bwd_variant_key(head_dim, dtype, causal, window, softcap, overrides) -> str:
    return "bwd" + _variant_key(head_dim, dtype, causal, window, softcap, overrides)[3:]


def compile_bwd_variant(head_dim: int, dtype: torch.dtype = torch.bfloat16, *, causal: bool = False,
                        window: tuple = (-1, -1), softcap: float = 0.0,
                        overrides: Optional[Dict[str, Any]] = None) -> CompileReport:
    """Compile one backward variant for sm_90 (no GPU needed) and report its resources."""
    from flashattn.backends.sm90.bwd import (bwd_kernel_for, dq_workspace, launch_args,
                                             split_workspace)
    from flashattn.backends.sm90.config import bwd_config

    window_left, window_right = window
    if causal:
        window_right = 0
    # packed sequences (bwd_kernel's VARLEN mode, one CTA per tile: the masked config), a
    # variant switch rather than a BwdConfig field; "short_seqs": a packed call of short
    # sequences (config.short_packed_seqs: d = 64 keeps 64-row blocks)
    varlen = bool((overrides or {}).get("varlen"))
    seqused = bool((overrides or {}).get("seqused"))  # varlen with seqused_k
    short = varlen and bool((overrides or {}).get("short_seqs"))
    # "split_blocks": N, a call that cuts N key blocks per KV head (BwdConfig.tile_split) of
    # a GQA 2:1 call (the split needs an even group)
    split = int((overrides or {}).get("split_blocks", 0))
    fields = {k: v for k, v in (overrides or {}).items()
              if k not in ("varlen", "seqused", "short_seqs", "split_blocks")}
    cfg = bwd_config(head_dim, masked=varlen or window_left >= 0 or window_right >= 0,
                     softcap=softcap > 0.0, short_seqs=short, **fields)
    b, s, h = 2, 1000, 4
    q = torch.empty((b, s, h, head_dim), dtype=dtype)
    s_pad = -(-s // cfg.block_m) * cfg.block_m
    cu_seqlens = None
    if varlen:  # (1, total, h, d) views, BLOCK_M statistics rows past total_q, b + 1 offsets
        q = q.reshape(1, b * s, h, head_dim)
        s_pad = -(-b * s // cfg.block_m) * cfg.block_m + cfg.block_m
        cu = torch.zeros(b + 1, dtype=torch.int32)
        cu_seqlens = (cu, cu, torch.zeros(b, dtype=torch.int32)) if seqused else (cu, cu)
    dq_acc = dq_workspace(q, s_pad)
    lse = torch.empty((q.shape[0], h, s_pad), dtype=torch.float32)
    kv = q[:, :, : h // 2] if split else q
    split_ws = split_workspace(kv, cfg, split) if split else None
    args, constexprs, options, _ = launch_args(
        q, q, kv, kv, lse, lse, dq_acc, kv, kv, cfg, softmax_scale=head_dim ** -0.5,
        window_left=window_left, window_right=window_right, softcap=softcap,
        cu_seqlens=cu_seqlens, split_ws=split_ws)
    return _compile(bwd_kernel_for(head_dim), args, constexprs, options,
                    _bwd_variant_key(head_dim, dtype, causal, window, softcap, overrides))


def compile_latent_variant(head_dim: Any = (64, 512), dtype: torch.dtype = torch.bfloat16, *,
                           causal: bool = False, window: tuple = (-1, -1), softcap: float = 0.0,
                           overrides: Optional[Dict[str, Any]] = None) -> CompileReport:
    """Compile one variant of the MLA decode kernel (backends/sm90/latent_kernel.py) for sm_90:
    128 query heads over one latent KV head of ``head_dim`` = (64, 512), causal with 2 query
    rows per sequence (``causal``), two key splits; ``overrides``: {"paged": bool, "page":
    int, "fp8": bool} (pages of ``page`` keys, 64 by default, or a contiguous cache; e4m3
    caches with their descales). ``window`` / ``softcap`` must be off (not covered)."""
    from flashattn.backends.sm90.latent import launch_args
    from flashattn.backends.sm90.latent_kernel import latent_decode_kernel

    if tuple(window) != (-1, -1) or softcap:
        raise ValueError("the MLA decode kernel takes no window or softcap")
    d, d_v = head_dim
    paged = bool((overrides or {}).get("paged"))
    page = int((overrides or {}).get("page", 64))
    cache_dtype = torch.float8_e4m3fn if (overrides or {}).get("fp8") else dtype
    b, s_q, h, splits = 4, 2 if causal else 1, 128, 2
    q = torch.empty(b, s_q, h, d, dtype=dtype)
    qv = torch.empty(b, s_q, h, d_v, dtype=dtype)
    if paged:
        kc = torch.empty(64, page, 1, d, dtype=cache_dtype)
        vc = torch.empty(64, page, 1, d_v, dtype=cache_dtype)
        table = torch.zeros(b, 1024 // page, dtype=torch.int32)
    else:
        kc = torch.empty(b, 1024, 1, d, dtype=cache_dtype)
        vc = torch.empty(b, 1024, 1, d_v, dtype=cache_dtype)
        table = None
    out = torch.empty(splits, b, s_q, h, d_v)
    lse = torch.empty(splits, b, h, s_q)
    args, constexprs, _ = launch_args(q, qv, kc, vc, torch.zeros(b, dtype=torch.int32), 0, table,
                                      out, lse, out.stride()[:4], lse.stride(), splits,
                                      (d + d_v) ** -0.5, causal, 1024,
                                      *([torch.ones(b, 1)] * 2 if cache_dtype != dtype else []))
    options = {k: constexprs.pop(k) for k in ("num_warps", "maxnreg")}
    return _compile(latent_decode_kernel, args, constexprs, options,
                    "latent" + _variant_key(head_dim, dtype, causal, window, softcap,
                                            overrides)[3:])


def main(argv=None) -> int:
    """``python -m tools.aot_sm90 VARIANTS_JSON``: compile each variant, print one JSON
    report per line. Runs in its own process because Triton's language functions are
    replaced by interpreted ones once TRITON_INTERPRET=1 is set (as the CPU tests do)."""
    import json
    import sys

    variants = json.loads((argv or sys.argv[1:])[0])
    dtypes = {"bfloat16": torch.bfloat16, "float16": torch.float16,
              "float8_e4m3fn": torch.float8_e4m3fn}
    for variant in variants:
        # a variant is (d, dtype, causal, window, softcap, overrides), optionally led by
        # "fwd" / "bwd" / "latent" (the kernel; fwd when absent)
        kind = variant[0] if isinstance(variant[0], str) else "fwd"
        d, dt, causal, window, softcap, overrides = variant[1:] if kind == variant[0] else variant
        compile_fn = {"fwd": compile_fwd_variant, "bwd": compile_bwd_variant,
                      "latent": compile_latent_variant}[kind]
        key_fn = {"fwd": _variant_key, "bwd": _bwd_variant_key,
                  "latent": lambda *a: "latent" + _variant_key(*a)[3:]}[kind]
        d = tuple(d) if isinstance(d, list) else d
        try:
            rep = compile_fn(d, dtypes[dt], causal=causal, window=tuple(window),
                             softcap=softcap, overrides=overrides)
            row = dict(key=rep.name, registers=rep.registers, spills=rep.spills,
                       shared=rep.shared, num_warps=rep.num_warps,
                       wgmma="wgmma.mma_async" in rep.ptx,
                       wgmma_e4m3=".e4m3.e4m3" in rep.ptx,
                       tma="cp.async.bulk.tensor" in rep.ptx,
                       tma_reduce="cp.reduce.async.bulk.tensor" in rep.ptx,
                       setmaxnreg=[int(x) for x in __import__("re").findall(
                           r"setmaxnreg\.(?:inc|dec)\.sync\.aligned\.u32\s+(\d+)", rep.ptx)],
                       ex2="ex2.approx" in rep.ptx, error=None)
        except Exception as exc:  # reported per variant, the test names it
            row = dict(key=key_fn(d, dtypes[dt], causal, window, softcap, overrides),
                       error=f"{type(exc).__name__}: {str(exc)[-2000:]}")
        print(json.dumps(row), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
