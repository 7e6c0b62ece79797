"""Ops on finished results: merging key splits and partial outputs (out, lse), learnable
sinks, and summing gradient partials that each cover a range of rows."""
from __future__ import annotations

from typing import Optional, Sequence, Tuple

import torch

from flashattn.dispatch import select as _select


def combine(out_partial: torch.Tensor, lse_partial: torch.Tensor, out: Optional[torch.Tensor],
            out_dtype: torch.dtype) -> Tuple[torch.Tensor, torch.Tensor]:
    """Merge attention computed over disjoint key splits: out_partial (splits, b, s_q, h, d_v)
    and lse_partial (splits, b, h, s_q) float32 -> (out (b, s_q, h, d_v) in ``out_dtype``,
    written into ``out`` when given; lse float32 (b, h, s_q))."""
    name = _select.select("combine", out_partial)
    return _select.backend(name).combine(out_partial, lse_partial, out, out_dtype)


def lse_merge(out_a: torch.Tensor, lse_a: torch.Tensor, out_b: torch.Tensor,
              lse_b: torch.Tensor, dest: torch.Tensor) -> None:
    """Two partial results over disjoint keys merged through their lse, in place: ``lse_a``
    (b, h, s) float32 becomes the merged lse, ``dest`` (b, s, h, d_v), which may be ``out_a``,
    the merged output (float32 math, stored in dest's dtype). Mismatched shapes raise
    ValueError on every backend (a kernel would read out of bounds, torch would broadcast)."""
    b, s, h, d_v = out_a.shape
    if (tuple(out_b.shape) != (b, s, h, d_v) or tuple(dest.shape) != (b, s, h, d_v)
            or tuple(lse_a.shape) != (b, h, s) or tuple(lse_b.shape) != (b, h, s)):
        raise ValueError(
            f"lse_merge: out_a {tuple(out_a.shape)}, out_b {tuple(out_b.shape)} and dest "
            f"{tuple(dest.shape)} must be (b, s, h, d_v) alike, lse_a {tuple(lse_a.shape)} and "
            f"lse_b {tuple(lse_b.shape)} (b, h, s)")
    _select.backend(_select.select("lse_merge", out_a)).lse_merge(out_a, lse_a, out_b, lse_b,
                                                                   dest)


def sum_rows(parts: Sequence[torch.Tensor], starts: Sequence[int], n_rows: int, row_dim: int,
             out_dtype: torch.dtype) -> torch.Tensor:
    """The float32 sum of ``parts``, each covering rows ``[starts[i], starts[i] +
    parts[i].shape[row_dim])`` of an output with ``n_rows`` rows along ``row_dim`` (the other
    dims as the parts'), added in the order given and rounded once to ``out_dtype``; rows no
    part covers are 0. ``parts``: one float dtype, one device, at least one. Ranges outside
    the output or mismatched dims raise ValueError (a kernel would read or write out of
    bounds)."""
    if not parts:
        raise ValueError("sum_rows: parts is empty (the output's shape comes from them)")
    first = parts[0]
    if not 0 <= row_dim < first.dim():
        raise ValueError(f"sum_rows: row_dim {row_dim} is not a dim of parts[0] "
                         f"{tuple(first.shape)}")
    if len(starts) != len(parts):
        raise ValueError(f"sum_rows: {len(starts)} starts for {len(parts)} parts")
    if n_rows < 0:
        raise ValueError(f"sum_rows: n_rows must be >= 0, got {n_rows}")
    shape = list(first.shape)
    shape[row_dim] = n_rows
    for i, (p, start) in enumerate(zip(parts, starts)):
        other = list(p.shape)
        other[row_dim] = n_rows
        if other != shape or p.dtype != first.dtype or p.device != first.device:
            raise ValueError(
                f"sum_rows: parts[{i}] {tuple(p.shape)} {p.dtype} on {p.device} does not match "
                f"parts[0] {tuple(first.shape)} {first.dtype} on {first.device} outside dim "
                f"{row_dim}")
        if start < 0 or start + p.shape[row_dim] > n_rows:
            raise ValueError(f"sum_rows: parts[{i}] covers rows [{start}, "
                             f"{start + p.shape[row_dim]}) outside [0, {n_rows})")
    outer = 1
    for n in shape[:row_dim]:
        outer *= n
    inner = 1
    for n in shape[row_dim + 1:]:
        inner *= n
    out = torch.empty(shape, dtype=out_dtype, device=first.device)
    views = [p.contiguous().view(outer, p.shape[row_dim], inner) for p in parts]
    _select.backend(_select.select("sum_rows", first)).sum_rows(
        views, [int(s) for s in starts], out.view(outer, n_rows, inner))
    return out


def sink_apply(out: torch.Tensor, lse: torch.Tensor, sink: torch.Tensor, packed: bool,
               out_dtype: Optional[torch.dtype] = None) -> Tuple[torch.Tensor, torch.Tensor]:
    """Learnable sinks on a finished attention output: (out * exp(lse - lse'), lse' =
    logaddexp(lse, sink)); out (b, s, h, d_v) / lse (b, h, s), or packed (t, h, d_v) / (h, t);
    the new out in ``out_dtype`` (default out's)."""
    return _select.backend(_select.select("sink_apply", out)).sink_apply(out, lse, sink, packed,
                                                                         out_dtype)


def sink_grad(dout: torch.Tensor, out: torch.Tensor, lse: torch.Tensor, sink: torch.Tensor,
              packed: bool) -> torch.Tensor:
    """d sink (h,) of learnable sinks from dout and the outputs with the sink (out', lse')."""
    return _select.backend(_select.select("sink_grad", out)).sink_grad(dout, out, lse, sink, packed)


__all__ = ["combine", "lse_merge", "sink_apply", "sink_grad", "sum_rows"]
