"""Calls with ``attention_chunk`` (chunked local attention) or ``seqused_q``, run as the
equivalent segmented varlen call (:mod:`flashattn.api.segments` says why it is exact).

Arguments arrive validated and normalised (window against the call's own seqlen_k /
max_seqlen_k, causal folded in, ALiBi as (b, h)). Outputs have the layout of the call that was
asked for; gradients flow through the reshapes and the varlen op's autograd formula.

A dense call whose query and key lengths are equal and a multiple of the chunk is simply a
dense call over ``batch * (s / C)`` sequences of C rows (a view of the same tensors), so it
keeps every dense backend (the Hopper kernels included). Other calls become varlen segments
(the portable / CPU varlen kernels).
"""
from __future__ import annotations

from typing import Optional, Tuple

import torch

from flashattn import ops as _ops
from flashattn.api import segments as _segments

Tensor = torch.Tensor


def _alibi_for(alibi_slopes: Optional[Tensor], sequence: Tensor) -> Optional[Tensor]:
    """(b, h) slopes -> (n_segments, h): each segment takes its sequence's row."""
    return None if alibi_slopes is None else alibi_slopes[sequence]


def dense(q: Tensor, k: Tensor, v: Tensor, alibi_slopes: Optional[Tensor],
          philox_seed: Optional[Tensor], scale: float, causal: bool, window_left: int,
          window_right: int, softcap: float, dropout_p: float, deterministic: bool,
          attention_chunk: int, learnable_sink: Optional[Tensor]) -> Tuple[Tensor, Tensor]:
    """Chunked dense attention: q (b, s_q, h, d), k / v (b, s_k, h_k, d[_v]); returns out
    (b, s_q, h, d_v) and lse float32 (b, h, s_q)."""
    b, s_q, h, _ = q.shape
    s_k, h_k = k.shape[1], k.shape[2]
    chunk = attention_chunk
    if s_q == s_k and s_k % chunk == 0:
        n = s_k // chunk
        qc = q.reshape(b * n, chunk, h, q.shape[3])
        kc = k.reshape(b * n, chunk, h_k, k.shape[3])
        vc = v.reshape(b * n, chunk, h_k, v.shape[3])
        alibi = None if alibi_slopes is None else alibi_slopes.repeat_interleave(n, dim=0)
        if learnable_sink is not None:
            out, lse = _ops.attention_with_sink(qc, kc, vc, learnable_sink, alibi, scale, causal,
                                                window_left, window_right, softcap,
                                                deterministic)
        else:
            out, lse, _ = _ops.attention(qc, kc, vc, alibi, philox_seed, scale, causal,
                                         window_left, window_right, softcap, dropout_p,
                                         deterministic, False)
        lse = lse.view(b, n, h, chunk).permute(0, 2, 1, 3).reshape(b, h, s_q)
        return out.reshape(b, s_q, h, out.shape[3]), lse
    cu_q = _segments.dense_cu_seqlens(b, s_q, q.device)
    cu_k = _segments.dense_cu_seqlens(b, s_k, q.device)
    out, lse = varlen(q.reshape(b * s_q, h, q.shape[3]), k.reshape(b * s_k, h_k, k.shape[3]),
                      v.reshape(b * s_k, h_k, v.shape[3]), cu_q, cu_k, None, None, s_q, s_k,
                      alibi_slopes, philox_seed, scale, causal, window_left, window_right,
                      softcap, dropout_p, deterministic, chunk, learnable_sink)
    return out.view(b, s_q, h, out.shape[2]), lse.view(h, b, s_q).permute(1, 0, 2).contiguous()


def varlen(q: Tensor, k: Tensor, v: Tensor, cu_seqlens_q: Tensor, cu_seqlens_k: Tensor,
           seqused_q: Optional[Tensor], seqused_k: Optional[Tensor], max_seqlen_q: int,
           max_seqlen_k: int, alibi_slopes: Optional[Tensor], philox_seed: Optional[Tensor],
           scale: float, causal: bool, window_left: int, window_right: int, softcap: float,
           dropout_p: float, deterministic: bool, attention_chunk: int,
           learnable_sink: Optional[Tensor]) -> Tuple[Tensor, Tensor]:
    """Packed q (total_q, h, d), k / v (total_k, h_k, d[_v]) with chunking and / or
    seqused_q: out (total_q, h, d_v) (0 on rows past seqused_q), lse (h, total_q)."""
    seg = _segments.build(cu_seqlens_q, cu_seqlens_k, seqused_q, seqused_k, attention_chunk,
                          max_seqlen_q, max_seqlen_k)
    alibi = _alibi_for(alibi_slopes, seg.sequence)
    if learnable_sink is not None:
        return _ops.varlen_attention_with_sink(
            q, k, v, learnable_sink, seg.cu_seqlens_q, seg.cu_seqlens_k, seg.seqused_k, alibi,
            seg.max_seqlen_q, seg.max_seqlen_k, scale, causal, window_left, window_right,
            softcap, deterministic)
    out, lse, _ = _ops.varlen_attention(
        q, k, v, seg.cu_seqlens_q, seg.cu_seqlens_k, seg.seqused_k, None, alibi,
        seg.max_seqlen_q, seg.max_seqlen_k, scale, causal, window_left, window_right, softcap,
        dropout_p, philox_seed, deterministic, False)
    return out, lse


__all__ = ["dense", "varlen"]
