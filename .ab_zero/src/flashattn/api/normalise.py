"""Argument normalisation, done once for every public function (flash-attn 2 semantics).

The public functions validate their arguments (:mod:`flashattn.api.validation`) and then call
these to turn them into the normalised parameters the ops take (docs/internals.md): the
softmax scale defaulted, window sides past the keys made unbounded, causal folded into
``window_right = 0``, ALiBi slopes as a (b, h) view, and the dropout seed drawn.
"""
from __future__ import annotations

from typing import Optional, Tuple

import torch

# Seeds in [0, 2**63 - 1): non-negative int64, inside the [0, 2**63) the backends accept.
SEED_HIGH = 2**63 - 1


def draw_philox_seed() -> torch.Tensor:
    """A dropout seed: int64 CPU tensor of shape (1,), from torch's default CPU generator.

    ``torch.manual_seed`` reproduces it. It stays a tensor (read by the op, on the CPU, so it
    never synchronises a GPU) so that torch.compile records the draw as a random op of the
    graph: every call of a compiled model draws a fresh seed instead of reusing the trace-time
    one. Dense and varlen calls draw it the same way.
    """
    return torch.randint(0, SEED_HIGH, (1,), dtype=torch.int64, device="cpu")


def softmax_scale_or_default(scale: Optional[float], head_dim: int) -> float:
    """``head_dim ** -0.5`` when ``scale`` is None."""
    return head_dim ** -0.5 if scale is None else scale


def window(window_left: int, window_right: int, causal: bool, seqlen_k: int) -> Tuple[int, int]:
    """flash-attn 2's rule (flash_api.cpp): window sides reaching ``seqlen_k`` or past it mean
    "unbounded" (-1), then causal forces ``window_right = 0`` (bottom-right aligned).
    ``seqlen_k``: the dense call's s_k, the varlen call's max_seqlen_k (the batch maximum,
    not a sequence's own), a KV-cache call's capacity."""
    if window_left >= seqlen_k:
        window_left = -1
    if window_right >= seqlen_k:
        window_right = -1
    if causal:
        window_right = 0
    return window_left, window_right


def alibi_bh(alibi_slopes: Optional[torch.Tensor], batch: int, nheads: int
             ) -> Optional[torch.Tensor]:
    """ALiBi slopes as (batch, nheads): a (nheads,) vector expanded with batch stride 0, a
    (batch, nheads) one made unit-stride in its last dim."""
    if alibi_slopes is None:
        return None
    if alibi_slopes.dim() == 1:
        return alibi_slopes.unsqueeze(0).expand(batch, nheads)
    if alibi_slopes.stride(-1) != 1 and nheads > 1:
        return alibi_slopes.contiguous()
    return alibi_slopes


def dropout_seed(dropout_p: float) -> Optional[torch.Tensor]:
    """The seed of a call: drawn only when dropout is on (the draw advances torch's generator,
    as flash-attn's does), None otherwise."""
    return draw_philox_seed() if dropout_p > 0.0 else None


__all__ = ["SEED_HIGH", "alibi_bh", "draw_philox_seed", "dropout_seed",
           "softmax_scale_or_default", "window"]
