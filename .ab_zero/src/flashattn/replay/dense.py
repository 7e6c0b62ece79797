"""Recorded dense calls: the dense forward's and backward's decisions for one call signature, made
once (the api's eager fast path keys them): the runners, :func:`dense_runner` (the forward with
the op's contiguous outputs) and :class:`DenseTrainEntry` (a signature with a gradient to
record)."""
from __future__ import annotations

from typing import Callable, Optional, Tuple

import torch

from flashattn.dispatch import dense as _dense
from flashattn.dispatch import select as _select
from flashattn.params import AttnParams
from flashattn.replay import autograd as _autograd


def forward_runner(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, params: AttnParams,
                   need_lse: bool = True):
    """:func:`forward`'s decisions for these inputs (no dropout / S_dmask), made once: a call
    ``run(q, k, v) -> (out, lse)`` for later calls of the same signature (the api's fast
    path keys it on shapes, strides, dtypes, device, alignment and settings, everything the
    decisions read). ``need_lse`` False: the caller drops lse, which may then be None."""
    if _dense.is_degenerate(q, k):
        return lambda q, k, v: _dense.degenerate_fwd(q, k, v, False)[:2]
    if _dense.small_query(q, k, v, params, False):
        # (its shape-only parts made once)
        return _dense.small_query_runner(q, k, v, params, need_lse)
    name = _select.select("fwd", q, k, v, params, False)
    make = getattr(_select.backend(name), "fwd_call", None) if name == "portable" else None
    if make is not None:
        call = make(q, k, v, params, need_lse)  # (replays its launch)
        if call is not None:
            return call
    fwd = _select.backend(name).fwd
    return lambda q, k, v: fwd(q, k, v, params, False)[:2]


def backward_runner(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, params: AttnParams):
    """:func:`backward`'s decisions for these inputs, made once: a call ``run(dout, q, k, v,
    out, lse) -> (dq, dk, dv)`` for later tensors of the same signature (the api's recorded
    dense calls with a gradient to record: :class:`DenseTrainEntry`)."""
    if _dense.is_degenerate(q, k):
        return lambda dout, q, k, v, out, lse: _dense.backward(dout, q, k, v, out, lse, params)
    bwd = _select.backend(_select.select("bwd", q, k, v, params)).bwd
    return lambda dout, q, k, v, out, lse: bwd(dout, q, k, v, out, lse, params)


def dense_runner(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, params: AttnParams,
                 need_lse: bool = True
                 ) -> Callable[[torch.Tensor, torch.Tensor, torch.Tensor],
                               Tuple[torch.Tensor, Optional[torch.Tensor]]]:
    """What the full path decided for this signature, as a call: dispatch's choice of
    backend and path for these (already validated and normalised) arguments, with the op's
    contiguous outputs. ``need_lse`` False (the signature does not return it): lse may come
    back None."""
    run = forward_runner(q, k, v, params, need_lse)

    def call(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor
             ) -> Tuple[torch.Tensor, Optional[torch.Tensor]]:
        out, lse = run(q, k, v)
        # (the op's contract; no-ops normally)
        return out.contiguous(), (None if lse is None else lse.contiguous())
    return call


class DenseTrainEntry:
    """A dense signature that records a gradient: its forward runner (:func:`dense_runner`,
    with the LSE the backward needs) and, from the signature's first backward on, its
    :func:`backward_runner`; a call runs both through ``replay.autograd.dense_recorded``'s
    autograd function (a training step's every layer repeats one signature, and the full
    path's checks and dispatch cost it ~100-200 µs of host per call on the H100 host,
    benchmarks/NOTES.md 2026-11-25)."""

    def __init__(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                 params: AttnParams) -> None:
        self.params = params
        self.forward = dense_runner(q, k, v, params, True)
        self._backward = None

    def backward(self, dout: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                 out: torch.Tensor, lse: torch.Tensor
                 ) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        if self._backward is None:
            self._backward = backward_runner(q, k, v, self.params)
        return self._backward(dout, q, k, v, out, lse)

    def __call__(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor
                 ) -> Tuple[torch.Tensor, torch.Tensor]:
        return _autograd.dense_recorded(self, q, k, v)


__all__ = ["DenseTrainEntry", "backward_runner", "dense_runner", "forward_runner"]
