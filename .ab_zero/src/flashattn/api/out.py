"""``out=``: the keyword every public attention function takes.

``fn(..., out=buf)`` writes the attention output into ``buf`` and returns ``buf`` in the
output's place (the LSE and the rest of a tuple unchanged), like torch's ``out=`` functions:

- ``buf`` must have the output's exact shape, dtype and device (checked before anything runs,
  so a KV-cache call with a bad ``out`` leaves the cache untouched); any strides.
- No autograd through ``out=`` (torch's rule for out= functions): with grad mode on, inputs
  that require grad raise.
- The kernels write their own output and the result is copied into ``buf`` (one extra
  pass over the output, ~1% of a prefill call, under a microsecond of device time for a
  decode step). What ``out=`` buys is a stable address (CUDA graphs, preallocated serving
  buffers), not memory.
"""
from __future__ import annotations

import functools
import inspect
from typing import Any, Callable, Optional, Tuple

import torch

from flashattn.api import validation as _v

Tensor = torch.Tensor
Expected = Callable[[inspect.BoundArguments], Optional[Tuple[tuple, torch.dtype, torch.device]]]

OUT_DOC = """
    out: None, or a tensor (keyword only) with exactly the output's shape, dtype and device:
        the output is written into it and it is returned in the output's place. No autograd
        (as torch's out= functions)."""


def check_out(out: Any, shape: tuple, dtype: torch.dtype, device: torch.device,
              name: str = "out") -> None:
    """``out`` must be a tensor of this shape, dtype and device (clear errors naming it)."""
    if not isinstance(out, Tensor):
        raise TypeError(f"{name} must be None or a torch.Tensor, got {_v._describe(out)}")
    if tuple(out.shape) != tuple(shape):
        raise ValueError(f"{name} must have the output's shape {tuple(shape)}, got "
                         f"{tuple(out.shape)}")
    if out.dtype != dtype:
        raise ValueError(f"{name} must have the output's dtype {dtype}, got {out.dtype}")
    if out.device != device:
        raise ValueError(f"{name} must be on the output's device ({device}), got {out.device}")


def _needs_grad(bound: inspect.BoundArguments) -> bool:
    if not torch.is_grad_enabled():
        return False
    return any(isinstance(x, Tensor) and x.requires_grad for x in bound.arguments.values())


def writes_out(expected: Expected):
    """Decorator: adds the keyword-only ``out`` to a public function. ``expected(bound)``
    gives the output's (shape, dtype, device) from the call's arguments, or None when they
    are malformed (the function then raises its own clear error)."""
    def wrap(fn):
        sig = inspect.signature(fn)
        param = inspect.Parameter("out", inspect.Parameter.KEYWORD_ONLY, default=None)

        @functools.wraps(fn)
        def wrapper(*args, out: Optional[Tensor] = None, **kwargs):
            if out is None:
                return fn(*args, **kwargs)
            bound = sig.bind(*args, **kwargs)
            bound.apply_defaults()
            if _needs_grad(bound):
                raise RuntimeError(f"{fn.__name__}(..., out=...): out= does not support "
                                   "autograd (inputs require grad); call it without out")
            want = expected(bound)
            if want is not None:
                check_out(out, *want)
            res = fn(*args, **kwargs)
            first = res[0] if isinstance(res, tuple) else res
            check_out(out, tuple(first.shape), first.dtype, first.device)
            out.copy_(first)
            return (out, *res[1:]) if isinstance(res, tuple) else out

        wrapper.__signature__ = sig.replace(parameters=[*sig.parameters.values(), param])
        if wrapper.__doc__:
            wrapper.__doc__ = wrapper.__doc__.rstrip() + "\n" + OUT_DOC + "\n"
        return wrapper
    return wrap


def _tensor(x: Any, ndim: int) -> bool:
    return isinstance(x, Tensor) and x.dim() == ndim


def like_q(q: str, v: str, v_ndim: int, q_ndim: int, dtype: Optional[str] = None) -> Expected:
    """Expected output: q's shape with v's last dim, q's dtype (or the bound argument
    ``dtype``'s value when not None, bfloat16 for FP8 q), q's device."""
    def expected(bound: inspect.BoundArguments):
        qt, vt = bound.arguments.get(q), bound.arguments.get(v)
        if not (_tensor(qt, q_ndim) and _tensor(vt, v_ndim)):
            return None
        out_dtype = bound.arguments.get(dtype) if dtype else None
        if out_dtype is None:
            out_dtype = torch.bfloat16 if qt.dtype == torch.float8_e4m3fn else qt.dtype
        return tuple(qt.shape[:-1]) + (vt.shape[-1],), out_dtype, qt.device
    return expected


def packed_qkv(name: str, seq_dims: int) -> Expected:
    """Expected output of a qkv-packed call: (*seq, 3, h, d) -> (*seq, h, d)."""
    def expected(bound: inspect.BoundArguments):
        qkv = bound.arguments.get(name)
        if not _tensor(qkv, seq_dims + 3):
            return None
        return tuple(qkv.shape[:seq_dims]) + tuple(qkv.shape[seq_dims + 1:]), qkv.dtype, \
            qkv.device
    return expected


__all__ = ["OUT_DOC", "check_out", "like_q", "packed_qkv", "writes_out"]
