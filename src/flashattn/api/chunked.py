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

from typing import Callable, Optional, Tuple

import torch

from flashattn import ops as _ops
from flashattn.api import segments as _segments

Tensor = torch.Tensor


def _alibi_for(alibi_slopes: Optional[Tensor], sequence: Tensor) -> Optional[Tensor]:
    """(b, h) slopes -> (n_segments, h): each segment takes its sequence's row."""
    return None if alibi_slopes is None else alibi_slopes[sequence]


def by_chunks(q: Tensor, k: Tensor, v: Tensor, chunk: int,
              dense_call: Callable[[Tensor, Tensor, Tensor, int], Tuple[Tensor, Tensor]],
              segments_call: Callable[[Tensor, Tensor, Tensor, "_segments.Segments"],
                                      Tuple[Tensor, Tensor]]) -> Tuple[Tensor, Tensor]:
    """A dense call with ``attention_chunk`` = chunk, for any kernel family: q (b, s_q, h, d),
    k / v (b, s_k, h_k, d[_v]); returns out (b, s_q, h, d_v) and lse float32 (b, h, s_q).

    Equal lengths that the chunk divides: ``dense_call(qc, kc, vc, n)`` on b * n sequences of
    chunk rows (views; sequence i of the call is chunk i % n of batch entry i // n, so a
    per-batch tensor is ``x.repeat_interleave(n, 0)``), returning (out, lse) in that dense
    layout. Otherwise ``segments_call(q, k, v, seg)`` on the packed rows and the segments of
    ``seg`` (``seg.sequence`` the batch entry of each), returning (out (b * s_q, h, d_v), lse
    (h, b * s_q))."""
    b, s_q, h, _ = q.shape
    s_k, h_k = k.shape[1], k.shape[2]
    if s_q == s_k and s_k % chunk == 0:
        n = s_k // chunk
        out, lse = dense_call(*(x.reshape(b * n, chunk, *x.shape[2:]) for x in (q, k, v)), n)
        lse = lse.view(b, n, h, chunk).permute(0, 2, 1, 3).reshape(b, h, s_q)
        return out.reshape(b, s_q, h, out.shape[3]), lse
    seg = _segments.build(_segments.dense_cu_seqlens(b, s_q, q.device),
                          _segments.dense_cu_seqlens(b, s_k, q.device), None, None, chunk,
                          s_q, s_k)
    out, lse = segments_call(q.reshape(b * s_q, h, q.shape[3]),
                             k.reshape(b * s_k, h_k, k.shape[3]),
                             v.reshape(b * s_k, h_k, v.shape[3]), seg)
    return out.view(b, s_q, h, out.shape[2]), lse.view(h, b, s_q).permute(1, 0, 2).contiguous()


def dense(q: Tensor, k: Tensor, v: Tensor, alibi_slopes: Optional[Tensor],
          philox_seed: Optional[Tensor], scale: float, causal: bool, window_left: int,
          window_right: int, softcap: float, dropout_p: float, deterministic: bool,
          attention_chunk: int, learnable_sink: Optional[Tensor]) -> Tuple[Tensor, Tensor]:
    """Chunked dense attention: q (b, s_q, h, d), k / v (b, s_k, h_k, d[_v]); returns out
    (b, s_q, h, d_v) and lse float32 (b, h, s_q)."""
    def dense_call(qc: Tensor, kc: Tensor, vc: Tensor, n: int) -> Tuple[Tensor, Tensor]:
        alibi = None if alibi_slopes is None else alibi_slopes.repeat_interleave(n, dim=0)
        if learnable_sink is not None:
            return _ops.attention_with_sink(qc, kc, vc, learnable_sink, alibi, scale, causal,
                                            window_left, window_right, softcap, deterministic)
        out, lse, _ = _ops.attention(qc, kc, vc, alibi, philox_seed, scale, causal,
                                     window_left, window_right, softcap, dropout_p,
                                     deterministic, False)
        return out, lse

    def segments_call(qp: Tensor, kp: Tensor, vp: Tensor, seg: "_segments.Segments"
                      ) -> Tuple[Tensor, Tensor]:
        return _over_segments(qp, kp, vp, seg, alibi_slopes, philox_seed, scale, causal,
                              window_left, window_right, softcap, dropout_p, deterministic,
                              learnable_sink)

    return by_chunks(q, k, v, attention_chunk, dense_call, segments_call)


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
    return _over_segments(q, k, v, seg, alibi_slopes, philox_seed, scale, causal, window_left,
                          window_right, softcap, dropout_p, deterministic, learnable_sink)


def _over_segments(q: Tensor, k: Tensor, v: Tensor, seg: "_segments.Segments",
                   alibi_slopes: Optional[Tensor], philox_seed: Optional[Tensor], scale: float,
                   causal: bool, window_left: int, window_right: int, softcap: float,
                   dropout_p: float, deterministic: bool, learnable_sink: Optional[Tensor]
                   ) -> Tuple[Tensor, Tensor]:
    """The varlen op over the segments ``seg`` (each with its sequence's ALiBi slopes)."""
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


__all__ = ["by_chunks", "dense", "varlen"]
