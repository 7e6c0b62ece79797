"""The repeated-call fast path of the public functions (host time of small calls).

A serving loop or ``generate()`` calls ``flash_attn_func`` / ``flash_attn_with_kvcache`` with
the same shapes thousands of times. The first call of a *call signature* runs the full path
(argument checks, normalisation, dispatch); the outcome is kept under a key made of
everything those decisions read, and later calls with the same key go straight to the
chosen backend. On the H100 host the checks and dispatch measured 40-60 µs of a 120-170 µs
call (benchmarks/NOTES.md, 2026-11-24).

This module is the api's side of it: for each entry function, which calls have a signature
(its key, built from :mod:`flashattn.replay.keys`' pieces and ``ops.eager_call``'s test, the
op path's own condition, which the replay layer below ops cannot ask), the cache that keeps
its entries, and what its first call records (:mod:`flashattn.replay`'s recorded calls). What
the key holds, so that no check whose outcome could differ is skipped:

- the exact Python types of the scalar arguments and their values (``causal=1`` and
  ``causal=True`` are different keys), and which optional tensors are given;
- every tensor's type (plain ``torch.Tensor`` only: subclasses and fake tensors take the full
  path) and its ``replay.keys.tensor_key`` (shape, strides, dtype, device, alignment);
- the runtime settings object, by identity (``replay.keys.CallCache``);
- whether a gradient is recorded (grad mode on and an input requires grad: the entry then
  runs its own autograd function, ``replay.autograd``; FP8 calls, which have no backward,
  take the full path), and that no tracer or dispatch mode is active (``ops.eager_call``'s
  test).

Values read from tensors are never in a key: they are checked where they always were, in the
ops' bodies (``dispatch.kvcache.kvcache``'s value checks of CPU metadata and the checked mode run on
every call, fast or not; ``flash_attn_varlen_func`` runs its value checks of cu_seqlens /
seqused_k on every call where they run on the full path).

Calls with dropout, ALiBi, sinks, chunking or ``out=`` take the full path, and so do paged
``flash_attn_varlen_func`` calls (a ``block_table``); a paged KV cache in
``flash_attn_with_kvcache`` is keyed (the block table as a tensor: its values are read by the
kernel) and takes the fast path, with or without ``qv`` (MLA's latent query, keyed as a
tensor).
``flash_attn_with_kvcache`` over an FP8 cache (and with an FP8 query) keys its descales as
:func:`fa3_fp8_key` does (presence and metadata; their values are read by the kernel, and CPU
descales are value-checked on every call).
FP8 calls have their own keys: ``flash_attn_fp8_func``, ``fp8.quantize``, and ``flash_attn_func``
and ``flash_attn_varlen_func`` on float8_e4m3fn inputs (FlashAttention-3's descale API).
"""
from __future__ import annotations

from typing import Any, Callable, Hashable, Optional, Tuple

import torch

from flashattn import ops as _ops
from flashattn.api import kvcache_validation as _kv
from flashattn.api import validation as _v
from flashattn.params import AttnParams
from flashattn.replay import fp8 as _replay_fp8
from flashattn.replay import kvcache as _replay_kvcache
from flashattn.replay import varlen as _replay_varlen
from flashattn.replay.dense import DenseTrainEntry, dense_runner
# (bound to module names: a key is built on every call, on a decode step's host path)
from flashattn.replay.keys import (SCALARS as _SCALARS, CallCache, descale_key as _descale_key,
                                   fp8_scalars as _fp8_scalars, records_grad as _records_grad,
                                   tensor_key as _tensor_key)
from flashattn.runtime.device import capturing

Tensor = torch.Tensor
MAX_ENTRIES = 512  # call signatures kept per function (then all dropped at once)
_DTYPES = (torch.float16, torch.bfloat16, torch.float32)
_MAX_HEAD_DIM = _v.MAX_HEAD_DIM  # (V wider than this with a gradient: by column slices)


# ---------------------------------------------------------------------------------------------
# flash_attn_func
# ---------------------------------------------------------------------------------------------
DENSE = CallCache(MAX_ENTRIES)


def _plain_qkv(q: Any, k: Any, v: Any, window_size: Any, grad_ok: bool = False) -> bool:
    """The tests every dense signature starts with: plain 16/32-bit tensors (FP8 and invalid
    dtypes take their own path), ops.eager_call's test (no tracing, no dispatch mode), no
    gradient to record (unless ``grad_ok``: the signature then keys it), and a window_size
    tuple of two (its items' types are keyed)."""
    if not (type(q) is Tensor and type(k) is Tensor and type(v) is Tensor):
        return False
    # (the types are checked above: eager_call() without tensors is its tracing test, and
    # the op path's own condition, which the recorded calls stand in for)
    if q.dtype not in _DTYPES or not _ops.eager_call():
        return False
    if not grad_ok and _records_grad(q, k, v):
        return False
    return type(window_size) is tuple and len(window_size) == 2


def dense_key(q: Any, k: Any, v: Any, dropout_p: Any, softmax_scale: Any, causal: Any,
              window_size: Any, softcap: Any, deterministic: Any,
              return_attn_probs: Any) -> Optional[tuple]:
    """The call signature of an eligible ``flash_attn_func`` call (no dropout / ALiBi / FP8 /
    sink / chunk: the caller checks those are absent), or None (full path). Every test is
    written out (no generator, one helper): this is a decoding step's host path. Whether the
    call records a gradient is part of it (such a signature's entry is a
    ``replay.dense.DenseTrainEntry``)."""
    if not _plain_qkv(q, k, v, window_size, grad_ok=True):
        return None
    if v.shape[-1] > _MAX_HEAD_DIM and _records_grad(q, k, v):
        return None  # (the full path runs it by V's column slices: api/wide_v.py)
    if type(dropout_p) not in (float, int) or dropout_p != 0:
        return None
    left, right = window_size
    if not (type(softmax_scale) in _SCALARS and type(causal) in _SCALARS
            and type(softcap) in _SCALARS and type(deterministic) in _SCALARS
            and type(return_attn_probs) in _SCALARS and type(left) in _SCALARS
            and type(right) in _SCALARS):
        return None
    return (_tensor_key(q), _tensor_key(k), _tensor_key(v), type(softmax_scale), softmax_scale,
            type(causal), causal, type(left), left, type(right), right, type(softcap), softcap,
            type(deterministic), deterministic, type(return_attn_probs), return_attn_probs,
            _records_grad(q, k, v))


def dense_entry(q: Tensor, k: Tensor, v: Tensor, params: AttnParams, need_lse: bool):
    """The entry of a dense signature: ``replay.dense.dense_runner``'s call, or for a call that
    records a gradient a ``replay.dense.DenseTrainEntry``."""
    if _records_grad(q, k, v):
        return DenseTrainEntry(q, k, v, params)
    return dense_runner(q, k, v, params, need_lse)


# ---------------------------------------------------------------------------------------------
# flash_attn_varlen_func
# ---------------------------------------------------------------------------------------------
VARLEN = CallCache(MAX_ENTRIES)


def varlen_key(q: Any, k: Any, v: Any, cu_seqlens_q: Any, cu_seqlens_k: Any, max_seqlen_q: Any,
               max_seqlen_k: Any, dropout_p: Any, softmax_scale: Any, causal: Any,
               window_size: Any, softcap: Any, deterministic: Any, return_attn_probs: Any,
               seqused_k: Any) -> Optional[tuple]:
    """The call signature of an eligible ``flash_attn_varlen_func`` call (no dropout, ALiBi,
    block_table, sink, seqused_q, chunk or FP8: the caller checks those are absent), or None
    (full path). As :func:`dense_key`, with the offsets (and seqused_k) keyed as tensors (their
    values are read by the kernels, or checked on every call where they are checkable) and
    the maxima as ints. Inputs that require grad are eligible: the recorded call runs through
    ``replay.autograd.varlen_recorded``'s autograd function (a packed training step's every
    layer repeats one signature)."""
    dense = dense_key(q, k, v, dropout_p, softmax_scale, causal, window_size, softcap,
                      deterministic, return_attn_probs)
    packed = _packed_key(cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, seqused_k)
    return None if dense is None or packed is None else dense + packed


def _packed_key(cu_seqlens_q: Any, cu_seqlens_k: Any, max_seqlen_q: Any, max_seqlen_k: Any,
                seqused_k: Any) -> Optional[tuple]:
    """The packed part of a varlen signature: the offsets and seqused_k keyed as tensors (their
    values are read by the kernels, or checked on every call where they are checkable), the
    maxima as ints; None (full path) for other types, or a tensor subclass (ops.eager_call's
    test)."""
    if type(cu_seqlens_q) is not Tensor or type(cu_seqlens_k) is not Tensor:
        return None
    if not _ops.eager_call(seqused_k):
        return None
    if type(max_seqlen_q) is not int or type(max_seqlen_k) is not int:
        return None
    return (_tensor_key(cu_seqlens_q), _tensor_key(cu_seqlens_k),
            None if seqused_k is None else _tensor_key(seqused_k), max_seqlen_q, max_seqlen_k)


def varlen_record(key: Hashable, q: Tensor, k: Tensor, v: Tensor, cu_seqlens_q: Tensor,
                  seqused_k: Optional[Tensor], max_seqlen_q: int, max_seqlen_k: int,
                  params: AttnParams) -> None:
    """Keep what the full path decided for this signature (arguments checked and normalised
    into ``params``) under ``key``: the :class:`~flashattn.replay.varlen.VarlenRunner`.
    Nothing is kept during CUDA-graph capture (as :func:`_record`)."""
    if not capturing():
        VARLEN.put(key, _replay_varlen.VarlenRunner(q, k, v, cu_seqlens_q, seqused_k,
                                                    max_seqlen_q, max_seqlen_k, params))


# ---------------------------------------------------------------------------------------------
# flash_attn_with_kvcache
# ---------------------------------------------------------------------------------------------
KVCACHE = CallCache(MAX_ENTRIES)


def kvcache_key(q: Any, k_cache: Any, v_cache: Any, k: Any, v: Any, rotary_cos: Any,
                rotary_sin: Any, cache_seqlens: Any, cache_batch_idx: Any, cache_leftpad: Any,
                block_table: Any, softmax_scale: Any, causal: Any, window_size: Any,
                softcap: Any, rotary_interleaved: Any, num_splits: Any,
                return_softmax_lse: Any) -> Optional[tuple]:
    """The call signature of an eligible ``flash_attn_with_kvcache`` call (no ALiBi, sink,
    chunk or packed lengths: the caller checks), or None. cache_seqlens may be an int (its
    value is part of the key: it is checked against the capacity on the host).

    Every test is written out (no helper calls per tensor): this is a decode step's host path,
    and the generic version (a key per optional tensor, usually None) took 4.6 µs against
    2.6 µs here on the CPU box (the whole api layer: 6.5 against 3.9)."""
    if type(q) is not Tensor or type(k_cache) is not Tensor or type(v_cache) is not Tensor:
        return None
    # ops.eager_call's test (plain tensors, checked here and below; no tracing, no dispatch
    # mode), first: nothing below may run under torch.compile (data_ptr() does not trace)
    if _ops.tracing():
        return None
    if block_table is not None and cache_batch_idx is not None:
        return None  # (the call's block table is gathered per call: the full path)
    seqlens_type = type(cache_seqlens)
    if seqlens_type is Tensor:
        seqlens_key = _tensor_key(cache_seqlens)
    elif cache_seqlens is None or seqlens_type is int:
        seqlens_key = (seqlens_type, cache_seqlens)
    else:
        return None
    optional = (k, v, rotary_cos, rotary_sin, cache_batch_idx, cache_leftpad, block_table)
    given = [t for t in optional if t is not None]
    if any(type(t) is not Tensor for t in given):
        return None
    # no gradient to record
    if torch.is_grad_enabled() and (
            q.requires_grad or k_cache.requires_grad or v_cache.requires_grad
            or (seqlens_type is Tensor and cache_seqlens.requires_grad)
            or any(t.requires_grad for t in given)):
        return None
    if type(window_size) is not tuple or len(window_size) != 2:
        return None
    left, right = window_size
    if not (type(softmax_scale) in _SCALARS and type(causal) in _SCALARS
            and type(softcap) in _SCALARS and type(rotary_interleaved) in _SCALARS
            and type(num_splits) in _SCALARS and type(return_softmax_lse) in _SCALARS
            and type(left) in _SCALARS and type(right) in _SCALARS):
        return None
    return (_tensor_key(q), _tensor_key(k_cache), _tensor_key(v_cache),
            tuple(None if t is None else _tensor_key(t) for t in optional) if given else None,
            seqlens_key, type(softmax_scale), softmax_scale, type(causal), causal,
            type(left), left, type(right), right, type(softcap), softcap,
            type(rotary_interleaved), rotary_interleaved, type(num_splits), num_splits,
            type(return_softmax_lse), return_softmax_lse)


def kvcache_descales_key(q_descale: Any, k_descale: Any, v_descale: Any) -> Optional[tuple]:
    """The descale part of an FP8 ``flash_attn_with_kvcache`` signature (appended to
    :func:`kvcache_key`'s): each None or a plain tensor's metadata (``replay.keys.descale_key``), or
    None when one is neither (the full path's checks decide about it)."""
    key = (_descale_key(q_descale), _descale_key(k_descale), _descale_key(v_descale))
    return None if False in key else key


def kvcache_qv_key(qv: Tensor) -> tuple:
    """The key part of ``flash_attn_with_kvcache``'s latent query (a plain tensor, keyed after
    :func:`kvcache_key`, which refuses traced calls)."""
    return (_tensor_key(qv),)


def kvcache_entry(args: tuple) -> Tuple[tuple, Optional[Callable[..., Tuple[Tensor, Tensor]]]]:
    """What a repeated ``flash_attn_with_kvcache`` signature keeps, from the full path's op
    arguments (``flashattn::fwd_kvcache``'s, no packed lengths): the normalised scalars after
    the 11 tensors, and the replay runner for the signature (None: the op's body runs on every
    call, see ``replay.kvcache.kvcache_runner``; a latent query ``qv`` is given to each call
    of either)."""
    (q, k_cache, v_cache, k, v, rotary_cos, rotary_sin, seqlens, batch_idx, leftpad,
     block_table, alibi, scale, causal, left, right, softcap, interleaved, num_splits) = args
    params = AttnParams(scale, causal, left, right, softcap, alibi, 0.0, 0)
    runner = _replay_kvcache.kvcache_runner(q, k_cache, v_cache, k, v, rotary_cos, rotary_sin,
                                            seqlens, batch_idx, leftpad, block_table, params,
                                            interleaved, num_splits)
    return args[11:], runner


def kvcache_args(template: tuple, q: Tensor, k_cache: Tensor, v_cache: Tensor,
                 k: Optional[Tensor], v: Optional[Tensor], rotary_cos: Optional[Tensor],
                 rotary_sin: Optional[Tensor], cache_seqlens: Any,
                 cache_batch_idx: Optional[Tensor], cache_leftpad: Optional[Tensor],
                 block_table: Optional[Tensor],
                 descales: Optional[Tuple[Optional[Tensor], ...]] = None,
                 qv: Optional[Tensor] = None) -> tuple:
    """The ``flashattn::fwd_kvcache`` arguments of this call from the signature's template
    (the normalised scalars): the tensors of this call, an int cache_seqlens as the same
    (b,) int32 tensor the full path makes; an FP8 call's ``descales`` (q_descale,
    k_descale, v_descale) after the (unused) packed-length arguments, then the latent query
    ``qv``, as the full path passes them."""
    args = (q, k_cache, v_cache, k, v, rotary_cos, rotary_sin,
            _kv.seqlens_tensor(cache_seqlens, q.shape[0], q.device), cache_batch_idx,
            cache_leftpad, block_table) + template
    if descales is not None or qv is not None:
        q_descale, k_descale, v_descale = descales or (None, None, None)
        args = args + (0, None, 0, None, None, k_descale, v_descale, q_descale)
    if qv is not None:
        args = args + (qv,)
    return args


# ---------------------------------------------------------------------------------------------
# flash_attn_fp8_func
# ---------------------------------------------------------------------------------------------
FP8 = CallCache(MAX_ENTRIES)
# the entry of a signature no recorded call covers (the replay runner returned None):
# its calls take the full path without asking again
FP8_FULL_PATH = False


def fp8_key(q: Any, k: Any, v: Any, softmax_scale: Any, causal: Any, window_size: Any,
            softcap: Any, incoherent: Any, seed: Any, block_m: Any, block_n: Any,
            return_lse: Any) -> Optional[tuple]:
    """The call signature of a ``flash_attn_fp8_func`` call with a fixed rotation (``seed`` an
    int: None draws new signs on every call and takes the full path), or None (full path).
    Same rules as :func:`dense_key`; inputs that require grad take the full path (a forward
    whose backward raises)."""
    if type(seed) is not int or not _plain_qkv(q, k, v, window_size):
        return None
    if not (type(incoherent) in _SCALARS and type(block_m) in _SCALARS
            and type(block_n) in _SCALARS):
        return None
    scalars = _fp8_scalars(softmax_scale, causal, window_size, softcap, None, return_lse)
    if scalars is None:
        return None
    return (_tensor_key(q), _tensor_key(k), _tensor_key(v), scalars, type(incoherent),
            incoherent, seed, type(block_m), block_m, type(block_n), block_n)


def _record(cache: CallCache, key: Hashable, make: Callable[[], Any]) -> Any:
    """A signature's first call, its arguments checked: keep ``make()`` (the replay package's
    recorded call, or None where none applies: then :data:`FP8_FULL_PATH`) under ``key`` and
    return it.
    During CUDA-graph capture nothing is built or kept (docs/internals.md: what a recorded
    call made there would exist only in the graph): None, and a later call asks again."""
    if capturing():
        return None
    run = make()
    run = FP8_FULL_PATH if run is None else run
    cache.put(key, run)
    return run


def fp8_record(key: Hashable, q: Tensor, k: Tensor, v: Tensor, params: AttnParams,
               signs: Optional[Tensor], block_m: int, block_n: int, need_lse: bool) -> Any:
    """What ``flash_attn_fp8_func``'s full path decided for this signature (arguments checked
    and normalised), kept under ``key``: a call ``run(q, k, v) -> (out, lse or None)``
    (replay's recorded FP8 call), :data:`FP8_FULL_PATH`, or None (:func:`_record`)."""
    return _record(FP8, key, lambda: _replay_fp8.fp8_e2e_runner(q, k, v, params, signs,
                                                                block_m, block_n, need_lse))


# ---------------------------------------------------------------------------------------------
# flash_attn_func on FP8 inputs (FlashAttention-3's descale API)
# ---------------------------------------------------------------------------------------------
FA3_FP8 = CallCache(MAX_ENTRIES)


def _plain_fp8_qkv(q: Any, k: Any, v: Any) -> bool:
    """The tests every FP8 signature starts with: plain float8_e4m3fn tensors, no tracing or
    dispatch mode, none requiring grad (the full path attaches a backward that raises)."""
    if not (type(q) is Tensor and type(k) is Tensor and type(v) is Tensor):
        return False
    e4m3 = torch.float8_e4m3fn
    if q.dtype is not e4m3 or k.dtype is not e4m3 or v.dtype is not e4m3 or _ops.tracing():
        return False
    return not (q.requires_grad or k.requires_grad or v.requires_grad)


def fa3_fp8_key(q: Any, k: Any, v: Any, dropout_p: Any, softmax_scale: Any, causal: Any,
                window_size: Any, softcap: Any, alibi_slopes: Any, return_attn_probs: Any,
                q_descale: Any, k_descale: Any, v_descale: Any, out_dtype: Any,
                return_lse: Any) -> Optional[tuple]:
    """The call signature of a ``flash_attn_func`` call on float8_e4m3fn q, k, v, or None (full
    path). Same rules as :func:`dense_key`; the descales are keyed by presence, shape,
    strides, dtype, device and alignment (their values are read by the kernel on every call).
    Dropout, ALiBi and return_attn_probs take the full path, which raises."""
    if not _plain_fp8_qkv(q, k, v) or alibi_slopes is not None:
        return None
    if type(dropout_p) not in (float, int) or dropout_p != 0 or return_attn_probs is not False:
        return None
    descales = (_descale_key(q_descale), _descale_key(k_descale), _descale_key(v_descale))
    if False in descales:
        return None
    scalars = _fp8_scalars(softmax_scale, causal, window_size, softcap, out_dtype, return_lse)
    if scalars is None:
        return None
    return (_tensor_key(q), _tensor_key(k), _tensor_key(v), descales, scalars)


def fa3_fp8_record(key: Hashable, q: Tensor, k: Tensor, v: Tensor,
                   descales: Tuple[Optional[Tensor], ...], params: AttnParams,
                   out_dtype: torch.dtype, need_lse: bool) -> Any:
    """What the FP8 ``flash_attn_func``'s full path decided for this signature (arguments
    checked and normalised), kept under ``key``: a call ``run(q, k, v, q_descale, k_descale,
    v_descale) -> (out, lse or None)`` (replay's recorded call), :data:`FP8_FULL_PATH`, or
    None (:func:`_record`)."""
    return _record(FA3_FP8, key, lambda: _replay_fp8.fp8_descale_runner(
        q, k, v, descales, params, out_dtype, need_lse))


# ---------------------------------------------------------------------------------------------
# flash_attn_varlen_func on FP8 inputs (FlashAttention-3's descale API)
# ---------------------------------------------------------------------------------------------
FA3_FP8_VARLEN = CallCache(MAX_ENTRIES)


def fa3_fp8_varlen_key(q: Any, k: Any, v: Any, cu_seqlens_q: Any, cu_seqlens_k: Any,
                       max_seqlen_q: Any, max_seqlen_k: Any, dropout_p: Any, softmax_scale: Any,
                       causal: Any, window_size: Any, softcap: Any, alibi_slopes: Any,
                       return_attn_probs: Any, q_descale: Any, k_descale: Any, v_descale: Any,
                       out_dtype: Any, seqused_k: Any) -> Optional[tuple]:
    """The call signature of a ``flash_attn_varlen_func`` call on float8_e4m3fn q, k, v (no
    block_table, sink, seqused_q or chunk: the caller checks), or None (full path): as
    :func:`fa3_fp8_key`, with the offsets, seqused_k and the maxima keyed as in
    :func:`varlen_key`."""
    dense = fa3_fp8_key(q, k, v, dropout_p, softmax_scale, causal, window_size, softcap,
                        alibi_slopes, return_attn_probs, q_descale, k_descale, v_descale,
                        out_dtype, False)
    packed = _packed_key(cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, seqused_k)
    return None if dense is None or packed is None else dense + packed


def fa3_fp8_varlen_record(key: Hashable, q: Tensor, k: Tensor, v: Tensor,
                          cu_seqlens_q: Tensor, seqused_k: Optional[Tensor], max_seqlen_k: int,
                          descales: Tuple[Optional[Tensor], ...], params: AttnParams,
                          out_dtype: torch.dtype) -> Any:
    """What the FP8 ``flash_attn_varlen_func``'s full path decided for this signature
    (arguments checked and normalised), kept under ``key``: a call ``run(q, k, v,
    cu_seqlens_q, cu_seqlens_k, seqused_k, q_descale, k_descale, v_descale) -> out``
    (replay.fp8.Fp8VarlenCall), :data:`FP8_FULL_PATH`, or None (:func:`_record`)."""
    return _record(FA3_FP8_VARLEN, key, lambda: _replay_fp8.fp8_varlen_runner(
        q, k, v, cu_seqlens_q, seqused_k, max_seqlen_k, descales, params, out_dtype))


# ---------------------------------------------------------------------------------------------
# fp8.attention on fp8.quantize's output (block descales)
# ---------------------------------------------------------------------------------------------
FP8_QUANTIZED = CallCache(MAX_ENTRIES)


def quantized_key(qkv: Any, softmax_scale: Any, causal: Any, window_size: Any, softcap: Any,
                  out_dtype: Any, return_lse: Any) -> Optional[tuple]:
    """The call signature of an ``fp8.attention`` call, or None (full path): the
    QuantizedQKV's (the caller checks the type: api.fp8_quantize imports this module) five tensors
    keyed as :func:`fa3_fp8_key`'s (plain tensors only; q, k, v float8_e4m3fn, the descales
    float32), its blocks (ints) and the scalars. Anything else takes the full path, whose
    checks raise or decide."""
    if not _plain_fp8_qkv(qkv.q, qkv.k, qkv.v):
        return None
    tables = (qkv.q_descale, qkv.k_descale, qkv.v_descale)
    if not all(type(x) is Tensor and x.dtype is torch.float32 for x in tables):
        return None
    if type(qkv.block_m) is not int or type(qkv.block_n) is not int:
        return None
    scalars = _fp8_scalars(softmax_scale, causal, window_size, softcap, out_dtype, return_lse)
    if scalars is None:
        return None
    return (*(_tensor_key(x) for x in (qkv.q, qkv.k, qkv.v) + tables), qkv.block_m,
            qkv.block_n, scalars)


def quantized_record(key: Hashable, qkv: Any, params: AttnParams, out_dtype: torch.dtype,
                     need_lse: bool) -> Any:
    """What ``fp8.attention``'s full path decided for this signature (arguments checked and
    normalised), kept under ``key``: a call ``run(q, k, v, q_descale, k_descale, v_descale)
    -> (out, lse or None)`` (replay's recorded call over block tables),
    :data:`FP8_FULL_PATH`, or None (:func:`_record`)."""
    shifts = (int(qkv.block_m).bit_length() - 1, int(qkv.block_n).bit_length() - 1)
    return _record(FP8_QUANTIZED, key, lambda: _replay_fp8.fp8_descale_runner(
        qkv.q, qkv.k, qkv.v, (qkv.q_descale, qkv.k_descale, qkv.v_descale), params, out_dtype,
        need_lse, shifts))


# ---------------------------------------------------------------------------------------------
# fp8.quantize
# ---------------------------------------------------------------------------------------------
QUANTIZE = CallCache(MAX_ENTRIES)


def quantize_key(q: Any, k: Any, v: Any, incoherent: Any, seed: Any, block_m: Any,
                 block_n: Any) -> Optional[tuple]:
    """The call signature of an ``fp8.quantize`` call with a fixed rotation (an int seed), or
    None (full path). Same rules as :func:`fp8_key`."""
    if type(seed) is not int or not _plain_qkv(q, k, v, (-1, -1)):
        return None
    if not (type(incoherent) in _SCALARS and type(block_m) in _SCALARS
            and type(block_n) in _SCALARS):
        return None
    return (_tensor_key(q), _tensor_key(k), _tensor_key(v), type(incoherent), incoherent, seed,
            type(block_m), block_m, type(block_n), block_n)


def quantize_record(key: Hashable, q: Tensor, k: Tensor, v: Tensor, signs: Optional[Tensor],
                    block_m: int, block_n: int) -> Any:
    """What ``fp8.quantize``'s full path decided for this signature, kept under ``key``: a
    call ``run(q, k, v) -> (q8, k8, v8, q_descale, k_descale, v_descale)`` (replay's
    recorded pass), :data:`FP8_FULL_PATH`, or None (:func:`_record`)."""
    return _record(QUANTIZE, key, lambda: _replay_fp8.fp8_quantize_runner(q, k, v, signs,
                                                                          block_m, block_n))


__all__ = ["DENSE", "FA3_FP8", "FA3_FP8_VARLEN", "FP8", "FP8_FULL_PATH", "FP8_QUANTIZED",
           "KVCACHE", "MAX_ENTRIES", "QUANTIZE", "VARLEN", "dense_entry", "dense_key",
           "fa3_fp8_key", "fa3_fp8_record", "fa3_fp8_varlen_key", "fa3_fp8_varlen_record",
           "fp8_key", "fp8_record", "kvcache_args", "kvcache_descales_key", "kvcache_entry",
           "kvcache_qv_key",
           "kvcache_key", "quantize_key", "quantize_record", "quantized_key", "quantized_record",
           "varlen_key", "varlen_record"]
