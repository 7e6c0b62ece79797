"""Host side shared by the Hopper forward and backward: TMA descriptors over (b, s, h, d)
tensors, their padded head dims and shared-memory layouts, and the L2 head-group rule."""
from __future__ import annotations

import functools
from typing import Any, Tuple

import torch
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.nvidia.hopper import TensorDescriptor

from flashattn.runtime.grid import next_pow2

LOG2E = 1.4426950408889634
_GL_DTYPE = {torch.float16: gl.float16, torch.bfloat16: gl.bfloat16,
             torch.float8_e4m3fn: gl.float8e4nv,
             torch.float32: gl.float32}  # (the FP8 forward's O, out_dtype=float32)
# bytes of the tiles that the CTAs running at the same time share should stay in L2 (50 MB on
# H100): the forward's K / V, the backward's Q / dO
_L2_SHARED_BUDGET = 24 * 2**20


def padded_head_dim(head_dim: int) -> int:
    """TMA boxes are powers of two: d = 96 / 192 load as 128 / 256 columns, zero-filled past d
    (zeros add nothing to QK^T, give zero O columns, and the TMA store drops them)."""
    return next_pow2(head_dim)


@functools.lru_cache(maxsize=None)
def nvmma_layout(block: Tuple[int, ...], dtype: Any) -> Any:
    """The NVMMA shared layout TMA and wgmma use for a ``block`` tile of ``dtype`` (a Gluon
    dtype). Cached: building it costs ~5 us of Python per descriptor per call (the layout is an
    immutable value, the same for every call with that block)."""
    return gl.NVMMASharedLayout.get_default_for(list(block), dtype)


def tensor_desc(t: torch.Tensor, rows: int) -> TensorDescriptor:
    """Rank-4 descriptor over (batch, seq, head, dim) with a [1, rows, 1, dim_pad] box."""
    block = [1, rows, 1, padded_head_dim(t.shape[3])]
    layout = nvmma_layout(tuple(block), _GL_DTYPE[t.dtype])
    return TensorDescriptor(t, list(t.shape), list(t.stride()), block, layout)


def keys_major_desc(v: torch.Tensor, rows: int) -> TensorDescriptor:
    """FP8 V: rank-4 descriptor over V^T = v.permute(0, 2, 3, 1) (batch, head, dim, seq), keys
    contiguous, with a [1, 1, dim_pad, rows] box (``rows`` keys)."""
    vt = v.permute(0, 2, 3, 1)
    block = [1, 1, padded_head_dim(v.shape[3]), rows]
    layout = nvmma_layout(tuple(block), _GL_DTYPE[v.dtype])
    return TensorDescriptor(vt, list(vt.shape), list(vt.stride()), block, layout)


def heads_per_group(n_heads: int, bytes_per_head: int) -> int:
    """How many of ``n_heads`` heads the grouped tile orders (tiles.tile_coords) walk at a time:
    as many as keep ``bytes_per_head`` each (the tensors their CTAs share) within the L2
    budget, at least one."""
    return max(1, min(n_heads, _L2_SHARED_BUDGET // max(1, bytes_per_head)))
