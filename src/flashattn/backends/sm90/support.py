"""Can the Hopper (Gluon, sm90) path run here, and does it cover this call?

Both questions answer with a reason string (None = yes), so dispatch can fall back to the
portable kernels and ``python -m flashattn info`` can say why. Nothing here imports the
Gluon kernels, so the checks are cheap and safe where Gluon's API differs.
"""
from __future__ import annotations

import functools
import math
import warnings
from typing import Any, Mapping, Optional

import torch

from flashattn.runtime import env

HEAD_DIMS = (64, 96, 128, 192, 256)
DTYPES = (torch.float16, torch.bfloat16)
# Gluon's API moves between releases. The kernels compile on these (the API differences are
# in flashattn.runtime.gluon_api), and this is what verified each one:
GLUON_TRITON = {
    "3.6": "H100: pytest -m gpu and the benchmark grid; sm_90 AOT in CI",
    "3.7": ("sm_90 AOT compile of every Gluon variant (74/74; CI compiles the "
            "default configs); not run on a GPU"),
    "3.8": ("sm_90 AOT compile of every Gluon variant (74/74; CI compiles the "
            "default configs); not run on a GPU"),
    "3.9": ("H100 (repacked wheel over the image's torch 2.11): pytest -m gpu "
            "(408 tests, bigmem excepted) and the 16k grid; sm_90 AOT in CI"),
}
# The Hopper path is on by default with every release above (each compiles every variant in
# CI); these also ran the GPU tests and the grid (``info`` says which is which). A release not
# above runs the portable kernels, with one warning naming it and what was verified
# (FLASHATTN_BACKEND=hopper tries the Gluon kernels anyway).
GPU_VERIFIED_TRITON = ("3.6", "3.9")
# (kept for callers of the former name: the version prefixes the Gluon kernels know)
TRITON_VERSIONS = tuple(v + "." for v in GLUON_TRITON)


def triton_minor(version: str) -> str:
    """'3.9.0' -> '3.9' (the key of GLUON_TRITON)."""
    return ".".join(version.split(".")[:2])


def triton_version() -> Optional[str]:
    try:
        import triton
    except ImportError:
        return None
    return getattr(triton, "__version__", "?")


def verified_summary() -> str:
    """One line: the releases the Gluon kernels were verified on, and how."""
    gpu = ", ".join(GPU_VERIFIED_TRITON)
    aot = ", ".join(v for v in GLUON_TRITON if v not in GPU_VERIFIED_TRITON)
    return f"GPU-verified on triton {gpu}; compile-verified (sm_90 AOT in CI) on {aot}"


@functools.lru_cache(maxsize=None)
def gluon_unavailable(allow_unknown: bool = False) -> Optional[str]:
    """Why this Triton cannot build the Hopper kernels (None when it can). A release the
    kernels were not verified on is refused unless ``allow_unknown`` (FLASHATTN_BACKEND=hopper
    then tries them)."""
    version = triton_version()
    if version is None:
        return "triton is not installed"
    minor = triton_minor(version)
    if minor not in GLUON_TRITON and not allow_unknown:
        return (f"triton {version} is not a release the Gluon kernels were verified on "
                f"({verified_summary()})")
    try:
        from triton.experimental.gluon import language as gl
        from triton.experimental.gluon.language.nvidia import hopper
        from triton.experimental.gluon.nvidia import hopper as gluon_host

        from flashattn.runtime import gluon_api  # noqa: F401 (the version-specific names)
    except Exception as exc:  # pragma: no cover - depends on the installed triton
        return f"triton.experimental.gluon not importable ({type(exc).__name__}: {exc})"
    needed = [(gl, "warp_specialize"), (gl, "NVMMADistributedLayout"), (hopper, "warpgroup_mma"),
              (hopper, "warpgroup_mma_wait"), (hopper.mbarrier, "expect"),
              (gluon_host, "TensorDescriptor")]
    missing = [f"{mod.__name__}.{name}" for mod, name in needed if not hasattr(mod, name)]
    if missing:
        return f"triton {version} lacks {', '.join(missing)}"
    return None


@functools.lru_cache(maxsize=None)
def _device_unavailable(index: int, forced: bool) -> Optional[str]:
    cap = torch.cuda.get_device_capability(index)
    if cap != (9, 0):
        return f"device cuda:{index} is sm_{cap[0]}{cap[1]}, not sm_90"
    reason = gluon_unavailable(allow_unknown=forced)
    if reason is not None and gluon_unavailable(allow_unknown=True) is None:  # unknown release
        warnings.warn(f"flashattn: the Hopper (Gluon) kernels are off on sm_90: {reason}; the "
                      "portable Triton kernels run instead (FLASHATTN_BACKEND=hopper tries the "
                      "Gluon kernels anyway)", stacklevel=3)
    return reason


def device_unavailable(device: torch.device) -> Optional[str]:
    """Why tensors on ``device`` cannot use the Hopper kernels (None when they can)."""
    if device.type != "cuda":
        return f"{device.type} tensors"
    if not torch.cuda.is_available():
        return "CUDA is not available"
    index = device.index if device.index is not None else torch.cuda.current_device()
    # (cached per device and mode: the warning above is said once)
    return _device_unavailable(index, env.settings().backend == "hopper")


def tma_ok(t: torch.Tensor) -> bool:
    """Whether TMA can address ``t``: 16-byte aligned base and strides, unit last stride,
    positive strides."""
    # (a plain loop, no generator: this runs three times per call on the dispatch path)
    strides = t.stride()
    if strides[-1] != 1 or t.data_ptr() % 16:
        return False
    elem = t.element_size()
    for s in strides[:-1]:
        if s <= 0 or (s * elem) % 16:
            return False
    return True


def call_unsupported(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                     params: Mapping[str, Any]) -> Optional[str]:
    """Why this forward call is not covered by the Hopper kernel (None when it is).

    params: the normalised keyword arguments of docs/internals.md.
    """
    if q.dtype not in DTYPES or k.dtype != q.dtype or v.dtype != q.dtype:
        return f"dtype {q.dtype} (Hopper path: float16, bfloat16)"
    d, d_v = q.shape[-1], v.shape[-1]
    if d not in HEAD_DIMS or d_v not in HEAD_DIMS:
        return f"head dims {d}/{d_v} (Hopper path: each one of {HEAD_DIMS})"
    if params.get("alibi_slopes") is not None:
        return "alibi_slopes"
    if float(params.get("dropout_p", 0.0)) != 0.0:
        return "dropout"
    if params.get("return_softmax", False):
        return "return_softmax"
    scale = float(params.get("softmax_scale", 1.0))
    if not (math.isfinite(scale) and scale > 0.0):
        return f"softmax_scale {scale} (Hopper path: finite, > 0)"
    softcap = float(params.get("softcap", 0.0))
    if softcap < 0.0 or not math.isfinite(softcap):
        return f"softcap {softcap}"
    if max(q.shape[:3]) >= 2**31 or max(k.shape[:3]) >= 2**31:
        return "a dimension >= 2**31"
    if not (tma_ok(q) and tma_ok(k) and tma_ok(v)):
        return "strides or base not 16-byte aligned (TMA)"
    return None


def fp8_unsupported(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, params: Any,
                    scales: Any, out_dtype: Optional[torch.dtype] = None,
                    varlen: bool = False) -> Optional[str]:
    """Why this FP8 forward is not covered by the Gluon FP8 kernel (None when it is): e4m3
    q / k / v, head dims of HEAD_DIMS, TMA-aligned q / k, and scale blocks no smaller than the
    kernel's tiles (one Q descale per consumer warpgroup's rows, one K / V descale per key
    block), and O's slot of ``out_dtype`` (None: 16-bit) within an SM's shared memory (a
    float32 O doubles it: d = 192 / 256 do not fit). ``params``: AttnParams; ``scales``:
    params.Fp8Scales. ``varlen``: q / k / v are the (1, total, h, d) views of a packed call
    (whose config never takes the long-causal tiles: sm90/fwd.flash_fwd_hopper_fp8_varlen)."""
    from flashattn.backends.sm90.config import (SMEM_LIMIT, fp8_fwd_config, fp8_long_causal,  # (data)
                                       fp8_smem_bytes)

    fp8 = torch.float8_e4m3fn
    if q.dtype != fp8 or k.dtype != fp8 or v.dtype != fp8:
        return "FP8 path: float8_e4m3fn q, k, v"
    d, d_v = q.shape[-1], v.shape[-1]
    if d not in HEAD_DIMS or d_v not in HEAD_DIMS:
        return f"head dims {d}/{d_v} (Hopper path: each one of {HEAD_DIMS})"
    if max(q.shape[:3]) >= 2**31 or max(k.shape[:3]) >= 2**31:
        return "a dimension >= 2**31"
    if not (tma_ok(q) and tma_ok(k)):
        return "strides or base not 16-byte aligned (TMA)"
    # the config the launch picks (sm90/fwd.py): key blocks shrink to shorter K / V descale
    # blocks (down to FP8_MIN_BLOCK_N), and grow to long causal ones only where the descales
    # cover them, so the block checks below hold for it as for the table's config
    wl, wr = params.window_left, params.window_right
    cfg = fp8_fwd_config(d, d_v, params.softcap > 0.0, wl >= 0 or wr >= 0,
                         kv_block_keys=1 << scales.kv_block_shift,
                         long_causal=not varlen and fp8_long_causal(wl, wr, k.shape[1]),
                         packed=varlen)
    if out_dtype == torch.float32:
        smem = fp8_smem_bytes(cfg, d, d_v, 4)
        if smem > SMEM_LIMIT:
            return f"out_dtype float32 at head dims {d}/{d_v} ({smem} bytes of shared memory)"
    if scales.q_block_shift < (cfg.block_m // cfg.consumers).bit_length() - 1:
        return f"q scale blocks of {1 << scales.q_block_shift} rows < {cfg.block_m // cfg.consumers}"
    if scales.kv_block_shift < cfg.block_n.bit_length() - 1:
        return f"kv scale blocks of {1 << scales.kv_block_shift} keys < {cfg.block_n}"
    return None


# Below these key lengths the portable kernels measured faster on the H100 (16k tokens per
# call; benchmarks/NOTES.md, 2026-11-23, after the launch-overhead work): the Hopper kernels pay
# fixed costs (descriptors, tile queue, warp-role start; the backward's dQ workspace and its
# cast) over too few key blocks, and at s_k = 512 every call is host-bound anyway.
# Forward hopper/portable, dense: d <= 128 at 1k 1.07-1.23x, at 512 0.79-1.03x; d = 256 at 1k
# 0.94x, at 2k 1.42x. Masked (causal): at 1k 0.67-0.72x, at 2k 1.10-1.14x.
# Backward, dense: at 1k 1.05-1.18x, at 512 0.68-1.0x; causal: at 1k 0.84-1.06x, at 2k 1.09-1.22x.
MIN_SEQLEN_K_DENSE = 1024
MIN_SEQLEN_K_DENSE_LARGE_D = 2048  # head dim > 128 (forward)
MIN_SEQLEN_K_MASKED = 2048
MIN_SEQLEN_K_BWD_DENSE = 1024
MIN_SEQLEN_K_BWD_MASKED = 2048
# Backward at d = 192 / 256 (bwd_wide_kernel.py against the portable backward, 2026-11-23):
# dense 512: 216 vs 162 TFLOP/s, 1k: 276 vs 198; causal 512: 109 vs 119, 1k: 212 vs 156.
MIN_SEQLEN_K_BWD_DENSE_LARGE_D = 512
MIN_SEQLEN_K_BWD_MASKED_LARGE_D = 1024


def slower_than_portable(q: torch.Tensor, k: torch.Tensor, params: Mapping[str, Any],
                         backward: bool = False) -> Optional[str]:
    """Why ``dispatch`` in auto mode keeps this covered call (forward, or ``backward``) on the
    portable kernels (measured to be faster there), or None. FLASHATTN_BACKEND=hopper ignores
    this rule."""
    seqlen_k = k.shape[1]
    masked = int(params.get("window_left", -1)) >= 0 or int(params.get("window_right", -1)) >= 0
    if backward and q.shape[-1] > 128:
        need = MIN_SEQLEN_K_BWD_MASKED_LARGE_D if masked else MIN_SEQLEN_K_BWD_DENSE_LARGE_D
    elif backward:
        need = MIN_SEQLEN_K_BWD_MASKED if masked else MIN_SEQLEN_K_BWD_DENSE
    elif masked:
        need = MIN_SEQLEN_K_MASKED
    else:
        need = MIN_SEQLEN_K_DENSE if q.shape[-1] <= 128 else MIN_SEQLEN_K_DENSE_LARGE_D
    if seqlen_k < need:
        return (f"seqlen_k {seqlen_k} < {need} ({'backward, ' if backward else ''}"
                f"{'masked' if masked else 'dense'}): portable is faster there")
    return None


# Packed (varlen) forward, Hopper varlen mode / portable, H100, 16k tokens of ragged lengths
# (benchmarks/probes/varlen_probe.py, d = 128, h = 16, 2026-11-25): mean 4k 1.64x dense /
# 1.24x causal, 2k 1.64x / 1.21x, 1k 1.71x / 1.37x, 512 1.59x / 1.58x, 256 1.02x / 0.88x,
# 128 1.35x / 1.35x. One launch serves every sequence, so the dense rule's fixed costs per
# call do not scale with the number of sequences; below 512 the points disagree.
MIN_MEAN_SEQLEN_K_VARLEN = 512
# Packed backward, bwd_kernel.py's varlen mode / portable, same probe (2026-11-25, backward
# forced too, three runs at 1k / 4k): 4k 1.59-1.67x dense / 1.42-1.46x causal, 1k 1.58x /
# 1.35x, 512 1.40x / 1.25x, 256 1.26x / 1.17x; not measured below.
MIN_MEAN_SEQLEN_K_VARLEN_BWD = 256
# d = 192 / 256 (bwd_wide_kernel.py's varlen mode; the portable backward is slow at those head
# dims): d = 256, same probe (2026-11-25), 4k 4.5x / 4.5x, 1k 4.3x / 3.8x, 512 3.8x / 3.1x,
# 256 3.1x / 2.4x, 128 2.3x / 2.2x (the lowest mean measured)
MIN_MEAN_SEQLEN_K_VARLEN_BWD_WIDE = 128


def varlen_slower_than_portable(q: torch.Tensor, k: torch.Tensor, n_seqs: int,
                                params: Mapping[str, Any],
                                backward: bool = False) -> Optional[str]:
    """Why ``dispatch`` in auto mode keeps this covered packed forward (or ``backward``) (q
    (total_q, h, d), k (total_k, h_k, d)) on the portable kernels, or None: a mean key length
    total_k / n_seqs below MIN_MEAN_SEQLEN_K_VARLEN(_BWD, _BWD_WIDE at d > 128) (the lengths
    themselves live on the device)."""
    mean_k = k.shape[0] // max(n_seqs, 1)
    if not backward:
        need = MIN_MEAN_SEQLEN_K_VARLEN
    elif q.shape[-1] > 128:
        need = MIN_MEAN_SEQLEN_K_VARLEN_BWD_WIDE
    else:
        need = MIN_MEAN_SEQLEN_K_VARLEN_BWD
    if mean_k < need:
        return (f"mean seqlen_k {mean_k} < {need} (varlen{' backward' if backward else ''}): "
                "portable is not slower there")
    return None


def varlen_unsupported(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                       params: Mapping[str, Any], seqused_k: Optional[torch.Tensor],
                       return_softmax: bool) -> Optional[str]:
    """Why this packed forward (q (total_q, h, d), k / v (total_k, h_k, d)) is not covered by
    the Hopper kernel's varlen mode (None when it is): the dense rules over the (1, total, h,
    d) views (``seqused_k``, any or None, is covered: the producer reads it), at least one
    sequence, query row and key (empty calls take the portable path's early exit)."""
    if q.shape[0] == 0 or k.shape[0] == 0:
        return "no query row or no key"
    if return_softmax:
        return "return_softmax"
    return call_unsupported(q.unsqueeze(0), k.unsqueeze(0), v.unsqueeze(0), params)


def unsupported(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                params: Mapping[str, Any]) -> Optional[str]:
    """Device check and call check together (None: the Hopper forward runs this call)."""
    return device_unavailable(q.device) or call_unsupported(q, k, v, params)


# Backward: bwd_kernel.py for d <= 128 (d = 96 runs as 128, zero-padded), bwd_wide_kernel.py
# for d = 192 / 256 (run as 256). dQ is accumulated by TMA reduce-add (fp32). Its order is
# fixed for deterministic=True at d = 128 without a mask or softcap (the key tiles take turns
# through a dQ writer warp, config.BwdConfig.deterministic; the kernel also runs d = 64 and
# masks); other deterministic calls run the portable backward. Measured on H100 (2026-11-23,
# hopper_probe --mode bwd, TFLOP/s, ordered Hopper / portable deterministic): dense d = 128
# 16k 500 / 405, 8k 444 / 393, 2k 359 / 339; d = 64 8k 326 / 313, 2k 242 / 272; causal d = 128
# 16k 315 / 408, 8k 252 / 368, 2k 193 / 279, d = 64 8k 224 / 296. Under a mask the key tiles'
# turns serialise; at d = 64 the writer's per-block round trips cost as much as the GEMMs.
BWD_HEAD_DIMS = (64, 96, 128, 192, 256)
ENV_HOPPER_BWD = "FLASHATTN_HOPPER_BWD"


def backward_unsupported(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                         params: Mapping[str, Any]) -> Optional[str]:
    """Why this backward call is not covered by the Hopper backward kernel (None when it is).

    params: the normalised keyword arguments of docs/internals.md (backward form, with
    ``deterministic``). ``FLASHATTN_HOPPER_BWD=0`` turns the Hopper backward off.
    """
    if not env.settings().hopper_bwd:
        return f"{ENV_HOPPER_BWD}=0"
    why = call_unsupported(q, k, v, {**params, "return_softmax": False})
    if why is not None:
        return why
    if q.shape[-1] not in BWD_HEAD_DIMS:
        return f"head dim {q.shape[-1]} (Hopper backward: one of {BWD_HEAD_DIMS})"
    if v.shape[-1] != q.shape[-1]:
        return f"head dims {q.shape[-1]}/{v.shape[-1]} (Hopper backward: equal)"
    if params.get("deterministic", False):
        from flashattn.backends.sm90.config import ordered_dq_unsupported

        if int(params.get("window_right", -1)) >= 0 or int(params.get("window_left", -1)) >= 0:
            return ("deterministic=True with a causal or window mask (the ordered dQ measured "
                    "slower than the portable backward there)")
        if q.shape[-1] != 128:
            return (f"deterministic=True at head dim {q.shape[-1]} (the ordered dQ measured "
                    f"faster than the portable backward at d = 128 only)")
        why = ordered_dq_unsupported(q.shape[-1], int(params.get("window_left", -1)),
                                     float(params.get("softcap", 0.0)))
        if why is not None:
            return f"deterministic=True with {why}"
    return None


def varlen_backward_unsupported(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                                params: Mapping[str, Any],
                                seqused_k: Optional[torch.Tensor]) -> Optional[str]:
    """Why this packed backward (q (total_q, h, d), k / v (total_k, h_k, d)) is not covered by
    the backward kernels' varlen mode (bwd_kernel.py, bwd_wide_kernel.py at d = 192 / 256;
    None when it is): the dense backward's rules over the (1, total, h, d) views,
    deterministic=False, at least one row and key (``seqused_k``, any or None, is covered)."""
    if q.shape[0] == 0 or k.shape[0] == 0:
        return "no query row or no key"
    if params.get("deterministic", False):
        return "deterministic=True (no ordered dQ in the varlen backward)"
    return backward_unsupported(q.unsqueeze(0), k.unsqueeze(0), v.unsqueeze(0), params)
