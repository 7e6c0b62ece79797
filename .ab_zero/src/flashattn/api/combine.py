"""``flash_attn_combine``: merge attention computed over disjoint key splits (flash-attn 2 / 3's
Flash-Decoding combine), through the ``flashattn::combine`` op (eager calls run its body)."""
from __future__ import annotations

from typing import Optional, Tuple

import torch

from flashattn import ops as _ops
from flashattn.api import kvcache_validation as _kv

Tensor = torch.Tensor


def flash_attn_combine(out_partial: Tensor, lse_partial: Tensor, out: Optional[Tensor] = None,
                       out_dtype: Optional[torch.dtype] = None) -> Tuple[Tensor, Tensor]:
    """Merge attention computed over disjoint key splits (the Flash-Decoding combine).

    Args:
        out_partial: (num_splits, batch, seqlen_q, nheads, headdim_v) float32, each split's
            normalised output.
        lse_partial: (num_splits, batch, nheads, seqlen_q) float32, each split's natural-log
            LSE; -inf for a split that saw no key (its out_partial entries are ignored).
        out: optional (batch, seqlen_q, nheads, headdim_v) tensor to write into.
        out_dtype: dtype of the result (default: out's dtype, else float32).

    Returns:
        (out (batch, seqlen_q, nheads, headdim_v), lse (batch, nheads, seqlen_q) float32);
        rows where every split is empty get out 0 and lse -inf.
    """
    _kv.check_combine(out_partial, lse_partial, out, out_dtype)
    return _ops.combine_splits(out_partial, lse_partial, out, out_dtype)


__all__ = ["flash_attn_combine"]
