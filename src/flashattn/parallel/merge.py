"""Merging partial attention results through their log-sum-exp.

A block of keys gives each query row a normalised output ``o_b`` and ``lse_b``; over disjoint
key blocks the full softmax is ``lse = log(exp(lse_a) + exp(lse_b))`` and
``out = exp(lse_a - lse) * o_a + exp(lse_b - lse) * o_b``. A row that saw no key in a block
has ``lse_b = -inf``: its weight is exactly 0; a row that saw no key at all keeps out 0 and
lse -inf (flash-attn's convention), with no NaN from ``-inf - -inf``.
"""
from __future__ import annotations

import torch

Tensor = torch.Tensor


def merge_into(out_acc: Tensor, lse_acc: Tensor, out_b: Tensor, lse_b: Tensor) -> None:
    """In place: ``out_acc`` (b, s, h, d_v) float32 and ``lse_acc`` (b, h, s) float32 absorb the
    block ``out_b`` (b, s, h, d_v, any float dtype) / ``lse_b`` (b, h, s) float32. Both may be
    row slices (views) of larger accumulators."""
    lse_new = torch.logaddexp(lse_acc, lse_b)
    # -inf only where both are -inf: a finite stand-in keeps both weights at exp(-inf) = 0
    safe = torch.where(torch.isinf(lse_new), torch.zeros_like(lse_new), lse_new)
    w_acc = torch.exp(lse_acc - safe).transpose(1, 2).unsqueeze(-1)
    w_b = torch.exp(lse_b - safe).transpose(1, 2).unsqueeze(-1)
    out_acc.mul_(w_acc).addcmul_(out_b, w_b)
    lse_acc.copy_(lse_new)


def merge_varlen_into(out_acc: Tensor, lse_acc: Tensor, out_b: Tensor, lse_b: Tensor) -> None:
    """:func:`merge_into` for packed rows: out (total, h, d_v), lse (h, total)."""
    merge_into(out_acc.unsqueeze(0), lse_acc.unsqueeze(0), out_b.unsqueeze(0),
               lse_b.unsqueeze(0))


__all__ = ["merge_into", "merge_varlen_into"]
