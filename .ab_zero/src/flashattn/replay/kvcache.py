"""Recorded and planned KV-cache calls: :func:`kvcache_runner` (the eager fast path's decode step),
:func:`kvcache_planned` (``flashattn.plan_decode``'s run) and :func:`decode_splits` (the plan's
split count, FlashAttention-3's get_scheduler_metadata)."""
from __future__ import annotations

from typing import Optional, Tuple

import torch

from flashattn import metadata
from flashattn.dispatch import dense as _dense
from flashattn.dispatch import kvcache as _kvcache
from flashattn.dispatch import latent as _latent
from flashattn.dispatch import select as _select
from flashattn.params import AttnParams
from flashattn.runtime import env
from flashattn.runtime.device import capturing


def kvcache_runner(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                   k: Optional[torch.Tensor], v: Optional[torch.Tensor],
                   rotary_cos: Optional[torch.Tensor], rotary_sin: Optional[torch.Tensor],
                   cache_seqlens: Optional[torch.Tensor],
                   cache_batch_idx: Optional[torch.Tensor], cache_leftpad: Optional[torch.Tensor],
                   block_table: Optional[torch.Tensor], params: AttnParams,
                   rotary_interleaved: bool, num_splits: int):
    """:func:`kvcache`'s decisions for this call signature (dense q, no packed lengths), made
    once: a call ``run(q, k_cache, v_cache, k, v, rotary_cos, rotary_sin, cache_seqlens,
    cache_batch_idx, cache_leftpad, block_table, need_lse=True, descales=None) -> (out,
    lse)`` for later calls whose tensors have the same shapes, strides, dtypes, devices and
    alignment and whose scalars, given tensors and settings are the same (the api's fast path
    keys on exactly those); with ``need_lse=False`` lse may come back None (the caller drops
    it). FP8 caches (and an FP8 q): ``descales`` = (q_descale, k_descale, v_descale), each
    None (1.0: ones the runner holds, made here, never during capture) or the call's float32
    (b, h_k) tensor; new float8_e4m3fn rows are appended with ones, as
    ``dispatch.kvcache.append_descales`` does. The value checks run in it as in
    :func:`kvcache` (always for CPU metadata). None where the full body must run on every
    call: the checked mode on a GPU (its checks depend on capture), empty shapes, or a backend
    without decode kernels (the torch path). ``qv``: the call's latent query (FlashAttention-3's
    multi-head latent attention), given to every call of a signature that has one."""
    batch, s_q, _, _ = q.shape
    metas = (cache_seqlens, cache_leftpad, cache_batch_idx, block_table)
    on_cpu = all(t.device.type == "cpu" for t in (q, *metas) if t is not None)
    if batch == 0 or s_q == 0 or (env.settings().checks and not on_cpu) or capturing():
        return None  # (capturing: tensors made here would be filled only by the graph)
    name = _select.select("kvcache", q)
    if name != "portable":
        return None
    impl = _select.backend(name)
    capacity = metadata.cache_capacity(k_cache, block_table)
    s_new = 0 if k is None else k.shape[1]
    rotary_q_step = 1 if params.masked else 0
    row_params = _dense.one_row_right_edge(params, s_q)
    full = None  # (cache_seqlens None: every row holds the whole cache; the kernel only reads)
    if cache_seqlens is None:
        full = torch.full((batch,), capacity, dtype=torch.int32, device=q.device)
    fp8_cache = k_cache.dtype == torch.float8_e4m3fn
    fp8_q = q.dtype == torch.float8_e4m3fn
    ones = None  # (FlashAttention-3: a missing descale is 1.0)
    if fp8_cache:
        ones = torch.ones((batch, k_cache.shape[2]), dtype=torch.float32, device=q.device)
    fp8_rows = tuple(x is not None and x.dtype == torch.float8_e4m3fn for x in (k, v))
    calls: list = []  # the DecodeCall, made by the first run (it needs the rotated q)

    def fp8_keywords(descales):
        """(the attention's, the append's) FP8 keywords, as dispatch.kvcache makes them."""
        if not fp8_cache:
            return {}, {}
        q_descale, k_descale, v_descale = descales or (None, None, None)
        kd = ones if k_descale is None else k_descale
        vd = ones if v_descale is None else v_descale
        attn = dict(k_descale=kd, v_descale=vd)
        if fp8_q:
            attn["q_descale"] = ones if q_descale is None else q_descale
        return attn, dict(k_descale=ones if fp8_rows[0] else kd,
                          v_descale=ones if fp8_rows[1] else vd)

    def run(q, k_cache, v_cache, k, v, rotary_cos, rotary_sin, cache_seqlens, cache_batch_idx,
            cache_leftpad, block_table, need_lse=True, descales=None, qv=None):
        seqlens = full if cache_seqlens is None else cache_seqlens
        fp8, append_fp8 = fp8_keywords(descales)
        if on_cpu:
            _kvcache.check_kvcache_values(seqlens, s_new, capacity, cache_leftpad,
                                          cache_batch_idx, k_cache, block_table, rotary_cos,
                                          s_q if rotary_q_step else 1, None)
        q_rot = q
        if s_new > 0:
            q_rot = impl.append_kv(q, k_cache, v_cache, k, v, rotary_cos, rotary_sin,
                                   rotary_interleaved, seqlens, cache_batch_idx, block_table,
                                   rotary_q_step, **append_fp8)
        if not calls:
            hopper = _latent.latent_kernel(q_rot, k_cache, v_cache, qv, block_table,
                                           row_params, cache_leftpad, cache_batch_idx,
                                           capacity, fp8)
            calls.append(impl.kvcache_call(q_rot, k_cache, v_cache, seqlens, s_new,
                                           p=row_params, leftpad=cache_leftpad,
                                           batch_idx=cache_batch_idx, block_table=block_table,
                                           num_splits=num_splits, capacity=capacity, qv=qv,
                                           **fp8, **hopper))
        return calls[0](q_rot, k_cache, v_cache, seqlens, cache_leftpad, cache_batch_idx,
                        block_table, row_params.alibi_slopes, need_lse=need_lse, qv=qv, **fp8)
    return run


def kvcache_planned(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                    seqlens: torch.Tensor, block_table: Optional[torch.Tensor],
                    params: AttnParams, num_splits: int, capacity: int, buffers: dict,
                    **extra: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor]:
    """A planned decode step (``flashattn.plan_decode``): attention of q (b, s_q, h, d) over
    the cache's first seqlens[b] keys, no new keys; the split count and the outputs come from
    the plan (``buffers``, reused between calls where the backend can). ``extra``: the FP8
    descales (k_descale, v_descale and an FP8 q's q_descale, float32 (b, h_k)), as
    ``dispatch.kvcache.fp8_descales`` gives them to the full call, and the latent query
    ``qv`` (b, s_q, h, d_v) of a plan with one."""
    params = _dense.one_row_right_edge(params, q.shape[1])
    name = _select.backend_for(q)
    hopper = {}
    if name == "portable":
        hopper = _latent.latent_kernel(q, k_cache, v_cache, extra.get("qv"), block_table,
                                       params, None, None, capacity, extra)
    return _select.backend(name).kvcache_attention(
        q, k_cache, v_cache, seqlens, 0, p=params, leftpad=None, batch_idx=None,
        block_table=block_table, num_splits=num_splits, capacity=capacity, buffers=buffers,
        **extra, **hopper)


def decode_splits(batch: int, seqlen_q: int, max_seqlen_k: int, nheads: int, nheads_k: int,
                  headdim: int, headdim_v: int, dtype: torch.dtype, page_size: Optional[int],
                  num_splits: int, window_left: int = -1, window_right: int = -1,
                  softcap: float = 0.0) -> int:
    """The number of key splits a KV-cache call of these shapes runs on the current CUDA
    device (FA3's get_scheduler_metadata); 1 where the call would not run split-KV kernels
    (no CUDA device or no Triton: the torch path has no splits). ``num_splits`` > 0 as given.
    MLA's shapes on sm90 get the Hopper MLA decode kernel's split count
    (``dispatch.latent.latent_split_waves``)."""
    if num_splits > 0:
        return int(num_splits)
    if not (torch.cuda.is_available() and _select.triton_available()):
        return 1
    device = torch.device("cuda", torch.cuda.current_device())
    waves = _latent.latent_split_waves(device, nheads_k, headdim, headdim_v, dtype, page_size,
                                       window_left, window_right, softcap)
    return _select.backend("portable").decode_splits(batch, seqlen_q, max_seqlen_k, nheads,
                                                     nheads_k, headdim, headdim_v, dtype,
                                                     page_size, device, waves)


__all__ = ["decode_splits", "kvcache_planned", "kvcache_runner"]
