"""Learnable attention sinks applied to a finished attention output, in one pass.

With S the scores of a row, s_h the sink logit of its head and (out, lse) the attention
without the sink (gpt-oss's sinks, FA4's ``learnable_sink``):

    lse' = logaddexp(lse, s_h),    out' = out * exp(lse - lse')

(a row that saw no key: lse = -inf, so out' = 0 and lse' = s_h). One program rescales
BLOCK_R rows of out (read once, written once in its dtype, fp32 math) and writes lse': the
whole cost of a sink is this one memory pass (the unfused torch composition made five).
"""
from __future__ import annotations

from typing import Optional, Tuple

import torch
import triton
import triton.language as tl

from flashattn.runtime.launch import launch_jit
from flashattn.backends.triton import config


@triton.jit
def _rows_of(Lse, Sink, n_rows, nheads, seqlen, lse_other, BLOCK_R: tl.constexpr):
    """This program's rows r = (b * seqlen + s) * nheads + h of a contiguous (b, s, h, d_v)
    tensor and their LSE entries in a contiguous (b, h, s) one (packed calls: b = 1, s =
    total): (rows, in-range mask, LSE offsets, lse, sink of the row's head in fp32)."""
    rows = tl.program_id(0).to(tl.int64) * BLOCK_R + tl.arange(0, BLOCK_R)
    ok = rows < n_rows
    head = rows % nheads
    bs = rows // nheads
    lse_off = (bs // seqlen) * nheads * seqlen + head * seqlen + bs % seqlen
    lse = tl.load(Lse + lse_off, mask=ok, other=lse_other)
    sink = tl.load(Sink + head, mask=ok, other=0.0).to(tl.float32)
    return rows, ok, lse_off, lse, sink


@triton.jit
def _sink_apply_kernel(Out, Lse, Sink, OutNew, LseNew, n_rows, nheads, seqlen,
                       HEAD_DIM_V: tl.constexpr, BLOCK_R: tl.constexpr, BLOCK_D: tl.constexpr):
    rows, ok, lse_off, lse, sink = _rows_of(Lse, Sink, n_rows, nheads, seqlen, float("-inf"),
                                            BLOCK_R)
    hi = tl.maximum(lse, sink)
    lse_new = hi + tl.log(tl.exp(lse - hi) + tl.exp(sink - hi))
    scale = tl.exp(lse - lse_new)  # 0 where lse = -inf
    offs_d = tl.arange(0, BLOCK_D)
    ptrs = rows[:, None] * HEAD_DIM_V + offs_d[None, :]
    tile_ok = ok[:, None] & (offs_d[None, :] < HEAD_DIM_V)
    o = tl.load(Out + ptrs, mask=tile_ok, other=0.0).to(tl.float32)
    tl.store(OutNew + ptrs, (o * scale[:, None]).to(OutNew.dtype.element_ty), mask=tile_ok)
    tl.store(LseNew + lse_off, lse_new, mask=ok)


@triton.jit
def _sink_grad_kernel(DOut, Out, Lse, Sink, Contrib, n_rows, nheads, seqlen,
                      HEAD_DIM_V: tl.constexpr, BLOCK_R: tl.constexpr, BLOCK_D: tl.constexpr):
    # each row's share of d sink: -exp(s_h - lse') * rowsum(dout * out'), written per row
    # (b, s, h order) and summed per head by the caller (no atomics on h addresses)
    rows, ok, _lse_off, lse, sink = _rows_of(Lse, Sink, n_rows, nheads, seqlen,
                                             float("inf"), BLOCK_R)
    offs_d = tl.arange(0, BLOCK_D)
    ptrs = rows[:, None] * HEAD_DIM_V + offs_d[None, :]
    tile_ok = ok[:, None] & (offs_d[None, :] < HEAD_DIM_V)
    do = tl.load(DOut + ptrs, mask=tile_ok, other=0.0).to(tl.float32)
    o = tl.load(Out + ptrs, mask=tile_ok, other=0.0).to(tl.float32)
    delta = tl.sum(do * o, 1)
    tl.store(Contrib + rows, -tl.exp(sink - lse) * delta, mask=ok)


def _row_launch(kernel, tensors, n_rows: int, h: int, seqlen: int, d_v: int) -> None:
    block_d = config.block_dim(d_v)
    block_r = max(1, min(128, 8192 // block_d))
    launch_jit(kernel, (triton.cdiv(n_rows, block_r),),
               (*tensors, n_rows, h, max(seqlen, 1)),
               dict(HEAD_DIM_V=d_v, BLOCK_R=block_r, BLOCK_D=block_d, num_warps=4))


def sink_grad(dout: torch.Tensor, out: torch.Tensor, lse: torch.Tensor, sink: torch.Tensor,
              packed: bool) -> torch.Tensor:
    """d sink (h,) in sink's dtype: -sum over rows of exp(sink - lse') * rowsum(dout * out')
    (out', lse': the outputs with the sink). One pass over dout and out, then a per-head sum
    of the (rows,) contributions."""
    dout, out, lse = dout.contiguous(), out.contiguous(), lse.contiguous()
    h, d_v = out.shape[-2], out.shape[-1]
    seqlen = out.shape[0] if packed else out.shape[1]
    n_rows = out.numel() // d_v if d_v else 0
    contrib = torch.zeros(max(n_rows, 1), dtype=torch.float32, device=out.device)
    if n_rows:
        _row_launch(_sink_grad_kernel, (dout, out, lse, sink.contiguous(), contrib), n_rows, h,
                    seqlen, d_v)
    return contrib[:n_rows].view(-1, h).sum(0).to(sink.dtype)


def sink_apply(out: torch.Tensor, lse: torch.Tensor, sink: torch.Tensor, packed: bool,
               out_dtype: Optional[torch.dtype] = None) -> Tuple[torch.Tensor, torch.Tensor]:
    """(out', lse') of module doc. out (b, s, h, d_v) / lse float32 (b, h, s), or packed out
    (t, h, d_v) / lse (h, t); sink float (h,). New tensors, out' in ``out_dtype`` (default
    out's). A float32 out (the forward's accumulator, unrounded) rounded here once gives the
    accuracy of a kernel that folds the sink into its epilogue; a 16-bit out is rounded twice."""
    out = out.contiguous()
    lse = lse.contiguous()
    sink = sink.contiguous()
    h, d_v = out.shape[-2], out.shape[-1]
    seqlen = out.shape[0] if packed else out.shape[1]
    n_rows = out.numel() // d_v if d_v else 0
    out_new = torch.empty(out.shape, dtype=out_dtype or out.dtype, device=out.device)
    lse_new = torch.empty_like(lse)
    if n_rows == 0:  # no rows (or d_v = 0): nothing to rescale
        return out_new, torch.logaddexp(lse, sink.float().view((-1, 1) if packed else (1, -1, 1)))
    _row_launch(_sink_apply_kernel, (out, lse, sink, out_new, lse_new), n_rows, h, seqlen, d_v)
    return out_new, lse_new


__all__ = ["sink_apply", "sink_grad"]
