"""Merge two partial attention results through their log-sum-exp, in one pass.

Two disjoint key blocks gave each query row the normalised outputs ``o_a`` / ``o_b`` and their
``lse_a`` / ``lse_b``; over both blocks

    lse = log(exp(lse_a) + exp(lse_b)),   out = exp(lse_a - lse) * o_a + exp(lse_b - lse) * o_b.

A row that saw no key in one block has lse -inf there: its weight is exactly 0 and that
block's output is never multiplied in (whatever its buffer holds, NaN included). A row with no
key in either keeps out 0 and lse -inf. Used by context parallelism's ring, where ``o_a`` is the
running float32 (or, for the ring's last merge, 16-bit) accumulator.

One program per (batch, head, ``BLOCK_M`` query rows): the two lse vectors once, then the rows'
``d_v`` values (last dim contiguous) read once from each side and written once, in float32
math, to ``dest`` (which may be ``o_a`` itself).
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from flashattn.backends.triton import config
from flashattn.runtime.launch import launch_jit


@triton.jit
def _lse_merge_kernel(OutA, LseA, OutB, LseB, Dest, seqlen, nheads,
                      s_ab, s_am, s_ah, s_lab, s_lah, s_lam,
                      s_bb, s_bm, s_bh, s_lbb, s_lbh, s_lbm,
                      s_db, s_dm, s_dh,
                      HEAD_DIM_V: tl.constexpr, BLOCK_DV: tl.constexpr, BLOCK_M: tl.constexpr):
    # one grid axis (axes 1 and 2 stop at 65535): row blocks fastest
    n_m = tl.cdiv(seqlen, BLOCK_M)
    pid = tl.program_id(0)
    pid_m = pid % n_m
    pid_bh = pid // n_m
    off_b = (pid_bh // nheads).to(tl.int64)
    off_h = (pid_bh % nheads).to(tl.int64)
    rows = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    row_ok = rows < seqlen
    rows64 = rows.to(tl.int64)

    lse_a = tl.load(LseA + off_b * s_lab + off_h * s_lah + rows64 * s_lam, mask=row_ok,
                    other=float("-inf"))
    lse_b = tl.load(LseB + off_b * s_lbb + off_h * s_lbh + rows64 * s_lbm, mask=row_ok,
                    other=float("-inf"))
    hi = tl.maximum(lse_a, lse_b)
    any_key = hi > float("-inf")
    ref = tl.where(any_key, hi, 0.0)  # a finite reference: no -inf - -inf
    e_a = tl.exp(lse_a - ref)  # exp(-inf) = 0 for a side without keys
    e_b = tl.exp(lse_b - ref)
    total = tl.where(any_key, e_a + e_b, 1.0)
    lse = tl.where(any_key, ref + tl.log(total), float("-inf"))
    w_a = e_a / total
    w_b = e_b / total

    cols = tl.arange(0, BLOCK_DV)
    mask = row_ok[:, None] & (cols[None, :] < HEAD_DIM_V)
    o_a = tl.load(OutA + off_b * s_ab + off_h * s_ah + rows64[:, None] * s_am + cols[None, :],
                  mask=mask, other=0.0).to(tl.float32)
    o_b = tl.load(OutB + off_b * s_bb + off_h * s_bh + rows64[:, None] * s_bm + cols[None, :],
                  mask=mask, other=0.0).to(tl.float32)
    # a zero weight must not multiply whatever that side holds (NaN * 0 is NaN)
    out = (tl.where((w_a > 0.0)[:, None], o_a * w_a[:, None], 0.0)
           + tl.where((w_b > 0.0)[:, None], o_b * w_b[:, None], 0.0))
    tl.store(Dest + off_b * s_db + off_h * s_dh + rows64[:, None] * s_dm + cols[None, :],
             out.to(Dest.dtype.element_ty), mask=mask)
    tl.store(LseA + off_b * s_lab + off_h * s_lah + rows64 * s_lam, lse, mask=row_ok)


def lse_merge(out_a: torch.Tensor, lse_a: torch.Tensor, out_b: torch.Tensor,
              lse_b: torch.Tensor, dest: torch.Tensor) -> None:
    """In place: ``lse_a`` (b, h, s) float32 becomes the merged lse and ``dest`` (b, s, h, d_v),
    any float dtype, the merged output of ``out_a`` / ``out_b`` (b, s, h, d_v), any float
    dtypes. Any strides; ``dest`` may be ``out_a`` and needs a contiguous last dim (a read-only
    side without one is copied). The shapes are checked by ``dispatch.merge.lse_merge``."""
    b, s, h, d_v = out_a.shape
    if dest.stride(-1) != 1 and d_v > 1:
        raise ValueError(f"lse_merge: dest needs a contiguous last dim, got strides "
                         f"{dest.stride()}")
    if b * s * h == 0:
        return
    if out_a.stride(-1) != 1 and d_v > 1:  # not dest (checked above): only read
        out_a = out_a.contiguous()
    if out_b.stride(-1) != 1 and d_v > 1:
        out_b = out_b.contiguous()
    block_dv = config.block_dim(d_v)
    # about 4k values a program: whole rows, enough of them to keep the loads in flight
    block_m = max(1, min(64, 4096 // block_dv))
    args = (out_a, lse_a, out_b, lse_b, dest, s, h,
            out_a.stride(0), out_a.stride(1), out_a.stride(2), *lse_a.stride(),
            out_b.stride(0), out_b.stride(1), out_b.stride(2), *lse_b.stride(),
            dest.stride(0), dest.stride(1), dest.stride(2))
    kwargs = dict(HEAD_DIM_V=d_v, BLOCK_DV=block_dv, BLOCK_M=block_m, num_warps=4)
    launch_jit(_lse_merge_kernel, (triton.cdiv(s, block_m) * b * h,), args, kwargs)


__all__ = ["lse_merge"]
