"""Which backend covers a call: the one place that decides, for every op (:data:`OPS`).

Backends (packages with a ``backend.py`` interface, declared in :mod:`flashattn.backends.interface`:
one function per op, taking the normalised :class:`flashattn.params.AttnParams`)::

    portable  flashattn.backends.triton: Triton kernels. CUDA tensors, or CPU tensors when
              TRITON_INTERPRET=1 (the Triton interpreter). Every op.
    cpu       flashattn.backends.cpu: chunked torch. Any device torch runs on. Every op.
    hopper    flashattn.backends.sm90: Gluon kernels for sm90, the dense forward of the calls they cover
              (fp16/bf16, head dims 64/96/128/192/256, causal, window, softcap, GQA, no dropout,
              alibi or return_softmax, TMA-aligned strides) and the backward of those with
              deterministic=False, and of unmasked deterministic=True calls at d = 128
              without softcap (``FLASHATTN_HOPPER_BWD=0`` turns the Hopper backward off).
              Everything else falls back to ``portable``.

``FLASHATTN_BACKEND`` = ``auto`` (default) | ``portable`` | ``cpu`` | ``hopper`` forces a path;
``flashattn.use_backend(name)`` does the same inside a ``with`` block (both read through
:mod:`flashattn.runtime.env`). ``auto`` and ``hopper`` use the Hopper kernels on an sm90 device
for the calls they cover (``auto`` only where they measured faster); ``portable`` never does.

Two questions about devices: :func:`backend_for` answers which *device backend* runs
('portable' Triton or 'cpu' torch), and :func:`family_for` refines it to the kernel family a
dense call starts from ('hopper' on sm90 when allowed). :func:`forward_family` /
:func:`backward_family` add the per-call checks (features, strides, measured crossovers);
:func:`select` answers for every op. Within the portable backend, :func:`small_query_allowed`
says when a forward with few query rows takes the split-KV decode kernel, and
:func:`quantize_backend` which backend runs the FP8 quantize pass.

Backend packages are imported lazily, on the first call that needs them (:func:`backend`), so
``import flashattn`` works where Triton does not (a laptop without CUDA uses the cpu path).
"""
from __future__ import annotations

import functools
import importlib
import importlib.util
import warnings
from typing import Any, Dict, Optional, Tuple

import torch

from flashattn import fp8_format
from flashattn.backends import interface
from flashattn.params import AttnParams, Fp8Scales
from flashattn.runtime import env


BACKENDS: Tuple[str, ...] = env.BACKENDS


ENV_BACKEND = "FLASHATTN_BACKEND"


ENV_INTERPRET = "TRITON_INTERPRET"


# every op dispatch chooses a backend for (select's first argument)
OPS: Tuple[str, ...] = ("fwd", "bwd", "varlen_fwd", "varlen_bwd", "kvcache", "varlen_paged_fwd",
                        "combine", "fp8_quantize", "fp8_fwd", "fp8_varlen_fwd", "sink_apply",
                        "sink_grad", "lse_merge", "sum_rows")


_LOADED: Dict[str, Any] = {}


def requested_backend() -> str:
    """The backend forced by ``FLASHATTN_BACKEND`` / ``use_backend`` ('auto' when unset)."""
    name = env.settings().backend
    if name not in BACKENDS:
        raise ValueError(
            f"environment variable {ENV_BACKEND}={name!r} is not a backend; "
            f"allowed: {', '.join(BACKENDS)}"
        )
    return name


def interpreting() -> bool:
    """True when TRITON_INTERPRET asks for the Triton interpreter (kernels run on CPU tensors).

    Triton reads this variable when a ``@triton.jit`` function is defined, so it must be set
    before ``flashattn`` is first imported (``runtime.env`` reads it once).
    """
    return env.settings().interpret


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
            # RuntimeError, not ValueError: the name is valid, this machine cannot run it.
            # The request came from use_backend(...) or the environment variable: name both.
            raise RuntimeError(
                f"backend {requested!r} (use_backend({requested!r}) or {ENV_BACKEND}="
                f"{requested}) cannot run on device {device}: {why}. Use use_backend('cpu') "
                f"or 'auto' (or unset {ENV_BACKEND}) for the chunked torch path."
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
    from flashattn.backends.sm90.support import device_unavailable

    return device_unavailable(device)


def family_for(tensor: "torch.Tensor | torch.device | str") -> str:
    """Kernel family ('hopper', 'portable' or 'cpu') that dense calls on this device start from.

    'hopper' when :func:`backend_for` says 'portable', ``FLASHATTN_BACKEND`` is ``auto`` or
    ``hopper``, and the device is sm90 with a Triton whose Gluon API the kernels know
    (``flashattn.backends.sm90.support``). A call the Hopper kernels do not cover still falls back to
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
    Hopper kernel covers the call (``flashattn.backends.sm90.support.call_unsupported``), else the
    device backend."""
    family = family_for(q)
    if family == "hopper":
        from flashattn.backends.sm90.support import call_unsupported, slower_than_portable

        if call_unsupported(q, k, v, params) is not None:
            return "portable"
        # auto: short keys run faster on the portable kernels (measured; see support.py)
        if requested_backend() == "auto" and slower_than_portable(q, k, params) is not None:
            return "portable"
    return family


def varlen_forward_family(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, n_seqs: int,
                          seqused_k: Optional[torch.Tensor], params: AttnParams,
                          return_softmax: bool = False) -> str:
    """The family whose packed forward runs this call (q (total_q, h, d), ``n_seqs``
    sequences): 'hopper' when the device allows it and the Hopper kernel's varlen mode covers
    the call (``flashattn.backends.sm90.support.varlen_unsupported``), else the device backend."""
    family = family_for(q)
    if family == "hopper":
        from flashattn.backends.sm90.support import varlen_slower_than_portable, varlen_unsupported

        if n_seqs < 1:
            return "portable"
        kwargs = params.kernel_kwargs()
        if varlen_unsupported(q, k, v, kwargs, seqused_k, return_softmax) is not None:
            return "portable"
        # auto: short sequences run faster on the portable kernels (mean key length)
        if (requested_backend() == "auto"
                and varlen_slower_than_portable(q, k, n_seqs, kwargs) is not None):
            return "portable"
    return family


def varlen_backward_family(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, n_seqs: int,
                           seqused_k: Optional[torch.Tensor], params: AttnParams) -> str:
    """The family whose packed backward runs this call: 'hopper' when the device allows it
    and bwd_kernel.py's varlen mode covers it
    (``flashattn.backends.sm90.support.varlen_backward_unsupported``), else the device backend."""
    family = family_for(q)
    if family == "hopper":
        from flashattn.backends.sm90.support import (varlen_backward_unsupported,
                                            varlen_slower_than_portable)

        kwargs = {**params.kernel_kwargs(), "deterministic": params.deterministic}
        if n_seqs < 1 or varlen_backward_unsupported(q, k, v, kwargs, seqused_k) is not None:
            return backend_for(q)
        if (requested_backend() == "auto"
                and varlen_slower_than_portable(q, k, n_seqs, kwargs, backward=True) is not None):
            return backend_for(q)
    return family


def backward_family(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, **params: Any) -> str:
    """The family whose backward runs this call: 'hopper' when the device allows it and the
    Hopper backward covers the call (``flashattn.backends.sm90.support.backward_unsupported``:
    fp16/bf16, d in 64/96/128/192/256, no dropout / alibi, ``deterministic=False``, TMA-aligned
    strides;
    ``FLASHATTN_HOPPER_BWD=0`` turns it off), else the device backend."""
    family = family_for(q)
    if family == "hopper":
        from flashattn.backends.sm90.support import backward_unsupported, slower_than_portable

        if backward_unsupported(q, k, v, params) is not None:
            return backend_for(q)
        # auto: short keys run faster on the portable backward (measured; see support.py)
        if requested_backend() == "auto" and slower_than_portable(q, k, params,
                                                                  backward=True) is not None:
            return backend_for(q)
    return family


def backend(name: str) -> Any:
    """The interface module (``backend.py``) of backend ``name`` ('hopper', 'portable',
    'cpu'), imported on first use."""
    mod = _LOADED.get(name)
    if mod is None:
        mod = _LOADED[name] = importlib.import_module(interface.MODULES[name])
    return mod


def select(op: str, q: torch.Tensor, k: Optional[torch.Tensor] = None,
           v: Optional[torch.Tensor] = None, params: Optional[AttnParams] = None,
           return_softmax: bool = False, scales: Optional[Fp8Scales] = None,
           out_dtype: Optional[torch.dtype] = None, n_seqs: Optional[int] = None,
           seqused_k: Optional[torch.Tensor] = None) -> str:
    """The backend ('hopper' | 'portable' | 'cpu') that runs ``op`` (one of :data:`OPS`) for
    these inputs: the dense and packed forward / backward may take the Hopper kernels
    (per-call checks need k, v and the params, packed calls also ``n_seqs`` and
    ``seqused_k``; the FP8 forwards also the scales and ``out_dtype``, None: a 16-bit one);
    every other op runs on the device backend."""
    if op in ("varlen_fwd", "varlen_bwd") and params is not None and n_seqs is not None:
        if op == "varlen_fwd":
            return varlen_forward_family(q, k, v, n_seqs, seqused_k, params, return_softmax)
        return varlen_backward_family(q, k, v, n_seqs, seqused_k, params)
    if (op == "fp8_varlen_fwd" and scales is not None and n_seqs is not None
            and fp8_varlen_on_hopper(q, k, v, n_seqs, params, scales, out_dtype)):
        return "hopper"
    if op == "fwd":
        return forward_family(q, k, v, **params.kernel_kwargs(), return_softmax=return_softmax)
    if op == "bwd":
        return backward_family(q, k, v, **params.kernel_kwargs(),
                               deterministic=params.deterministic)
    if op not in OPS:
        raise ValueError(f"op must be one of {OPS}, got {op!r}")
    if op == "fp8_fwd" and fp8_on_hopper(q, q, k, v, params, scales, out_dtype):
        return "hopper"
    return backend_for(q)


def fp8_on_hopper(x: torch.Tensor, q8: torch.Tensor, k8: torch.Tensor, v8: torch.Tensor,
                  params: AttnParams, scales: Fp8Scales,
                  out_dtype: Optional[torch.dtype] = None) -> bool:
    """Whether the Hopper FP8 kernel runs this FP8 forward: x's device starts from the Hopper
    family and the kernel covers q8 / k8 / v8 with these params, scale blocks and output
    dtype."""
    if family_for(x) != "hopper":
        return False
    from flashattn.backends.sm90.support import fp8_unsupported

    return fp8_unsupported(q8, k8, v8, params, scales, out_dtype) is None


def fp8_varlen_on_hopper(q8: torch.Tensor, k8: torch.Tensor, v8: torch.Tensor, n_seqs: int,
                         params: AttnParams, scales: Fp8Scales,
                         out_dtype: Optional[torch.dtype]) -> bool:
    """Whether the Hopper FP8 kernel's varlen mode runs this packed FP8 forward: the dense FP8
    rules over the (1, total, h, d) views (seqused_k included), at least one sequence, row
    and key."""
    if family_for(q8) != "hopper" or n_seqs < 1 or q8.shape[0] == 0 or k8.shape[0] == 0:
        return False
    from flashattn.backends.sm90.support import fp8_unsupported

    views = (q8.unsqueeze(0), k8.unsqueeze(0), v8.unsqueeze(0))
    return fp8_unsupported(*views, params, scales, out_dtype, varlen=True) is None


def quantize_backend(q: torch.Tensor, block_m: int, block_n: int) -> str:
    """The backend of the FP8 quantize pass: the device's, except that scale blocks longer
    than the fused Triton pass's tile (fp8_format.PASS_MAX_BLOCK) take the torch ops of the
    cpu backend (device-agnostic) on any device."""
    name = select("fp8_quantize", q)
    if name == "portable" and max(block_m, block_n) > fp8_format.PASS_MAX_BLOCK:
        return "cpu"
    return name


# Dense calls with at most this many query rows run the split-KV decode kernel (Flash-Decoding:
# the keys split over programs, GQA heads packed into the query rows). Measured on the H100
# (2026-11-23, probes/small_query_probe.py, results/h100_small_query_2026-11-23.json; GQA
# 32/8, d 128, causal, s_q 1 / 4 / 16): faster than the prefill kernels at every point in CUDA
# graphs, 1.14-1.5x at L = 1k, 2.2-2.5x at batch 8-64, 4-8x at batch 1 and L >= 4k (the
# prefill kernels have no key split: 0.27-0.38 TB/s at batch 1); so no shape rule.
SMALL_QUERY_MAX = 16


def small_query_allowed(q: torch.Tensor, rows: int, params: AttnParams,
                        return_softmax: bool) -> bool:
    """Whether a forward with at most ``rows`` query rows per sequence runs the decode kernel
    (same out / lse contract, so either backward serves it): few query rows, no dropout /
    S_dmask / shifted ALiBi (context parallelism's blocks: the decode kernel's ALiBi has no
    shift), on the Triton device backend, not forced to the Hopper kernels."""
    if (rows > SMALL_QUERY_MAX or return_softmax or params.dropout_p > 0.0
            or params.alibi_shift or not env.settings().small_query):
        return False
    return requested_backend() in ("auto", "portable") and backend_for(q) == "portable"


__all__ = ["backend", "backend_for", "BACKENDS", "backward_family", "ENV_BACKEND",
           "ENV_INTERPRET", "family_for", "forward_family", "fp8_on_hopper",
           "fp8_varlen_on_hopper", "hopper_reason", "interpreting", "OPS", "quantize_backend",
           "requested_backend", "select", "small_query_allowed", "SMALL_QUERY_MAX",
           "triton_available", "varlen_backward_family", "varlen_forward_family"]
