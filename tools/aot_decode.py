"""Compile the decode / combine / rotary kernels for sm_90 without a GPU and report resources.

Runs each launch path of ``flashattn.backends.triton.decode.decode_attention`` (and the rotary and
combine launches) with CPU stand-in tensors, captures the arguments the launch would pass,
and compiles them with ``triton.compile(..., target=GPUTarget("cuda", 90, 32))``. Prints one
JSON line per variant: registers, spill bytes, shared memory, whether the K/V loads are
pipelined (cp.async), use TMA (cp.async.bulk.tensor), the mma flavour, and for the FP8 cache
variants (``_kv8``: e4m3 cache, bf16 q; ``_q8kv8``: FA3's FP8 q too) the shared-memory byte
loads (``ld_shared_b8``: a dot operand gathered byte by byte; 0 expected) and the copies
narrower than 16 bytes (``cp_narrow``, the page table's 4-byte loads aside). The ``_qv``
variants are multi-head latent attention's (FA3's ``qv``): DeepSeek's d 64 / d_v 512 over one
KV head (``_dv512``), bf16 and FP8 latent caches, and qv over an FP8 cache through the FP8
launch configs, bf16 / fp16 / fp32 (V widened to qv's dtype, the operand of both of its dots,
in the loaded layout: no byte loads expected either).

    env -u TRITON_INTERPRET PYTHONPATH=src python benchmarks/decode_aot.py [--ptx DIR]

(Must run without TRITON_INTERPRET: Triton swaps in interpreted language functions then.)
"""
from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import subprocess
import sys
import tempfile
from typing import Any, Dict

import torch


def _resources(cubin: bytes) -> Dict[str, Any]:
    import triton

    tool = os.path.join(os.path.dirname(triton.backends.nvidia.__file__), "bin", "cuobjdump")
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


class _Capture:
    """Stands in for ``kernel[grid]``: records the launch arguments instead of launching."""

    def __init__(self, fn):
        self.fn = fn
        self.calls = []

    def __getitem__(self, grid):
        def launch(*args, **kwargs):
            self.calls.append((grid, args, kwargs))
        return launch


def compile_captured(fn, args, kwargs, force: Dict[str, Any] | None = None):
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource
    from triton._C.libtriton import native_specialize_impl
    from triton.backends.compiler import BaseBackend

    kwargs = dict(kwargs)
    kwargs.update(force or {})
    names = list(fn.arg_names)
    # launch options (num_warps, num_stages, launch_pdl, ...): every keyword not a parameter
    options = {k: kwargs.pop(k) for k in list(kwargs) if k not in names}
    signature, consts, attrs = {}, {}, {}
    for i, (name, value) in enumerate(zip(names, args)):
        # the JIT's own specialisation: 16-divisible ints / 16-aligned pointers, ints == 1
        ty, attr = native_specialize_impl(BaseBackend, value, False, True, True)[:2]
        signature[name] = ty
        if ty == "constexpr":
            consts[(i,)] = value
        elif isinstance(attr, str):
            attrs[(i,)] = BaseBackend.parse_attr(attr)
    for name, value in kwargs.items():
        signature[name] = "constexpr"
        consts[(names.index(name),)] = value
    src = ASTSource(fn, signature, consts, attrs)
    return triton.compile(src, target=GPUTarget("cuda", 90, 32), options=options)


def _report(tag, kernel, ptx_dir=None):
    ptx = kernel.asm["ptx"]
    if ptx_dir:
        os.makedirs(ptx_dir, exist_ok=True)
        with open(os.path.join(ptx_dir, tag + ".ptx"), "w") as f:
            f.write(ptx)
    row = dict(key=tag, **_resources(kernel.asm["cubin"]), shared=kernel.metadata.shared,
               num_warps=kernel.metadata.num_warps,
               cp_async="cp.async.cg" in ptx or "cp.async.ca" in ptx,
               tma="cp.async.bulk.tensor" in ptx, wgmma="wgmma.mma_async" in ptx,
               mma="mma.sync" in ptx, ld_v4=ptx.count("ld.global.v4"),
               ld_shared_b8=ptx.count("ld.shared.b8"),
               cp_narrow=len(re.findall(r"cp\.async\.c[ga]\.shared\.global[^;]*, 0x8,", ptx)),
               error=None)
    print(json.dumps(row), flush=True)


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--ptx", default=None)
    ap.add_argument("--configs", default="")
    ap.add_argument("--all", action="store_true", help="also every feature flag")
    args = ap.parse_args()
    from flashattn.runtime import env
    from flashattn.backends.triton import combine as comb
    from flashattn.backends.triton import decode as dec
    from flashattn.backends.triton import rotary as rot

    bf = torch.bfloat16
    variants = []
    for paged in (False, True):
        for s_q in (1, 4):
            for tma in ((True, False) if not paged else (False,)):
                variants.append((paged, s_q, tma, ""))
    for c in [c for c in args.configs.split(";") if c.strip()]:
        variants.append((False, 1, True, c))
        variants.append((True, 1, False, c))
    fp8_variants = [(paged, s_q, False, "", dict(kv8=True, q8=q8))
                    for paged in (False, True) for s_q in (1, 4) for q8 in (False, True)]
    fp8_variants += [(False, 1, False, "", dict(kv8=True, dtype=dt, d=d))
                     for dt, d in ((torch.float16, 64), (torch.float32, 128), (bf, 256))]
    # the contiguous e4m3 cache's long-stream config (a full grid of >= 16k keys takes it;
    # these stand-ins are short, so it is forced): decode.RESIDENT lists its residency
    fp8_variants += [(False, 1, False, "64,4,3,0", dict(kv8=True))]
    # qv (HAS_QV): the bf16 and FP8 latent caches (the wide-V config), and qv over an FP8
    # cache at d_v <= 256 (the FP8 configs); every math dtype, so that each pair of dot
    # operands meets
    qv_variants = [(True, 1, False, "", dict(qv=True, d=64, dv=512, h=128, h_k=1)),
                   (True, 1, False, "", dict(qv=True, kv8=True, d=64, dv=512, h=128, h_k=1)),
                   (True, 1, False, "", dict(qv=True, kv8=True)),
                   (False, 1, False, "", dict(qv=True, kv8=True, dtype=torch.float16, d=64)),
                   (False, 1, False, "", dict(qv=True, kv8=True, dtype=torch.float32))]
    features = [dict()]
    if args.all:
        features += [dict(alibi=True), dict(softcap=True), dict(window=True), dict(leftpad=True),
                     dict(batch_idx=True), dict(varlen=True), dict(dtype=torch.float32),
                     dict(dtype=torch.float16, d=64), dict(d=256), dict(d=80),
                     dict(alibi=True, softcap=True, window=True, leftpad=True)]
        variants = [(p, 2, t, "", f) for p in (False, True) for t in ((True,) if not p else (False,))
                    for f in features[1:]] + [v + (dict(),) for v in variants]
    else:
        variants = [v + (dict(),) for v in variants]
    variants += fp8_variants + qv_variants
    for paged, s_q, tma, cfg, feat in variants:
        if feat.get("varlen") and not paged:
            continue
        tag = f"decode_{'paged16' if paged else 'contig'}_sq{s_q}_{'tma' if tma else 'ptr'}" + (
            f"_cfg{cfg.replace(',', '-')}" if cfg else "") + "".join(
            f"_{k}{'' if v is True else str(v).replace('torch.', '')}" for k, v in feat.items()
            if v is not False)
        # the launch config the decode wrapper reads (flashattn reads its environment once)
        forced = env.override(decode_config=cfg) if cfg else contextlib.nullcontext()
        cap = _Capture(dec._decode_kernel)
        orig = dec._decode_kernel
        dec._decode_kernel = cap
        try:
            forced.__enter__()
            b, h, h_k = 2, feat.get("h", 32), feat.get("h_k", 8)
            d = feat.get("d", 128)
            dv = feat.get("dv", d)
            dt = feat.get("dtype", bf)
            e4m3 = torch.float8_e4m3fn
            q = torch.empty(b, s_q, h, d, dtype=e4m3 if feat.get("q8") else dt)
            kv_dt = e4m3 if feat.get("kv8") else dt
            if paged:
                kc = torch.empty(64, 16, h_k, d, dtype=kv_dt)
                table = torch.zeros(b, 32, dtype=torch.int32)
            else:
                kc = torch.empty(b + 1, 512, h_k, d, dtype=kv_dt)
                table = None
            vc = kc if dv == d else torch.empty(kc.shape[:3] + (dv,), dtype=kv_dt)
            seqlens = torch.full((b,), 100, dtype=torch.int32)
            extra = {}
            if feat.get("kv8"):  # an FP8 cache's descales (and an FP8 q's)
                extra = dict(k_descale=torch.ones(b, h_k), v_descale=torch.ones(b, h_k))
                if feat.get("q8"):
                    extra["q_descale"] = torch.ones(b, h_k)
            if feat.get("qv"):  # the latent query, in q's dtype (never an FP8 q: refused)
                extra["qv"] = torch.empty(b, s_q, h, dv, dtype=dt)
            if feat.get("varlen"):
                q = torch.empty(7, h, d, dtype=dt)
                extra = dict(cu_seqlens_q=torch.tensor([0, 3, 7], dtype=torch.int32),
                             max_seqlen_q=4)
            dec.decode_attention(
                q, kc, vc, seqlens, 0, softmax_scale=0.1,
                window_left=8 if feat.get("window") else -1,
                window_right=0 if (s_q > 1 or feat.get("window")) else -1,
                softcap=5.0 if feat.get("softcap") else 0.0,
                alibi_slopes=torch.empty(b, h) if feat.get("alibi") else None, num_splits=1,
                max_seqlen_k=512, block_table=table,
                leftpad=seqlens if feat.get("leftpad") else None,
                batch_idx=seqlens if feat.get("batch_idx") and not paged else None, **extra)
        finally:
            dec._decode_kernel = orig
            forced.__exit__(None, None, None)
        grid, a, kw = cap.calls[0]
        try:
            kern = compile_captured(orig, a, kw,
                                    force={"USE_TMA": tma and kw["HEAD_DIM"] == kw["BLOCK_D"]
                                           and not kw["KV_FP8"]
                                           and dec.launch_config(kw["HEAD_DIM"],
                                                                 a[0].element_size(), paged)[3]})
            _report(tag, kern, args.ptx)
        except Exception as exc:  # noqa: BLE001
            print(json.dumps(dict(key=tag, error=f"{type(exc).__name__}: {str(exc)[-3000:]}")),
                  flush=True)

    # combine and rotary
    for name, mod, attr, call in (
        ("combine", comb, "_combine_kernel",
         lambda: comb.combine_splits(torch.empty(8, 2, 1, 32, 128), torch.empty(8, 2, 32, 1),
                                     torch.empty(2, 1, 32, 128, dtype=bf),
                                     torch.empty(2, 32, 1))),
        ("rotary_paged", rot, "_rotary_store_kernel",
         lambda: rot.rotary_store(torch.empty(2, 1, 8, 128, dtype=bf),
                                  torch.empty(64, 16, 8, 128, dtype=bf),
                                  torch.zeros(2, dtype=torch.int32),
                                  cos=torch.empty(100, 64, dtype=bf),
                                  sin=torch.empty(100, 64, dtype=bf), interleaved=False,
                                  block_table=torch.zeros(2, 8, dtype=torch.int32))),
    ):
        orig = getattr(mod, attr)
        cap = _Capture(orig)
        setattr(mod, attr, cap)
        try:
            call()
        finally:
            setattr(mod, attr, orig)
        grid, a, kw = cap.calls[0]
        try:
            _report(name, compile_captured(orig, a, kw), args.ptx)
        except Exception as exc:  # noqa: BLE001
            print(json.dumps(dict(key=name, error=f"{type(exc).__name__}: {str(exc)[-3000:]}")),
                  flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
