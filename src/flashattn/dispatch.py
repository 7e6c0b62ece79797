"""Backend choice: which implementation runs a call.

Backends (all take the normalised parameters of ``docs/internals.md``)::

    portable  Triton kernels, flashattn.kernels.fwd.flash_fwd / kernels.bwd.flash_bwd.
              CUDA tensors, or CPU tensors when TRITON_INTERPRET=1 (the Triton interpreter).
    cpu       chunked torch, flashattn.cpu.chunked_fwd / chunked_bwd. Any device torch runs on.
    hopper    Gluon kernels for sm90 (flashattn.hopper): the forward of the calls they cover
              (fp16/bf16, head dims 64/96/128/192/256, causal, window, softcap, GQA, no dropout,
              alibi or return_softmax, TMA-aligned strides) and the backward of those with
              deterministic=False, and of unmasked deterministic=True calls at d = 128
              without softcap (``FLASHATTN_HOPPER_BWD=0`` turns the Hopper backward off).
              Everything else falls back to ``portable``.

``FLASHATTN_BACKEND`` = ``auto`` (default) | ``portable`` | ``cpu`` | ``hopper`` forces a path.
``auto`` and ``hopper`` use the Hopper kernels on an sm90 device for the calls they cover;
``portable`` never does. It is read at every call, so tests can switch it with
``monkeypatch.setenv``.

Two questions, two functions: :func:`backend_for` answers which *device backend* runs
('portable' Triton or 'cpu' torch; varlen and other callers choose their kernels by it), and
:func:`family_for` refines it to the kernel family a dense call starts from ('hopper' on sm90
when allowed). :func:`forward_family` adds the per-call check (features, strides).

Kernel modules are imported lazily, on the first call that needs them, so ``import flashattn``
works where Triton does not (a laptop without CUDA uses the cpu path).

Degenerate shapes (batch, seqlen_q or seqlen_k of 0) are answered here without calling any
backend: zero-size grids are not worth special-casing in every kernel.
"""
from __future__ import annotations

import functools
import importlib.util
import os
import warnings
from typing import Any, Callable, Optional, Tuple

import torch

BACKENDS: Tuple[str, ...] = ("auto", "portable", "cpu", "hopper")
ENV_BACKEND = "FLASHATTN_BACKEND"
ENV_INTERPRET = "TRITON_INTERPRET"

# Same truthy spellings as triton's own getenv_bool (case-insensitive).
_TRUTHY = frozenset({"1", "true", "on", "yes"})


def requested_backend() -> str:
    """The backend forced by ``FLASHATTN_BACKEND`` ('auto' when unset or empty)."""
    raw = os.environ.get(ENV_BACKEND, "")
    name = raw.strip().lower() or "auto"
    if name not in BACKENDS:
        raise ValueError(
            f"environment variable {ENV_BACKEND}={raw!r} is not a backend; "
            f"allowed: {', '.join(BACKENDS)}"
        )
    return name


def interpreting() -> bool:
    """True when TRITON_INTERPRET asks for the Triton interpreter (kernels run on CPU tensors).

    Triton reads this variable when a ``@triton.jit`` function is defined, so it must be set
    before ``flashattn.kernels`` is first imported.
    """
    return os.environ.get(ENV_INTERPRET, "").strip().lower() in _TRUTHY


@functools.lru_cache(maxsize=None)
def triton_available() -> bool:
    """Whether the ``triton`` package is installed (checked without importing it)."""
    try:
        return importlib.util.find_spec("triton") is not None
    except (ImportError, ValueError):  # pragma: no cover - broken installs
        return False


@functools.lru_cache(maxsize=None)
def _warn_no_triton_once(device_type: str) -> None:
    warnings.warn(
        f"flashattn: triton is not installed; {device_type} tensors use the chunked torch "
        "path (correct but slow). Install triton for the fused kernels.",
        RuntimeWarning,
        stacklevel=4,
    )


def _device_of(x: Any) -> torch.device:
    if isinstance(x, torch.Tensor):
        return x.device
    return torch.device(x)


def backend_for(tensor: "torch.Tensor | torch.device | str") -> str:
    """Name of the backend ('portable' or 'cpu') a call with ``tensor``'s device would use.

    Accepts a tensor or a device. Raises RuntimeError when ``FLASHATTN_BACKEND`` forces a
    backend that cannot run on that device (e.g. 'portable' for CPU tensors without
    TRITON_INTERPRET=1, or without triton installed).
    """
    return _backend_for(_device_of(tensor), requested_backend())


def _backend_for(device: torch.device, requested: str) -> str:
    """:func:`backend_for` with ``FLASHATTN_BACKEND`` already read (``requested``)."""
    if requested == "cpu":
        return "cpu"
    # Triton runs on CUDA (and ROCm, which torch also calls 'cuda') devices, or anything
    # on CPU under the interpreter.
    triton_can_run = triton_available() and (
        device.type == "cuda" or (device.type == "cpu" and interpreting())
    )
    if requested in ("portable", "hopper"):  # hopper: the Triton family (family_for refines it)
        if not triton_can_run:
            why = (
                "triton is not installed"
                if not triton_available()
                else f"{device.type} tensors need CUDA, or TRITON_INTERPRET=1 for CPU tensors"
            )
            raise RuntimeError(
                f"{ENV_BACKEND}={requested} cannot run on device {device}: {why}. "
                f"Unset {ENV_BACKEND} (or set it to 'cpu') to use the chunked torch path."
            )
        return "portable"
    # auto
    if triton_can_run:
        return "portable"
    if device.type == "cuda":
        _warn_no_triton_once(device.type)
    return "cpu"


def _hopper_device_reason(device: torch.device) -> Optional[str]:
    """Why the Hopper kernels cannot run on ``device`` (None: they can). A seam for tests."""
    from flashattn.hopper.support import device_unavailable

    return device_unavailable(device)


def family_for(tensor: "torch.Tensor | torch.device | str") -> str:
    """Kernel family ('hopper', 'portable' or 'cpu') that dense calls on this device start from.

    'hopper' when :func:`backend_for` says 'portable', ``FLASHATTN_BACKEND`` is ``auto`` or
    ``hopper``, and the device is sm90 with a Triton whose Gluon API the kernels know
    (``flashattn.hopper.support``). A call the Hopper kernels do not cover still falls back to
    'portable' (:func:`forward_family`).
    """
    device = _device_of(tensor)
    requested = requested_backend()  # read once: this runs on every call
    backend = _backend_for(device, requested)
    if backend != "portable" or requested not in ("auto", "hopper"):
        return backend
    if device.type != "cuda" or interpreting():
        return backend
    return "hopper" if _hopper_device_reason(device) is None else backend


def hopper_reason(tensor: "torch.Tensor | torch.device | str") -> Optional[str]:
    """Why dense calls on this device do not start from the Hopper kernels (None: they do)."""
    device = _device_of(tensor)
    if requested_backend() not in ("auto", "hopper"):
        return f"{ENV_BACKEND}={requested_backend()}"
    if backend_for(device) != "portable":
        return f"device backend is {backend_for(device)!r}"
    if interpreting():
        return "TRITON_INTERPRET=1 (Gluon cannot be interpreted)"
    return _hopper_device_reason(device)


def forward_family(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, **params: Any) -> str:
    """The family whose forward runs this call: 'hopper' when the device allows it and the
    Hopper kernel covers the call (``flashattn.hopper.support.call_unsupported``), else the
    device backend."""
    family = family_for(q)
    if family == "hopper":
        from flashattn.hopper.support import call_unsupported, slower_than_portable

        if call_unsupported(q, k, v, params) is not None:
            return "portable"
        # auto: short keys run faster on the portable kernels (measured; see support.py)
        if requested_backend() == "auto" and slower_than_portable(q, k, params) is not None:
            return "portable"
    return family


def backward_family(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, **params: Any) -> str:
    """The family whose backward runs this call: 'hopper' when the device allows it and the
    Hopper backward covers the call (``flashattn.hopper.support.backward_unsupported``:
    fp16/bf16, d in 64/96/128/192/256, no dropout / alibi, ``deterministic=False``, TMA-aligned
    strides;
    ``FLASHATTN_HOPPER_BWD=0`` turns it off), else the device backend."""
    family = family_for(q)
    if family == "hopper":
        from flashattn.hopper.support import backward_unsupported, slower_than_portable

        if backward_unsupported(q, k, v, params) is not None:
            return backend_for(q)
        # auto: short keys run faster on the portable backward (measured; see support.py)
        if requested_backend() == "auto" and slower_than_portable(q, k, params,
                                                                  backward=True) is not None:
            return backend_for(q)
    return family


def _backend_fns(name: str) -> Tuple[Callable[..., Any], Callable[..., Any]]:
    if name == "hopper":
        from flashattn.hopper.bwd import flash_bwd_hopper
        from flashattn.hopper.fwd import flash_fwd_hopper

        return flash_fwd_hopper, flash_bwd_hopper
    if name == "portable":
        from flashattn.kernels.bwd import flash_bwd
        from flashattn.kernels.fwd import flash_fwd

        return flash_fwd, flash_bwd
    from flashattn.cpu import chunked_bwd, chunked_fwd

    return chunked_fwd, chunked_bwd


def _is_degenerate(q: torch.Tensor, k: torch.Tensor) -> bool:
    return q.shape[0] == 0 or q.shape[1] == 0 or k.shape[1] == 0


def _degenerate_fwd(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, return_softmax: bool
) -> Tuple[torch.Tensor, torch.Tensor, Optional[torch.Tensor]]:
    # No batch, no query or no key: every row sees no key -> out 0, lse -inf.
    b, s_q, h, _ = q.shape
    s_k, d_v = k.shape[1], v.shape[3]
    out = torch.zeros((b, s_q, h, d_v), dtype=q.dtype, device=q.device)
    lse = torch.full((b, h, s_q), float("-inf"), dtype=torch.float32, device=q.device)
    s_dmask = (
        torch.zeros((b, h, s_q, s_k), dtype=q.dtype, device=q.device) if return_softmax else None
    )
    return out, lse, s_dmask


def forward(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, **params: Any
) -> Tuple[torch.Tensor, torch.Tensor, Optional[torch.Tensor]]:
    """Run the forward of the chosen backend: ``(out, lse, S_dmask | None)``.

    ``params`` are the normalised keyword arguments of ``docs/internals.md`` (softmax_scale,
    causal, window_left, window_right, softcap, alibi_slopes, dropout_p, philox_seed,
    return_softmax). Inputs are assumed validated.
    """
    if _is_degenerate(q, k):
        return _degenerate_fwd(q, k, v, bool(params.get("return_softmax", False)))
    fwd, _ = _backend_fns(forward_family(q, k, v, **params))
    return fwd(q, k, v, **params)


def backward(
    dout: torch.Tensor,
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    out: torch.Tensor,
    lse: torch.Tensor,
    **params: Any,
) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Run the backward of the chosen backend: ``(dq, dk, dv)`` shaped and typed like q, k, v.

    ``params`` as for :func:`forward`, with ``deterministic`` instead of ``return_softmax``.
    """
    if _is_degenerate(q, k):
        return tuple(  # type: ignore[return-value]
            torch.zeros(x.shape, dtype=x.dtype, device=x.device) for x in (q, k, v)
        )
    # The Hopper backward takes the calls it covers; the rest run the portable backward (same
    # lse contract, so either forward's lse serves either backward).
    _, bwd = _backend_fns(backward_family(q, k, v, **params))
    return bwd(dout, q, k, v, out, lse, **params)


__all__ = [
    "BACKENDS",
    "backend_for",
    "family_for",
    "forward_family",
    "backward_family",
    "hopper_reason",
    "requested_backend",
    "interpreting",
    "triton_available",
    "forward",
    "backward",
]
