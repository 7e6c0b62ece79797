"""FlashAttention-3's interface (``flash_attn_interface`` of flash-attn's hopper/ package):
its signatures, argument names and return conventions over flashattn's kernels, for serving
engines and model code written against FA3. ``import flashattn.fa3 as flash_attn_interface``.

Where FA3 and flash-attn 2 differ, this module follows FA3:

- ``flash_attn_func`` / ``flash_attn_varlen_func`` take no dropout / ALiBi arguments, have
  ``qv``, the FP8 descales, ``attention_chunk``, ``num_splits``, ``pack_gqa``, ``sm_margin``,
  and return ``out``, or ``(out, softmax_lse)`` with ``return_attn_probs=True``.
- ``flash_attn_with_kvcache`` names the paged cache's table ``page_table``.
- Windows: FA3 masks with a side as given, flash-attn 2 counts a side >= seqlen_k as
  unbounded; the masks differ only for a right side in [seqlen_k, seqlen_q - 1) (more
  queries than keys), which raises ``NotImplementedError`` instead of using flash-attn 2's.
- ``flash_attn_combine`` returns ``(out, softmax_lse)`` and takes and returns the LSE as
  (…, seqlen, nheads) (flash-attn 2's layout, and ``flashattn.flash_attn_combine``'s, is
  (…, nheads, seqlen)).
- ``get_scheduler_metadata`` returns the split decision (int32 CPU tensor, one entry: the
  number of key splits) that ``flash_attn_with_kvcache(scheduler_metadata=...)`` then uses;
  for a whole serving loop planned once see ``flashattn.plan_decode``.

Accepted as documented no-ops: ``pack_gqa`` (the decode kernels always pack a KV head's
query heads into one tile; the prefill kernels read each K/V block once per query block
regardless), ``sm_margin`` (no SM is reserved), ``num_splits`` on the dense / varlen prefill
calls (their kernels have no key split; the decode path takes it). ``attention_chunk``
(chunked local attention) works in every call, forward and backward (FA3's backward refuses
it); ``seqused_q`` in the varlen call; packed queries (``cu_seqlens_q`` / ``max_seqlen_q``),
packed new keys (``cu_seqlens_k_new``), ``rotary_seqlens`` and ``cache_batch_idx`` with
``page_table`` (row b takes the table's row cache_batch_idx[b]) in the KV-cache call, and
FP8 KV caches there: float8_e4m3fn ``k_cache`` / ``v_cache`` with ``k_descale`` /
``v_descale`` (float32 (batch, nheads_k), None = 1.0), with FA3's float8_e4m3fn q and
``q_descale`` (out bfloat16) or a bf16 / fp16 / fp32 q (out in q's dtype): K / V (and an FP8
q) are widened on chip and the dots run in bf16 (q's dtype for a 16/32-bit q); new k / v in
float8_e4m3fn are stored as they are, in a 16/32-bit dtype quantized in.

Multi-head latent attention in the KV-cache call (``qv``, DeepSeek's MLA decode): the latent
query qv (batch, seqlen_q, nheads, headdim_v) scores ``softmax_scale * (q . k + qv . v)``
against the cached values themselves, out is over v, and softmax_scale defaults to
``(headdim + headdim_v) ** -0.5`` (FA3's default). It works with everything the KV-cache call
takes: appends of new k / v (qv scores against them too), rotary (q and k only), paged caches
of any page size, cache_batch_idx, cache_leftpad, num_splits, GQA / MQA, causal, windows,
softcap, packed queries (qv packed like q) and FP8 caches with a bf16 / fp16 / fp32 q (qv . v
against the dequantized v). headdim_v goes to 512 in the KV-cache call, with or without qv
(FA3 also asks headdim <= 64 and headdim_v >= 256 for qv, and 16-bit inputs; flashattn takes
any headdim up to 256 and fp32). ``flash_attn_func`` / ``flash_attn_varlen_func`` take ``qv``
too, forward only as in FA3 (a backward raises NotImplementedError, where FA3's would leave the
qv term out of dq / dk / dv): with MHA / GQA / MQA, causal and local windows, softcap,
attention_chunk, num_splits, seqused_q / seqused_k, computed as a KV-cache call over the call's
own keys (:mod:`flashattn.api.qv_attention`). Not supported yet, and raising
``NotImplementedError`` naming the argument: head dims above 256 for q / k, ``qv`` with FP8
inputs (FA3 refuses it too) and ``return_attn_probs`` with FP8 inputs in the varlen call.
FP8 inputs take ``attention_chunk`` (both calls) and ``seqused_q`` (varlen) as FA3's do.
"""
from __future__ import annotations

from typing import Optional, Sequence, Tuple, Union

import torch

from flashattn.api import out as _out
from flashattn.api import combine as _combine
from flashattn.api import dense as _dense
from flashattn.api import fp8_attention as _fp8
from flashattn.api import kvcache as _kvcache
from flashattn.api import qv_attention as _qv
from flashattn.api import validation as _v
from flashattn.api import varlen as _varlen

Tensor = torch.Tensor


def _check_head_dims(q: Tensor, v: Optional[Tensor]) -> None:
    """Head dims the dense / varlen kernels do not take: q's past MAX_HEAD_DIM, v's past
    MAX_HEAD_DIM_V (its forward; v None: the KV-cache call, whose v_cache is checked with its
    other arguments)."""
    for x, n, most in ((q, "q", _v.MAX_HEAD_DIM), (v, "v", _v.MAX_HEAD_DIM_V)):
        if isinstance(x, Tensor) and x.dim() >= 1 and x.shape[-1] > most:
            raise NotImplementedError(f"flashattn.fa3: head dim {x.shape[-1]} of {n} is not "
                                      f"supported (at most {most})")


def _check_window_rule(window_size: object, causal: object, seqlen_q: object,
                       seqlen_k: object, k_name: str) -> None:
    """Refuse the windows on which FA3's and flash-attn 2's rules disagree.

    FA3 masks with a window side as given: its clamps (left >= seqlen_k - 1 and
    right >= seqlen_q - 1 become -1) change no mask. flashattn applies flash-attn 2's rule,
    under which a side >= ``k_name`` (seqlen_k, max_seqlen_k, the cache capacity) is
    unbounded. The two masks differ only for a right side in [seqlen_k, seqlen_q - 1), i.e.
    when the queries outnumber the keys: there FA3 hides keys from the first rows that
    flashattn would show, so such a call raises instead of computing the other mask. Values
    that are not ints are left to the argument checks, which name them."""
    if causal is True or not isinstance(window_size, (tuple, list)) or len(window_size) != 2:
        return
    right = window_size[1]
    if not all(isinstance(x, int) and not isinstance(x, bool)
               for x in (right, seqlen_q, seqlen_k)):
        return
    if seqlen_k <= right < seqlen_q - 1:
        raise NotImplementedError(
            f"flashattn.fa3: window_size[1] = {right} with seqlen_q = {seqlen_q} and "
            f"{k_name} = {seqlen_k} is not supported yet: FlashAttention-3 masks keys past "
            f"i + seqlen_k - seqlen_q + {right} for query i (rows near the start see fewer "
            f"keys), while flashattn applies flash-attn 2's rule, under which a side >= "
            f"{k_name} is unbounded. window_size[1] = -1 asks for the unbounded mask.")




@_out.writes_out(_out.like_q("q", "v", 4, 4))
def flash_attn_func(q: Tensor, k: Tensor, v: Tensor, softmax_scale: Optional[float] = None,
                    causal: bool = False, qv: Optional[Tensor] = None,
                    q_descale: Optional[Tensor] = None, k_descale: Optional[Tensor] = None,
                    v_descale: Optional[Tensor] = None,
                    window_size: Tuple[int, int] = (-1, -1), attention_chunk: int = 0,
                    softcap: float = 0.0, num_splits: int = 1, pack_gqa: Optional[bool] = None,
                    deterministic: bool = False, sm_margin: int = 0,
                    return_attn_probs: bool = False) -> Union[Tensor, Tuple[Tensor, Tensor]]:
    """FA3's ``flash_attn_func``: q (batch, seqlen_q, nheads, headdim), k / v (batch, seqlen_k,
    nheads_k, headdim[_v]); float16 / bfloat16 (float32 too), or float8_e4m3fn with the
    (batch, nheads_k) float32 descales (forward only, bf16 output). Returns out, or (out,
    softmax_lse (batch, nheads, seqlen_q)) with return_attn_probs. Differentiable (16/32-bit),
    except with ``qv`` (batch, seqlen_q, nheads, headdim_v): multi-head latent attention,
    score ``softmax_scale * (q . k + qv . v)``, forward only as in FA3
    (:mod:`flashattn.api.qv_attention`)."""
    _check_head_dims(q, v)
    if isinstance(q, Tensor) and isinstance(k, Tensor) and q.dim() == 4 and k.dim() == 4:
        _check_window_rule(window_size, causal, q.shape[1], k.shape[1], "seqlen_k")
    if qv is not None:
        out, lse = _qv.dense(q, k, v, qv, softmax_scale=softmax_scale, causal=causal,
                             window_size=window_size, attention_chunk=attention_chunk,
                             softcap=softcap, num_splits=num_splits,
                             descales=(q_descale, k_descale, v_descale))
        return (out, lse) if return_attn_probs else out
    kw = dict(softmax_scale=softmax_scale, causal=causal, window_size=window_size,
              softcap=softcap, deterministic=deterministic)
    if _fp8.is_fp8(q, k, v):
        kw.pop("deterministic")
        res = _fp8.dense(q, k, v, dropout_p=0.0, alibi_slopes=None, return_attn_probs=False,
                         q_descale=q_descale, k_descale=k_descale, v_descale=v_descale,
                         out_dtype=None, return_lse=return_attn_probs,
                         attention_chunk=attention_chunk, **kw)
        return res
    out, lse, _ = _dense.flash_attn_func(q, k, v, q_descale=q_descale, k_descale=k_descale,
                                         v_descale=v_descale, return_attn_probs=True,
                                         attention_chunk=attention_chunk, **kw)
    return (out, lse) if return_attn_probs else out


@_out.writes_out(_out.like_q("q", "v", 3, 3))
def flash_attn_varlen_func(q: Tensor, k: Tensor, v: Tensor, cu_seqlens_q: Tensor,
                           cu_seqlens_k: Tensor, max_seqlen_q: int, max_seqlen_k: int,
                           seqused_q: Optional[Tensor] = None,
                           seqused_k: Optional[Tensor] = None,
                           softmax_scale: Optional[float] = None, causal: bool = False,
                           qv: Optional[Tensor] = None, q_descale: Optional[Tensor] = None,
                           k_descale: Optional[Tensor] = None,
                           v_descale: Optional[Tensor] = None,
                           window_size: Tuple[int, int] = (-1, -1), attention_chunk: int = 0,
                           softcap: float = 0.0, num_splits: int = 1,
                           pack_gqa: Optional[bool] = None, deterministic: bool = False,
                           sm_margin: int = 0, return_attn_probs: bool = False
                           ) -> Union[Tensor, Tuple[Tensor, Tensor]]:
    """FA3's ``flash_attn_varlen_func``: packed q (total_q, nheads, headdim), k / v (total_k,
    nheads_k, headdim[_v]), int32 cu_seqlens (batch + 1,), seqused_k (batch,) or None.
    Returns out (total_q, nheads, headdim_v), or (out, softmax_lse (nheads, total_q)).
    ``qv`` (total_q, nheads, headdim_v): multi-head latent attention, forward only, as in
    :func:`flash_attn_func`."""
    _check_head_dims(q, v)
    _check_window_rule(window_size, causal, max_seqlen_q, max_seqlen_k, "max_seqlen_k")
    if qv is not None:
        out, lse = _qv.varlen(q, k, v, qv, cu_seqlens_q, cu_seqlens_k, max_seqlen_q,
                              max_seqlen_k, seqused_q=seqused_q, seqused_k=seqused_k,
                              softmax_scale=softmax_scale, causal=causal,
                              window_size=window_size, attention_chunk=attention_chunk,
                              softcap=softcap, num_splits=num_splits,
                              descales=(q_descale, k_descale, v_descale))
        return (out, lse) if return_attn_probs else out
    kw = dict(softmax_scale=softmax_scale, causal=causal, window_size=window_size,
              softcap=softcap, deterministic=deterministic, seqused_k=seqused_k,
              seqused_q=seqused_q, attention_chunk=attention_chunk)
    if _fp8.is_fp8(q, k, v):
        if return_attn_probs:
            raise NotImplementedError("flashattn.fa3: return_attn_probs with FP8 varlen inputs "
                                      "is not supported yet")
        return _varlen.flash_attn_varlen_func(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q,
                                              max_seqlen_k, q_descale=q_descale,
                                              k_descale=k_descale, v_descale=v_descale, **kw)
    out, lse, _ = _varlen.flash_attn_varlen_func(
        q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k,
        return_attn_probs=True, q_descale=q_descale, k_descale=k_descale,
        v_descale=v_descale, **kw)
    return (out, lse) if return_attn_probs else out


@_out.writes_out(_out.like_q("q", "v_cache", 4, 4))
def flash_attn_with_kvcache(q: Tensor, k_cache: Tensor, v_cache: Tensor,
                            k: Optional[Tensor] = None, v: Optional[Tensor] = None,
                            qv: Optional[Tensor] = None, rotary_cos: Optional[Tensor] = None,
                            rotary_sin: Optional[Tensor] = None,
                            cache_seqlens: Optional[Union[int, Tensor]] = None,
                            cache_batch_idx: Optional[Tensor] = None,
                            cache_leftpad: Optional[Tensor] = None,
                            page_table: Optional[Tensor] = None,
                            cu_seqlens_q: Optional[Tensor] = None,
                            cu_seqlens_k_new: Optional[Tensor] = None,
                            max_seqlen_q: Optional[int] = None,
                            rotary_seqlens: Optional[Tensor] = None,
                            q_descale: Optional[Tensor] = None,
                            k_descale: Optional[Tensor] = None,
                            v_descale: Optional[Tensor] = None,
                            softmax_scale: Optional[float] = None, causal: bool = False,
                            window_size: Sequence[int] = (-1, -1), attention_chunk: int = 0,
                            softcap: float = 0.0, rotary_interleaved: bool = True,
                            scheduler_metadata: Optional[Tensor] = None, num_splits: int = 0,
                            pack_gqa: Optional[bool] = None, sm_margin: int = 0,
                            return_softmax_lse: bool = False
                            ) -> Union[Tensor, Tuple[Tensor, Tensor]]:
    """FA3's ``flash_attn_with_kvcache``: flashattn.flash_attn_with_kvcache with the paged
    cache's table named ``page_table`` and the split count from ``scheduler_metadata`` when
    given (see :func:`get_scheduler_metadata`). Returns out, or (out, softmax_lse (batch,
    nheads, seqlen_q)) with return_softmax_lse; with packed queries (``cu_seqlens_q``) out is
    (total_q, nheads, headdim_v) and softmax_lse (nheads, total_q).

    ``qv`` (batch, seqlen_q, nheads, headdim_v) (packed: (total_q, nheads, headdim_v)), q's
    dtype: multi-head latent attention (DeepSeek's MLA decode: q the rotary part, headdim 64,
    qv the latent part, v_cache the latent cache with headdim_v 512, one KV head). The score
    is ``softmax_scale * (q . k + qv . v)`` and softmax_scale defaults to ``(headdim +
    headdim_v) ** -0.5``; headdim_v up to 512 (with or without qv).

    FP8 as FA3: float8_e4m3fn k_cache / v_cache with ``k_descale`` / ``v_descale`` float32
    (batch, nheads_k) (None = 1.0), and q float8_e4m3fn with ``q_descale`` (batch, nheads_k)
    (out bfloat16) or, beyond FA3, bf16 / fp16 (out in q's dtype). New k / v are
    float8_e4m3fn (stored as they are, FA3's) or 16/32-bit (quantized in with the descales).
    The decode kernel reads the FP8 bytes and widens them to bf16 on chip; its dots are bf16
    (the step is bound by reading the cache, not by the tensor cores). ``qv`` works over an
    FP8 cache with a 16-bit q; with a float8_e4m3fn q it raises NotImplementedError."""
    _check_head_dims(q, None)
    if isinstance(q, Tensor) and isinstance(k_cache, Tensor) and k_cache.dim() == 4:
        capacity = k_cache.shape[1]
        if isinstance(page_table, Tensor) and page_table.dim() == 2:
            capacity *= page_table.shape[1]
        rows = max_seqlen_q if cu_seqlens_q is not None else (
            q.shape[1] if q.dim() == 4 else None)
        _check_window_rule(window_size, causal, rows, capacity, "the cache capacity")
    if scheduler_metadata is not None:
        if not isinstance(scheduler_metadata, Tensor) or scheduler_metadata.numel() != 1 \
                or scheduler_metadata.device.type != "cpu":
            raise ValueError("scheduler_metadata must be what flashattn.fa3."
                             "get_scheduler_metadata returns (a one-entry CPU int32 tensor), "
                             f"got {_v._describe(scheduler_metadata)}")
        num_splits = int(scheduler_metadata[0])
    return _kvcache.flash_attn_with_kvcache(
        q, k_cache, v_cache, k, v, rotary_cos, rotary_sin, cache_seqlens, cache_batch_idx,
        cache_leftpad, page_table, softmax_scale, causal, window_size, softcap,
        rotary_interleaved, None, num_splits, return_softmax_lse,
        attention_chunk=attention_chunk, cu_seqlens_q=cu_seqlens_q, max_seqlen_q=max_seqlen_q,
        cu_seqlens_k_new=cu_seqlens_k_new, rotary_seqlens=rotary_seqlens, k_descale=k_descale,
        v_descale=v_descale, q_descale=q_descale, qv=qv)


def get_scheduler_metadata(batch_size: int, max_seqlen_q: int, max_seqlen_k: int,
                           num_heads_q: int, num_heads_kv: int, headdim: int,
                           cache_seqlens: Optional[Tensor] = None,
                           qkv_dtype: torch.dtype = torch.bfloat16,
                           headdim_v: Optional[int] = None, cu_seqlens_q: Optional[Tensor] = None,
                           cu_seqlens_k_new: Optional[Tensor] = None,
                           cache_leftpad: Optional[Tensor] = None,
                           page_size: Optional[int] = None, max_seqlen_k_new: int = 0,
                           causal: bool = False, window_size: Tuple[int, int] = (-1, -1),
                           attention_chunk: int = 0, has_softcap: bool = False,
                           num_splits: int = 0, pack_gqa: Optional[bool] = None,
                           sm_margin: int = 0) -> Tensor:
    """FA3's ``get_scheduler_metadata``: the split decision of a KV-cache call of these shapes,
    computed once on the host (int32 CPU tensor of one entry: the number of key splits; pass
    it as ``scheduler_metadata``). ``num_splits`` > 0 is returned as given; the decision
    does not depend on ``attention_chunk``."""
    from flashattn.replay import kvcache as _replay_kvcache
    window_left, window_right = window_size
    if causal:
        window_right = 0
    splits = _replay_kvcache.decode_splits(batch_size, max_seqlen_q, max_seqlen_k,
                                           num_heads_q, num_heads_kv, headdim,
                                           headdim_v or headdim, qkv_dtype, page_size,
                                           num_splits, int(window_left), int(window_right),
                                           1.0 if has_softcap else 0.0)
    return torch.tensor([splits], dtype=torch.int32)


def flash_attn_combine(out_partial: Tensor, lse_partial: Tensor, out: Optional[Tensor] = None,
                       out_dtype: Optional[torch.dtype] = None) -> Tuple[Tensor, Tensor]:
    """FA3's ``flash_attn_combine``: out_partial (num_splits, batch, seqlen, nheads, headdim)
    float32, lse_partial (num_splits, batch, seqlen, nheads) float32 (FA3's layout). Returns
    ``(out, softmax_lse)`` as FA3's ``fwd_combine`` does: out (batch, seqlen, nheads, headdim)
    (written into ``out`` when given), softmax_lse (batch, seqlen, nheads) float32."""
    if not isinstance(lse_partial, Tensor) or lse_partial.dim() != 4:
        raise ValueError("lse_partial must be (num_splits, batch, seqlen, nheads), got "
                         f"{_v._describe(lse_partial)}")
    res, lse = _combine.flash_attn_combine(out_partial, lse_partial.transpose(2, 3), out,
                                           out_dtype)
    return res, lse.transpose(1, 2)


__all__ = ["flash_attn_combine", "flash_attn_func", "flash_attn_varlen_func",
           "flash_attn_with_kvcache", "get_scheduler_metadata"]
