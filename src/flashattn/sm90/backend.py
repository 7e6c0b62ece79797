"""The Hopper (Gluon, sm90) backend's interface: the dense forward and backward, for the calls
``support.call_unsupported`` / ``support.backward_unsupported`` accept (dispatch checks).
Every other op runs on the portable backend."""
from __future__ import annotations

import torch

from flashattn.params import AttnParams
from flashattn.sm90.bwd import flash_bwd_hopper
from flashattn.sm90.fwd import flash_fwd_hopper

Tensor = torch.Tensor


def fwd(q: Tensor, k: Tensor, v: Tensor, p: AttnParams, return_softmax: bool):
    """Dense forward: (out, lse, None)."""
    return flash_fwd_hopper(q, k, v, **p.kernel_kwargs(), return_softmax=return_softmax)


def bwd(dout: Tensor, q: Tensor, k: Tensor, v: Tensor, out: Tensor, lse: Tensor, p: AttnParams):
    """Dense backward: (dq, dk, dv)."""
    return flash_bwd_hopper(dout, q, k, v, out, lse, **p.kernel_kwargs(),
                            deterministic=p.deterministic)


__all__ = ["bwd", "fwd"]
