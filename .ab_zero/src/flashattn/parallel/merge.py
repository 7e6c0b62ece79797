"""Merging partial attention results through their log-sum-exp.

A block of keys gives each query row a normalised output ``o_b`` and ``lse_b``; over disjoint
key blocks the full softmax is ``lse = log(exp(lse_a) + exp(lse_b))`` and
``out = exp(lse_a - lse) * o_a + exp(lse_b - lse) * o_b``. A row that saw no key in a block
has ``lse_b = -inf``: its weight is exactly 0; a row that saw no key at all keeps out 0 and
lse -inf (flash-attn's convention), with no NaN from ``-inf - -inf``. One pass of the device's
kernel (``flashattn.ops.lse_merge``: Triton on GPUs, torch ops on CPUs).
"""
from __future__ import annotations

from typing import Optional

import torch

from flashattn import ops as _ops

Tensor = torch.Tensor


def merge_into(out_acc: Tensor, lse_acc: Tensor, out_b: Tensor, lse_b: Tensor,
               dest: Optional[Tensor] = None) -> None:
    """In place: ``lse_acc`` (b, h, s) float32 absorbs ``lse_b`` (b, h, s) float32, and the
    merged output of ``out_acc`` / ``out_b`` (b, s, h, d_v, any float dtypes) goes to ``dest``
    (same shape, any float dtype; default ``out_acc`` itself). All may be row slices (views)
    of larger tensors."""
    _ops.lse_merge(out_acc, lse_acc, out_b, lse_b, out_acc if dest is None else dest)


def ready_to_merge(out: Tensor, last: bool) -> Tensor:
    """The ring forward's running output, ready for a merge: as it is for the ring's last
    merge, else float32 (one copy, the first time, of a 16-bit first output kept as the
    running sum). A merge computes in float32 and rounds once into its destination, and a
    16-bit running sum that holds one block's output is that output exactly, so the last
    merge into it gives the bits a float32 sum would."""
    return out if last or out.dtype == torch.float32 else out.float()


def merge_varlen_into(out_acc: Tensor, lse_acc: Tensor, out_b: Tensor, lse_b: Tensor,
                      dest: Optional[Tensor] = None) -> None:
    """:func:`merge_into` for packed rows: out (total, h, d_v), lse (h, total)."""
    merge_into(out_acc.unsqueeze(0), lse_acc.unsqueeze(0), out_b.unsqueeze(0),
               lse_b.unsqueeze(0), None if dest is None else dest.unsqueeze(0))


__all__ = ["merge_into", "merge_varlen_into", "ready_to_merge"]
