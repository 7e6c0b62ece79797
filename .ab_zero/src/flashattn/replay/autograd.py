"""The autograd functions of the recorded calls: a recorded signature's forward and backward
runners (:class:`~flashattn.replay.dense.DenseTrainEntry`,
:class:`~flashattn.replay.varlen.VarlenRunner`) as one differentiable call.

They apply the same autograd formula as the ``fwd`` / ``bwd`` and ``varlen_fwd`` /
``varlen_bwd`` ops of :mod:`flashattn.ops` (q, k, v differentiable, lse not; the gradient of
out with unit last-dim stride, ``dispatch.dense.unit_last_stride``), with dispatch's decisions
made once per signature instead of on every call. They live here rather than beside the ops
because they hold recorded runners, not op bodies: nothing in them needs :mod:`flashattn.ops`.
Used only for plain eager tensors (the api keys a call only where ``ops.eager_call``'s
conditions hold); torch.compile, export, dispatch modes and tensor subclasses take the ops.
"""
from __future__ import annotations

from typing import Optional, Tuple

import torch

from flashattn.dispatch import dense as _dense

Tensor = torch.Tensor


class _RecordedDense(torch.autograd.Function):
    """A recorded dense signature's forward and backward (``entry``: a
    :class:`~flashattn.replay.dense.DenseTrainEntry`, api/fastpath.DENSE's entry for calls with
    a gradient to record): differentiable in q, k, v; lse is not. The bodies of ``fwd`` /
    ``bwd`` for plain eager tensors, with dispatch's decisions made once per signature."""

    @staticmethod
    def forward(ctx, q, k, v, entry):
        out, lse = entry.forward(q, k, v)
        ctx.save_for_backward(q, k, v, out, lse)
        ctx.entry = entry
        ctx.mark_non_differentiable(lse)
        return out, lse

    @staticmethod
    def backward(ctx, dout, _dlse):
        q, k, v, out, lse = ctx.saved_tensors
        dq, dk, dv = ctx.entry.backward(_dense.unit_last_stride(dout), q, k, v, out, lse)
        return dq.contiguous(), dk.contiguous(), dv.contiguous(), None


def dense_recorded(entry, q: Tensor, k: Tensor, v: Tensor) -> Tuple[Tensor, Tensor]:
    """(out, lse) of a recorded dense signature with a gradient to record (``entry``: its
    forward and backward runners), through autograd."""
    return _RecordedDense.apply(q, k, v, entry)


class _RecordedVarlen(torch.autograd.Function):
    """A recorded packed signature's forward and backward (``replay.varlen.VarlenRunner``: the
    api's fast path for a repeated ``flash_attn_varlen_func`` signature), differentiable in q,
    k, v; lse is not. The same bodies as ``varlen_fwd`` / ``varlen_bwd`` for plain eager
    tensors (the api checks ``ops.eager_call``'s conditions before it keys a call)."""

    @staticmethod
    def forward(ctx, q, k, v, cu_seqlens_q, cu_seqlens_k, seqused_k, runner):
        out, lse = runner.forward(q, k, v, cu_seqlens_q, cu_seqlens_k, seqused_k)
        ctx.save_for_backward(q, k, v, out, lse, cu_seqlens_q, cu_seqlens_k, seqused_k)
        ctx.runner = runner
        ctx.mark_non_differentiable(lse)
        return out, lse

    @staticmethod
    def backward(ctx, dout, _dlse):
        q, k, v, out, lse, cu_seqlens_q, cu_seqlens_k, seqused_k = ctx.saved_tensors
        dq, dk, dv = ctx.runner.backward(_dense.unit_last_stride(dout), q, k, v, out, lse,
                                         cu_seqlens_q, cu_seqlens_k, seqused_k)
        return dq, dk, dv, None, None, None, None


def varlen_recorded(runner, q: Tensor, k: Tensor, v: Tensor, cu_seqlens_q: Tensor,
                    cu_seqlens_k: Tensor, seqused_k: Optional[Tensor]
                    ) -> Tuple[Tensor, Tensor]:
    """(out, lse) of a recorded packed signature (``runner``: its replay.varlen.VarlenRunner),
    through autograd when a gradient is to be recorded."""
    if torch.is_grad_enabled() and (q.requires_grad or k.requires_grad or v.requires_grad):
        return _RecordedVarlen.apply(q, k, v, cu_seqlens_q, cu_seqlens_k, seqused_k, runner)
    return runner.forward(q, k, v, cu_seqlens_q, cu_seqlens_k, seqused_k)


__all__ = ["dense_recorded", "varlen_recorded"]
