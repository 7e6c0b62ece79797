"""FlashAttention-3's ``qv`` (multi-head latent attention) in ``flash_attn_func`` and
``flash_attn_varlen_func``: forward only, computed as a KV-cache call over the call's own keys.

FA3 takes ``qv`` (b, s_q, h, d_v), packed (total_q, h, d_v) in the varlen call, in every
forward: the score is ``softmax_scale * (q . k + qv . v)`` (the latent query scores against
the values themselves), out is over v, and the default scale is ``(d + d_v) ** -0.5``. Its own
tests run it in the dense and varlen calls at seqlen_q up to 4224, with MHA / GQA / MQA,
causal and local windows, softcap, attention_chunk and num_splits; it has no backward for it
(its autograd formula computes dq / dk / dv without the qv term).

No kernel here is new. The KV-cache call already computes that score on every backend (the
portable decode kernel, which tiles any number of query rows; the Hopper MLA kernel where it
covers the call; the cpu path), with flash-attn's bottom-right aligned masks over each
sequence's own keys. So:

- a dense call is a KV-cache call with k / v as the cache, every row full;
- a varlen call is a KV-cache call with packed queries over a cache of one row, the packed
  keys (1, total_k, h_k, d): every sequence reads row 0 (``cache_batch_idx``) from its first
  key (``cache_leftpad`` = cu_seqlens_k[:-1]) to its last (``cache_seqlens`` = its end:
  cu_seqlens_k[1:], or the start + seqused_k). Local key j of a sequence is then its key j,
  which is what the masks and attention_chunk count;
- seqused_q: the segments of :mod:`flashattn.api.segments` (the used rows of each sequence,
  then a segment with no keys for the rest, which gets 0 and lse -inf as the varlen call
  writes them).

Window sides follow flash-attn 2's rule against seqlen_k / max_seqlen_k here, before the call
(the KV-cache call applies the same rule against its capacity, which for the one-row cache is
total_k). Everything is torch ops on the lengths' device: no host read, CUDA-graph
capturable. The output refuses a backward with NotImplementedError (``ops.forward_only``);
inputs that require grad are accepted, as FA3's tests pass them.
"""
from __future__ import annotations

from typing import Optional, Sequence, Tuple

import torch

from flashattn import ops as _ops
from flashattn.api import fp8_attention as _fp8
from flashattn.api import kvcache as _kvcache
from flashattn.api import kvcache_validation as _kv
from flashattn.api import normalise as _p
from flashattn.api import segments as _segments
from flashattn.api import validation as _v
from flashattn.api import varlen as _varlen

Tensor = torch.Tensor

NO_BACKWARD = ("qv (multi-head latent attention) in flash_attn_func / flash_attn_varlen_func "
               "is forward only (FlashAttention-3 has no backward for it either); run the "
               "call under torch.no_grad(), or without qv to train")


def _check_not_fp8(q: Tensor, k: Tensor, v: Tensor, descales: Sequence[Optional[Tensor]]
                   ) -> None:
    """FA3 takes qv with fp16 / bf16 inputs only (its latent kernels are 16-bit ones)."""
    if _fp8.is_fp8(q, k, v):
        raise NotImplementedError("qv (multi-head latent attention) with FP8 q / k / v is not "
                                  "supported (FlashAttention-3 takes qv with float16 / "
                                  "bfloat16 inputs only): pass q, k, v and qv in bf16 / fp16")
    _fp8.check_descales_need_fp8(False, descales, None)


def _splits(num_splits: object) -> int:
    """FA3's num_splits (<= 0: its heuristic) as the KV-cache call's (0: the heuristic)."""
    if isinstance(num_splits, int) and not isinstance(num_splits, bool) and num_splits < 0:
        return 0
    return _kv.check_num_splits(num_splits)


def _no_keys(q: Tensor, v: Tensor, packed: bool) -> Tuple[Tensor, Tensor]:
    """The result of a call without a single key (the KV-cache call needs a cache of >= 1
    row and >= 1 position): out 0 (q's shape, d_v wide), lse -inf."""
    out = torch.zeros((*q.shape[:-1], v.shape[-1]), dtype=q.dtype, device=q.device)
    if packed:  # (total_q, h) -> lse (h, total_q)
        lse_shape = (q.shape[1], q.shape[0])
    else:       # (b, s_q, h) -> lse (b, h, s_q)
        lse_shape = (q.shape[0], q.shape[2], q.shape[1])
    return out, torch.full(lse_shape, float("-inf"), dtype=torch.float32, device=q.device)


def dense(q: Tensor, k: Tensor, v: Tensor, qv: Tensor, *, softmax_scale: Optional[float],
          causal: bool, window_size: Sequence[int], attention_chunk: int, softcap: float,
          num_splits: int, descales: Sequence[Optional[Tensor]] = (None, None, None)
          ) -> Tuple[Tensor, Tensor]:
    """FA3's dense forward with ``qv``: q (b, s_q, h, d), k (b, s_k, h_k, d), v (b, s_k, h_k,
    d_v), qv (b, s_q, h, d_v), all one 16/32-bit dtype. Returns out (b, s_q, h, d_v) in q's
    dtype (refusing a backward) and lse (b, h, s_q) float32."""
    _check_not_fp8(q, k, v, descales)
    _v.check_qkv(q, k, v, max_head_dim_v=_v.MAX_HEAD_DIM_V)
    _kv.check_qv(qv, q, v, "v")
    scale, causal, left, right, softcap, _ = _v.check_options(softmax_scale, causal,
                                                              window_size, softcap, False)
    attention_chunk = _v.check_attention_chunk(attention_chunk)
    splits = _splits(num_splits)
    left, right = _p.window(left, right, causal, k.shape[1])
    if k.shape[0] == 0 or k.shape[1] == 0:
        out, lse = _no_keys(q, v, packed=False)
    else:
        with torch.no_grad():
            out, lse = _kvcache.flash_attn_with_kvcache(
                q, k, v, softmax_scale=scale, causal=causal, window_size=(left, right),
                softcap=softcap, num_splits=splits, return_softmax_lse=True,
                attention_chunk=attention_chunk, qv=qv)
    return _ops.forward_only(out, (q, k, v, qv), NO_BACKWARD), lse


def varlen(q: Tensor, k: Tensor, v: Tensor, qv: Tensor, cu_seqlens_q: Tensor,
           cu_seqlens_k: Tensor, max_seqlen_q: int, max_seqlen_k: int, *,
           seqused_q: Optional[Tensor], seqused_k: Optional[Tensor],
           softmax_scale: Optional[float], causal: bool, window_size: Sequence[int],
           attention_chunk: int, softcap: float, num_splits: int,
           descales: Sequence[Optional[Tensor]] = (None, None, None)) -> Tuple[Tensor, Tensor]:
    """FA3's varlen forward with ``qv``: packed q (total_q, h, d), k (total_k, h_k, d), v
    (total_k, h_k, d_v), qv (total_q, h, d_v); int32 cu_seqlens (batch + 1,), seqused_q /
    seqused_k int32 (batch,) or None. Returns out (total_q, h, d_v) in q's dtype (refusing a
    backward) and lse (h, total_q) float32."""
    _check_not_fp8(q, k, v, descales)
    _v.check_varlen_qkv(q, k, v, max_head_dim_v=_v.MAX_HEAD_DIM_V)
    _kv.check_qv(qv, q, v, "v")
    batch = _v.check_cu_seqlens(cu_seqlens_q, cu_seqlens_k, q.device)
    max_seqlen_q = _v.check_max_seqlen(max_seqlen_q, "max_seqlen_q")
    max_seqlen_k = _v.check_max_seqlen(max_seqlen_k, "max_seqlen_k")
    _v.check_seqused_k(seqused_k, batch, q.device)
    _v.check_seqused_k(seqused_q, batch, q.device, "seqused_q")
    scale, causal, left, right, softcap, _ = _v.check_options(softmax_scale, causal,
                                                              window_size, softcap, False)
    attention_chunk = _v.check_attention_chunk(attention_chunk)
    splits = _splits(num_splits)
    _varlen.check_values(cu_seqlens_q, cu_seqlens_k, seqused_k, max_seqlen_q, max_seqlen_k,
                         q.shape[0], k.shape[0])
    _varlen.check_seqused_q_values(cu_seqlens_q, seqused_q)
    # flash-attn 2 (varlen): the window rule against max_seqlen_k (the batch maximum)
    left, right = _p.window(left, right, causal, max_seqlen_k)
    if batch == 0 or k.shape[0] == 0:
        out, lse = _no_keys(q, v, packed=True)
        return _ops.forward_only(out, (q, k, v, qv), NO_BACKWARD), lse
    if seqused_q is not None:
        seg = _segments.build(cu_seqlens_q, cu_seqlens_k, seqused_q, seqused_k, 0,
                              max_seqlen_q, max_seqlen_k)
        cu_q, key_start, key_count, max_q = (seg.cu_seqlens_q, seg.cu_seqlens_k[:-1],
                                             seg.seqused_k, seg.max_seqlen_q)
    else:
        cu_q, key_start, max_q = cu_seqlens_q, cu_seqlens_k[:-1], max_seqlen_q
        key_count = cu_seqlens_k[1:] - key_start if seqused_k is None else seqused_k
    n = key_start.shape[0]
    with torch.no_grad():
        out, lse = _kvcache.flash_attn_with_kvcache(
            q, k.unsqueeze(0), v.unsqueeze(0),
            cache_seqlens=(key_start + key_count).to(torch.int32),
            cache_batch_idx=torch.zeros(n, dtype=torch.int32, device=q.device),
            cache_leftpad=key_start.to(torch.int32).contiguous(), softmax_scale=scale,
            causal=causal, window_size=(left, right), softcap=softcap, num_splits=splits,
            return_softmax_lse=True, attention_chunk=attention_chunk, cu_seqlens_q=cu_q,
            max_seqlen_q=max_q, qv=qv)
    return _ops.forward_only(out, (q, k, v, qv), NO_BACKWARD), lse


__all__ = ["NO_BACKWARD", "dense", "varlen"]
