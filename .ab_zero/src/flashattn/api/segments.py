"""Chunked local attention (``attention_chunk``) and ``seqused_q`` as a list of segments.

Both features hide whole blocks of the score matrix along the sequences' own axes, so instead
of new masks in every kernel they become a different packing of the same varlen problem:

- ``attention_chunk`` = C (FlashAttention-3, Llama-4): key j is visible from a query at key
  position p only when ``j // C == floor(p / C)`` (besides causal / window). The query rows of
  one sequence that share a chunk are contiguous, and so are the keys of that chunk; each
  (rows of chunk c, keys of chunk c) pair is one *segment* of a varlen call.
- ``seqused_q``: only the first ``seqused_q[b]`` rows of sequence b are queries; the rest of
  its rows form a segment with no keys (the varlen kernels write 0 there, lse -inf).

Why this is exact: inside a segment the varlen kernels align the last query row with the last
key (bottom-right), and both end at the same absolute position ``min((c + 1) C, s_k) - 1``
(query positions run up to s_k - 1), so every relative distance, hence causal, window and
ALiBi, is that of the full problem. Keys before a segment's range are skipped through its
``seqused_k`` (the kernels accept gaps between key ranges); the backward of the varlen op over
the same segments is the exact gradient (keys in no segment get 0).

Everything is torch ops on the metadata's device (no host read, CUDA-graph capturable); the
number of segments is bounded on the host from max_seqlen_q: ``ceil(max_seqlen_q / C) + 1``
per sequence, plus one for a seqused_q tail. Unused segments are empty.
"""
from __future__ import annotations

from typing import NamedTuple, Optional

import torch

Tensor = torch.Tensor


class Segments(NamedTuple):
    """A varlen problem equivalent to the chunked / seqused_q one.

    cu_seqlens_q: int32 (n + 1,): segment i owns query rows [cu_seqlens_q[i], cu_seqlens_q[i+1]).
    cu_seqlens_k: int32 (n + 1,): segment i's keys start at cu_seqlens_k[i] ...
    seqused_k: int32 (n,): ... and it has seqused_k[i] of them.
    sequence: int64 (n,): the input sequence (batch entry) of each segment (ALiBi slopes).
    max_seqlen_q / max_seqlen_k: host bounds of any segment's lengths.
    """

    cu_seqlens_q: Tensor
    cu_seqlens_k: Tensor
    seqused_k: Tensor
    sequence: Tensor
    max_seqlen_q: int
    max_seqlen_k: int


def chunk_is_noop(attention_chunk: int, max_seqlen_k: int, window_right: int,
                  seqlen_q_le_k: bool) -> bool:
    """Whether a chunk of C positions hides nothing: every key is in chunk 0 (C >= s_k) and
    no query sits at a negative position (seqlen_q <= seqlen_k for every sequence, or a
    causal right edge, which already hides everything from such a query)."""
    if attention_chunk <= 0:
        return True
    return attention_chunk >= max_seqlen_k and (seqlen_q_le_k or window_right == 0)


def dense_cu_seqlens(batch: int, seqlen: int, device: torch.device) -> Tensor:
    """int32 (batch + 1,) cumulative lengths of ``batch`` sequences of ``seqlen`` rows each
    (a dense (b, s, ...) tensor viewed as (b * s, ...)), built on ``device``."""
    return torch.arange(0, (batch + 1) * seqlen, seqlen, dtype=torch.int32, device=device) \
        if seqlen > 0 else torch.zeros(batch + 1, dtype=torch.int32, device=device)


def build(cu_seqlens_q: Tensor, cu_seqlens_k: Tensor, seqused_q: Optional[Tensor],
          seqused_k: Optional[Tensor], attention_chunk: int, max_seqlen_q: int,
          max_seqlen_k: int) -> Segments:
    """The segments of sequences ``cu_seqlens_q`` / ``cu_seqlens_k`` (int32 (b + 1,)),
    optional ``seqused_q`` / ``seqused_k`` (int32 (b,)), chunk C (0 = none).

    Sequence b has ``lq = seqused_q[b]`` (or all its rows) queries at key positions
    ``p = i + lk - lq`` and ``lk`` keys. Its piece t (t = 0 .. P - 1, P = ceil(max_seqlen_q /
    C) + 1) is chunk ``c = floor((lk - lq) / C) + t``: rows ``[c C - (lk - lq), (c + 1) C -
    (lk - lq))`` and keys ``[c C, (c + 1) C)``, both clipped to the sequence. Chunks below 0
    hold the rows at negative positions and no key. The P pieces cover every row.
    """
    device = cu_seqlens_q.device
    q_start = cu_seqlens_q[:-1].long()
    q_rows = (cu_seqlens_q[1:].long() - q_start).clamp_min(0)
    lq = q_rows if seqused_q is None else torch.minimum(seqused_q.long().clamp_min(0), q_rows)
    k_start = cu_seqlens_k[:-1].long()
    lk = (cu_seqlens_k[1:].long() - k_start) if seqused_k is None else seqused_k.long()
    lk = lk.clamp_min(0)
    if attention_chunk > 0:
        chunk = int(attention_chunk)
        pieces = -(-max_seqlen_q // chunk) + 1
        offset = (lk - lq)[:, None]
        c = torch.div(offset, chunk, rounding_mode="floor") \
            + torch.arange(pieces, device=device)[None, :]
        row_lo = torch.minimum((c * chunk - offset).clamp_min(0), lq[:, None])
        key_lo = torch.minimum((c * chunk).clamp_min(0), lk[:, None])
        key_hi = torch.minimum(((c + 1) * chunk).clamp_min(0), lk[:, None])
        max_q, max_k = min(max_seqlen_q, chunk), min(max_seqlen_k, chunk)
    else:
        row_lo = torch.zeros_like(lq)[:, None]
        key_lo = torch.zeros_like(lk)[:, None]
        key_hi = lk[:, None]
        max_q, max_k = max_seqlen_q, max_seqlen_k
    seg_q = q_start[:, None] + row_lo
    seg_k = k_start[:, None] + key_lo
    seg_used = key_hi - key_lo
    if seqused_q is not None:
        # rows past seqused_q: one more segment per sequence, with no keys
        seg_q = torch.cat([seg_q, (q_start + lq)[:, None]], dim=1)
        seg_k = torch.cat([seg_k, (k_start + key_hi[:, -1])[:, None]], dim=1)
        seg_used = torch.cat([seg_used, torch.zeros_like(seg_used[:, :1])], dim=1)
        max_q = max_seqlen_q
    per_seq = seg_q.shape[1]
    batch = q_start.shape[0]
    cu_q = torch.cat([seg_q.reshape(-1), cu_seqlens_q[-1:].long()]).to(torch.int32)
    # the end of the last key range: past every segment's start (the kernels read a segment's
    # keys through seqused_k, so this entry only bounds the packing)
    cu_k = torch.cat([seg_k.reshape(-1), torch.maximum(cu_seqlens_k[-1:].long(),
                                                        seg_k.reshape(-1)[-1:])]).to(torch.int32)
    sequence = torch.arange(batch, device=device).repeat_interleave(per_seq)
    return Segments(cu_q, cu_k, seg_used.reshape(-1).to(torch.int32), sequence, max_q, max_k)


__all__ = ["Segments", "build", "chunk_is_noop", "dense_cu_seqlens"]
