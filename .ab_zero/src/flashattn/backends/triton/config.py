"""Launch configuration of the portable kernels: tile shapes, autotune spaces, precision.

The tuned spaces are data (``_FWD_SPACE`` / ``_BWD_SPACE``); ``early_config_prune`` keeps the
entries that match the head dim and dtype of a call so autotuning times a handful of
candidates, and ``cache_results=True`` keeps the winner on disk across processes.
Under ``TRITON_INTERPRET=1`` a single small config runs (the interpreter has one config only).
"""
from __future__ import annotations

import torch
import triton

from flashattn.runtime import device as _device
from flashattn.runtime import env
from flashattn.runtime.env import INTERPRET
# host-side helpers the kernels' wrappers use as ``config.<name>`` (they live in the runtime)
from flashattn.runtime.grid import MAX_GRID_YZ, bh_on_axis0, cdiv, next_pow2  # noqa: F401
from flashattn.runtime.launch import install_allocator  # noqa: F401


def atomic_dq_enabled() -> bool:
    """dQ by fp32 atomics in the dK/dV pass (FLASHATTN_ATOMIC_DQ=1; the separate dQ pass is
    faster on H100)."""
    return env.settings().atomic_dq


def block_dim(head_dim: int) -> int:
    """Padded head-dim tile: a power of two, at least 16 (tl.dot's minimum K)."""
    return max(16, next_pow2(head_dim))


def seq_bucket(seqlen_q: int, seqlen_k: int) -> int:
    """Autotune key for sequence length: next power of two of the longer side, capped."""
    return min(next_pow2(max(seqlen_q, seqlen_k, 1)), 16384)


def upcast_dots(t: torch.Tensor) -> bool:
    """The interpreter multiplies raw bf16 bits in tl.dot: upcast operands to fp32 there."""
    return INTERPRET and t.dtype == torch.bfloat16


def dot_precision(t: torch.Tensor) -> str:
    """fp32 inputs must match PyTorch's fp32 accuracy: use exact IEEE products, not TF32."""
    return "ieee" if (t.dtype == torch.float32 or upcast_dots(t)) else "tf32"


def _cfg(bm, bn, warps, stages, **extra):
    return triton.Config({"BLOCK_M": bm, "BLOCK_N": bn, **extra}, num_warps=warps, num_stages=stages)


# (max BLOCK_D, element bytes) -> candidate configs. Shared memory per stage is roughly
# (BLOCK_N * (BLOCK_D + BLOCK_DV)) * bytes, which bounds the stage count at d = 256.
def _fcfg(bm, bn, warps, stages, ws=False):
    """Forward config; ``ws`` turns on Triton's warp specialization of the main key loop."""
    return _cfg(bm, bn, warps, stages, WARP_SPEC=ws)


_FWD_SPACE = {
    (64, 2): [_fcfg(128, 64, 4, 3), _fcfg(128, 128, 8, 3), _fcfg(128, 64, 4, 4), _fcfg(128, 128, 4, 3),
              _fcfg(64, 64, 4, 3), _fcfg(128, 128, 8, 3, True), _fcfg(128, 64, 8, 3, True)],
    (128, 2): [_fcfg(128, 64, 8, 3), _fcfg(128, 128, 8, 3), _fcfg(128, 64, 8, 4), _fcfg(64, 64, 4, 3),
               _fcfg(128, 128, 8, 3, True), _fcfg(128, 64, 8, 3, True)],
    (256, 2): [_fcfg(128, 64, 8, 1), _fcfg(64, 64, 4, 1), _fcfg(128, 32, 8, 3), _fcfg(64, 32, 4, 3)],
    (64, 4): [_fcfg(64, 64, 4, 3), _fcfg(64, 32, 4, 1)],
    (128, 4): [_fcfg(64, 32, 4, 3), _fcfg(64, 32, 4, 1)],
    (256, 4): [_fcfg(32, 32, 4, 1), _fcfg(64, 32, 4, 1)],
    # V 257-512 wide (forward only; pointer loads: no TMA box is that wide). sm_90 compile
    # (tools/aot_portable.py, Triton 3.6) at d 64 / 128 / 256 with V 512: M64 N32 w8 s2 223-242
    # registers, no spill, 80-128 KiB shared; M64 N64 w8 s2 244-255, no spill, up to 224 KiB;
    # one stage spills at d 256; fp32 M32 N16 w8 spills ~900 bytes, M16 N16 w4 none
    (512, 2): [_fcfg(64, 32, 8, 2), _fcfg(64, 64, 8, 2)],
    (512, 4): [_fcfg(16, 16, 4, 1)],
}
# Backward (dK/dV pass): BLOCK_N keys stay on chip, BLOCK_M query rows stream.
_BWD_KV_SPACE = {
    (64, 2): [_cfg(64, 128, 8, 2), _cfg(32, 128, 4, 3), _cfg(64, 64, 4, 2)],
    (128, 2): [_cfg(64, 128, 8, 2), _cfg(64, 128, 8, 3), _cfg(32, 128, 4, 3), _cfg(64, 64, 4, 2),
               _cfg(32, 64, 4, 3)],
    (256, 2): [_cfg(32, 64, 4, 1), _cfg(32, 64, 8, 2), _cfg(16, 64, 4, 2), _cfg(64, 64, 8, 2),
               _cfg(32, 32, 4, 2), _cfg(32, 32, 4, 1)],
    (64, 4): [_cfg(32, 64, 4, 1), _cfg(32, 32, 4, 1)],
    (128, 4): [_cfg(32, 32, 4, 1), _cfg(32, 64, 4, 1)],
    (256, 4): [_cfg(16, 32, 4, 1), _cfg(32, 32, 4, 1)],
}
# Backward (dQ pass): BLOCK_M query rows stay on chip, BLOCK_N keys stream.
_BWD_Q_SPACE = {
    (64, 2): [_cfg(128, 64, 8, 3), _cfg(128, 32, 4, 3), _cfg(64, 64, 4, 3)],
    (128, 2): [_cfg(128, 64, 8, 3), _cfg(128, 32, 4, 3), _cfg(64, 64, 4, 3)],
    # (M64 N64 w8 s3 was here: it needs 257 KiB of shared memory and never launched; AOT report)
    (256, 2): [_cfg(64, 32, 4, 3), _cfg(64, 32, 4, 1), _cfg(32, 64, 4, 3), _cfg(32, 32, 4, 1)],
    (64, 4): [_cfg(64, 32, 4, 1), _cfg(32, 32, 4, 1)],
    (128, 4): [_cfg(32, 32, 4, 1), _cfg(64, 32, 4, 1)],
    (256, 4): [_cfg(32, 16, 4, 1), _cfg(32, 32, 4, 1)],
}
# Warp-specialised configs use 8 warps: Triton 3.6 fails to compile them with 4 warps.
# Note: ptxas 12.x (Triton 3.6) segfaults on some TMA kernels pipelined with num_stages=2
# (forward and dQ; see benchmarks/NOTES.md), so those spaces use 1 or >= 3 stages.
_INTERPRET_CFG = _cfg(16, 16, 4, 1)


def _space_key(named_args, kwargs):
    d = max(kwargs["BLOCK_D"], kwargs["BLOCK_DV"])
    d = 64 if d <= 64 else (128 if d <= 128 else (256 if d <= 256 else 512))
    q = named_args.get("Q")
    elem = q.element_size() if q is not None else 2
    return d, (4 if elem >= 4 else 2)


def _pruner(space):
    def prune(configs, named_args, **kwargs):
        candidates = list(space[_space_key(named_args, kwargs)])
        # FLASHATTN_AUTOTUNE=0: first candidate only (tests, quick checks: no tuning runs)
        if not env.settings().autotune:
            return candidates[:1]
        return candidates
    return prune


def _all(space):
    seen, out = set(), []
    for cfgs in space.values():
        for c in cfgs:
            key = str(c)
            if key not in seen:
                seen.add(key)
                out.append(c)
    return out


_KEY = ["HEAD_DIM", "HEAD_DIM_V", "HAS_LEFT", "HAS_RIGHT", "HAS_SOFTCAP", "HAS_ALIBI",
        "HAS_DROPOUT", "seq_bucket", "VARLEN"]


def _autotune(kernel, space, reset_to_zero=None, interpret_cfg=_INTERPRET_CFG):
    if INTERPRET:
        return triton.autotune(configs=[interpret_cfg], key=[])(kernel)
    return triton.autotune(configs=_all(space), key=_KEY,
                           prune_configs_by={"early_config_prune": _pruner(space)},
                           reset_to_zero=reset_to_zero, cache_results=True)(kernel)


def autotune_fwd(kernel):
    return _autotune(kernel, _FWD_SPACE, interpret_cfg=_fcfg(16, 16, 4, 1))


def autotune_bwd_kv(kernel, reset_to_zero=None):
    return _autotune(kernel, _BWD_KV_SPACE, reset_to_zero)


def autotune_bwd_q(kernel):
    return _autotune(kernel, _BWD_Q_SPACE)


def use_tma(*tensors: torch.Tensor) -> bool:
    """Whether K/V (or Q/dO) tiles can stream through TMA tensor descriptors.

    Needs Hopper or newer (or the interpreter, which emulates descriptors so CPU tests
    cover this path) and 16-byte aligned base and strides of the (b, s, h) dimensions.
    """
    for t in tensors:
        if t.data_ptr() % 16 or any(st == 0 or (st * t.element_size()) % 16 for st in t.stride()[:-1]):
            return False
    if INTERPRET:
        return True
    t = tensors[0]
    if not t.is_cuda:
        return False
    index = t.device.index
    return _device.capability_major(torch.cuda.current_device() if index is None else index) >= 9


def fwd_use_tma(k: torch.Tensor, v: torch.Tensor) -> bool:
    """:func:`use_tma` for the forward's K / V tiles: a TMA box is at most 256 elements a side,
    so V wider than 256 streams through pointer loads."""
    return v.shape[-1] <= 256 and use_tma(k, v)


def sm_count(device: torch.device) -> int:
    """Multiprocessors of ``device`` (see :func:`flashattn.runtime.device.sm_count`)."""
    return _device.sm_count(device)
