"""Argument checks of ``flash_attn_with_kvcache`` and ``flash_attn_combine``.

Style of :mod:`flashattn.api.validation` (whose helpers are reused): ``TypeError`` for the wrong
kind of object, ``ValueError`` for a wrong value, messages naming the argument, what was
given and what is allowed.

Two kinds of checks:
- metadata (shapes, dtypes, devices, strides): always; they never touch data;
- values (cache_seqlens + s_new within the cache, leftpad, cache_batch_idx and the used
  block_table entries in range, rotary table long enough): on CPU tensors always, where
  reading them is free. On a GPU they would cost a device synchronisation on every decode
  step (and are impossible inside CUDA-graph capture), so by default they are skipped there,
  as flash-attn does; the checked mode (``flashattn.checks()``, ``FLASHATTN_CHECKS=1``) turns
  them on outside graph capture
  (debugging). The kernels never read outside the cache for valid lengths and mask every
  row they do not own.
"""
from __future__ import annotations

import numbers
from typing import Any, Tuple

import torch

from flashattn import metadata
from flashattn.api import validation as _v
from flashattn.api.validation import _describe, check_tensor



FP8_CACHE = torch.float8_e4m3fn


def is_fp8_cache(x: Any) -> bool:
    """Whether x is a float8_e4m3fn tensor (an FP8 KV cache)."""
    return isinstance(x, torch.Tensor) and x.dtype == FP8_CACHE


def is_fp8_query(x: Any) -> bool:
    """Whether x is a float8_e4m3fn query (FlashAttention-3's FP8 q, with q_descale)."""
    return isinstance(x, torch.Tensor) and x.dtype == FP8_CACHE


def _check_fp8_pair(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor) -> None:
    """An FP8 cache: both caches float8_e4m3fn; q float8_e4m3fn (FlashAttention-3's FP8 query)
    or 16/32-bit (the cache is dequantized on chip into q's precision)."""
    for x, n, other in ((k_cache, "k_cache", v_cache), (v_cache, "v_cache", k_cache)):
        if x.dtype != FP8_CACHE:
            raise TypeError(f"{n} has dtype {x.dtype} but "
                            f"{'v_cache' if n == 'k_cache' else 'k_cache'} is {other.dtype}: an "
                            "FP8 KV cache has both caches in torch.float8_e4m3fn")
    if q.dtype == FP8_CACHE:
        return
    if q.dtype == torch.float8_e5m2:
        raise TypeError("q has dtype torch.float8_e5m2; an FP8 query must be "
                        "torch.float8_e4m3fn (FlashAttention-3's), with q_descale")
    _v._check_dtype(q, "q")


def _check_fp8_query_cache(q: torch.Tensor, k_cache: torch.Tensor) -> None:
    """An FP8 (e4m3 / e5m2) q needs float8_e4m3fn caches: FlashAttention-3 takes q, k and v in
    one dtype for FP8, and a 16-bit cache would have to be quantized on every read."""
    if q.dtype in (torch.float8_e4m3fn, torch.float8_e5m2):
        raise TypeError(f"q has dtype {q.dtype} but k_cache is {k_cache.dtype}: an FP8 query "
                        "needs torch.float8_e4m3fn k_cache / v_cache (FlashAttention-3 takes q, "
                        "k and v in one dtype); pass a bf16 / fp16 q with this cache")


def check_cache(q: Any, k_cache: Any, v_cache: Any, paged: bool) -> None:
    """q (b, s_q, h, d); caches (b_cache, s_cache, h_k, d / d_v), or paged
    (num_blocks, page_size, h_k, d / d_v). dtype, device, GQA and head-dim rules of q/k/v;
    caches float8_e4m3fn (both) with a float8_e4m3fn or 16/32-bit q, or q's dtype."""
    check_tensor(q, "q", 4, "(batch, seqlen_q, nheads, headdim)")
    layout = ("(num_blocks, page_size, nheads_k, {}) with block_table" if paged
              else "(batch_size_cache, seqlen_cache, nheads_k, {})")
    check_tensor(k_cache, "k_cache", 4, layout.format("headdim"))
    check_tensor(v_cache, "v_cache", 4, layout.format("headdim_v"))
    what = "num_blocks" if paged else "batch_size_cache"
    if k_cache.shape[0] != v_cache.shape[0]:
        raise ValueError(f"{what} mismatch: k_cache has {k_cache.shape[0]} but v_cache has "
                         f"{v_cache.shape[0]}; they must be equal")
    if k_cache.shape[1] != v_cache.shape[1]:
        name = "page_size" if paged else "seqlen_cache"
        raise ValueError(f"{name} mismatch: k_cache has {k_cache.shape[1]} but v_cache has "
                         f"{v_cache.shape[1]} (shapes {tuple(k_cache.shape)}, "
                         f"{tuple(v_cache.shape)}); they must be equal")
    if k_cache.shape[0] < 1 or k_cache.shape[1] < 1:
        raise ValueError(f"k_cache must have {what} >= 1 and "
                         f"{'page_size' if paged else 'seqlen_cache'} >= 1, got shape "
                         f"{tuple(k_cache.shape)}")
    for x, n in ((q, "q"), (k_cache, "k_cache"), (v_cache, "v_cache")):
        _v._check_last_dim_contiguous(x, n)
    # dense rules (dtype, device, heads, head dims) on q against the cache rows, as views with
    # q's batch (the caches themselves when their row count already is q's: no view to build)
    b = q.shape[0]
    fp8_cache = is_fp8_cache(k_cache) or is_fp8_cache(v_cache)
    if not fp8_cache:
        _check_fp8_query_cache(q, k_cache)
    if fp8_cache:
        _check_fp8_pair(q, k_cache, v_cache)
        # the dense rules (device, heads, head dims) on stand-ins of the math's dtype (q's, or
        # bf16 for an FP8 q) in the tensors' shapes and devices: the FP8 dtype rule is the
        # pair check's
        math = torch.bfloat16 if q.dtype == FP8_CACHE else q.dtype
        k_view, v_view = (torch.empty((1, 1, 1, x.shape[3]), dtype=math, device=x.device)
                          .expand(b, x.shape[1], x.shape[2], x.shape[3])
                          for x in (k_cache, v_cache))
        if q.dtype == FP8_CACHE:
            q = torch.empty((1, 1, 1, q.shape[3]), dtype=math, device=q.device).expand(q.shape)
    elif not paged and k_cache.shape[0] == b:
        k_view, v_view = k_cache, v_cache
    else:
        k_view = k_cache[:1].expand(max(b, 1), -1, -1, -1)[:b]
        v_view = v_cache[:1].expand(max(b, 1), -1, -1, -1)[:b]
    _v.check_qkv(q, k_view, v_view, ("q", "k_cache", "v_cache"),
                 max_head_dim_v=_v.MAX_HEAD_DIM_V)


def check_qv(qv: Any, q: torch.Tensor, v_cache: torch.Tensor, v_name: str = "v_cache") -> None:
    """FlashAttention-3's latent query (multi-head latent attention): None, or a tensor of
    q's shape with v_cache's head dim last ((batch, seqlen_q, nheads, headdim_v), or packed
    (total_q, nheads, headdim_v) with cu_seqlens_q), q's dtype and device, last dim
    contiguous. Its score ``qv . v`` is taken against the cached values themselves. Not with
    a float8_e4m3fn q (FA3's FP8 query): NotImplementedError. ``v_name``: what the messages
    call the values (``v`` in the dense / varlen calls)."""
    if qv is None:
        return
    if is_fp8_query(q):
        # (FA3 takes qv in q's dtype; an FP8 qv would need a descale of its own, and FA3's
        # latent kernels are 16-bit ones)
        raise NotImplementedError(
            "qv (multi-head latent attention) with a torch.float8_e4m3fn q is not supported: "
            "pass q and qv in bfloat16 / float16 (the KV cache may stay float8_e4m3fn)")
    packed = q.dim() == 3
    layout = ("(total_q, nheads, headdim_v) with cu_seqlens_q" if packed
              else "(batch, seqlen_q, nheads, headdim_v)")
    check_tensor(qv, "qv", q.dim(), layout)
    want = tuple(q.shape[:-1]) + (v_cache.shape[-1],)
    if tuple(qv.shape) != want:
        raise ValueError(f"qv must have shape {layout} = {want} (q's shape with {v_name}'s "
                         f"head dim {v_cache.shape[-1]}: it scores against the values), got "
                         f"{tuple(qv.shape)}")
    if qv.dtype != q.dtype:
        raise TypeError(f"qv must have the dtype of q ({q.dtype}), got {qv.dtype}")
    if qv.device != q.device:
        raise ValueError(f"qv must be on the device of q ({q.device}), got {qv.device}")
    _v._check_last_dim_contiguous(qv, "qv")


def check_descales(k_descale: Any, v_descale: Any, k_cache: torch.Tensor, batch: int,
                   q_descale: Any = None, q: Any = None) -> None:
    """FlashAttention-3's descales: with a float8_e4m3fn cache, k_descale / v_descale each None
    (1.0) or a float32 (batch, nheads_k) tensor on the cache's device, finite and > 0 where its
    values are free to read (real value = fp8 * descale); with any other cache, both None.
    q_descale likewise with a float8_e4m3fn q (one descale per (batch, KV head): the query
    heads of a GQA group share it), else None."""
    fp8 = is_fp8_cache(k_cache)
    h_k = k_cache.shape[2]
    for x, n in ((q_descale, "q_descale"), (k_descale, "k_descale"), (v_descale, "v_descale")):
        if x is None:
            continue
        if n == "q_descale":
            if not is_fp8_query(q):
                raise ValueError(f"q_descale was given but q has dtype "
                                 f"{getattr(q, 'dtype', None)}: q_descale belongs to a "
                                 "torch.float8_e4m3fn query; pass None")
        elif not fp8:
            raise ValueError(f"{n} was given but k_cache has dtype {k_cache.dtype}: descales "
                             "belong to a torch.float8_e4m3fn KV cache; pass None")
        if not isinstance(x, torch.Tensor):
            raise TypeError(f"{n} must be None or a float32 tensor (batch, nheads_k) = "
                            f"({batch}, {h_k}), got {_describe(x)}")
        rules = (("dtype", torch.float32, x.dtype, TypeError),
                 ("shape (batch, nheads_k)", (batch, h_k), tuple(x.shape), ValueError),
                 ("the device of k_cache", k_cache.device, x.device, ValueError))
        for what, want, got, exc in rules:
            if want != got:
                raise exc(f"{n} must have {what} = {want}, got {got}")
    check_descale_values(q_descale=q_descale, k_descale=k_descale, v_descale=v_descale)


def check_descale_values(**descales: Any) -> None:
    """Descales (None or float32 tensors, by name) are finite and > 0, where reading them is
    free (CPU tensors) or asked for (the checked mode); the recorded-call fast path runs this
    on every call, as the full path does."""
    for n, x in descales.items():
        if x is not None and metadata.values_checkable(x) \
                and not bool((torch.isfinite(x) & (x > 0)).all()):
            raise ValueError(f"{n} must be finite and > 0 (real value = fp8 * descale)")


def check_varlen_q(q: Any, cu_seqlens_q: Any, max_seqlen_q: Any, cache_seqlens: Any
                   ) -> torch.Tensor:
    """FlashAttention-3's packed queries: q (total_q, h, d), cu_seqlens_q int32 (batch + 1,),
    max_seqlen_q an int >= 0, both given. Returns a (batch, 1, h, d) view of q's first row
    (the dense checks' stand-in: dtype, device, heads, head dim)."""
    if cu_seqlens_q is None or max_seqlen_q is None:
        given, missing = (("cu_seqlens_q", "max_seqlen_q") if max_seqlen_q is None
                          else ("max_seqlen_q", "cu_seqlens_q"))
        raise ValueError(f"{given} was given without {missing}: packed queries need both")
    check_tensor(q, "q", 3, "(total_q, nheads, headdim) with cu_seqlens_q")
    if not isinstance(cu_seqlens_q, torch.Tensor) or cu_seqlens_q.dim() != 1 \
            or cu_seqlens_q.shape[0] < 1:
        raise ValueError(f"cu_seqlens_q must be an int32 tensor (batch + 1,), got "
                         f"{_describe(cu_seqlens_q)}")
    batch = cu_seqlens_q.shape[0] - 1
    _v._check_int32_vector(cu_seqlens_q, "cu_seqlens_q", batch + 1, "batch + 1", q.device)
    if isinstance(cache_seqlens, torch.Tensor) and cache_seqlens.dim() == 1 \
            and cache_seqlens.shape[0] != batch:
        raise ValueError(f"cache_seqlens has {cache_seqlens.shape[0]} entries but cu_seqlens_q "
                         f"describes {batch} sequences")
    _v.check_max_seqlen(max_seqlen_q, "max_seqlen_q")
    h, d = q.shape[1], q.shape[2]
    if q.shape[0] == 0:
        return torch.empty((batch, 1, h, d), dtype=q.dtype, device=q.device)
    return q[:1].unsqueeze(0).expand(batch, 1, h, d)


def check_packed_new_kv(k: Any, v: Any, cu_seqlens_k_new: Any, batch: int,
                        k_cache: torch.Tensor, v_cache: torch.Tensor) -> int:
    """FlashAttention-3's packed new keys: k (total_new, h_k, d), v (total_new, h_k, d_v) with
    cu_seqlens_k_new int32 (batch + 1,). Returns total_new."""
    if k is None or v is None:
        raise ValueError("cu_seqlens_k_new was given without k and v: it packs the new keys")
    check_tensor(k, "k", 3, "(total_new, nheads_k, headdim) with cu_seqlens_k_new")
    check_tensor(v, "v", 3, "(total_new, nheads_k, headdim_v) with cu_seqlens_k_new")
    _v._check_int32_vector(cu_seqlens_k_new, "cu_seqlens_k_new", batch + 1, "batch + 1",
                           k_cache.device)
    h_k, d, d_v = k_cache.shape[2], k_cache.shape[3], v_cache.shape[3]
    for x, n, last, ref in ((k, "k", d, k_cache), (v, "v", d_v, v_cache)):
        _check_new_rows(x, n, (k.shape[0], h_k, last), ref, "total_new, nheads_k", "")
    return k.shape[0]


def _check_new_rows(x: torch.Tensor, n: str, want: tuple, ref: torch.Tensor, dims: str,
                    why: str) -> None:
    """New keys / values ``x`` (named ``n``): shape ``want`` ((dims, headdim[_v])), and the
    dtype and device of their cache ``ref``; last dim contiguous."""
    if tuple(x.shape) != want:
        raise ValueError(f"{n} must have shape ({dims}, "
                         f"{'headdim' if n == 'k' else 'headdim_v'}) = {want}{why}, got "
                         f"{tuple(x.shape)}")
    if is_fp8_cache(ref):
        # float8_e4m3fn rows are in the cache's units already (FlashAttention-3's FP8 k / v,
        # stored as they are); 16/32-bit rows are quantized in with the descale
        if x.dtype not in _v.SUPPORTED_DTYPES and x.dtype != FP8_CACHE:
            raise TypeError(f"{n} must be float16 / bfloat16 / float32 (quantized into the "
                            f"float8_e4m3fn {n}_cache with {n}_descale) or float8_e4m3fn "
                            f"(stored as it is), got {x.dtype}")
    elif x.dtype != ref.dtype:
        raise TypeError(f"{n} must have the dtype of {n}_cache ({ref.dtype}), got {x.dtype}")
    if x.device != ref.device:
        raise ValueError(f"{n} must be on the device of {n}_cache ({ref.device}), got "
                         f"{x.device}")
    _v._check_last_dim_contiguous(x, n)


def check_new_kv(k: Any, v: Any, q: torch.Tensor, k_cache: torch.Tensor,
                 v_cache: torch.Tensor, capacity: int) -> int:
    """k (b, s_new, h_k, d), v (b, s_new, h_k, d_v), both or neither; returns s_new (0 when
    none). s_new must fit in the cache (``capacity`` = s_cache or max_blocks * page_size)."""
    if k is None and v is None:
        return 0
    if (k is None) != (v is None):
        given, missing = ("k", "v") if v is None else ("v", "k")
        raise ValueError(f"{given} was given without {missing}: pass both new keys and new "
                         "values to append, or neither")
    check_tensor(k, "k", 4, "(batch, seqlen_new, nheads_k, headdim)")
    check_tensor(v, "v", 4, "(batch, seqlen_new, nheads_k, headdim_v)")
    b, h_k, d, d_v = q.shape[0], k_cache.shape[2], k_cache.shape[3], v_cache.shape[3]
    for x, n, last, ref in ((k, "k", d, k_cache), (v, "v", d_v, v_cache)):
        _check_new_rows(x, n, (b, k.shape[1], h_k, last), ref, "batch, seqlen_new, nheads_k",
                        f" to match q and {n}_cache")
    s_new = k.shape[1]
    if s_new > capacity:
        raise ValueError(f"the cache is too short for the new tokens: k has seqlen_new = {s_new} "
                         f"but the cache holds {capacity} positions per sequence")
    return s_new


def check_cache_seqlens(cache_seqlens: Any, batch: int, device: torch.device,
                        capacity: int) -> None:
    """None, an int in [0, capacity], or an int32 (batch,) tensor on q's device."""
    if cache_seqlens is None:
        return
    if isinstance(cache_seqlens, torch.Tensor):
        if cache_seqlens.dtype != torch.int32:
            raise TypeError(f"cache_seqlens must have dtype torch.int32, got "
                            f"{cache_seqlens.dtype} (convert with .to(torch.int32))")
        if cache_seqlens.dim() != 1 or cache_seqlens.shape[0] != batch:
            raise ValueError(f"cache_seqlens must have shape (batch,) = ({batch},), got "
                             f"{tuple(cache_seqlens.shape)}")
        if cache_seqlens.device != device:
            raise ValueError(f"cache_seqlens must be on the device of q ({device}), got "
                             f"{cache_seqlens.device}")
        return
    if isinstance(cache_seqlens, bool) or not isinstance(cache_seqlens, numbers.Integral):
        raise TypeError("cache_seqlens must be None, an int or a torch.int32 tensor of shape "
                        f"(batch,), got {_describe(cache_seqlens)}")
    if not 0 <= int(cache_seqlens) <= capacity:
        raise ValueError(f"cache_seqlens must be in [0, {capacity}] (the cache length), got "
                         f"{int(cache_seqlens)}")


def seqlens_tensor(cache_seqlens: Any, batch: int, device: torch.device) -> Any:
    """cache_seqlens as the op takes it: an int becomes an int32 (batch,) tensor on the device
    (from host ints only: graph friendly); a tensor or None passes through."""
    if cache_seqlens is None or isinstance(cache_seqlens, torch.Tensor):
        return cache_seqlens
    return torch.full((batch,), int(cache_seqlens), dtype=torch.int32, device=device)


def check_index_vector(x: Any, name: str, batch: int, device: torch.device) -> None:
    """cache_batch_idx / cache_leftpad: None or an int32 (batch,) tensor on q's device."""
    if x is None:
        return
    _v._check_int32_vector(x, name, batch, "batch", device)


def check_rotary(cos: Any, sin: Any, q: torch.Tensor, has_new_kv: bool) -> None:
    """rotary_cos / rotary_sin: both or neither, (seqlen_ro, rotary_dim / 2) with
    2 <= rotary_dim <= headdim, same floating dtype, on q's device; needs new k / v."""
    if cos is None and sin is None:
        return
    if (cos is None) != (sin is None):
        given, missing = ("rotary_cos", "rotary_sin") if sin is None else ("rotary_sin",
                                                                           "rotary_cos")
        raise ValueError(f"{given} was given without {missing}: pass both or neither")
    for x, n in ((cos, "rotary_cos"), (sin, "rotary_sin")):
        check_tensor(x, n, 2, "(seqlen_ro, rotary_dim / 2)")
        if not x.is_floating_point():
            raise TypeError(f"{n} must be a floating tensor, got {x.dtype}")
        if x.device != q.device:
            raise ValueError(f"{n} must be on the device of q ({q.device}), got {x.device}")
        if x.shape[1] > 1 and x.stride(1) != 1:
            raise ValueError(f"{n} must have a contiguous last dimension, got strides "
                             f"{tuple(x.stride())}")
    if cos.shape != sin.shape:
        raise ValueError(f"rotary_cos and rotary_sin must have the same shape, got "
                         f"{tuple(cos.shape)} and {tuple(sin.shape)}")
    if cos.dtype != sin.dtype:
        raise TypeError(f"rotary_cos and rotary_sin must have the same dtype, got {cos.dtype} "
                        f"and {sin.dtype}")
    d = q.shape[3]
    rot = 2 * cos.shape[1]
    if cos.shape[0] < 1 or not 2 <= rot <= d:
        raise ValueError(f"rotary_cos must have shape (seqlen_ro, rotary_dim / 2) with "
                         f"seqlen_ro >= 1 and 2 <= rotary_dim <= headdim ({d}), got "
                         f"{tuple(cos.shape)} (rotary_dim = {rot})")
    if not has_new_kv:
        raise ValueError("rotary_cos / rotary_sin need new keys k and values v to append (the "
                         "cached keys are already rotated)")


def rows_of_block_table(block_table: Any, cache_batch_idx: Any, batch: int,
                        device: torch.device) -> torch.Tensor:
    """FlashAttention-3's cache_batch_idx with a paged cache: batch row b's pages are the block
    table's row cache_batch_idx[b]. Returns the (batch, max_blocks) table of the call's rows
    (a device gather, no host read; indices clamped to the table's rows, and checked on the
    host where that is free or in the checked mode)."""
    if not isinstance(block_table, torch.Tensor) or block_table.dim() != 2 \
            or block_table.dtype != torch.int32 or block_table.shape[0] < 1:
        raise ValueError("block_table must be an int32 (rows, max_blocks_per_seq) tensor with "
                         f"rows >= 1 when cache_batch_idx picks its rows, got "
                         f"{_describe(block_table)}")
    if block_table.device != device:
        raise ValueError(f"block_table must be on the same device as q ({device}), got "
                         f"{block_table.device}")
    check_index_vector(cache_batch_idx, "cache_batch_idx", batch, device)
    rows = block_table.shape[0]
    if metadata.values_checkable(cache_batch_idx):
        for i, r in enumerate(metadata.to_host(cache_batch_idx)[0].tolist()):
            if not 0 <= r < rows:
                raise ValueError(f"cache_batch_idx[{i}] = {r} is out of range: block_table has "
                                 f"{rows} rows (allowed 0..{rows - 1})")
    return block_table[cache_batch_idx.long().clamp(0, rows - 1)]


def check_num_splits(num_splits: Any) -> int:
    if isinstance(num_splits, bool) or not isinstance(num_splits, numbers.Integral):
        raise TypeError(f"num_splits must be an int >= 0 (0 = heuristic, 1 = no split), got "
                        f"{_describe(num_splits)}")
    if int(num_splits) < 0:
        raise ValueError(f"num_splits must be >= 0 (0 = heuristic, 1 = no split), got "
                         f"{int(num_splits)}")
    return int(num_splits)


def check_combine(out_partial: Any, lse_partial: Any, out: Any, out_dtype: Any
                  ) -> Tuple[int, int, int, int, int]:
    """out_partial (num_splits, b, s_q, h, d_v) float32, lse_partial (num_splits, b, h, s_q)
    float32 on the same device; out None or (b, s_q, h, d_v); out_dtype a float dtype."""
    check_tensor(out_partial, "out_partial", 5, "(num_splits, batch, seqlen_q, nheads, headdim_v)")
    check_tensor(lse_partial, "lse_partial", 4, "(num_splits, batch, nheads, seqlen_q)")
    for x, n in ((out_partial, "out_partial"), (lse_partial, "lse_partial")):
        if x.dtype != torch.float32:
            raise TypeError(f"{n} must have dtype torch.float32, got {x.dtype}")
    s, b, s_q, h, d_v = out_partial.shape
    want = (s, b, h, s_q)
    if tuple(lse_partial.shape) != want:
        raise ValueError(f"lse_partial must have shape (num_splits, batch, nheads, seqlen_q) = "
                         f"{want} to match out_partial {tuple(out_partial.shape)}, got "
                         f"{tuple(lse_partial.shape)}")
    if s < 1:
        raise ValueError(f"out_partial must have num_splits >= 1, got shape "
                         f"{tuple(out_partial.shape)}")
    if lse_partial.device != out_partial.device:
        raise ValueError(f"lse_partial must be on the device of out_partial "
                         f"({out_partial.device}), got {lse_partial.device}")
    if out_dtype is not None and (not isinstance(out_dtype, torch.dtype)
                                  or out_dtype not in _v.SUPPORTED_DTYPES):
        raise TypeError(f"out_dtype must be None or one of torch.float16, torch.bfloat16, "
                        f"torch.float32, got {_describe(out_dtype)}")
    if out is not None:
        check_tensor(out, "out", 4, "(batch, seqlen_q, nheads, headdim_v)")
        if tuple(out.shape) != (b, s_q, h, d_v):
            raise ValueError(f"out must have shape {(b, s_q, h, d_v)}, got {tuple(out.shape)}")
        if out.device != out_partial.device:
            raise ValueError(f"out must be on the device of out_partial ({out_partial.device}), "
                             f"got {out.device}")
        if out_dtype is not None and out.dtype != out_dtype:
            raise TypeError(f"out has dtype {out.dtype} but out_dtype is {out_dtype}")
        if out.dtype not in _v.SUPPORTED_DTYPES:
            raise TypeError(f"out has dtype {out.dtype}; supported: torch.float16, "
                            "torch.bfloat16, torch.float32")
        _v._check_last_dim_contiguous(out, "out")
    return s, b, s_q, h, d_v


__all__ = ["check_cache", "check_descale_values", "check_descales", "check_qv",
           "is_fp8_cache", "is_fp8_query", "check_new_kv", "check_packed_new_kv",
           "check_varlen_q", "check_cache_seqlens", "check_index_vector",
           "check_rotary", "check_num_splits", "check_combine", "rows_of_block_table",
           "seqlens_tensor"]
