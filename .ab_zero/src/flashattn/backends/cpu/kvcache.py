"""KV-cache attention in plain torch: the backend for CPU tensors without the interpreter.

Same semantics as the Triton path (``triton/rotary.py`` + ``triton/decode.py``): the new
keys / values are rotated (optional) and written into the cache in place, q is rotated,
then every batch row gathers its keys ``[leftpad, cache_seqlens + s_new)`` (through the
block table when paged) and runs :func:`flashattn.backends.cpu.chunked_fwd` on them, so memory stays
O(tile) beyond the gathered keys of one row. Lengths are read on the host, which is free
for CPU tensors. ``num_splits`` does not change the math and is ignored here.

FP8 caches (float8_e4m3fn, one float32 descale per (batch row, KV head)): the append quantizes
as the Triton path does (:func:`quantize`), the attention dequantizes each row's gathered keys
and values to float32 (``fp8 * descale``, exact) and attends in float32: the exact answer on
the dequantized cache, returned in q's dtype. A float8_e4m3fn q (FlashAttention-3's, with
q_descale per (batch row, KV head), shared by the group's query heads) is dequantized the
same way and the output is bfloat16.

Multi-head latent attention (FlashAttention-3's ``qv``): the score ``q.k + qv.v`` is the dot of
the concatenated query ``[q, qv]`` with ``[k, v]``, so each row attends with those as its
query and keys and with v as its values: one exact softmax, nothing new to get wrong.
"""
from __future__ import annotations

from typing import Optional, Tuple

import torch

from flashattn.backends.cpu.dense import chunked_fwd


def rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, positions: torch.Tensor,
           interleaved: bool) -> torch.Tensor:
    """Rotary embedding of x (b, s, nh, d) at integer ``positions`` (b, s), computed in fp32
    (float64 for float64 inputs) and returned in x's dtype. Positions past the table keep x.
    """
    comp = torch.promote_types(x.dtype, torch.float32)
    half = cos.shape[1]
    rot = 2 * half
    valid = positions < cos.shape[0]
    idx = positions.clamp(max=cos.shape[0] - 1).clamp(min=0).long()
    c = cos.to(comp)[idx].unsqueeze(2)  # (b, s, 1, half)
    s = sin.to(comp)[idx].unsqueeze(2)
    xr = x[..., :rot].to(comp)
    if interleaved:
        x0, x1 = xr[..., 0::2], xr[..., 1::2]
        r0, r1 = x0 * c - x1 * s, x1 * c + x0 * s
        rotated = torch.stack((r0, r1), dim=-1).flatten(-2)
    else:
        x0, x1 = xr[..., :half], xr[..., half:]
        rotated = torch.cat((x0 * c - x1 * s, x1 * c + x0 * s), dim=-1)
    rotated = torch.where(valid[:, :, None, None], rotated, xr)
    return torch.cat((rotated.to(x.dtype), x[..., rot:]), dim=-1)


def _cache_rows(batch: int, positions: torch.Tensor, page_size: int,
                block_table: Optional[torch.Tensor], batch_idx: Optional[torch.Tensor]
                ) -> Tuple[torch.Tensor, torch.Tensor]:
    """(dim-0 index, dim-1 index) of cache positions (b, n) for every batch row."""
    if block_table is not None:
        pages = torch.gather(block_table.long(), 1, positions // page_size)
        return pages, positions % page_size
    rows = batch_idx.long() if batch_idx is not None else torch.arange(
        batch, device=positions.device)
    return rows.view(-1, 1).expand_as(positions), positions


def quantize(x: torch.Tensor, descale: torch.Tensor) -> torch.Tensor:
    """x (b, s, h_k, d) in a 16/32-bit dtype -> float8_e4m3fn with descale (b, h_k) float32:
    ``x / descale`` in float32, saturated to +-448, rounded to nearest even."""
    y = x.float() / descale.float()[:, None, :, None]
    return y.clamp(-448.0, 448.0).to(torch.float8_e4m3fn)


def _dequantize(x8: torch.Tensor, descale: Optional[torch.Tensor]) -> torch.Tensor:
    """A gathered FP8 row (1, s_k, h_k, d) and its descale (1, h_k) -> float32 real values."""
    return x8.float() * descale.float()[:, None, :, None]


def append_kv(k_cache: torch.Tensor, v_cache: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
              cache_seqlens: torch.Tensor, cos: Optional[torch.Tensor],
              sin: Optional[torch.Tensor], interleaved: bool,
              batch_idx: Optional[torch.Tensor], block_table: Optional[torch.Tensor],
              rot_base: Optional[torch.Tensor] = None,
              k_descale: Optional[torch.Tensor] = None,
              v_descale: Optional[torch.Tensor] = None) -> None:
    """Write k (rotated if cos is given) and v at cache positions cache_seqlens[b] + i; the
    rotation angle's position is ``rot_base[b] + i`` (default: the cache position).
    ``k_descale`` / ``v_descale`` (b, h_k) float32: FP8 caches, k / v quantized in
    (:func:`quantize`, after the rotation in k's dtype; float8_e4m3fn k / v come with ones
    and are rotated in float32, so they are rounded once, as the Triton path does)."""
    b, s_new = k.shape[:2]
    if k.dtype == torch.float8_e4m3fn:
        k = k.float()
    if v.dtype == torch.float8_e4m3fn:
        v = v.float()
    steps = torch.arange(s_new, device=k.device)
    positions = cache_seqlens.long().view(-1, 1) + steps
    if cos is not None:
        angle_pos = positions if rot_base is None else rot_base.long().view(-1, 1) + steps
        k = rotate(k, cos, sin, angle_pos, interleaved)
    d0, d1 = _cache_rows(b, positions, k_cache.shape[1], block_table, batch_idx)
    if k_descale is not None:
        k, v = quantize(k, k_descale), quantize(v, v_descale)
    k_cache[d0, d1] = k.to(k_cache.dtype)
    v_cache[d0, d1] = v.to(v_cache.dtype)


def out_dtype(q: torch.Tensor) -> torch.dtype:
    """q's dtype, bfloat16 for a float8_e4m3fn q (FlashAttention-3's rule)."""
    return torch.bfloat16 if q.dtype == torch.float8_e4m3fn else q.dtype


def kvcache_fwd(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                seqlens_k: torch.Tensor, seqlen_k_add: int, *, softmax_scale: float,
                window_left: int, window_right: int, softcap: float,
                alibi_slopes: Optional[torch.Tensor], leftpad: Optional[torch.Tensor],
                batch_idx: Optional[torch.Tensor], block_table: Optional[torch.Tensor],
                attention_chunk: int = 0, k_descale: Optional[torch.Tensor] = None,
                v_descale: Optional[torch.Tensor] = None,
                q_descale: Optional[torch.Tensor] = None, qv: Optional[torch.Tensor] = None
                ) -> Tuple[torch.Tensor, torch.Tensor]:
    """Attention of q (b, s_q, h, d) against each row's keys ``[leftpad, seqlens_k +
    seqlen_k_add)`` of the cache. Returns out (b, s_q, h, d_v) in q's dtype and lse float32
    (b, h, s_q) (-inf / 0 on rows that see no key). With ``attention_chunk`` C > 0 each row's
    queries are split by chunk (:func:`chunk_pieces`) and each piece sees its chunk's keys.
    ``k_descale`` / ``v_descale`` (b, h_k) float32: FP8 caches, attended in float32 on their
    dequantized values; ``q_descale`` (b, h_k) float32 likewise for a float8_e4m3fn (or its
    rotated bf16) q, whose out is bfloat16. ``qv`` (b, s_q, h, d_v) (FlashAttention-3's latent
    query): scores ``q.k + qv.v``, computed as the one dot of ``[q, qv]`` with ``[k, v]`` per
    KV head (the query heads of a GQA group share it; no KV head is repeated), values v."""
    b, s_q, h, _ = q.shape
    d_v = v_cache.shape[3]
    out = torch.zeros(b, s_q, h, d_v, dtype=out_dtype(q) if q_descale is None
                      else torch.bfloat16, device=q.device)
    lse = torch.full((b, h, s_q), float("-inf"), dtype=torch.float32, device=q.device)
    ends = (seqlens_k.long() + seqlen_k_add).tolist()
    starts = leftpad.tolist() if leftpad is not None else [0] * b
    page_size = k_cache.shape[1]
    for i in range(b):
        s_k = ends[i] - starts[i]
        if s_k <= 0 or s_q == 0:
            continue
        positions = torch.arange(starts[i], ends[i], device=q.device).view(1, -1)
        row = batch_idx[i:i + 1] if batch_idx is not None else torch.tensor([i])
        d0, d1 = _cache_rows(1, positions, page_size,
                             None if block_table is None else block_table[i:i + 1],
                             row.to(q.device))
        k_i, v_i = k_cache[d0, d1], v_cache[d0, d1]  # (1, s_k, h_k, d)
        q_i = q[i:i + 1]
        if k_descale is not None:
            k_i = _dequantize(k_i, k_descale[i:i + 1])
            v_i = _dequantize(v_i, v_descale[i:i + 1])
            q_i = q_i.float()
        if q_descale is not None:  # query head j uses its KV head's descale, j // (h / h_k)
            q_i = q_i * q_descale[i].float().repeat_interleave(h // k_cache.shape[2])[
                None, None, :, None]
        if qv is not None:
            # (the dequantized v in an FP8 cache: the latent score is against real values)
            q_i = torch.cat((q_i, qv[i:i + 1].to(q_i.dtype)), dim=-1)
            k_i = torch.cat((k_i, v_i), dim=-1)
        for r0, r1, k0, k1 in chunk_pieces(s_q, s_k, attention_chunk):
            if k1 <= k0:
                continue  # rows before the first key: no key in their chunk
            o_i, lse_i, _ = chunked_fwd(
                q_i[:, r0:r1], k_i[:, k0:k1], v_i[:, k0:k1], softmax_scale=softmax_scale,
                causal=window_right == 0, window_left=window_left, window_right=window_right,
                softcap=softcap,
                alibi_slopes=None if alibi_slopes is None else alibi_slopes[i:i + 1],
                dropout_p=0.0, philox_seed=0, return_softmax=False)
            out[i, r0:r1] = o_i[0].to(out.dtype)
            lse[i, :, r0:r1] = lse_i[0]
    return out, lse


def chunk_pieces(s_q: int, s_k: int, chunk: int):
    """(row_lo, row_hi, key_lo, key_hi) per chunk of ``chunk`` key positions (chunked local
    attention; chunk 0 = one piece of everything). Query row r sits at key position
    ``r + s_k - s_q``; the rows and keys of one chunk end at the same position, so the
    bottom-right alignment of each piece keeps every relative distance (window, ALiBi)."""
    if chunk <= 0:
        return [(0, s_q, 0, s_k)]
    offset = s_k - s_q
    pieces = []
    for c in range(offset // chunk, (s_k - 1) // chunk + 1):
        r0, r1 = max(c * chunk - offset, 0), min((c + 1) * chunk - offset, s_q)
        if r1 > r0:
            pieces.append((r0, r1, max(c * chunk, 0), max(min((c + 1) * chunk, s_k), 0)))
    return pieces


def varlen_paged_fwd(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                     cu_seqlens_q: torch.Tensor, cu_seqlens_k: torch.Tensor,
                     seqused_k: Optional[torch.Tensor], block_table: torch.Tensor, *,
                     softmax_scale: float, window_left: int, window_right: int, softcap: float,
                     alibi_slopes: Optional[torch.Tensor]) -> Tuple[torch.Tensor, torch.Tensor]:
    """Packed queries (total_q, h, d) against a paged cache; lse (h, total_q)."""
    total_q, h, _ = q.shape
    out = torch.zeros(total_q, h, v_cache.shape[3], dtype=q.dtype, device=q.device)
    lse = torch.full((h, total_q), float("-inf"), dtype=torch.float32, device=q.device)
    cu_q = cu_seqlens_q.tolist()
    if seqused_k is not None:
        lens_k = seqused_k.tolist()
    else:
        cu_k = cu_seqlens_k.tolist()
        lens_k = [e - s for s, e in zip(cu_k, cu_k[1:])]
    for i in range(len(cu_q) - 1):
        q0, q1 = cu_q[i], cu_q[i + 1]
        if q1 <= q0:
            continue
        seqlens = torch.tensor([lens_k[i]], dtype=torch.int32, device=q.device)
        o_i, lse_i = kvcache_fwd(
            q[q0:q1].unsqueeze(0), k_cache, v_cache, seqlens, 0, softmax_scale=softmax_scale,
            window_left=window_left, window_right=window_right, softcap=softcap,
            alibi_slopes=None if alibi_slopes is None else alibi_slopes[i:i + 1],
            leftpad=None, batch_idx=None, block_table=block_table[i:i + 1])
        out[q0:q1] = o_i[0]
        lse[:, q0:q1] = lse_i[0]
    return out, lse


def combine(out_partial: torch.Tensor, lse_partial: torch.Tensor, out_dtype: torch.dtype
            ) -> Tuple[torch.Tensor, torch.Tensor]:
    """Merge split results (see ``triton/combine.py``): out_partial (S, b, s_q, h, d_v),
    lse_partial (S, b, h, s_q) -> out (b, s_q, h, d_v) in out_dtype, lse (b, h, s_q) fp32."""
    lse_p = lse_partial.float()
    lse_max = lse_p.amax(dim=0)
    any_key = lse_max > float("-inf")
    lse_ref = torch.where(any_key, lse_max, torch.zeros_like(lse_max))
    w = torch.exp(lse_p - lse_ref)  # 0 for splits that saw no key
    w_sum = w.sum(dim=0)
    w_sum_safe = torch.where(any_key, w_sum, torch.ones_like(w_sum))
    lse = torch.where(any_key, lse_ref + torch.log(w_sum_safe),
                      torch.full_like(w_sum, float("-inf")))
    w = (w / w_sum_safe).permute(0, 1, 3, 2).unsqueeze(-1)  # (S, b, s_q, h, 1)
    o = out_partial.float()
    # an empty split's buffer is never multiplied in (it may hold anything, even NaN)
    contrib = torch.where(w > 0, o * w, torch.zeros_like(o))
    return contrib.sum(dim=0).to(out_dtype), lse


__all__ = ["quantize", "rotate", "append_kv", "kvcache_fwd", "out_dtype", "varlen_paged_fwd",
           "combine"]
