"""The KV-cache op's body (``flash_attn_with_kvcache``): value checks of the metadata where
allowed, the in-place append with rotary, then attention on the device backend."""
from __future__ import annotations

from typing import Optional, Tuple

import torch

from flashattn import metadata
from flashattn.dispatch import dense as _dense
from flashattn.dispatch import latent as _latent
from flashattn.dispatch import merge as _merge
from flashattn.dispatch import select as _select
from flashattn.params import AttnParams


def kvcache(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
            k: Optional[torch.Tensor], v: Optional[torch.Tensor],
            rotary_cos: Optional[torch.Tensor], rotary_sin: Optional[torch.Tensor],
            cache_seqlens: Optional[torch.Tensor], cache_batch_idx: Optional[torch.Tensor],
            cache_leftpad: Optional[torch.Tensor], block_table: Optional[torch.Tensor],
            params: AttnParams, rotary_interleaved: bool, num_splits: int,
            cu_seqlens_q: Optional[torch.Tensor] = None, max_seqlen_q: int = 0,
            cu_seqlens_k_new: Optional[torch.Tensor] = None,
            rotary_seqlens: Optional[torch.Tensor] = None,
            k_descale: Optional[torch.Tensor] = None, v_descale: Optional[torch.Tensor] = None,
            q_descale: Optional[torch.Tensor] = None, qv: Optional[torch.Tensor] = None,
            sink: Optional[torch.Tensor] = None) -> Tuple[torch.Tensor, torch.Tensor]:
    """The body of ``flash_attn_with_kvcache`` after its argument checks: value checks where
    they are allowed (:func:`flashattn.metadata.values_checkable`), the in-place append (with
    rotary), attention. ``params`` is normalised by the api (window against the cache
    capacity, causal folded in, alibi (b, h)). Returns out (b, s_q, h, d_v) and lse float32
    (b, h, s_q); with ``cu_seqlens_q`` (FlashAttention-3's varlen queries) q is packed
    (total_q, h, d) and out / lse are (total_q, h, d_v) / (h, total_q). ``cu_seqlens_k_new``:
    k / v packed (total_new, h_k, d); ``rotary_seqlens``: rotation positions' base.
    ``k_descale`` / ``v_descale``: float32 (b, h_k) or None (1.0) for float8_e4m3fn caches;
    ``q_descale`` likewise for a float8_e4m3fn q (out is then bfloat16).
    ``qv``: FlashAttention-3's latent query (q's shape with d_v): the backends add ``qv . v``
    to the scores (never rotated: rotary is q's and k's). ``sink`` float (h,): learnable
    sinks, applied by one pass over the attention's float32 output, which rounds once to the
    output's dtype (as the dense forward's portable route does)."""
    fp8 = fp8_descales(k_cache, k_descale, v_descale, cache_seqlens, q, q_descale)
    latent = {} if qv is None else dict(qv=qv)
    varlen = cu_seqlens_q is not None or cu_seqlens_k_new is not None
    if varlen:
        out, lse = _kvcache_varlen(q, k_cache, v_cache, k, v, rotary_cos, rotary_sin,
                                   cache_seqlens, cache_batch_idx, cache_leftpad, block_table,
                                   params, rotary_interleaved, num_splits, cu_seqlens_q,
                                   max_seqlen_q, cu_seqlens_k_new, rotary_seqlens, fp8, latent,
                                   sink is not None)
        return _with_sink(out, lse, sink, cu_seqlens_q is not None, q)
    batch, s_q, h, d = q.shape
    device = q.device
    capacity = metadata.cache_capacity(k_cache, block_table)
    s_new = 0 if k is None else k.shape[1]
    # flash-attn rotates q token by token (positions cache_seqlens + i) when the call is causal
    # or local, else every token at cache_seqlens
    rotary_q_step = 1 if params.masked else 0
    params = _dense.one_row_right_edge(params, s_q)
    seqlens = cache_seqlens
    if seqlens is None:
        seqlens = torch.full((batch,), capacity, dtype=torch.int32, device=device)

    if metadata.values_checkable(seqlens, cache_leftpad, cache_batch_idx, block_table,
                                 rotary_seqlens):
        check_kvcache_values(seqlens, s_new, capacity, cache_leftpad, cache_batch_idx,
                             k_cache, block_table, rotary_cos, s_q if rotary_q_step else 1,
                             rotary_seqlens)

    name = _select.select("kvcache", q)
    impl = _select.backend(name)
    rot = dict(rotary_seqlens=rotary_seqlens) if rotary_seqlens is not None else {}
    rot.update(append_descales(fp8, k, v))
    if batch == 0 or s_q == 0:
        out = torch.zeros((batch, s_q, h, v_cache.shape[3]), dtype=out_dtype(q), device=device)
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
    if qv is not None and name == "portable":  # (the cpu backend: no Triton to import)
        latent.update(_latent.latent_kernel(q_rot, k_cache, v_cache, qv, block_table, params,
                                            cache_leftpad, cache_batch_idx, capacity, fp8))
    wide = {} if sink is None else dict(out_dtype=torch.float32)
    out, lse = impl.kvcache_attention(q_rot, k_cache, v_cache, seqlens, s_new, p=params,
                                      leftpad=cache_leftpad, batch_idx=cache_batch_idx,
                                      block_table=block_table, num_splits=num_splits,
                                      capacity=capacity, **fp8, **latent, **wide)
    return _with_sink(out, lse, sink, False, q)


def _with_sink(out: torch.Tensor, lse: torch.Tensor, sink: Optional[torch.Tensor],
               packed: bool, q: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor]:
    """(out, lse) with learnable sinks applied (``sink`` None: as they are), out in the call's
    output dtype (:func:`out_dtype`)."""
    if sink is None:
        return out, lse
    return _merge.sink_apply(out, lse, sink, packed=packed, out_dtype=out_dtype(q))


def out_dtype(q: torch.Tensor) -> torch.dtype:
    """The output's dtype: q's, bfloat16 for a float8_e4m3fn q (FlashAttention-3's rule)."""
    return torch.bfloat16 if q.dtype == torch.float8_e4m3fn else q.dtype


def fp8_descales(k_cache: torch.Tensor, k_descale: Optional[torch.Tensor],
                 v_descale: Optional[torch.Tensor], cache_seqlens: Optional[torch.Tensor],
                 q: torch.Tensor, q_descale: Optional[torch.Tensor] = None) -> dict:
    """The attention's FP8 keywords: {} for a 16/32-bit cache; for a float8_e4m3fn cache both
    (b, h_k) float32 descales, and with a float8_e4m3fn q its q_descale too, a missing one as
    ones (FlashAttention-3: None means 1.0; b from cache_seqlens, else q's batch)."""
    if k_cache.dtype != torch.float8_e4m3fn:
        return {}
    batch = cache_seqlens.shape[0] if cache_seqlens is not None else q.shape[0]
    ones = lambda: torch.ones((batch, k_cache.shape[2]), dtype=torch.float32,  # noqa: E731
                              device=k_cache.device)
    kw = dict(k_descale=ones() if k_descale is None else k_descale,
              v_descale=ones() if v_descale is None else v_descale)
    if q.dtype == torch.float8_e4m3fn:
        kw["q_descale"] = ones() if q_descale is None else q_descale
    return kw


def append_descales(fp8: dict, k: Optional[torch.Tensor], v: Optional[torch.Tensor]) -> dict:
    """The append's FP8 keywords from the attention's (:func:`fp8_descales`): the caches'
    descales for 16/32-bit new rows (quantized in); ones for float8_e4m3fn rows, which are in
    the cache's units already (FlashAttention-3's FP8 k / v): quantizing them with 1 stores
    them unchanged, and a rotated row is rounded once, saturating, from its float32 rotation.
    {} for a 16/32-bit cache."""
    if not fp8:
        return {}
    kw = {}
    for x, n in ((k, "k_descale"), (v, "v_descale")):
        fp8_rows = x is not None and x.dtype == torch.float8_e4m3fn
        kw[n] = torch.ones_like(fp8[n]) if fp8_rows else fp8[n]
    return kw


def check_kvcache_values(seqlens, s_new, capacity, leftpad, batch_idx, k_cache, block_table,
                         rotary_cos, q_positions, rotary_seqlens) -> None:
    """:func:`metadata.check_values` of a KV-cache call (``q_positions``: rotary positions q
    takes past each row's length: s_q when rotated token by token, else 1)."""
    metadata.check_values(seqlens, s_new, capacity, leftpad, batch_idx, k_cache.shape[0],
                          block_table, k_cache.shape[0], k_cache.shape[1],
                          None if rotary_cos is None else rotary_cos.shape[0], q_positions,
                          rotary_seqlens)


def _kvcache_varlen(q, k_cache, v_cache, k, v, rotary_cos, rotary_sin, cache_seqlens,
                    cache_batch_idx, cache_leftpad, block_table, params, rotary_interleaved,
                    num_splits, cu_seqlens_q, max_seqlen_q, cu_seqlens_k_new, rotary_seqlens,
                    fp8=None, latent=None, float32_out=False):
    """:func:`kvcache` with packed queries and / or packed new keys (FlashAttention-3): the
    batch comes from cache_seqlens; sequence b's keys end at cache_seqlens[b] + its new keys
    (device arithmetic, no host read), and the attention runs the decode kernel's packed-query
    mode (or, for dense q, its usual mode over those lengths). ``fp8``: the backends' FP8
    keywords (:func:`fp8_descales`); ``latent``: {} or {"qv": qv}; ``float32_out``: out in
    float32 (for the sink pass)."""
    fp8 = fp8 or {}
    latent = latent or {}
    append_fp8 = append_descales(fp8, k, v)
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
    impl = _select.backend(_select.select("kvcache", q))
    q_rot = q
    if k is not None or rotary_cos is not None:
        q_rot = impl.append_kv(q, k_cache, v_cache, k, v, rotary_cos, rotary_sin,
                               rotary_interleaved, cache_seqlens, cache_batch_idx,
                               block_table, rotary_q_step, cu_seqlens_q=cu_seqlens_q,
                               max_seqlen_q=max_seqlen_q, cu_seqlens_k_new=cu_seqlens_k_new,
                               max_seqlen_k_new=max_new, rotary_seqlens=rotary_seqlens,
                               **append_fp8)
    if cu_seqlens_q is None:
        params = _dense.one_row_right_edge(params, q.shape[1])
    elif batch == 0 or q.shape[0] == 0 or max_seqlen_q == 0:
        total_q, h, _ = q.shape
        return (torch.zeros((total_q, h, v_cache.shape[3]), dtype=out_dtype(q), device=device),
                torch.full((h, total_q), float("-inf"), dtype=torch.float32, device=device))
    wide = dict(out_dtype=torch.float32) if float32_out else {}
    return impl.kvcache_attention(q_rot, k_cache, v_cache, seqlens_end, 0, p=params,
                                  leftpad=cache_leftpad, batch_idx=cache_batch_idx,
                                  block_table=block_table, num_splits=num_splits,
                                  capacity=capacity, cu_seqlens_q=cu_seqlens_q,
                                  max_seqlen_q=max_seqlen_q, **fp8, **latent, **wide)


__all__ = ["append_descales", "check_kvcache_values", "fp8_descales", "kvcache", "out_dtype"]
