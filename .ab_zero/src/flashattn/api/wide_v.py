"""Attention with V wider than the backward kernels take (``MAX_HEAD_DIM`` < d_v <=
``MAX_HEAD_DIM_V``) in calls that record a gradient: one call per slice of V's columns.

``softmax(Q K^T) V = [P V_1 | P V_2 | ...]``, and the backward splits the same way: with
``dP = sum_s dO_s V_s^T`` and ``D = sum_s rowsum(dO_s * O_s)``, ``dS = P * (dP - D)`` is the
sum of the slices' own ``dS_s``, so the whole call's dQ / dK are the sums of the slices' (which
autograd forms) and dV_s is the slice's own. Each slice recomputes Q K^T and the softmax (at
q / k 64 and v 512 wide: two slices of 256, 11 % more FLOPs than one pass). Calls without a
gradient take one kernel instead (the portable forward takes V up to 512). Dropout would need
the same mask in every slice: refused with a gradient. Calls without a gradient go by slices
too where each slice runs on the Hopper kernel (:func:`faster_by_slices`): the recomputed
Q K^T costs less there than the portable kernel's one pass saves.
"""
from __future__ import annotations

from typing import Callable, List, Tuple, Union

import torch

from flashattn import ops as _ops
from flashattn.api import validation as _v

Tensor = torch.Tensor


def column_slices(d_v: int) -> List[Tuple[int, int]]:
    """[start, end) column ranges of equal width (the last one shorter by the remainder), as
    few as keep each at most ``MAX_HEAD_DIM`` wide: 512 -> 2 x 256, 384 -> 2 x 192."""
    n = -(-d_v // _v.MAX_HEAD_DIM)
    width = -(-d_v // n)
    return [(a, min(a + width, d_v)) for a in range(0, d_v, width)]


def faster_by_slices(q: Tensor, v: Tensor, alibi_slopes, dropout_p: float) -> bool:
    """A call without a gradient runs faster by slices than in one pass (the slices' kernel is
    the Hopper one: ``flashattn.ops.wide_v_slices_faster``)."""
    a, b = column_slices(v.shape[-1])[0]
    return _ops.wide_v_slices_faster(q, b - a, alibi_slopes is not None, dropout_p)


def by_slices(run: Callable[[Tensor], Union[Tensor, tuple]], v: Tensor
              ) -> Union[Tensor, tuple]:
    """``run(v_s)`` for each column slice ``v_s`` of ``v`` (views, last dim last), outputs
    joined along the last dim; a tuple result (out, lse, S_dmask) keeps the first slice's
    lse (every slice's softmax is the same) and S_dmask."""
    parts = [run(v[..., a:b]) for a, b in column_slices(v.shape[-1])]
    if isinstance(parts[0], tuple):
        return (torch.cat([p[0] for p in parts], dim=-1),) + tuple(parts[0][1:])
    return torch.cat(parts, dim=-1)


def refuse_dropout(dropout_p: float) -> None:
    """NotImplementedError for dropout in a call that goes by slices (see the module doc)."""
    if dropout_p > 0.0:
        raise NotImplementedError(
            f"dropout_p > 0 with v's head dim above {_v.MAX_HEAD_DIM} and inputs that require "
            "grad is not supported (each V slice would draw its own dropout mask); got "
            f"dropout_p={dropout_p}")


__all__ = ["by_slices", "column_slices", "faster_by_slices", "refuse_dropout"]
