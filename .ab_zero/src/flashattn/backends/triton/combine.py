"""Merge split-KV partial attention results (the second pass of Flash-Decoding).

Split s saw a disjoint part of the keys and produced a normalised output ``o_s`` and its
log-sum-exp ``lse_s``. The full softmax is their LSE-weighted mean:

    lse = log(sum_s exp(lse_s)),   out = sum_s exp(lse_s - lse) * o_s

computed with the maximum subtracted first. A split that saw no key has ``lse_s = -inf``:
its weight is exactly 0 and its ``o_s`` is never multiplied in (so garbage there, even NaN,
cannot leak). A row where every split is empty gets out 0 and lse -inf.

One program per (batch, query position, head) row; splits stream in chunks of
``SPLIT_CHUNK`` rows of ``d_v`` values.
"""
from __future__ import annotations

from typing import Any, Tuple

import torch
import triton
import triton.language as tl

from flashattn.backends.triton import config
from flashattn.runtime.launch import launch_jit


@triton.jit
def _combine_kernel(OutP, LseP, Out, Lse, n_splits, seqlen_q, nheads,
                    stride_ps, stride_pb, stride_pm, stride_ph,
                    stride_qs, stride_qb, stride_qh, stride_qm,
                    stride_ob, stride_om, stride_oh,
                    stride_lb, stride_lh, stride_lm,
                    HEAD_DIM_V: tl.constexpr, BLOCK_DV: tl.constexpr,
                    BLOCK_S: tl.constexpr, SPLIT_CHUNK: tl.constexpr):
    pid = tl.program_id(0)
    off_h = pid % nheads
    rest = pid // nheads
    off_m = rest % seqlen_q
    off_b = rest // seqlen_q

    lse_base = LseP + off_b.to(tl.int64) * stride_qb + off_h.to(tl.int64) * stride_qh \
        + off_m.to(tl.int64) * stride_qm
    offs_s = tl.arange(0, BLOCK_S)
    lse_s = tl.load(lse_base + offs_s.to(tl.int64) * stride_qs, mask=offs_s < n_splits,
                    other=float("-inf"))
    lse_max = tl.max(lse_s, 0)
    any_key = lse_max > float("-inf")
    lse_ref = tl.where(any_key, lse_max, 0.0)
    w_sum = tl.sum(tl.exp(lse_s - lse_ref), 0)  # exp(-inf) = 0 for empty splits
    w_sum_safe = tl.where(any_key, w_sum, 1.0)
    lse = tl.where(any_key, lse_ref + tl.log(w_sum_safe), float("-inf"))

    offs_dv = tl.arange(0, BLOCK_DV)
    offs_c = tl.arange(0, SPLIT_CHUNK)
    o_base = OutP + off_b.to(tl.int64) * stride_pb + off_m.to(tl.int64) * stride_pm \
        + off_h.to(tl.int64) * stride_ph
    acc = tl.zeros([BLOCK_DV], dtype=tl.float32)
    for s0 in range(0, n_splits, SPLIT_CHUNK):
        splits = s0 + offs_c
        s_ok = splits < n_splits
        l_c = tl.load(lse_base + splits.to(tl.int64) * stride_qs, mask=s_ok, other=float("-inf"))
        w = tl.exp(l_c - lse_ref) / w_sum_safe
        o_c = tl.load(o_base + splits.to(tl.int64)[:, None] * stride_ps + offs_dv[None, :],
                      mask=s_ok[:, None] & (offs_dv[None, :] < HEAD_DIM_V), other=0.0)
        # weight 0 (empty split) must not multiply whatever that split left in its buffer
        contrib = tl.where((w > 0.0)[:, None], o_c * w[:, None], 0.0)
        acc += tl.sum(contrib, 0)

    o_ptrs = Out + off_b.to(tl.int64) * stride_ob + off_m.to(tl.int64) * stride_om \
        + off_h.to(tl.int64) * stride_oh + offs_dv
    tl.store(o_ptrs, acc.to(Out.dtype.element_ty), mask=offs_dv < HEAD_DIM_V)
    tl.store(Lse + off_b.to(tl.int64) * stride_lb + off_h.to(tl.int64) * stride_lh
             + off_m.to(tl.int64) * stride_lm, lse)


def combine_launch(out_partial: torch.Tensor, lse_partial: torch.Tensor, out: torch.Tensor,
                   lse: torch.Tensor) -> Tuple[Any, Tuple[int], tuple, dict]:
    """The combine kernel's launch ``(fn, grid, args, kwargs)`` for these tensors (see
    :func:`combine_splits`; out_partial has a unit last stride). The four tensors lead
    ``args`` (a launch plan's slots 0-3)."""
    n_splits, b, s_q, h, d_v = out_partial.shape
    block_s = max(2, config.next_pow2(n_splits))
    block_dv = config.block_dim(d_v)
    chunk = min(block_s, 16 if block_dv <= 128 else 8)
    args = (
        out_partial, lse_partial, out, lse, n_splits, s_q, h,
        out_partial.stride(0), out_partial.stride(1), out_partial.stride(2), out_partial.stride(3),
        *lse_partial.stride(),
        out.stride(0), out.stride(1), out.stride(2),
        *lse.stride())
    kwargs = dict(
        HEAD_DIM_V=d_v, BLOCK_DV=block_dv, BLOCK_S=block_s, SPLIT_CHUNK=chunk,
        num_warps=4 if block_dv * chunk >= 2048 else 2,
    )
    return _combine_kernel, (b * s_q * h,), args, kwargs


def combine_splits(out_partial: torch.Tensor, lse_partial: torch.Tensor, out: torch.Tensor,
                   lse: torch.Tensor) -> None:
    """Write the merge of the splits into ``out`` / ``lse`` (Triton).

    out_partial (num_splits, b, s_q, h, d_v) float32, lse_partial (num_splits, b, h, s_q)
    float32, any strides with unit last dim for out_partial; out (b, s_q, h, d_v) any float
    dtype, lse (b, h, s_q) float32.
    """
    _, b, s_q, h, _ = out_partial.shape
    if b * s_q * h == 0:
        return
    if out_partial.stride(-1) != 1:
        out_partial = out_partial.contiguous()
    fn, grid, args, kwargs = combine_launch(out_partial, lse_partial, out, lse)
    launch_jit(fn, grid, args, kwargs)


__all__ = ["combine_launch", "combine_splits"]
