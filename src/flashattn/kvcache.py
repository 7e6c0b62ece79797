"""Inference with a KV cache: ``flash_attn_with_kvcache`` and ``flash_attn_combine``.

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
- Window sides >= the cache capacity (s_cache, or max_blocks * page_size) are unbounded
  (flash-attn's rule); causal sets right = 0.

Flash-Decoding: the key range is split over ``num_splits`` programs (0 = heuristic from the
SM count and the shapes, 1 = no split) and merged by ``kernels.combine``. Nothing here reads
a tensor value on the host for GPU tensors and every allocation size comes from shapes, so a
decode step (append + attention) can be captured in a CUDA graph and replayed with new
cache_seqlens values.

Backends: Triton (``kernels/rotary.py``, ``kernels/decode.py``, ``kernels/combine.py``) on
CUDA or under TRITON_INTERPRET=1; plain torch (``cpu_kvcache.py``) otherwise, as
:func:`flashattn.dispatch.backend_for` decides.
"""
from __future__ import annotations

from typing import Optional, Sequence, Tuple, Union

import torch

from flashattn import dispatch
from flashattn import kvcache_validation as _kv
from flashattn import validation as _v

Tensor = torch.Tensor


def _capacity(k_cache: Tensor, block_table: Optional[Tensor]) -> int:
    """Positions a sequence can hold: s_cache, or max_blocks * page_size when paged."""
    if block_table is not None:
        return block_table.shape[1] * k_cache.shape[1]
    return k_cache.shape[1]


def _normalize_window(causal: bool, window_size: Tuple[int, int], capacity: int
                      ) -> Tuple[int, int]:
    left, right = (-1 if w < 0 or w >= capacity else int(w) for w in window_size)
    return left, (0 if causal else right)


def _alibi_bh(alibi_slopes: Optional[Tensor], batch: int, h: int) -> Optional[Tensor]:
    if alibi_slopes is None:
        return None
    return alibi_slopes.view(1, h).expand(batch, h) if alibi_slopes.dim() == 1 else alibi_slopes


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
) -> Union[Tensor, Tuple[Tensor, Tensor]]:
    """Attention against a KV cache, appending new keys / values in place (flash-attn 2 API).

    Args:
        q: (batch, seqlen_q, nheads, headdim), fp16 / bf16 / fp32.
        k_cache, v_cache: (batch_size_cache, seqlen_cache, nheads_k, headdim[_v]), or with
            block_table (num_blocks, page_size, nheads_k, headdim[_v]). Same dtype as q.
            Modified in place when k / v are given.
        k, v: None, or (batch, seqlen_new, nheads_k, headdim[_v]): appended at cache_seqlens.
        rotary_cos, rotary_sin: None, or (seqlen_ro, rotary_dim / 2) (needs k / v).
        cache_seqlens: None (every row holds the whole cache), an int, or (batch,) int32: the
            number of cached positions of each row before this call.
        cache_batch_idx: None or (batch,) int32: cache row of each batch row (not with
            block_table).
        cache_leftpad: None or (batch,) int32: first cache position of each row.
        block_table: None or (batch, max_blocks_per_seq) int32: pages of each row.
        softmax_scale: default headdim ** -0.5.
        causal, window_size: bottom-right aligned masks, (-1, -1) = unbounded.
        softcap: 0.0 = off. alibi_slopes: None or float32 (nheads,) / (batch, nheads).
        rotary_interleaved: pairs (0, 1), (2, 3)... if True, else (0, rotary_dim / 2)...
        num_splits: 0 = heuristic, 1 = no split, n = split the keys over n programs.
        return_softmax_lse: also return the LSE.

    Returns:
        out (batch, seqlen_q, nheads, headdim_v) in q's dtype, and with return_softmax_lse
        lse (batch, nheads, seqlen_q) float32 (-inf on rows that see no key; their out is 0).
    """
    args = _prepare(q, k_cache, v_cache, k, v, rotary_cos, rotary_sin, cache_seqlens,
                    cache_batch_idx, cache_leftpad, block_table, softmax_scale, causal,
                    window_size, softcap, rotary_interleaved, alibi_slopes, num_splits)
    return_softmax_lse = _v.check_bool(return_softmax_lse, "return_softmax_lse")
    # plain eager tensors run the body directly (torch.library's dispatch costs tens of us per
    # call, as for the dense ops); compile, export, modes and subclasses see the op
    from flashattn import ops

    if ops._eager_call(*args[:12]):  # the tensor arguments
        out, lse = kvcache_fwd(*args)
    else:
        out, lse = ops.fwd_kvcache(*args)
    return (out, lse) if return_softmax_lse else out


def _prepare(q, k_cache, v_cache, k, v, rotary_cos, rotary_sin, cache_seqlens, cache_batch_idx,
             cache_leftpad, block_table, softmax_scale, causal, window_size, softcap,
             rotary_interleaved, alibi_slopes, num_splits) -> tuple:
    """Every argument check of :func:`flash_attn_with_kvcache` that needs no tensor value
    (those run in :func:`kvcache_fwd`, at run time); returns the arguments of
    :func:`kvcache_fwd` / ``ops.fwd_kvcache``: cache_seqlens as a (b,) int32 tensor or None,
    softmax_scale resolved, window_size as two ints."""
    paged = block_table is not None
    _kv.check_cache(q, k_cache, v_cache, paged)
    batch, s_q, h, d = q.shape
    device = q.device
    if paged:
        _v.check_block_table(block_table, batch, device)
        if cache_batch_idx is not None:
            raise ValueError("cache_batch_idx cannot be combined with block_table: the block "
                             "table already maps every batch row to its pages")
    capacity = _capacity(k_cache, block_table)
    s_new = _kv.check_new_kv(k, v, q, k_cache, v_cache, capacity)
    _kv.check_cache_seqlens(cache_seqlens, batch, device, capacity)
    if cache_seqlens is None and s_new > 0:
        raise ValueError("cache_seqlens is required when k / v are given: it says where the "
                         "new tokens go")
    _kv.check_index_vector(cache_batch_idx, "cache_batch_idx", batch, device)
    _kv.check_index_vector(cache_leftpad, "cache_leftpad", batch, device)
    _kv.check_rotary(rotary_cos, rotary_sin, q, s_new > 0)
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
    if scale is None:
        scale = d ** -0.5
    # cache_seqlens as an int32 (b,) device tensor; from host ints only (graph friendly)
    if cache_seqlens is not None and not isinstance(cache_seqlens, torch.Tensor):
        cache_seqlens = torch.full((batch,), int(cache_seqlens), dtype=torch.int32,
                                   device=device)
    return (q, k_cache, v_cache, k, v, rotary_cos, rotary_sin, cache_seqlens, cache_batch_idx,
            cache_leftpad, block_table, alibi_slopes, float(scale), causal, int(window[0]),
            int(window[1]), float(softcap), rotary_interleaved, num_splits)


def kvcache_fwd(q: Tensor, k_cache: Tensor, v_cache: Tensor, k: Optional[Tensor],
                v: Optional[Tensor], rotary_cos: Optional[Tensor], rotary_sin: Optional[Tensor],
                cache_seqlens: Optional[Tensor], cache_batch_idx: Optional[Tensor],
                cache_leftpad: Optional[Tensor], block_table: Optional[Tensor],
                alibi_slopes: Optional[Tensor], softmax_scale: float, causal: bool,
                window_left: int, window_right: int, softcap: float, rotary_interleaved: bool,
                num_splits: int) -> Tuple[Tensor, Tensor]:
    """The body of :func:`flash_attn_with_kvcache` (and of the ``fwd_kvcache`` op) after the
    argument checks of :func:`_prepare`: value checks where they are allowed
    (``kvcache_validation.values_checkable``), the in-place append (with rotary), attention.
    Returns out (b, s_q, h, d_v) and lse float32 (b, h, s_q)."""
    batch, s_q, h, d = q.shape
    device = q.device
    capacity = _capacity(k_cache, block_table)
    s_new = 0 if k is None else k.shape[1]
    # flash-attn rotates each query token at its own position when causal or local (any window
    # given, even one wider than the cache), else every token at cache_seqlens
    rotary_q_step = 1 if (causal or (window_left, window_right) != (-1, -1)) else 0
    window_left, window_right = _normalize_window(causal, (window_left, window_right), capacity)
    if s_q == 1 and window_right == 0:
        # one query row sits on the last key: a right edge of 0 hides nothing (no mask work)
        window_right = -1
    seqlens = cache_seqlens
    if seqlens is None:
        seqlens = torch.full((batch,), capacity, dtype=torch.int32, device=device)

    if _kv.values_checkable(seqlens, cache_leftpad, cache_batch_idx, block_table):
        _kv.check_values(seqlens, s_new, capacity, cache_leftpad, cache_batch_idx,
                         k_cache.shape[0], block_table, k_cache.shape[0], k_cache.shape[1],
                         None if rotary_cos is None else rotary_cos.shape[0],
                         s_q if rotary_q_step else 1)

    d_v = v_cache.shape[3]
    if batch == 0 or s_q == 0:
        out = torch.zeros((batch, s_q, h, d_v), dtype=q.dtype, device=device)
        lse = torch.full((batch, h, s_q), float("-inf"), dtype=torch.float32, device=device)
        if s_new > 0 and batch > 0:
            _append(q, k_cache, v_cache, k, v, rotary_cos, rotary_sin, rotary_interleaved,
                    seqlens, cache_batch_idx, block_table)
        return out, lse

    alibi_bh = _alibi_bh(alibi_slopes, batch, h)
    q_rot = q
    if s_new > 0:
        q_rot = _append(q, k_cache, v_cache, k, v, rotary_cos, rotary_sin, rotary_interleaved,
                        seqlens, cache_batch_idx, block_table, rotary_q_step)
    params = dict(softmax_scale=softmax_scale, window_left=window_left,
                  window_right=window_right, softcap=softcap, alibi_slopes=alibi_bh,
                  leftpad=cache_leftpad, batch_idx=cache_batch_idx, block_table=block_table)
    if dispatch.backend_for(q) == "portable":
        from flashattn.kernels.decode import decode_attention

        return decode_attention(q_rot, k_cache, v_cache, seqlens, s_new, num_splits=num_splits,
                                max_seqlen_k=capacity, **params)
    from flashattn.cpu_kvcache import kvcache_fwd as cpu_kvcache_fwd

    return cpu_kvcache_fwd(q_rot, k_cache, v_cache, seqlens, s_new, **params)


def _append(q: Tensor, k_cache: Tensor, v_cache: Tensor, k: Tensor, v: Tensor,
            cos: Optional[Tensor], sin: Optional[Tensor], interleaved: bool, seqlens: Tensor,
            batch_idx: Optional[Tensor], block_table: Optional[Tensor],
            rotary_q_step: int = 1) -> Tensor:
    """Write k (rotated) / v into the caches in place; return q rotated (or q itself)."""
    if dispatch.backend_for(q) == "portable":
        from flashattn.kernels.rotary import rotary_store

        rotary_store(k, k_cache, seqlens, cos=cos, sin=sin, interleaved=interleaved,
                     batch_idx=batch_idx, block_table=block_table)
        rotary_store(v, v_cache, seqlens, batch_idx=batch_idx, block_table=block_table)
        if cos is None:
            return q
        q_rot = torch.empty_like(q, memory_format=torch.contiguous_format)
        rotary_store(q, q_rot, seqlens, cos=cos, sin=sin, interleaved=interleaved,
                     pos_step=rotary_q_step, to_cache=False)
        return q_rot
    from flashattn.cpu_kvcache import append_kv, rotate

    append_kv(k_cache, v_cache, k, v, seqlens, cos, sin, interleaved, batch_idx, block_table)
    if cos is None:
        return q
    s_q = q.shape[1]
    positions = seqlens.long().view(-1, 1) + rotary_q_step * torch.arange(s_q, device=q.device)
    return rotate(q, cos, sin, positions, interleaved)


def flash_attn_combine(out_partial: Tensor, lse_partial: Tensor, out: Optional[Tensor] = None,
                       out_dtype: Optional[torch.dtype] = None) -> Tuple[Tensor, Tensor]:
    """Merge attention computed over disjoint key splits (the Flash-Decoding combine).

    Args:
        out_partial: (num_splits, batch, seqlen_q, nheads, headdim_v) float32, each split's
            normalised output.
        lse_partial: (num_splits, batch, nheads, seqlen_q) float32, each split's natural-log
            LSE; -inf for a split that saw no key (its out_partial entries are ignored).
        out: optional (batch, seqlen_q, nheads, headdim_v) tensor to write into.
        out_dtype: dtype of the result (default: out's dtype, else float32).

    Returns:
        (out (batch, seqlen_q, nheads, headdim_v), lse (batch, nheads, seqlen_q) float32);
        rows where every split is empty get out 0 and lse -inf.
    """
    _, b, s_q, h, d_v = _kv.check_combine(out_partial, lse_partial, out, out_dtype)
    dtype = out_dtype if out_dtype is not None else (out.dtype if out is not None
                                                     else torch.float32)
    if dispatch.backend_for(out_partial) == "portable":
        from flashattn.kernels.combine import combine_splits

        res = out if out is not None else torch.empty((b, s_q, h, d_v), dtype=dtype,
                                                      device=out_partial.device)
        lse = torch.empty((b, h, s_q), dtype=torch.float32, device=out_partial.device)
        combine_splits(out_partial, lse_partial, res, lse)
        return res, lse
    from flashattn.cpu_kvcache import combine

    res, lse = combine(out_partial, lse_partial, dtype)
    if out is not None:
        out.copy_(res)
        res = out
    return res, lse


def _varlen_paged_forward(q: Tensor, k_cache: Tensor, v_cache: Tensor, cu_seqlens_q: Tensor,
                          cu_seqlens_k: Tensor, seqused_k: Optional[Tensor], max_seqlen_q: int,
                          max_seqlen_k: int, block_table: Tensor, *, softmax_scale: float,
                          window_left: int, window_right: int, softcap: float,
                          alibi_slopes: Optional[Tensor]) -> Tuple[Tensor, Tensor]:
    """Packed varlen queries against a paged KV cache (for ``flash_attn_varlen_func``).

    q (total_q, h, d); caches (num_blocks, page_size, h_k, d / d_v); cu_seqlens_q / _k
    (b + 1,) int32; seqused_k (b,) int32 or None; block_table (b, max_blocks) int32.
    Sequence b has queries ``q[cu_seqlens_q[b]:cu_seqlens_q[b + 1]]`` and keys at positions
    ``[0, s_k)`` of its pages, ``s_k = seqused_k[b]`` if given else
    ``cu_seqlens_k[b + 1] - cu_seqlens_k[b]``. Window already normalised (-1 = unbounded,
    causal folded into window_right = 0, bottom-right aligned per sequence); alibi_slopes
    (b, h) float32 or None. Inputs are validated by the caller.

    Returns out (total_q, h, d_v) in q's dtype (0 on rows outside every sequence) and lse
    float32 (h, total_q).
    """
    total_q, h, _ = q.shape
    if total_q == 0 or cu_seqlens_q.shape[0] < 2:
        out = torch.zeros((total_q, h, v_cache.shape[3]), dtype=q.dtype, device=q.device)
        lse = torch.full((h, total_q), float("-inf"), dtype=torch.float32, device=q.device)
        return out, lse
    params = dict(softmax_scale=softmax_scale, window_left=window_left,
                  window_right=window_right, softcap=softcap, alibi_slopes=alibi_slopes)
    if dispatch.backend_for(q) == "portable":
        from flashattn.kernels.decode import decode_attention

        seqlens = seqused_k if seqused_k is not None else (
            cu_seqlens_k[1:] - cu_seqlens_k[:-1])
        out, lse = decode_attention(q, k_cache, v_cache, seqlens, 0, num_splits=0,
                                    max_seqlen_k=int(max_seqlen_k), block_table=block_table,
                                    cu_seqlens_q=cu_seqlens_q, max_seqlen_q=int(max_seqlen_q),
                                    **params)
        # rows outside every sequence (past cu_seqlens_q[-1]) are never written by a program
        return out, lse
    from flashattn.cpu_kvcache import varlen_paged_fwd

    return varlen_paged_fwd(q, k_cache, v_cache, cu_seqlens_q, cu_seqlens_k, seqused_k,
                            block_table, **params)


__all__ = ["flash_attn_with_kvcache", "flash_attn_combine"]
