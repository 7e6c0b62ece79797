"""Backend choice for every op: the one place that decides which implementation runs a call.

Backends (packages with a ``backend.py`` interface: one function per op, taking the normalised
:class:`flashattn.params.AttnParams`)::

    portable  flashattn.triton: Triton kernels. CUDA tensors, or CPU tensors when
              TRITON_INTERPRET=1 (the Triton interpreter). Every op.
    cpu       flashattn.cpu: chunked torch. Any device torch runs on. Every op.
    hopper    flashattn.sm90: Gluon kernels for sm90, the dense forward of the calls they cover
              (fp16/bf16, head dims 64/96/128/192/256, causal, window, softcap, GQA, no dropout,
              alibi or return_softmax, TMA-aligned strides) and the backward of those with
              deterministic=False, and of unmasked deterministic=True calls at d = 128
              without softcap (``FLASHATTN_HOPPER_BWD=0`` turns the Hopper backward off).
              Everything else falls back to ``portable``.

:func:`select` answers for every op (``OPS``); the op functions below (:func:`forward`,
:func:`backward`, :func:`varlen_forward`, :func:`varlen_backward`, :func:`kvcache`,
:func:`varlen_paged_forward`, :func:`combine`) run the chosen backend, and are what the
torch.library ops in :mod:`flashattn.ops` call.

``FLASHATTN_BACKEND`` = ``auto`` (default) | ``portable`` | ``cpu`` | ``hopper`` forces a path;
``flashattn.use_backend(name)`` does the same inside a ``with`` block (both read through
:mod:`flashattn.runtime.env`). ``auto`` and ``hopper`` use the Hopper kernels on an sm90 device
for the calls they cover (``auto`` only where they measured faster); ``portable`` never does.

Two questions about devices: :func:`backend_for` answers which *device backend* runs
('portable' Triton or 'cpu' torch), and :func:`family_for` refines it to the kernel family a
dense call starts from ('hopper' on sm90 when allowed). :func:`forward_family` /
:func:`backward_family` add the per-call checks (features, strides, measured crossovers).

Backend packages are imported lazily, on the first call that needs them, so
``import flashattn`` works where Triton does not (a laptop without CUDA uses the cpu path).

Degenerate shapes (batch, seqlen_q or seqlen_k of 0) are answered here without calling any
backend: zero-size grids are not worth special-casing in every kernel.
"""
from __future__ import annotations

import functools
import importlib
import importlib.util
import math
import warnings
from typing import Any, Dict, Optional, Tuple

import torch

from flashattn import fp8_format, metadata
from flashattn.params import ONE_BLOCK_SHIFT, AttnParams, Fp8Scales
from flashattn.runtime import env
from flashattn.runtime.device import capturing
from flashattn.dispatch import interface

BACKENDS: Tuple[str, ...] = env.BACKENDS
ENV_BACKEND = "FLASHATTN_BACKEND"
ENV_INTERPRET = "TRITON_INTERPRET"
# every op dispatch chooses a backend for (select's first argument)
OPS: Tuple[str, ...] = ("fwd", "bwd", "varlen_fwd", "varlen_bwd", "kvcache", "varlen_paged_fwd",
                        "combine", "fp8_quantize", "fp8_fwd", "fp8_varlen_fwd", "sink_apply",
                        "sink_grad")
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
    from flashattn.sm90.support import device_unavailable

    return device_unavailable(device)


def family_for(tensor: "torch.Tensor | torch.device | str") -> str:
    """Kernel family ('hopper', 'portable' or 'cpu') that dense calls on this device start from.

    'hopper' when :func:`backend_for` says 'portable', ``FLASHATTN_BACKEND`` is ``auto`` or
    ``hopper``, and the device is sm90 with a Triton whose Gluon API the kernels know
    (``flashattn.sm90.support``). A call the Hopper kernels do not cover still falls back to
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
    Hopper kernel covers the call (``flashattn.sm90.support.call_unsupported``), else the
    device backend."""
    family = family_for(q)
    if family == "hopper":
        from flashattn.sm90.support import call_unsupported, slower_than_portable

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
    the call (``flashattn.sm90.support.varlen_unsupported``), else the device backend."""
    family = family_for(q)
    if family == "hopper":
        from flashattn.sm90.support import varlen_slower_than_portable, varlen_unsupported

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
    (``flashattn.sm90.support.varlen_backward_unsupported``), else the device backend."""
    family = family_for(q)
    if family == "hopper":
        from flashattn.sm90.support import (varlen_backward_unsupported,
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
    Hopper backward covers the call (``flashattn.sm90.support.backward_unsupported``:
    fp16/bf16, d in 64/96/128/192/256, no dropout / alibi, ``deterministic=False``, TMA-aligned
    strides;
    ``FLASHATTN_HOPPER_BWD=0`` turns it off), else the device backend."""
    family = family_for(q)
    if family == "hopper":
        from flashattn.sm90.support import backward_unsupported, slower_than_portable

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
            and _fp8_varlen_on_hopper(q, k, v, n_seqs, params, scales, out_dtype)):
        return "hopper"
    if op == "fwd":
        return forward_family(q, k, v, **params.kernel_kwargs(), return_softmax=return_softmax)
    if op == "bwd":
        return backward_family(q, k, v, **params.kernel_kwargs(),
                               deterministic=params.deterministic)
    if op not in OPS:
        raise ValueError(f"op must be one of {OPS}, got {op!r}")
    if op == "fp8_fwd" and _fp8_on_hopper(q, q, k, v, params, scales, out_dtype):
        return "hopper"
    return backend_for(q)


def _fp8_on_hopper(x: torch.Tensor, q8: torch.Tensor, k8: torch.Tensor, v8: torch.Tensor,
                   params: AttnParams, scales: Fp8Scales,
                   out_dtype: Optional[torch.dtype] = None) -> bool:
    """Whether the Hopper FP8 kernel runs this FP8 forward: x's device starts from the Hopper
    family and the kernel covers q8 / k8 / v8 with these params, scale blocks and output
    dtype."""
    if family_for(x) != "hopper":
        return False
    from flashattn.sm90.support import fp8_unsupported

    return fp8_unsupported(q8, k8, v8, params, scales, out_dtype) is None


def _fp8_varlen_on_hopper(q8: torch.Tensor, k8: torch.Tensor, v8: torch.Tensor, n_seqs: int,
                          params: AttnParams, scales: Fp8Scales,
                          out_dtype: Optional[torch.dtype]) -> bool:
    """Whether the Hopper FP8 kernel's varlen mode runs this packed FP8 forward: the dense FP8
    rules over the (1, total, h, d) views (seqused_k included), at least one sequence, row
    and key."""
    if family_for(q8) != "hopper" or n_seqs < 1 or q8.shape[0] == 0 or k8.shape[0] == 0:
        return False
    from flashattn.sm90.support import fp8_unsupported

    views = (q8.unsqueeze(0), k8.unsqueeze(0), v8.unsqueeze(0))
    return fp8_unsupported(*views, params, scales, out_dtype, varlen=True) is None


# ---------------------------------------------------------------------------------------------
# The ops' bodies: pick the backend, run it
# ---------------------------------------------------------------------------------------------
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


# Dense calls with at most this many query rows run the split-KV decode kernel (Flash-Decoding:
# the keys split over programs, GQA heads packed into the query rows). Measured on the H100
# (session 11, probes/small_query_probe.py, results/h100_small_query_2026-11-23.json; GQA
# 32/8, d 128, causal, s_q 1 / 4 / 16): faster than the prefill kernels at every point in CUDA
# graphs, 1.14-1.5x at L = 1k, 2.2-2.5x at batch 8-64, 4-8x at batch 1 and L >= 4k (the
# prefill kernels have no key split: 0.27-0.38 TB/s at batch 1); so no shape rule.
SMALL_QUERY_MAX = 16


def _small_query_allowed(q: torch.Tensor, rows: int, params: AttnParams,
                         return_softmax: bool) -> bool:
    """Whether a forward with at most ``rows`` query rows per sequence runs the decode kernel
    (same out / lse contract, so either backward serves it): few query rows, no dropout /
    S_dmask, on the Triton device backend, not forced to the Hopper kernels."""
    if (rows > SMALL_QUERY_MAX or return_softmax or params.dropout_p > 0.0
            or not env.settings().small_query):
        return False
    return requested_backend() in ("auto", "portable") and backend_for(q) == "portable"


def _small_query(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, params: AttnParams,
                 return_softmax: bool) -> bool:
    """Whether this dense forward runs the decode kernel (:func:`_small_query_allowed`)."""
    return _small_query_allowed(q, q.shape[1], params, return_softmax)


def _one_row_right_edge(params: AttnParams, s_q: int) -> AttnParams:
    """A single query row sits on the last key (bottom-right alignment): a right window edge
    of 0 hides nothing there, so drop it (the decode kernel then skips the mask work)."""
    if s_q == 1 and params.window_right == 0:
        return params._replace(window_right=-1)
    return params


def _small_query_runner(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, params: AttnParams,
                        need_lse: bool = True):
    """The dense forward through the decode kernel (k / v a full 'cache' of s_k keys), as a
    call ``run(q, k, v) -> (out, lse)`` for tensors of these shapes. What depends only on the
    shapes is made once: the bottom-right params and the (b,) int32 key counts, which the
    kernel only reads (a repeated call, e.g. a generate() step without padding through the
    fast path's runner, saves an allocation and a fill launch)."""
    row_params = _one_row_right_edge(params, q.shape[1])
    seqlens = torch.full((q.shape[0],), k.shape[1], dtype=torch.int32, device=q.device)
    if capturing():
        # the fill above is only recorded into the graph, not run: a runner kept for eager
        # calls after the capture would read unset counts. Fill per call then.
        def run_capture(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor):
            lens = torch.full((q.shape[0],), k.shape[1], dtype=torch.int32, device=q.device)
            return backend("portable").kvcache_attention(
                q, k, v, lens, 0, p=row_params, leftpad=None, batch_idx=None, block_table=None,
                num_splits=0, capacity=k.shape[1])
        return run_capture
    call = backend("portable").kvcache_call(q, k, v, seqlens, 0, p=row_params, leftpad=None,
                                            batch_idx=None, block_table=None, num_splits=0,
                                            capacity=k.shape[1])

    def run(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor):
        return call(q, k, v, seqlens, None, None, None, row_params.alibi_slopes,
                    need_lse=need_lse)
    return run


def _small_query_forward(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                         params: AttnParams) -> Tuple[torch.Tensor, torch.Tensor, None]:
    """The dense forward through the decode kernel (see _small_query_runner)."""
    out, lse = _small_query_runner(q, k, v, params)(q, k, v)
    return out, lse, None


def _small_query_varlen(q: torch.Tensor, n_seqs: int, max_seqlen_q: int, params: AttnParams,
                        return_softmax: bool = False) -> bool:
    """Whether this packed forward runs the decode kernel: at most SMALL_QUERY_MAX query rows
    per sequence (a decoding step of a packed batch, speculative verification), under the dense
    rule (:func:`_small_query_allowed`), and at least one sequence."""
    return n_seqs >= 1 and _small_query_allowed(q, max_seqlen_q, params, return_softmax)


def _packed_keys_as_cache(k: torch.Tensor, v: torch.Tensor, cu_seqlens_k: torch.Tensor,
                          seqused_k: Optional[torch.Tensor]):
    """Packed keys (total_k, h_k, d) as the decode kernel's cache: ``(k_cache, v_cache,
    starts, ends)``, one cache row (total_k, h_k, d) that every sequence shares (batch stride
    0, nothing copied), sequence b's keys at cache positions ``[starts[b], ends[b])``: its
    ``cu_seqlens_k`` slot, ``seqused_k[b]`` of them when given. The kernel takes the start as
    its left pad (``cache_leftpad``), so masks and ALiBi count from the sequence's first key,
    and clamps both bounds to the rows of k (no value reads outside it)."""
    n_seqs = cu_seqlens_k.shape[0] - 1
    # (the decode kernel reads its length vectors with unit stride)
    cu_seqlens_k = _unit_stride(cu_seqlens_k)
    k_cache = k.unsqueeze(0).expand(n_seqs, -1, -1, -1)
    v_cache = v.unsqueeze(0).expand(n_seqs, -1, -1, -1)
    starts = cu_seqlens_k[:-1]
    ends = cu_seqlens_k[1:] if seqused_k is None else starts + seqused_k
    return k_cache, v_cache, starts, ends


def _unit_stride(lengths: torch.Tensor) -> torch.Tensor:
    """A (n,) length vector as the decode kernel reads it: unit stride (a copy otherwise)."""
    return lengths if lengths.stride(0) == 1 else lengths.contiguous()


def _small_query_varlen_runner(max_seqlen_q: int, max_seqlen_k: int, params: AttnParams):
    """The packed forward through the decode kernel (split-KV, the GQA group packed into the
    query rows), as a call ``run(q, k, v, cu_seqlens_q, cu_seqlens_k, seqused_k) -> (out
    (total_q, h, d_v), lse float32 (h, total_q))``; rows outside every sequence get out 0 /
    lse -inf, as from the prefill kernels. Its first call makes the kernel's ``DecodeCall``
    from that call's tensors, later calls of the same signature replay it. The split count
    follows from ``max_seqlen_k`` (the host's bound: no value is read on the host)."""
    row_params = _one_row_right_edge(params, max_seqlen_q)
    call = None

    def run(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cu_seqlens_q: torch.Tensor,
            cu_seqlens_k: torch.Tensor, seqused_k: Optional[torch.Tensor]):
        nonlocal call
        k_cache, v_cache, starts, ends = _packed_keys_as_cache(k, v, cu_seqlens_k, seqused_k)
        cu_seqlens_q = _unit_stride(cu_seqlens_q)
        if call is None:
            call = backend("portable").kvcache_call(
                q, k_cache, v_cache, ends, 0, p=row_params, leftpad=starts, batch_idx=None,
                block_table=None, num_splits=0, capacity=max(1, max_seqlen_k),
                cu_seqlens_q=cu_seqlens_q, max_seqlen_q=max_seqlen_q)
        return call(q, k_cache, v_cache, ends, starts, None, None, row_params.alibi_slopes,
                    cu_seqlens_q)
    return run


def forward(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, params: AttnParams,
            return_softmax: bool = False
            ) -> Tuple[torch.Tensor, torch.Tensor, Optional[torch.Tensor]]:
    """Dense forward: ``(out, lse, S_dmask | None)``. Inputs validated and normalised."""
    if _is_degenerate(q, k):
        return _degenerate_fwd(q, k, v, return_softmax)
    if _small_query(q, k, v, params, return_softmax):
        return _small_query_forward(q, k, v, params)
    return backend(select("fwd", q, k, v, params, return_softmax)).fwd(q, k, v, params,
                                                                      return_softmax)


def forward_runner(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, params: AttnParams,
                   need_lse: bool = True):
    """:func:`forward`'s decisions for these inputs (no dropout / S_dmask), made once: a call
    ``run(q, k, v) -> (out, lse)`` for later calls of the same signature (the api's fast
    path keys it on shapes, strides, dtypes, device, alignment and settings, everything the
    decisions read). ``need_lse`` False: the caller drops lse, which may then be None."""
    if _is_degenerate(q, k):
        return lambda q, k, v: _degenerate_fwd(q, k, v, False)[:2]
    if _small_query(q, k, v, params, False):
        # (its shape-only parts made once)
        return _small_query_runner(q, k, v, params, need_lse)
    name = select("fwd", q, k, v, params, False)
    make = getattr(backend(name), "fwd_call", None) if name == "portable" else None
    if make is not None:
        call = make(q, k, v, params, need_lse)  # (replays its launch)
        if call is not None:
            return call
    fwd = backend(name).fwd
    return lambda q, k, v: fwd(q, k, v, params, False)[:2]


def backward_runner(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, params: AttnParams):
    """:func:`backward`'s decisions for these inputs, made once: a call ``run(dout, q, k, v,
    out, lse) -> (dq, dk, dv)`` for later tensors of the same signature (the api's recorded
    dense calls with a gradient to record: ops._RecordedDense)."""
    if _is_degenerate(q, k):
        return lambda dout, q, k, v, out, lse: backward(dout, q, k, v, out, lse, params)
    bwd = backend(select("bwd", q, k, v, params)).bwd
    return lambda dout, q, k, v, out, lse: bwd(dout, q, k, v, out, lse, params)


def forward_with_sink(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, params: AttnParams,
                      sink: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor]:
    """Dense forward with learnable sinks (h,): (out, lse) of attention whose softmax
    denominators include exp(sink[h]). The Hopper kernel folds the sink into its epilogue
    (no extra pass); the other paths run the plain forward and then :func:`sink_apply`."""
    if not _is_degenerate(q, k) and not _small_query(q, k, v, params, False) \
            and select("fwd", q, k, v, params) == "hopper":
        out, lse, _ = backend("hopper").fwd(q, k, v, params, False, sink=sink)
        return out, lse
    out, lse, _ = forward(q, k, v, params)
    return sink_apply(out, lse, sink, packed=False)


def backward(dout: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
             out: torch.Tensor, lse: torch.Tensor, params: AttnParams
             ) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Dense backward: ``(dq, dk, dv)`` shaped and typed like q, k, v. The Hopper backward
    takes the calls it covers; the rest run the portable backward (same lse contract, so
    either forward's lse serves either backward)."""
    if _is_degenerate(q, k):
        return tuple(  # type: ignore[return-value]
            torch.zeros(x.shape, dtype=x.dtype, device=x.device) for x in (q, k, v)
        )
    return backend(select("bwd", q, k, v, params)).bwd(dout, q, k, v, out, lse, params)


def varlen_forward(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cu_seqlens_q: torch.Tensor,
                   cu_seqlens_k: torch.Tensor, seqused_k: Optional[torch.Tensor],
                   block_table: Optional[torch.Tensor], max_seqlen_q: int, max_seqlen_k: int,
                   params: AttnParams, return_softmax: bool = False
                   ) -> Tuple[torch.Tensor, torch.Tensor, Optional[torch.Tensor]]:
    """Packed variable-length forward: ``(out (total_q, h, d_v), lse (h, total_q), S_dmask |
    None)``; with ``block_table`` k / v are paged caches (forward only, no dropout)."""
    if max_seqlen_q == 0 or max_seqlen_k == 0:
        # every query or every key sequence is empty: no row sees a key (no zero-size grids)
        total_q, h, _ = q.shape
        out = torch.zeros((total_q, h, v.shape[-1]), dtype=q.dtype, device=q.device)
        lse = torch.full((h, total_q), float("-inf"), dtype=torch.float32, device=q.device)
        s_dmask = (torch.zeros((cu_seqlens_q.shape[0] - 1, h, max_seqlen_q, max_seqlen_k),
                               dtype=q.dtype, device=q.device) if return_softmax else None)
        return out, lse, s_dmask
    if block_table is not None:
        out, lse = varlen_paged_forward(q, k, v, cu_seqlens_q, cu_seqlens_k, seqused_k,
                                        max_seqlen_q, max_seqlen_k, block_table, params)
        return out, lse, None
    if _small_query_varlen(q, cu_seqlens_q.shape[0] - 1, max_seqlen_q, params, return_softmax):
        out, lse = _small_query_varlen_runner(max_seqlen_q, max_seqlen_k, params)(
            q, k, v, cu_seqlens_q, cu_seqlens_k, seqused_k)
        return out, lse, None
    family = varlen_forward_family(q, k, v, cu_seqlens_q.shape[0] - 1, seqused_k, params,
                                   return_softmax)
    return backend(family).varlen_fwd(
        q, k, v, cu_seqlens_q, cu_seqlens_k, seqused_k, max_seqlen_q, max_seqlen_k, params,
        return_softmax)


def varlen_backward(dout: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                    out: torch.Tensor, lse: torch.Tensor, cu_seqlens_q: torch.Tensor,
                    cu_seqlens_k: torch.Tensor, seqused_k: Optional[torch.Tensor],
                    max_seqlen_q: int, max_seqlen_k: int, params: AttnParams
                    ) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Packed variable-length backward: ``(dq, dk, dv)``; dout / out (total_q, h, d_v) (dout
    with unit last-dim stride), lse float32 (h, total_q)."""
    if max_seqlen_q == 0 or max_seqlen_k == 0:  # no row saw a key: no gradient anywhere
        return tuple(  # type: ignore[return-value]
            torch.zeros(x.shape, dtype=x.dtype, device=x.device) for x in (q, k, v))
    family = varlen_backward_family(q, k, v, cu_seqlens_q.shape[0] - 1, seqused_k, params)
    return backend(family).varlen_bwd(
        dout, q, k, v, out, lse, cu_seqlens_q, cu_seqlens_k, seqused_k, max_seqlen_q,
        max_seqlen_k, params)


class VarlenRunner:
    """:func:`varlen_forward` and :func:`varlen_backward`'s decisions for one packed call
    signature, made once (no block_table, dropout, S_dmask, ALiBi or sink): the families, and
    the backend's recorded calls where it has them (the Hopper backend's
    ``varlen_fwd_call`` / ``varlen_bwd_call``: output shapes, config and launch plans found
    once; the decode kernel's call for few query rows per sequence). The api's fast path
    (api/fastpath.VARLEN) keeps one per signature, keyed on everything these decisions read:
    shapes, strides, dtypes, device, alignment, the number of sequences, whether seqused_k is
    given, the maxima, the params and the settings.

    Built from the signature's first call (validated, normalised ``params``); ``forward`` and
    ``backward`` take later calls' tensors."""

    def __init__(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                 cu_seqlens_q: torch.Tensor, seqused_k: Optional[torch.Tensor],
                 max_seqlen_q: int, max_seqlen_k: int, params: AttnParams) -> None:
        self.params, self.max_seqlen_q, self.max_seqlen_k = params, max_seqlen_q, max_seqlen_k
        self.n_seqs = cu_seqlens_q.shape[0] - 1
        # every query or every key sequence empty: varlen_forward's early exit on each call
        self.empty = max_seqlen_q == 0 or max_seqlen_k == 0
        self._fwd = self._fwd_call = None
        self._bwd = self._bwd_call = None  # (decided by the signature's first backward)
        if self.empty:
            return
        if _small_query_varlen(q, self.n_seqs, max_seqlen_q, params):
            self._fwd_call = _small_query_varlen_runner(max_seqlen_q, max_seqlen_k, params)
            return
        impl = backend(varlen_forward_family(q, k, v, self.n_seqs, seqused_k, params))
        make = getattr(impl, "varlen_fwd_call", None)
        if make is not None:
            self._fwd_call = make(q, k, v, self.n_seqs, seqused_k is not None, params)
        self._fwd = impl.varlen_fwd

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                cu_seqlens_q: torch.Tensor, cu_seqlens_k: torch.Tensor,
                seqused_k: Optional[torch.Tensor]) -> Tuple[torch.Tensor, torch.Tensor]:
        """(out (total_q, h, d_v), lse float32 (h, total_q)), contiguous."""
        if self._fwd_call is not None:
            return self._fwd_call(q, k, v, cu_seqlens_q, cu_seqlens_k, seqused_k)
        if self.empty:
            out, lse, _ = varlen_forward(q, k, v, cu_seqlens_q, cu_seqlens_k, seqused_k, None,
                                         self.max_seqlen_q, self.max_seqlen_k, self.params)
        else:
            out, lse, _ = self._fwd(q, k, v, cu_seqlens_q, cu_seqlens_k, seqused_k,
                                    self.max_seqlen_q, self.max_seqlen_k, self.params, False)
        return out.contiguous(), lse.contiguous()

    def backward(self, dout: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                 out: torch.Tensor, lse: torch.Tensor, cu_seqlens_q: torch.Tensor,
                 cu_seqlens_k: torch.Tensor, seqused_k: Optional[torch.Tensor]
                 ) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(dq, dk, dv), contiguous, shaped and typed like q, k, v; dout (total_q, h, d_v)
        with unit last-dim stride."""
        if self.empty:
            return varlen_backward(dout, q, k, v, out, lse, cu_seqlens_q, cu_seqlens_k,
                                   seqused_k, self.max_seqlen_q, self.max_seqlen_k, self.params)
        if self._bwd is None:
            impl = backend(varlen_backward_family(q, k, v, self.n_seqs, seqused_k, self.params))
            make = getattr(impl, "varlen_bwd_call", None)
            if make is not None:
                self._bwd_call = make(q, k, v, dout, self.n_seqs, seqused_k is not None,
                                      self.params)
            self._bwd = impl.varlen_bwd
        if self._bwd_call is not None:
            return self._bwd_call(dout, q, k, v, out, lse, cu_seqlens_q, cu_seqlens_k,
                                  seqused_k)
        dq, dk, dv = self._bwd(dout, q, k, v, out, lse, cu_seqlens_q, cu_seqlens_k, seqused_k,
                               self.max_seqlen_q, self.max_seqlen_k, self.params)
        return dq.contiguous(), dk.contiguous(), dv.contiguous()


def varlen_paged_forward(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                         cu_seqlens_q: torch.Tensor, cu_seqlens_k: torch.Tensor,
                         seqused_k: Optional[torch.Tensor], max_seqlen_q: int, max_seqlen_k: int,
                         block_table: torch.Tensor, params: AttnParams
                         ) -> Tuple[torch.Tensor, torch.Tensor]:
    """Packed varlen queries (total_q, h, d) against a paged KV cache (num_blocks, page_size,
    h_k, d / d_v). Sequence b has queries ``q[cu_seqlens_q[b]:cu_seqlens_q[b + 1]]`` and keys
    at positions ``[0, s_k)`` of its pages, ``s_k = seqused_k[b]`` if given else the
    cu_seqlens_k difference. Returns out (total_q, h, d_v) (0 on rows outside every sequence)
    and lse float32 (h, total_q)."""
    total_q, h, _ = q.shape
    if total_q == 0 or cu_seqlens_q.shape[0] < 2:
        out = torch.zeros((total_q, h, v_cache.shape[3]), dtype=q.dtype, device=q.device)
        lse = torch.full((h, total_q), float("-inf"), dtype=torch.float32, device=q.device)
        return out, lse
    return backend(select("varlen_paged_fwd", q)).varlen_paged_fwd(
        q, k_cache, v_cache, cu_seqlens_q, cu_seqlens_k, seqused_k, max_seqlen_q, max_seqlen_k,
        block_table, params)


def kvcache(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
            k: Optional[torch.Tensor], v: Optional[torch.Tensor],
            rotary_cos: Optional[torch.Tensor], rotary_sin: Optional[torch.Tensor],
            cache_seqlens: Optional[torch.Tensor], cache_batch_idx: Optional[torch.Tensor],
            cache_leftpad: Optional[torch.Tensor], block_table: Optional[torch.Tensor],
            params: AttnParams, rotary_interleaved: bool, num_splits: int,
            cu_seqlens_q: Optional[torch.Tensor] = None, max_seqlen_q: int = 0,
            cu_seqlens_k_new: Optional[torch.Tensor] = None,
            rotary_seqlens: Optional[torch.Tensor] = None
            ) -> Tuple[torch.Tensor, torch.Tensor]:
    """The body of ``flash_attn_with_kvcache`` after its argument checks: value checks where
    they are allowed (:func:`flashattn.metadata.values_checkable`), the in-place append (with
    rotary), attention. ``params`` is normalised by the api (window against the cache
    capacity, causal folded in, alibi (b, h)). Returns out (b, s_q, h, d_v) and lse float32
    (b, h, s_q); with ``cu_seqlens_q`` (FlashAttention-3's varlen queries) q is packed
    (total_q, h, d) and out / lse are (total_q, h, d_v) / (h, total_q). ``cu_seqlens_k_new``:
    k / v packed (total_new, h_k, d); ``rotary_seqlens``: rotation positions' base."""
    varlen = cu_seqlens_q is not None or cu_seqlens_k_new is not None
    if varlen:
        return _kvcache_varlen(q, k_cache, v_cache, k, v, rotary_cos, rotary_sin, cache_seqlens,
                               cache_batch_idx, cache_leftpad, block_table, params,
                               rotary_interleaved, num_splits, cu_seqlens_q, max_seqlen_q,
                               cu_seqlens_k_new, rotary_seqlens)
    batch, s_q, h, d = q.shape
    device = q.device
    capacity = metadata.cache_capacity(k_cache, block_table)
    s_new = 0 if k is None else k.shape[1]
    # flash-attn rotates q token by token (positions cache_seqlens + i) when the call is causal
    # or local, else every token at cache_seqlens
    rotary_q_step = 1 if params.masked else 0
    params = _one_row_right_edge(params, s_q)
    seqlens = cache_seqlens
    if seqlens is None:
        seqlens = torch.full((batch,), capacity, dtype=torch.int32, device=device)

    if metadata.values_checkable(seqlens, cache_leftpad, cache_batch_idx, block_table,
                                 rotary_seqlens):
        _check_kvcache_values(seqlens, s_new, capacity, cache_leftpad, cache_batch_idx,
                              k_cache, block_table, rotary_cos, s_q if rotary_q_step else 1,
                              rotary_seqlens)

    impl = backend(select("kvcache", q))
    rot = dict(rotary_seqlens=rotary_seqlens) if rotary_seqlens is not None else {}
    if batch == 0 or s_q == 0:
        out = torch.zeros((batch, s_q, h, v_cache.shape[3]), dtype=q.dtype, device=device)
        lse = torch.full((batch, h, s_q), float("-inf"), dtype=torch.float32, device=device)
        if s_new > 0 and batch > 0:
            impl.append_kv(q, k_cache, v_cache, k, v, rotary_cos, rotary_sin, rotary_interleaved,
                           seqlens, cache_batch_idx, block_table, **rot)
        return out, lse
    q_rot = q
    if s_new > 0:
        q_rot = impl.append_kv(q, k_cache, v_cache, k, v, rotary_cos, rotary_sin,
                               rotary_interleaved, seqlens, cache_batch_idx, block_table,
                               rotary_q_step, **rot)
    return impl.kvcache_attention(q_rot, k_cache, v_cache, seqlens, s_new, p=params,
                                  leftpad=cache_leftpad, batch_idx=cache_batch_idx,
                                  block_table=block_table, num_splits=num_splits,
                                  capacity=capacity)


def _check_kvcache_values(seqlens, s_new, capacity, leftpad, batch_idx, k_cache, block_table,
                          rotary_cos, q_positions, rotary_seqlens) -> None:
    """:func:`metadata.check_values` of a KV-cache call (``q_positions``: rotary positions q
    takes past each row's length: s_q when rotated token by token, else 1)."""
    metadata.check_values(seqlens, s_new, capacity, leftpad, batch_idx, k_cache.shape[0],
                          block_table, k_cache.shape[0], k_cache.shape[1],
                          None if rotary_cos is None else rotary_cos.shape[0], q_positions,
                          rotary_seqlens)


def kvcache_runner(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                   k: Optional[torch.Tensor], v: Optional[torch.Tensor],
                   rotary_cos: Optional[torch.Tensor], rotary_sin: Optional[torch.Tensor],
                   cache_seqlens: Optional[torch.Tensor],
                   cache_batch_idx: Optional[torch.Tensor], cache_leftpad: Optional[torch.Tensor],
                   block_table: Optional[torch.Tensor], params: AttnParams,
                   rotary_interleaved: bool, num_splits: int):
    """:func:`kvcache`'s decisions for this call signature (dense q, no packed lengths), made
    once: a call ``run(q, k_cache, v_cache, k, v, rotary_cos, rotary_sin, cache_seqlens,
    cache_batch_idx, cache_leftpad, block_table, need_lse=True) -> (out, lse)`` for later
    calls whose tensors have the same shapes, strides, dtypes, devices and alignment and whose
    scalars, given tensors and settings are the same (the api's fast path keys on exactly
    those); with ``need_lse=False`` lse may come back None (the caller drops it). The value
    checks run in it as in :func:`kvcache` (always for CPU metadata). None where the full body
    must run on every call: the checked mode on a GPU (its checks depend on capture), empty
    shapes, or a backend without decode kernels (the torch path)."""
    batch, s_q, _, _ = q.shape
    metas = (cache_seqlens, cache_leftpad, cache_batch_idx, block_table)
    on_cpu = all(t.device.type == "cpu" for t in (q, *metas) if t is not None)
    if batch == 0 or s_q == 0 or (env.settings().checks and not on_cpu) or capturing():
        return None  # (capturing: tensors made here would be filled only by the graph)
    name = select("kvcache", q)
    if name != "portable":
        return None
    impl = backend(name)
    capacity = metadata.cache_capacity(k_cache, block_table)
    s_new = 0 if k is None else k.shape[1]
    rotary_q_step = 1 if params.masked else 0
    row_params = _one_row_right_edge(params, s_q)
    full = None  # (cache_seqlens None: every row holds the whole cache; the kernel only reads)
    if cache_seqlens is None:
        full = torch.full((batch,), capacity, dtype=torch.int32, device=q.device)
    calls: list = []  # the DecodeCall, made by the first run (it needs the rotated q)

    def run(q, k_cache, v_cache, k, v, rotary_cos, rotary_sin, cache_seqlens, cache_batch_idx,
            cache_leftpad, block_table, need_lse=True):
        seqlens = full if cache_seqlens is None else cache_seqlens
        if on_cpu:
            _check_kvcache_values(seqlens, s_new, capacity, cache_leftpad, cache_batch_idx,
                                  k_cache, block_table, rotary_cos,
                                  s_q if rotary_q_step else 1, None)
        q_rot = q
        if s_new > 0:
            q_rot = impl.append_kv(q, k_cache, v_cache, k, v, rotary_cos, rotary_sin,
                                   rotary_interleaved, seqlens, cache_batch_idx, block_table,
                                   rotary_q_step)
        if not calls:
            calls.append(impl.kvcache_call(q_rot, k_cache, v_cache, seqlens, s_new,
                                           p=row_params, leftpad=cache_leftpad,
                                           batch_idx=cache_batch_idx, block_table=block_table,
                                           num_splits=num_splits, capacity=capacity))
        return calls[0](q_rot, k_cache, v_cache, seqlens, cache_leftpad, cache_batch_idx,
                        block_table, row_params.alibi_slopes, need_lse=need_lse)
    return run


def _kvcache_varlen(q, k_cache, v_cache, k, v, rotary_cos, rotary_sin, cache_seqlens,
                    cache_batch_idx, cache_leftpad, block_table, params, rotary_interleaved,
                    num_splits, cu_seqlens_q, max_seqlen_q, cu_seqlens_k_new, rotary_seqlens):
    """:func:`kvcache` with packed queries and / or packed new keys (FlashAttention-3): the
    batch comes from cache_seqlens; sequence b's keys end at cache_seqlens[b] + its new keys
    (device arithmetic, no host read), and the attention runs the decode kernel's packed-query
    mode (or, for dense q, its usual mode over those lengths)."""
    device = q.device
    capacity = metadata.cache_capacity(k_cache, block_table)
    if cache_seqlens is None:  # every row holds the whole cache
        batch = cu_seqlens_q.shape[0] - 1 if cu_seqlens_q is not None else q.shape[0]
        cache_seqlens = torch.full((batch,), capacity, dtype=torch.int32, device=device)
    batch = cache_seqlens.shape[0]
    rotary_q_step = 1 if params.masked else 0
    max_new = 0
    if k is not None:
        if cu_seqlens_k_new is not None:
            new = cu_seqlens_k_new[1:] - cu_seqlens_k_new[:-1]
            max_new = k.shape[0]
        else:
            new = k.shape[1]
            max_new = k.shape[1]
        seqlens_end = (cache_seqlens + new).to(torch.int32)
    else:
        seqlens_end = cache_seqlens
    if metadata.values_checkable(cache_seqlens, seqlens_end, cache_leftpad, cache_batch_idx,
                                 block_table, cu_seqlens_q, cu_seqlens_k_new, rotary_seqlens):
        metadata.check_varlen_kvcache(cache_seqlens, seqlens_end, capacity, cu_seqlens_q,
                                      q.shape[0] if cu_seqlens_q is not None else None,
                                      cu_seqlens_k_new,
                                      k.shape[0] if cu_seqlens_k_new is not None else None,
                                      rotary_seqlens,
                                      None if rotary_cos is None else rotary_cos.shape[0],
                                      rotary_q_step,
                                      1 if cu_seqlens_q is not None else q.shape[1])
        metadata.check_values(seqlens_end, 0, capacity, cache_leftpad, cache_batch_idx,
                              k_cache.shape[0], block_table, k_cache.shape[0], k_cache.shape[1],
                              None, 1)
    impl = backend(select("kvcache", q))
    q_rot = q
    if k is not None or rotary_cos is not None:
        q_rot = impl.append_kv(q, k_cache, v_cache, k, v, rotary_cos, rotary_sin,
                               rotary_interleaved, cache_seqlens, cache_batch_idx,
                               block_table, rotary_q_step, cu_seqlens_q=cu_seqlens_q,
                               max_seqlen_q=max_seqlen_q, cu_seqlens_k_new=cu_seqlens_k_new,
                               max_seqlen_k_new=max_new, rotary_seqlens=rotary_seqlens)
    if cu_seqlens_q is None:
        params = _one_row_right_edge(params, q.shape[1])
    elif batch == 0 or q.shape[0] == 0 or max_seqlen_q == 0:
        total_q, h, _ = q.shape
        return (torch.zeros((total_q, h, v_cache.shape[3]), dtype=q.dtype, device=device),
                torch.full((h, total_q), float("-inf"), dtype=torch.float32, device=device))
    return impl.kvcache_attention(q_rot, k_cache, v_cache, seqlens_end, 0, p=params,
                                  leftpad=cache_leftpad, batch_idx=cache_batch_idx,
                                  block_table=block_table, num_splits=num_splits,
                                  capacity=capacity, cu_seqlens_q=cu_seqlens_q,
                                  max_seqlen_q=max_seqlen_q)


def combine(out_partial: torch.Tensor, lse_partial: torch.Tensor, out: Optional[torch.Tensor],
            out_dtype: torch.dtype) -> Tuple[torch.Tensor, torch.Tensor]:
    """Merge attention computed over disjoint key splits: out_partial (splits, b, s_q, h, d_v)
    and lse_partial (splits, b, h, s_q) float32 -> (out (b, s_q, h, d_v) in ``out_dtype``,
    written into ``out`` when given; lse float32 (b, h, s_q))."""
    return backend(select("combine", out_partial)).combine(out_partial, lse_partial, out,
                                                           out_dtype)


def sink_apply(out: torch.Tensor, lse: torch.Tensor, sink: torch.Tensor, packed: bool
               ) -> Tuple[torch.Tensor, torch.Tensor]:
    """Learnable sinks on a finished attention output: (out * exp(lse - lse'), lse' =
    logaddexp(lse, sink)); out (b, s, h, d_v) / lse (b, h, s), or packed (t, h, d_v) / (h, t)."""
    return backend(select("sink_apply", out)).sink_apply(out, lse, sink, packed)


def sink_grad(dout: torch.Tensor, out: torch.Tensor, lse: torch.Tensor, sink: torch.Tensor,
              packed: bool) -> torch.Tensor:
    """d sink (h,) of learnable sinks from dout and the outputs with the sink (out', lse')."""
    return backend(select("sink_grad", out)).sink_grad(dout, out, lse, sink, packed)


def fp8_quantize(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                 signs: Optional[torch.Tensor], block_m: int, block_n: int,
                 v_wgmma: bool = False) -> Tuple[torch.Tensor, ...]:
    """FP8 block quantization of q, k, v (incoherent processing of q and k with ``signs``):
    (q8, k8, v8, q_descale (b, h, nq), k_descale (b, h_k, nk), v_descale (b, h_k, nk)); v8 in
    wgmma key order with ``v_wgmma`` (fp8_format.wgmma_vt_empty), else keys contiguous."""
    return backend(quantize_backend(q, block_m, block_n)).fp8_quantize(
        q, k, v, signs, block_m, block_n, v_wgmma=v_wgmma)


def quantize_backend(q: torch.Tensor, block_m: int, block_n: int) -> str:
    """The backend of the FP8 quantize pass: the device's, except that scale blocks longer
    than the fused Triton pass's tile (fp8_format.PASS_MAX_BLOCK) take the torch ops of the
    cpu backend (device-agnostic) on any device."""
    name = select("fp8_quantize", q)
    if name == "portable" and max(block_m, block_n) > fp8_format.PASS_MAX_BLOCK:
        return "cpu"
    return name


def fp8_v_wgmma(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, params: AttnParams,
                block_m: int, block_n: int) -> bool:
    """Whether a quantize pass of q, k, v (16/32-bit, validated) with these blocks should write
    V in wgmma key order (fp8_quantize's ``v_wgmma``): exactly when :func:`fp8_forward` will run
    the Hopper kernel on its outputs, so the order never has to be undone, and the forward
    skips its permuting pass (30 us per 32 MB on the H100). Decided on meta stand-ins with the
    shapes and layouts the pass writes (fresh allocations: 16-byte aligned). Kept per
    signature: it reads only shapes, dtypes, the device, the params, the blocks and the
    settings (three meta allocations and the Hopper coverage checks cost ~40 us of host per
    flash_attn_fp8_func call on the H100 host)."""
    key = (tuple(q.shape), tuple(k.shape), tuple(v.shape), q.dtype, q.device, params,
           int(block_m), int(block_n), env.settings())
    hit = _FP8_V_WGMMA.get(key)
    if hit is not None:
        return hit
    meta = torch.device("meta")
    q8 = torch.empty(q.shape, dtype=fp8_format.FP8_DTYPE, device=meta)
    k8 = torch.empty(k.shape, dtype=fp8_format.FP8_DTYPE, device=meta)
    v8 = fp8_format.keys_contiguous_empty(v.shape, meta)
    scales = Fp8Scales(q8, k8, v8, int(block_m).bit_length() - 1,  # (the tables are not read)
                       int(block_n).bit_length() - 1)
    decision = _fp8_on_hopper(q, q8, k8, v8, params, scales, q.dtype)
    if len(_FP8_V_WGMMA) >= 512:  # (signatures that never repeat must not grow it forever)
        _FP8_V_WGMMA.clear()
    _FP8_V_WGMMA[key] = decision
    return decision


_FP8_V_WGMMA: Dict[tuple, bool] = {}


def kvcache_planned(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                    seqlens: torch.Tensor, block_table: Optional[torch.Tensor],
                    params: AttnParams, num_splits: int, capacity: int, buffers: dict
                    ) -> Tuple[torch.Tensor, torch.Tensor]:
    """A planned decode step (``flashattn.plan_decode``): attention of q (b, s_q, h, d) over
    the cache's first seqlens[b] keys, no new keys; the split count and the outputs come from
    the plan (``buffers``, reused between calls where the backend can)."""
    params = _one_row_right_edge(params, q.shape[1])
    return backend(backend_for(q)).kvcache_attention(
        q, k_cache, v_cache, seqlens, 0, p=params, leftpad=None, batch_idx=None,
        block_table=block_table, num_splits=num_splits, capacity=capacity, buffers=buffers)


def decode_splits(batch: int, seqlen_q: int, max_seqlen_k: int, nheads: int, nheads_k: int,
                  headdim: int, headdim_v: int, dtype: torch.dtype, page_size: Optional[int],
                  num_splits: int) -> int:
    """The number of key splits a KV-cache call of these shapes runs on the current CUDA
    device (FA3's get_scheduler_metadata); 1 where the call would not run split-KV kernels
    (no CUDA device or no Triton: the torch path has no splits). ``num_splits`` > 0 as given."""
    if num_splits > 0:
        return int(num_splits)
    if not (torch.cuda.is_available() and triton_available()):
        return 1
    device = torch.device("cuda", torch.cuda.current_device())
    return backend("portable").decode_splits(batch, seqlen_q, max_seqlen_k, nheads, nheads_k,
                                             headdim, headdim_v, dtype, page_size, device)


def fp8_forward(q8: torch.Tensor, k8: torch.Tensor, v8: torch.Tensor, scales: Fp8Scales,
                params: AttnParams, out_dtype: torch.dtype, v_wgmma: bool = False
                ) -> Tuple[torch.Tensor, torch.Tensor]:
    """Dense FP8 forward: (out (b, s_q, h, d_v) in ``out_dtype``, lse (b, h, s_q)). Inputs
    validated: float8_e4m3fn q8 / k8 / v8 and block descales (params.Fp8Scales). ``v_wgmma``:
    v8 is in wgmma key order (fp8_quantize's ``v_wgmma``): the Hopper kernels read it as is,
    any other backend gets it back in key order."""
    v_keys = v8[:, :k8.shape[1]] if v_wgmma else v8  # (the shape the checks expect)
    if _is_degenerate(q8, k8):
        out, lse, _ = _degenerate_fwd(q8, k8, v_keys, False)
        return out.to(out_dtype), lse
    name = select("fp8_fwd", q8, k8, v_keys, params, scales=scales, out_dtype=out_dtype)
    if v_wgmma:
        if name == "hopper":
            return backend(name).fp8_fwd(q8, k8, v8, scales, params, out_dtype, v_wgmma=True)
        v8 = fp8_format.from_wgmma_order(v8, k8.shape[1])
    return backend(name).fp8_fwd(q8, k8, v8, scales, params, out_dtype)


def fp8_e2e_runner(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, params: AttnParams,
                   signs: Optional[torch.Tensor], block_m: int, block_n: int, need_lse: bool
                   ) -> Optional["Fp8Call"]:
    """``flash_attn_fp8_func``'s decisions for these validated 16/32-bit inputs, made once: a
    :class:`Fp8Call` for the calls that run the Triton quantize pass and then the Hopper FP8
    kernel (CUDA, V in wgmma key order, >= 32 keys per scale), None for the rest (they take
    the full path on every call). The caller keys it on everything the decisions read
    (shapes, strides, dtypes, device, alignment, params, blocks, seed, settings)."""
    if (q.device.type != "cuda" or _is_degenerate(q, k)
            or block_n < fp8_format.WGMMA_KEY_GROUP
            or quantize_backend(q, block_m, block_n) != "portable"
            or not fp8_v_wgmma(q, k, v, params, block_m, block_n)):
        return None
    return Fp8Call(q, k, v, params, signs, block_m, block_n, need_lse)


class _Workspace:
    """The layout of a recorded call's per-stream workspace (``runtime.buffers``): named
    regions, each laid out as its meta tensor (dtype, shape, strides; a strided view must
    cover all of its storage) at a 256-byte-aligned offset."""

    def __init__(self, regions: "list[Tuple[str, torch.Tensor]]") -> None:
        self._regions: Dict[str, tuple] = {}
        offset = 0
        for name, meta in regions:
            nbytes = meta.dtype.itemsize * math.prod(meta.shape)
            self._regions[name] = (offset, nbytes, meta.dtype, tuple(meta.shape), meta.stride())
            offset += -(-nbytes // 256) * 256
        self.nbytes = offset

    def offset(self, name: str) -> int:
        return self._regions[name][0]

    def view(self, ws: torch.Tensor, name: str) -> torch.Tensor:
        """Region ``name`` of the workspace ``ws`` (a uint8 buffer of >= :attr:`nbytes`)."""
        offset, nbytes, dtype, shape, strides = self._regions[name]
        return ws.narrow(0, offset, nbytes).view(dtype).as_strided(shape, strides)


def _meta(shape: Tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
    return torch.empty(shape, dtype=dtype, device="meta")


class _WorkspaceCall:
    """What the recorded FP8 calls share: a per-(stream, thread) workspace of named regions
    (one of them "counter", the forward's tile queue), a fresh ``out`` and, when the
    signature returns it, a fresh ``lse`` per call. A subclass sets ``self._fwd`` (an
    sm90/fwd.Fp8FwdCall) and calls :meth:`_setup` in its constructor."""

    def _setup(self, kind: str, regions: "list[Tuple[str, torch.Tensor]]",
               out_shape: Tuple[int, ...], out_dtype: torch.dtype, lse_shape: Tuple[int, ...],
               device: torch.device, need_lse: bool) -> None:
        self._kind, self._ws = kind, _Workspace(regions)
        self._counter_at = self._ws.offset("counter")
        self._out_shape, self._out_dtype, self._lse_shape = out_shape, out_dtype, lse_shape
        self._device, self._index, self._need_lse = device, device.index, need_lse
        # (imported here: runtime.buffers needs Triton, and dispatch must import without it)
        from flashattn.runtime import buffers

        self._buffers = buffers
        self._recorded = False

    def _begin(self) -> Tuple[torch.Tensor, torch.Tensor, Optional[torch.Tensor]]:
        """(workspace, out, lse or None) of this call; the tile-queue counter zeroed when the
        forward takes its tiles from it (it starts at zero on every call)."""
        ws = self._buffers.stream_buffer(self._kind, self._ws.nbytes, self._index)
        out = torch.empty(self._out_shape, dtype=self._out_dtype, device=self._device)
        lse = (torch.empty(self._lse_shape, dtype=torch.float32, device=self._device)
               if self._need_lse else None)
        if self._fwd.uses_counter:
            ws.narrow(0, self._counter_at, 4).zero_()
        return ws, out, lse


class Fp8Call(_WorkspaceCall):
    """``flash_attn_fp8_func`` for one call signature (issue 21's recorded calls, for FP8
    prefill): the quantize pass and the Hopper FP8 forward, both launched by replaying their
    recorded launch plans with addresses. The pass's outputs, the LSE when the caller drops it
    and the forward's tile-queue counter live in one workspace reused per (stream, thread)
    (``runtime.buffers``; the stream orders one call's forward before the next call's pass),
    so a call allocates only ``out`` (and ``lse`` when it is returned). The full path
    allocated nine tensors and checked the pass's outputs again (~400 µs of host per call on
    the H100 host, benchmarks/NOTES.md, session 15).

    Made by :func:`fp8_e2e_runner`. The first call (and any call whose replay cannot run now:
    fast launches off, a profiler listening) launches through tensor views of the workspace
    and records the plans."""

    # the workspace's regions: the pass's six outputs (fp8_format.quantized_empty's order),
    # the LSE when the caller drops it, the tile-queue counter
    _REGIONS = ("q8", "k8", "v8", "q_descale", "k_descale", "v_descale", "lse", "counter")

    def __init__(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, params: AttnParams,
                 signs: Optional[torch.Tensor], block_m: int, block_n: int,
                 need_lse: bool) -> None:
        b, s_q, h, d = q.shape
        d_v = v.shape[3]
        # the pass's outputs as the pass lays them out (V^T in wgmma key order: a view that
        # covers all of its storage), then the LSE and the counter: (name, meta tensor)
        metas = fp8_format.quantized_empty(q.shape, k.shape, v.shape, block_m, block_n, True,
                                           torch.device("meta"))
        self._setup("fp8-call", list(zip(self._REGIONS,
                                         metas + (_meta((b, h, s_q), torch.float32),
                                                  _meta((1,), torch.int32)))),
                    (b, s_q, h, d_v), q.dtype, (b, h, s_q), q.device, need_lse)
        self._offsets = tuple(self._ws.offset(name) for name in self._REGIONS)
        self._shifts = (int(block_m).bit_length() - 1, int(block_n).bit_length() - 1)
        self._quantize = backend("portable").fp8_quantize_call(signs, block_m, block_n)
        self._fwd = backend("hopper").fp8_fwd_call(d, d_v, params, q.dtype)

    def __call__(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor
                 ) -> Tuple[torch.Tensor, Optional[torch.Tensor]]:
        """(out (b, s_q, h, d_v) in q's dtype, lse (b, h, s_q) float32 or None when the
        signature does not return it) for q, k, v of this call signature."""
        ws, out, lse = self._begin()
        if self._recorded:
            base = ws.data_ptr()
            q8, k8, v8, qs, ks, vs, lse_ws, counter = (base + o for o in self._offsets)
            lse_at = lse_ws if lse is None else lse.data_ptr()
            if (self._quantize.replay(q, k, v, (q8, k8, v8, qs, ks, vs))
                    and self._fwd.replay((q8, k8, v8, out.data_ptr(), lse_at,
                                          counter if self._fwd.uses_counter else lse_at,
                                          qs, ks, vs))):
                return out, lse
            # (a replay that cannot run now launches through the views below; the pass may
            # then run twice, which writes the same values)
        views = {name: self._ws.view(ws, name) for name in self._REGIONS}
        q8, k8, v8 = views["q8"], views["k8"], views["v8"]
        self._quantize.record(q, k, v, (q8, k8, v8, views["q_descale"], views["k_descale"],
                                        views["v_descale"]))
        scales = Fp8Scales(views["q_descale"], views["k_descale"], views["v_descale"],
                           *self._shifts)
        lse_t = views["lse"] if lse is None else lse
        self._fwd.record(q8, k8, v8, scales, out, lse_t,
                         views["counter"] if self._fwd.uses_counter else lse_t)
        self._recorded = self._quantize.plan is not None and self._fwd.plan is not None
        return out, lse


def fp8_quantize_runner(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                        signs: Optional[torch.Tensor], block_m: int, block_n: int
                        ) -> Optional["Fp8QuantizeCall"]:
    """``fp8.quantize``'s decisions for these validated inputs, made once: a
    :class:`Fp8QuantizeCall` where the Triton pass runs them (CUDA, every tensor non-empty),
    None elsewhere (the full path on every call)."""
    if (q.device.type != "cuda" or quantize_backend(q, block_m, block_n) != "portable"
            or q.numel() == 0 or k.numel() == 0 or v.numel() == 0):
        return None
    return Fp8QuantizeCall(q, k, v, signs, block_m, block_n)


class Fp8QuantizeCall:
    """``fp8.quantize`` for one call signature: its six outputs allocated fresh (the caller
    owns them; V keys contiguous, fp8_format.keys_contiguous_empty) and the pass's recorded
    launch replayed with their addresses (triton/fp8_quantize.QuantizeCall). The full path's
    checks, dispatch and launch-plan lookup cost ~200 µs of host per call on the H100 host
    (benchmarks/NOTES.md, session 14)."""

    def __init__(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                 signs: Optional[torch.Tensor], block_m: int, block_n: int) -> None:
        self._shapes = (q.shape, k.shape, v.shape, block_m, block_n)
        self._device = q.device
        self._quantize = backend("portable").fp8_quantize_call(signs, block_m, block_n,
                                                               v_wgmma=False)

    def __call__(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor
                 ) -> Tuple[torch.Tensor, ...]:
        """(q8, k8, v8, q_descale, k_descale, v_descale), as the full path returns them."""
        outs = fp8_format.quantized_empty(*self._shapes, False, self._device)
        if not self._quantize.replay(q, k, v, tuple(t.data_ptr() for t in outs)):
            self._quantize.record(q, k, v, outs)  # (first call, or no replay now)
        return outs


def fp8_descale_runner(q8: torch.Tensor, k8: torch.Tensor, v8: torch.Tensor,
                       descales: Tuple[Optional[torch.Tensor], ...], params: AttnParams,
                       out_dtype: torch.dtype, need_lse: bool,
                       shifts: Tuple[int, int] = (ONE_BLOCK_SHIFT, ONE_BLOCK_SHIFT)
                       ) -> Optional["Fp8DescaleCall"]:
    """An FP8 forward on e4m3 q, k, v whose descales the caller holds: FlashAttention-3's API
    (``flash_attn_func``, (batch, nheads_k) descales or None, ``shifts`` one block per head) or
    ``fp8.attention`` (block tables (batch, heads, blocks) of 2^shifts rows / keys). The
    decisions for these validated inputs, made once: a :class:`Fp8DescaleCall` where the
    Hopper FP8 kernel runs them (CUDA, not degenerate), None elsewhere (the full path on every
    call). The caller keys it on everything the decisions read (shapes, strides, dtypes,
    device, alignment, params, which descales are given, the blocks)."""
    if q8.device.type != "cuda" or _is_degenerate(q8, k8):
        return None
    b, h, h_k = q8.shape[0], q8.shape[2], k8.shape[2]
    meta = torch.empty((b, h, 1), dtype=torch.float32, device="meta")
    scales = Fp8Scales(meta, meta[:, :h_k], meta[:, :h_k], *shifts)
    if select("fp8_fwd", q8, k8, v8, params, scales=scales, out_dtype=out_dtype) != "hopper":
        return None
    return Fp8DescaleCall(q8, k8, v8, descales, params, out_dtype, need_lse, shifts)


class Fp8DescaleCall(_WorkspaceCall):
    """FlashAttention-3's FP8 API for one call signature (issue 21's recorded calls): V^T in
    the kernel's wgmma key order written by a replayed pass (sm90/v_layout.VtCall), then the
    Hopper FP8 forward replayed (sm90/fwd.Fp8FwdCall), both with addresses. V^T, the dropped
    LSE, the tile-queue counter and the descale tables that must be copied live in one
    workspace reused per (stream, thread) (``runtime.buffers``), so a call allocates only
    ``out`` (and ``lse`` when it is returned). The full path validated the inputs on meta
    tensors, expanded the descales and allocated V^T on every call.

    The kernel reads one float32 descale table per tensor, (batch, heads, blocks) contiguous.
    FA3's descales are (batch, nheads_k) with one block per head (``shifts`` 31); block tables
    (``fp8.attention``) are already (batch, heads, blocks). Per descale, fixed by the
    signature: a table of ones made once (None: FA3's "= 1"), the caller's tensor read in place
    (contiguous, and for FA3's q, one query head per kv head), or a copy into the workspace on
    every call (FA3's q descale of a GQA group: one entry per query head; a non-contiguous
    descale). Values are never cached: a call with new descale values (same signature)
    computes with them.

    Made by :func:`fp8_descale_runner`. The first call (and any call whose replay cannot run
    now: fast launches off, a profiler listening) launches through tensor views of the
    workspace and records the plans."""

    def __init__(self, q8: torch.Tensor, k8: torch.Tensor, v8: torch.Tensor,
                 descales: Tuple[Optional[torch.Tensor], ...], params: AttnParams,
                 out_dtype: torch.dtype, need_lse: bool,
                 shifts: Tuple[int, int] = (ONE_BLOCK_SHIFT, ONE_BLOCK_SHIFT)) -> None:
        b, s_q, h, d = q8.shape
        s_k, h_k, d_v = k8.shape[1], k8.shape[2], v8.shape[3]
        self._group = h // h_k
        self._shifts = tuple(shifts)
        # FA3's (batch, nheads_k) descales, or block tables as the kernel reads them
        self._fa3 = all(x is None or x.dim() == 2 for x in descales)
        f32, device = torch.float32, q8.device
        # the workspace's regions: V^T, the LSE, the counter, then the tables to copy
        regions = [("vt", _meta((b, h_k, d_v, fp8_format.wgmma_padded_keys(s_k)), torch.uint8)),
                   ("lse", _meta((b, h, s_q), f32)), ("counter", _meta((1,), torch.int32))]
        # per descale (q, k, v): ("ones", table), ("given", None) or ("copy", region name)
        self._tables: list = []
        for name, x, heads in (("q", descales[0], h), ("k", descales[1], h_k),
                               ("v", descales[2], h_k)):
            shape = (b, heads, 1) if self._fa3 else tuple(x.shape)
            if x is None:
                self._tables.append(("ones", torch.ones(shape, dtype=f32, device=device)))
            elif (self._fa3 and name == "q" and self._group > 1) or not x.is_contiguous():
                self._tables.append(("copy", name))
                regions.append((name, _meta(shape, f32)))
            else:
                self._tables.append(("given", None))
        self._setup("fp8-descale-call", regions, (b, s_q, h, d_v), out_dtype, (b, h, s_q),
                    device, need_lse)
        self._offsets = tuple(self._ws.offset(name) for name in ("vt", "lse", "counter"))
        self._vt = backend("hopper").fp8_vt_call()
        self._fwd = backend("hopper").fp8_fwd_call(d, d_v, params, out_dtype)

    def _copy(self, ws: torch.Tensor, name: str, x: torch.Tensor) -> torch.Tensor:
        """Table ``name``'s workspace region filled from the caller's descale ``x``: one entry
        per query head of the group (FA3's q), or a contiguous copy."""
        table = self._ws.view(ws, name)
        if self._fa3:
            b, heads = table.shape[0], x.shape[1]
            table.view(b, heads, -1).copy_(x.unsqueeze(-1).expand(b, heads,
                                                                  table.shape[1] // heads))
        else:
            table.copy_(x)
        return table

    def __call__(self, q8: torch.Tensor, k8: torch.Tensor, v8: torch.Tensor,
                 q_descale: Optional[torch.Tensor], k_descale: Optional[torch.Tensor],
                 v_descale: Optional[torch.Tensor]
                 ) -> Tuple[torch.Tensor, Optional[torch.Tensor]]:
        """(out (b, s_q, h, d_v) in the signature's out_dtype, lse (b, h, s_q) float32 or None
        when the signature does not return it) for these inputs and descales (float32, as the
        signature's: FA3's (b, h_k) or None, or block tables)."""
        ws, out, lse = self._begin()
        descales = (q_descale, k_descale, v_descale)
        # the tables the forward reads: constant ones, the caller's, or refilled copies
        tables = [what if how == "ones" else x if how == "given" else self._copy(ws, what, x)
                  for (how, what), x in zip(self._tables, descales)]
        if self._recorded:  # addresses only: no view of the workspace per call
            base = ws.data_ptr()
            vt, lse_ws, counter = (base + o for o in self._offsets)
            lse_at = lse_ws if lse is None else lse.data_ptr()
            if (self._vt.replay(v8.data_ptr(), vt)
                    and self._fwd.replay((q8.data_ptr(), k8.data_ptr(), vt, out.data_ptr(),
                                          lse_at, counter if self._fwd.uses_counter else lse_at,
                                          *(t.data_ptr() for t in tables)))):
                return out, lse
        # (a replay that cannot run now launches through the views; V^T may then be
        # written twice, with the same values)
        vt = self._ws.view(ws, "vt")
        lse_t = self._ws.view(ws, "lse") if lse is None else lse
        counter_t = self._ws.view(ws, "counter") if self._fwd.uses_counter else lse_t
        self._vt.record(v8, vt)
        if self._fa3:  # (the caller's (b, h_k) descales as the kernel's (b, h_k, 1) tables)
            tables = [t.unsqueeze(-1) if how == "given" else t
                      for (how, _), t in zip(self._tables, tables)]
        scales = Fp8Scales(*tables, *self._shifts)
        self._fwd.record(q8, k8, vt.view(fp8_format.FP8_DTYPE).permute(0, 3, 1, 2), scales,
                         out, lse_t, counter_t)
        self._recorded = self._vt.plan is not None and self._fwd.plan is not None
        return out, lse


def fp8_varlen_runner(q8: torch.Tensor, k8: torch.Tensor, v8: torch.Tensor,
                      cu_seqlens_q: torch.Tensor, seqused_k: Optional[torch.Tensor],
                      max_seqlen_k: int, descales: Tuple[Optional[torch.Tensor], ...],
                      params: AttnParams, out_dtype: torch.dtype
                      ) -> Optional["Fp8VarlenCall"]:
    """``flash_attn_varlen_func``'s FP8 decisions (FA3's descale API) for these validated
    inputs, made once: an :class:`Fp8VarlenCall` where the Hopper FP8 kernel's varlen mode runs
    them, None elsewhere (the full path on every call)."""
    n_seqs = cu_seqlens_q.shape[0] - 1
    call = Fp8VarlenCall(q8, k8, n_seqs, descales)
    scales = call.scales(*descales)
    if not _fp8_varlen_on_hopper(q8, k8, v8, n_seqs, params, scales, out_dtype):
        return None
    call.packed = backend("hopper").fp8_varlen_call(
        q8, k8, v8, n_seqs, seqused_k is not None, max_seqlen_k, scales, params, out_dtype)
    return call


class Fp8VarlenCall:
    """A packed FP8 signature (FA3's descale API on ``flash_attn_varlen_func``) on the Hopper
    kernel: FA3's (b, h_k) descales (or None: ones made once) as the kernel's (b, h, 1) /
    (b, h_k, 1) tables, then the backend's recorded packed call (sm90 PackedFwdCall: the V^T
    pass, the clearing pass and the forward from their launch plans). The full path's checks,
    dispatch and plan keys measured 250-570 µs of host per call on the H100 host (session 24,
    benchmarks/NOTES.md); the api's fast path (api/fastpath.FA3_FP8_VARLEN) keeps one per
    signature."""

    def __init__(self, q8: torch.Tensor, k8: torch.Tensor, n_seqs: int,
                 descales: Tuple[Optional[torch.Tensor], ...]) -> None:
        self.group = q8.shape[1] // k8.shape[1]
        heads = (q8.shape[1], k8.shape[1], k8.shape[1])
        # (a descale left out is 1: its table is made once and only read)
        self._ones = [torch.ones((n_seqs, n, 1), dtype=torch.float32, device=q8.device)
                      if x is None else None for x, n in zip(descales, heads)]
        self.packed = None

    def scales(self, q_descale: Optional[torch.Tensor], k_descale: Optional[torch.Tensor],
               v_descale: Optional[torch.Tensor]) -> Fp8Scales:
        """The kernel's tables for FA3's descales: q's repeated for each query head of its
        group, every table (b, heads, 1) contiguous, one block per sequence."""
        if q_descale is None:
            qd = self._ones[0]
        elif self.group > 1:
            qd = q_descale.repeat_interleave(self.group, dim=1).unsqueeze(-1)
        else:
            qd = q_descale.unsqueeze(-1).contiguous()
        kd, vd = (ones if x is None else x.unsqueeze(-1).contiguous()
                  for ones, x in zip(self._ones[1:], (k_descale, v_descale)))
        return Fp8Scales(qd, kd, vd, ONE_BLOCK_SHIFT, ONE_BLOCK_SHIFT)

    def __call__(self, q8: torch.Tensor, k8: torch.Tensor, v8: torch.Tensor,
                 cu_seqlens_q: torch.Tensor, cu_seqlens_k: torch.Tensor,
                 seqused_k: Optional[torch.Tensor], q_descale: Optional[torch.Tensor],
                 k_descale: Optional[torch.Tensor], v_descale: Optional[torch.Tensor]
                 ) -> torch.Tensor:
        """out (total_q, h, d_v) in the signature's out_dtype."""
        out, _ = self.packed(q8, k8, v8, cu_seqlens_q, cu_seqlens_k, seqused_k,
                             self.scales(q_descale, k_descale, v_descale))
        return out


def fp8_varlen_forward(q8: torch.Tensor, k8: torch.Tensor, v8: torch.Tensor,
                       cu_seqlens_q: torch.Tensor, cu_seqlens_k: torch.Tensor,
                       seqused_k: Optional[torch.Tensor], max_seqlen_q: int, max_seqlen_k: int,
                       scales: Fp8Scales, params: AttnParams, out_dtype: torch.dtype
                       ) -> Tuple[torch.Tensor, torch.Tensor]:
    """Packed varlen FP8 forward: (out (total_q, h, d_v), lse (h, total_q)); one descale per
    (sequence, head). The Hopper FP8 kernel's varlen mode takes the calls it covers (the
    dense FP8 rules over the (1, total, h, d) views; seqused_k included)."""
    name = select("fp8_varlen_fwd", q8, k8, v8, params, scales=scales, out_dtype=out_dtype,
                  n_seqs=cu_seqlens_q.shape[0] - 1)
    return backend(name).fp8_varlen_fwd(q8, k8, v8, cu_seqlens_q, cu_seqlens_k, seqused_k,
                                        max_seqlen_q, max_seqlen_k, scales, params, out_dtype)


__all__ = [
    "BACKENDS",
    "OPS",
    "backend",
    "backend_for",
    "backward",
    "backward_runner",
    "backward_family",
    "combine",
    "decode_splits",
    "family_for",
    "forward",
    "forward_family",
    "varlen_backward_family",
    "varlen_forward_family",
    "Fp8Call",
    "Fp8DescaleCall",
    "Fp8QuantizeCall",
    "fp8_descale_runner",
    "fp8_e2e_runner",
    "fp8_quantize_runner",
    "fp8_forward",
    "fp8_quantize",
    "fp8_v_wgmma",
    "quantize_backend",
    "fp8_varlen_forward",
    "fp8_varlen_runner",
    "Fp8VarlenCall",
    "hopper_reason",
    "interpreting",
    "kvcache",
    "kvcache_planned",
    "forward_runner",
    "forward_with_sink",
    "sink_apply",
    "sink_grad",
    "requested_backend",
    "select",
    "triton_available",
    "varlen_backward",
    "varlen_forward",
    "varlen_paged_forward",
]
