"""Ops on finished attention outputs (out, lse): merging key splits and learnable sinks."""
from __future__ import annotations

from typing import Optional, Tuple

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


__all__ = ["combine", "lse_merge", "sink_apply", "sink_grad"]
