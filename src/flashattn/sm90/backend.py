"""The Hopper (Gluon, sm90) backend's interface: the dense forward and backward, for the calls
``support.call_unsupported`` / ``support.backward_unsupported`` accept (dispatch checks).
Every other op runs on the portable backend."""
from __future__ import annotations

import torch

from flashattn.params import AttnParams
# through the modules (not their functions imported by name): a test spy or probe that
# replaces a kernel module's entry point is then the one that runs
from flashattn.sm90 import bwd as _bwd
from flashattn.sm90 import fwd as _fwd

Tensor = torch.Tensor


def fwd(q: Tensor, k: Tensor, v: Tensor, p: AttnParams, return_softmax: bool):
    """Dense forward: (out, lse, None)."""
    return _fwd.flash_fwd_hopper(q, k, v, **p.kernel_kwargs(), return_softmax=return_softmax)


def bwd(dout: Tensor, q: Tensor, k: Tensor, v: Tensor, out: Tensor, lse: Tensor, p: AttnParams):
    """Dense backward: (dq, dk, dv)."""
    return _bwd.flash_bwd_hopper(dout, q, k, v, out, lse, **p.kernel_kwargs(),
                                 deterministic=p.deterministic)


__all__ = ["bwd", "fwd"]
