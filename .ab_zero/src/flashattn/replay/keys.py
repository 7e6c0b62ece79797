"""The keys of recorded calls and the bounded cache that holds them.

A recorded call is kept under a *key*: everything the full path's checks and dispatch read
for one call signature, so that a later call with the same key may skip them. The api's
per-function keys (``api/fastpath.py``: ``dense_key``, ``kvcache_key``, ...) are built from
the pieces here:

- :func:`tensor_key`: a tensor's shape, strides, dtype, device and the 16-byte alignment of
  its data pointer (the Hopper kernels' TMA condition; Triton specialises on it). Values read
  from tensors are never in a key: they are checked where they always were, on every call;
- :data:`SCALARS`: the scalar argument types a key takes as they are, type and value both
  (``causal=1`` and ``causal=True`` are different keys); other types take the full path;
- :func:`descale_key`, :func:`fp8_scalars`: the descale and scalar parts the FP8 signatures
  share; :func:`records_grad`: whether a call records a gradient;
- :class:`CallCache`: the entries, each tagged with the runtime settings object
  (``FLASHATTN_BACKEND``, ``use_backend``, ``checks``, ...) it was recorded under. A hit needs
  the same object, by identity: every change of the settings makes a new one.

Nothing here tests whether a call is traced or wrapped (``ops.eager_call``): that is the op
path's own condition, and this layer sits below :mod:`flashattn.ops`; the api tests it before
it builds a key (``data_ptr()`` does not trace).
"""
from __future__ import annotations

from typing import Any, Dict, Hashable, Optional, Tuple

import torch

from flashattn.runtime import env

Tensor = torch.Tensor

# the scalar argument types a key takes as they are (type and value both in the key: causal=1
# and causal=True are different signatures); other types, e.g. numpy scalars or lists, take
# the full path, whose checks decide about them
SCALARS = (type(None), bool, int, float)


def tensor_key(t: Tensor) -> tuple:
    """A plain tensor in a key: shape, strides, dtype, device, data pointer modulo 16."""
    return (t.shape, t.stride(), t.dtype, t.device, t.data_ptr() % 16)


def descale_key(x: Any) -> Any:
    """A descale argument in a key: None, a plain tensor's :func:`tensor_key`, or False (the
    call takes the full path, whose checks decide about it). The values are read by the
    kernel on every call."""
    if x is None:
        return None
    return tensor_key(x) if type(x) is Tensor else False


def records_grad(q: Tensor, k: Tensor, v: Tensor) -> bool:
    """Whether a call on q, k, v records a gradient (grad mode on and one requires grad)."""
    return torch.is_grad_enabled() and (q.requires_grad or k.requires_grad or v.requires_grad)


def fp8_scalars(softmax_scale: Any, causal: Any, window_size: Any, softcap: Any,
                out_dtype: Any, return_lse: Any) -> Optional[tuple]:
    """The scalar part of an FP8 signature (types and values, as the dense key's), or None
    when one takes the full path (a list window, a non-dtype out_dtype, numpy scalars)."""
    if type(window_size) is not tuple or len(window_size) != 2:
        return None
    if not (out_dtype is None or type(out_dtype) is torch.dtype):
        return None
    left, right = window_size
    if not (type(softmax_scale) in SCALARS and type(causal) in SCALARS
            and type(softcap) in SCALARS and type(return_lse) in SCALARS
            and type(left) in SCALARS and type(right) in SCALARS):
        return None
    return (type(softmax_scale), softmax_scale, type(causal), causal, type(left), left,
            type(right), right, type(softcap), softcap, out_dtype, type(return_lse), return_lse)


class CallCache:
    """Entries ``key -> (settings, value)``, at most ``max_entries`` (then all dropped at
    once); a hit needs the same settings object."""

    def __init__(self, max_entries: int) -> None:
        self._max_entries = max_entries
        self._entries: Dict[Hashable, Tuple[Any, Any]] = {}

    def get(self, key: Hashable) -> Any:
        hit = self._entries.get(key)
        if hit is not None and hit[0] is env.settings():
            return hit[1]
        return None

    def put(self, key: Hashable, value: Any) -> None:
        if len(self._entries) >= self._max_entries:
            self._entries.clear()
        self._entries[key] = (env.settings(), value)

    def clear(self) -> None:
        self._entries.clear()


__all__ = ["SCALARS", "CallCache", "descale_key", "fp8_scalars", "records_grad", "tensor_key"]
