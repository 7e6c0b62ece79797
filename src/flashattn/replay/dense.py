"""Recorded dense calls: the dense forward's and backward's decisions for one call signature, made
once (the api's eager fast path keys them)."""
from __future__ import annotations

import torch

from flashattn.dispatch import dense as _dense
from flashattn.dispatch import select as _select
from flashattn.params import AttnParams


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
    dense calls with a gradient to record: ops._RecordedDense)."""
    if _dense.is_degenerate(q, k):
        return lambda dout, q, k, v, out, lse: _dense.backward(dout, q, k, v, out, lse, params)
    bwd = _select.backend(_select.select("bwd", q, k, v, params)).bwd
    return lambda dout, q, k, v, out, lse: bwd(dout, q, k, v, out, lse, params)


__all__ = ["backward_runner", "forward_runner"]
