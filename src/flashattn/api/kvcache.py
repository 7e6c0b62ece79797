"""Inference with a KV cache: ``flash_attn_with_kvcache`` (``flash_attn_combine``: combine.py).

flash-attn 2 semantics (``flash_attn_interface.flash_attn_with_kvcache``):

- q (b, s_q, h, d) attends to each batch row's cached keys plus the new ones:
  keys ``[cache_leftpad[b], cache_seqlens[b] + s_new)`` in cache positions (local key j is
  position ``cache_leftpad[b] + j``); masks (causal / window, bottom-right aligned) and ALiBi
  use those local indices.
- k / v (b, s_new, h_k, d), when given, are written **in place** into the cache at positions
  ``cache_seqlens[b] + i`` before the attention (``cache_seqlens`` itself is not changed).
- rotary (rotary_cos / rotary_sin (s_ro, rotary_dim / 2)): new keys are rotated at positions
  ``cache_seqlens[b] + i`` (absolute cache positions); q at ``cache_seqlens[b] + i`` when
  causal or local, else every query token at ``cache_seqlens[b]``. Interleaved (GPT-J) or not
  (GPT-NeoX). Needs k / v.
- cache (b_cache, s_cache, h_k, d) with ``cache_batch_idx`` mapping batch rows to cache rows,
  or paged (num_blocks, page_size, h_k, d) with ``block_table`` (b, max_blocks) int32; any
  page size >= 1 (flash-attn asks for multiples of 256).
- FP8 cache (FlashAttention-3's): k_cache / v_cache in float8_e4m3fn with ``k_descale`` /
  ``v_descale`` float32 (batch, nheads_k) (real value = fp8 * descale; None = 1.0) and a
  16/32-bit q. The kernels read the FP8 bytes and dequantize on chip; the math runs in q's
  precision as for a 16-bit cache and out is in q's dtype. New k / v in a 16/32-bit dtype are
  quantized into the cache: ``saturate(x / descale)`` rounded to nearest even (after rotary);
  float8_e4m3fn k / v are in the cache's units already and stored as they are (rotated in
  float32 and re-rounded when rotary is asked). One descale per (sequence, KV head) is FA3's
  layout and what per-tensor / per-head scales of serving engines map onto (broadcast them
  to (batch, nheads_k)).
- FP8 query (FlashAttention-3's): q in float8_e4m3fn with ``q_descale`` float32 (batch,
  nheads_k) (the query heads of a GQA group share their KV head's descale; None = 1.0), with
  an FP8 cache only (FA3 takes q, k and v in one dtype). out is bfloat16 (FA3's rule). The
  query is widened to bf16 on load (exact) and q_descale joins k_descale in the score scale;
  the dots are bf16 tensor-core products, not FP8 ones: a decode step is bound by reading
  the cache (each K / V byte meets at most 64 query rows), so FP8 dots would buy no time and
  would quantize P as well. A rotated FP8 q is kept in bf16 (rotated in float32).
- Window sides >= the cache capacity (s_cache, or max_blocks * page_size) are unbounded
  (flash-attn's rule); causal sets right = 0.
- Multi-head latent attention (FlashAttention-3's ``qv``, keyword only): qv (b, s_q, h, d_v)
  adds ``qv . v`` to every score (before scale, softcap, ALiBi and mask), against the cached
  values after the append (dequantized in an FP8 cache); the default scale becomes
  ``(d + d_v) ** -0.5``. headdim_v goes to 512 here (the dense calls stop at 256). Not with
  an FP8 query (NotImplementedError naming qv); a 16-bit q and qv over an FP8 cache are fine.

Flash-Decoding: the key range is split over ``num_splits`` programs (0 = heuristic from the
SM count and the shapes, 1 = no split) and merged by ``triton.combine``. Nothing here reads
a tensor value on the host for GPU tensors and every allocation size comes from shapes, so a
decode step (append + attention) can be captured in a CUDA graph and replayed with new
cache_seqlens values.

Backends: Triton (``triton/rotary.py``, ``triton/decode.py``, ``triton/combine.py``) on
CUDA or under TRITON_INTERPRET=1; plain torch (``cpu/kvcache.py``) otherwise, as
:func:`flashattn.dispatch.select` decides.
"""
from __future__ import annotations

from typing import Optional, Sequence, Tuple, Union

import torch

from flashattn import metadata
from flashattn import ops as _ops
from flashattn.api import out as _out
from flashattn.api import fastpath as _fast
from flashattn.api import kvcache_validation as _kv
from flashattn.api import normalise as _p
from flashattn.api import validation as _v

Tensor = torch.Tensor



@_out.writes_out(_out.like_q("q", "v_cache", 4, 4))
def flash_attn_with_kvcache(
    q: Tensor,
    k_cache: Tensor,
    v_cache: Tensor,
    k: Optional[Tensor] = None,
    v: Optional[Tensor] = None,
    rotary_cos: Optional[Tensor] = None,
    rotary_sin: Optional[Tensor] = None,
    cache_seqlens: Optional[Union[int, Tensor]] = None,
    cache_batch_idx: Optional[Tensor] = None,
    cache_leftpad: Optional[Tensor] = None,
    block_table: Optional[Tensor] = None,
    softmax_scale: Optional[float] = None,
    causal: bool = False,
    window_size: Sequence[int] = (-1, -1),
    softcap: float = 0.0,
    rotary_interleaved: bool = True,
    alibi_slopes: Optional[Tensor] = None,
    num_splits: int = 0,
    return_softmax_lse: bool = False,
    *,
    learnable_sink: Optional[Tensor] = None,
    attention_chunk: int = 0,
    cu_seqlens_q: Optional[Tensor] = None,
    max_seqlen_q: Optional[int] = None,
    cu_seqlens_k_new: Optional[Tensor] = None,
    rotary_seqlens: Optional[Tensor] = None,
    k_descale: Optional[Tensor] = None,
    v_descale: Optional[Tensor] = None,
    q_descale: Optional[Tensor] = None,
    qv: Optional[Tensor] = None,
) -> Union[Tensor, Tuple[Tensor, Tensor]]:
    """Attention against a KV cache, appending new keys / values in place (flash-attn 2 API).

    Args:
        q: (batch, seqlen_q, nheads, headdim), fp16 / bf16 / fp32, or float8_e4m3fn with an
            FP8 cache (see q_descale).
        k_cache, v_cache: (batch_size_cache, seqlen_cache, nheads_k, headdim[_v]), or with
            block_table (num_blocks, page_size, nheads_k, headdim[_v]); headdim <= 256,
            headdim_v <= 512 (multi-head latent attention's latent cache). Same dtype as q, or
            both torch.float8_e4m3fn (an FP8 cache, see k_descale). Modified in place when
            k / v are given.
        k, v: None, or (batch, seqlen_new, nheads_k, headdim[_v]): appended at cache_seqlens
            (in the caches' dtype; with an FP8 cache in a 16/32-bit dtype, quantized in with
            the descale, or float8_e4m3fn, stored as it is).
        rotary_cos, rotary_sin: None, or (seqlen_ro, rotary_dim / 2) (needs k / v).
        cache_seqlens: None (every row holds the whole cache), an int, or (batch,) int32: the
            number of cached positions of each row before this call.
        cache_batch_idx: None or (batch,) int32: cache row of each batch row (not with
            block_table).
        cache_leftpad: None or (batch,) int32: first cache position of each row.
        block_table: None or (batch, max_blocks_per_seq) int32: pages of each row.
        softmax_scale: default headdim ** -0.5 ((headdim + headdim_v) ** -0.5 with qv).
        causal, window_size: bottom-right aligned masks, (-1, -1) = unbounded.
        softcap: 0.0 = off. alibi_slopes: None or float32 (nheads,) / (batch, nheads).
        rotary_interleaved: pairs (0, 1), (2, 3)... if True, else (0, rotary_dim / 2)...
        num_splits: 0 = heuristic, 1 = no split, n = split the keys over n programs.
        return_softmax_lse: also return the LSE.
        learnable_sink: None or a float (nheads,) tensor (keyword only): one extra softmax
            logit per head that attends to nothing (gpt-oss's sinks); the LSE includes it.
        attention_chunk: 0, or C > 0 (keyword only; FlashAttention-3's chunked local
            attention, Llama-4): a query at local key position p (bottom-right aligned)
            sees only keys j with ``j // C == floor(p / C)``, besides causal / window. The
            call counts as local (q is rotated token by token).
        cu_seqlens_q, max_seqlen_q: None, or (keyword only; FlashAttention-3's varlen queries:
            chunked prefill, speculative decoding) int32 (batch + 1,) and an int: q is packed
            (total_q, nheads, headdim), sequence b's queries are rows [cu_seqlens_q[b],
            cu_seqlens_q[b + 1]) (at most max_seqlen_q), bottom-right aligned to its keys.
            out is then (total_q, nheads, headdim_v) and lse (nheads, total_q).
        cu_seqlens_k_new: None, or int32 (batch + 1,) (keyword only; FA3): k / v are packed
            (total_new, nheads_k, headdim[_v]), sequence b appends rows [cu_seqlens_k_new[b],
            cu_seqlens_k_new[b + 1]) at cache_seqlens[b].
        rotary_seqlens: None, or int32 (batch,) (keyword only; FA3): rotate the new keys and q
            at rotary_seqlens[b] + i instead of their cache positions cache_seqlens[b] + i.
        k_descale, v_descale: None, or float32 (batch, nheads_k) (keyword only; FA3): the
            dequantization scales of an FP8 cache (real = fp8 * descale; None = 1.0). Only
            with float8_e4m3fn caches.
        q_descale: None, or float32 (batch, nheads_k) (keyword only; FA3): the dequantization
            scale of a float8_e4m3fn q (query head h uses q_descale[b, h // (nheads //
            nheads_k)]; None = 1.0). Only with a float8_e4m3fn q.
        qv: None, or (keyword only; FlashAttention-3's multi-head latent attention) the latent
            query (batch, seqlen_q, nheads, headdim_v) (packed: (total_q, nheads, headdim_v)),
            q's dtype: the score becomes ``softmax_scale * (q . k + qv . v)`` (it scores
            against the cached values, new ones included, dequantized in an FP8 cache) and
            softmax_scale defaults to ``(headdim + headdim_v) ** -0.5``. qv is not rotated.
            Not with a float8_e4m3fn q (NotImplementedError: q and qv in bf16 / fp16 over an
            FP8 cache are supported).

    Returns:
        out (batch, seqlen_q, nheads, headdim_v) in q's dtype (bfloat16 for a float8_e4m3fn
        q), and with return_softmax_lse
        lse (batch, nheads, seqlen_q) float32 (-inf on rows that see no key; their out is 0).
    """
    key = None
    fp8 = _kv.is_fp8_cache(k_cache) or _kv.is_fp8_cache(v_cache) or _kv.is_fp8_query(q)
    # FP8 signatures key their descales too (presence and metadata; the values are read by
    # the kernel); a 16/32-bit call with a descale takes the full path, which raises; a
    # latent query (qv, multi-head latent attention) is keyed as a tensor
    descales = _fast.kvcache_descales_key(q_descale, k_descale, v_descale) if fp8 else None
    if ((qv is None or type(qv) is torch.Tensor)
            and (descales is not None if fp8 else
                 k_descale is None and v_descale is None and q_descale is None)
            and alibi_slopes is None and learnable_sink is None and type(attention_chunk) is int
            and attention_chunk == 0 and cu_seqlens_q is None and max_seqlen_q is None
            and cu_seqlens_k_new is None and rotary_seqlens is None):
        # a repeated call signature skips the argument checks (api/fastpath.py); the value
        # checks of the metadata (and of CPU descales) run on every call, as before
        key = _fast.kvcache_key(q, k_cache, v_cache, k, v, rotary_cos, rotary_sin,
                                cache_seqlens, cache_batch_idx, cache_leftpad, block_table,
                                softmax_scale, causal, window_size, softcap,
                                rotary_interleaved, num_splits, return_softmax_lse)
        if key is not None and fp8:
            key = key + descales
        if key is not None and qv is not None:  # (after kvcache_key: never while tracing)
            key = key + _fast.kvcache_qv_key(qv)
        entry = None if key is None else _fast.KVCACHE.get(key)
        if entry is not None:
            template, runner = entry
            fp8_args = None
            if fp8:
                _kv.check_descale_values(q_descale=q_descale, k_descale=k_descale,
                                         v_descale=v_descale)
                fp8_args = (q_descale, k_descale, v_descale)
            if runner is not None:  # the signature's recorded decode call
                if type(cache_seqlens) is int:
                    cache_seqlens = _kv.seqlens_tensor(cache_seqlens, q.shape[0], q.device)
                out, lse = runner(q, k_cache, v_cache, k, v, rotary_cos, rotary_sin,
                                  cache_seqlens, cache_batch_idx, cache_leftpad, block_table,
                                  need_lse=bool(return_softmax_lse), descales=fp8_args, qv=qv)
            else:
                out, lse = _ops.kvcache_attention(*_fast.kvcache_args(
                    template, q, k_cache, v_cache, k, v, rotary_cos, rotary_sin, cache_seqlens,
                    cache_batch_idx, cache_leftpad, block_table, fp8_args, qv))
            return (out, lse) if return_softmax_lse else out
    varlen = (cu_seqlens_q, max_seqlen_q, cu_seqlens_k_new, rotary_seqlens)
    args = _prepare(q, k_cache, v_cache, k, v, rotary_cos, rotary_sin, cache_seqlens,
                    cache_batch_idx, cache_leftpad, block_table, softmax_scale, causal,
                    window_size, softcap, rotary_interleaved, alibi_slopes, num_splits, *varlen,
                    k_descale=k_descale, v_descale=v_descale, q_descale=q_descale,
                    qv=qv)
    return_softmax_lse = _v.check_bool(return_softmax_lse, "return_softmax_lse")
    # plain eager tensors run the op's body directly (torch.library's dispatch costs tens of
    # us per call); compile, export, modes and subclasses see the op
    _v.check_learnable_sink(learnable_sink, q.shape[-2], q.device)
    attention_chunk = _v.check_attention_chunk(attention_chunk)
    if key is not None:
        _fast.KVCACHE.put(key, _fast.kvcache_entry(args))
    # (the op's order after the scalars: the packed-length arguments, the descales, the
    # latent query, the sink; each group is passed when it or a later one is used)
    sink = learnable_sink is not None
    if (attention_chunk > 0 or any(x is not None for x in varlen) or fp8 or qv is not None
            or sink):
        args = args + (attention_chunk, cu_seqlens_q,
                       0 if max_seqlen_q is None else int(max_seqlen_q), cu_seqlens_k_new,
                       rotary_seqlens)
    if fp8 or qv is not None or sink:
        args = args + (k_descale, v_descale, q_descale)
    if qv is not None or sink:
        args = args + (qv,)
    if sink:  # (inside the op: the attention's output stays float32 until the sink pass)
        args = args + (learnable_sink.detach(),)
    out, lse = _ops.kvcache_attention(*args)
    return (out, lse) if return_softmax_lse else out


def _prepare(q, k_cache, v_cache, k, v, rotary_cos, rotary_sin, cache_seqlens, cache_batch_idx,
             cache_leftpad, block_table, softmax_scale, causal, window_size, softcap,
             rotary_interleaved, alibi_slopes, num_splits, cu_seqlens_q=None, max_seqlen_q=None,
             cu_seqlens_k_new=None, rotary_seqlens=None, *, k_descale=None,
             v_descale=None, q_descale=None, qv=None) -> tuple:
    """Every argument check of :func:`flash_attn_with_kvcache` that needs no tensor value
    (those run in the op's body, ``dispatch.kvcache``, at run time); returns the arguments of
    the ``flashattn::fwd_kvcache`` op: cache_seqlens as a (b,) int32 tensor or None,
    softmax_scale resolved, the window normalised against the cache capacity (flash-attn 2's
    rule, which comes before the op decides how q is rotated), alibi_slopes as (b, h);
    with ``qv`` the default scale is (headdim + headdim_v) ** -0.5 (FlashAttention-3)."""
    paged = block_table is not None
    q_dense = q
    if cu_seqlens_q is not None or max_seqlen_q is not None:
        q_dense = _kv.check_varlen_q(q, cu_seqlens_q, max_seqlen_q, cache_seqlens)
    _kv.check_cache(q_dense, k_cache, v_cache, paged)
    batch, s_q, h, d = q_dense.shape
    _kv.check_descales(k_descale, v_descale, k_cache, batch, q_descale, q)
    _kv.check_qv(qv, q, v_cache)
    device = q.device
    if paged:
        if cache_batch_idx is not None:
            # FlashAttention-3: batch row b uses the block table's row cache_batch_idx[b]
            block_table = _kv.rows_of_block_table(block_table, cache_batch_idx, batch, device)
            cache_batch_idx = None
        _v.check_block_table(block_table, batch, device)
    capacity = metadata.cache_capacity(k_cache, block_table)
    if cu_seqlens_k_new is not None:
        s_new = _kv.check_packed_new_kv(k, v, cu_seqlens_k_new, batch, k_cache, v_cache)
    else:
        s_new = _kv.check_new_kv(k, v, q_dense, k_cache, v_cache, capacity)
    _kv.check_index_vector(rotary_seqlens, "rotary_seqlens", batch, device)
    _kv.check_cache_seqlens(cache_seqlens, batch, device, capacity)
    if cache_seqlens is not None and not isinstance(cache_seqlens, torch.Tensor) \
            and cu_seqlens_k_new is None and int(cache_seqlens) + s_new > capacity:
        # (a host int: the capacity guard costs nothing; a device tensor is checked with the
        # other values, where that is free or in the checked mode)
        raise ValueError(metadata.capacity_message(f"cache_seqlens = {int(cache_seqlens)}",
                                                   s_new, capacity, block_table,
                                                   k_cache.shape[1]))
    if cache_seqlens is None and k is not None:
        raise ValueError("cache_seqlens is required when k / v are given: it says where the "
                         "new tokens go")
    _kv.check_index_vector(cache_batch_idx, "cache_batch_idx", batch, device)
    _kv.check_index_vector(cache_leftpad, "cache_leftpad", batch, device)
    _kv.check_rotary(rotary_cos, rotary_sin, q_dense, k is not None)
    scale = _v.check_softmax_scale(softmax_scale)
    causal = _v.check_causal(causal)
    window = _v.check_window_size(window_size)
    softcap = _v.check_softcap(softcap)
    rotary_interleaved = _v.check_bool(rotary_interleaved, "rotary_interleaved")
    _v.check_alibi_slopes(alibi_slopes, batch, h, device)
    num_splits = _kv.check_num_splits(num_splits)
    if not paged and cache_batch_idx is None and k_cache.shape[0] < batch:
        raise ValueError(f"k_cache has {k_cache.shape[0]} rows but q has batch {batch}: pass "
                         "cache_batch_idx to map batch rows to cache rows, or a larger cache")
    # FlashAttention-3: with qv the score sums d + d_v products, and so does its default scale
    scale = _p.softmax_scale_or_default(scale, d + (0 if qv is None else v_cache.shape[3]))
    # flash-attn 2 (mha_fwd_kvcache): window sides reaching the capacity are unbounded, then
    # causal sets right = 0; only then is the call "local" (it decides q's rotary positions)
    window = _p.window(window[0], window[1], causal, capacity)
    alibi_slopes = _p.alibi_bh(alibi_slopes, batch, h)
    cache_seqlens = _kv.seqlens_tensor(cache_seqlens, batch, device)
    return (q, k_cache, v_cache, k, v, rotary_cos, rotary_sin, cache_seqlens, cache_batch_idx,
            cache_leftpad, block_table, alibi_slopes, float(scale), causal, int(window[0]),
            int(window[1]), float(softcap), rotary_interleaved, num_splits)


__all__ = ["flash_attn_with_kvcache"]
