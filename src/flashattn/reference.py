"""Naive attention: the test oracle.

Materialises the full (b, h, s_q, s_k) score matrix, so it is only for tests and checks.
It is written independently of the backends (its own visibility rule, plain torch ops) so
that a shared bug cannot hide, and it is differentiable with torch autograd (tests take
float64 gradients through it).

Semantics (docs/internals.md): scores ``q.k * softmax_scale``, then softcap
``c * tanh(s / c)``, then ALiBi ``-slope * |i + s_k - s_q - j|``, then the visibility mask
(causal / sliding window, bottom-right aligned); softmax; dropout with a given keep mask and
``1 / (1 - p)`` scaling; ``@ v``. A query row that sees no key gets out 0 and lse -inf.
"""
from __future__ import annotations

import math
from typing import Optional

import torch


def normalize_window(causal: bool, window_size: tuple[int, int]) -> tuple[int, int]:
    """Public ``(causal, window_size)`` -> ``(window_left, window_right)``, -1 = unbounded.

    Causal is a window whose right side is 0; negative sizes mean unbounded.
    """
    left, right = (int(w) for w in window_size)
    left = -1 if left < 0 else left
    right = -1 if right < 0 else right
    if causal:
        right = 0
    return left, right


def visible_mask(s_q: int, s_k: int, window_left: int, window_right: int,
                 device: torch.device | str = "cpu", attention_chunk: int = 0) -> torch.Tensor:
    """Bool (s_q, s_k): True where key j is visible from query i.

    Visible iff ``window_left < 0 or j >= i + s_k - s_q - window_left`` and
    ``window_right < 0 or j <= i + s_k - s_q + window_right`` (bottom-right aligned), and,
    with ``attention_chunk`` C > 0 (FlashAttention-3's chunked local attention, Llama-4),
    key and query position ``p = i + s_k - s_q`` lie in the same chunk of C positions:
    ``j // C == floor(p / C)``. Positions are those of the keys (0 = the first key); a query
    at a negative position (s_q > s_k) is in a chunk with no keys and sees none.
    """
    i = torch.arange(s_q, device=device).view(-1, 1)
    j = torch.arange(s_k, device=device).view(1, -1)
    diag = i + (s_k - s_q)  # the key aligned with query i
    mask = torch.ones(s_q, s_k, dtype=torch.bool, device=device)
    if window_left >= 0:
        mask &= j >= diag - window_left
    if window_right >= 0:
        mask &= j <= diag + window_right
    if attention_chunk > 0:
        mask &= torch.div(j, attention_chunk, rounding_mode="floor") == torch.div(
            diag, attention_chunk, rounding_mode="floor")
    return mask


def alibi_bias(alibi_slopes: torch.Tensor, b: int, h: int, s_q: int, s_k: int,
               dtype: torch.dtype, shift: int = 0) -> torch.Tensor:
    """ALiBi bias (b, h, s_q, s_k) in ``dtype``: ``-slope * |i + s_k - s_q + shift - j|``.

    alibi_slopes: float32 (h,) or (b, h). ``shift``: 0 is flash-attn's ALiBi; the library's
    context parallelism passes a block's global offset (``AttnParams.alibi_shift``).
    """
    slopes = alibi_slopes.to(dtype)
    if slopes.dim() == 1:
        slopes = slopes.view(1, h).expand(b, h)
    i = torch.arange(s_q, device=slopes.device).view(-1, 1)
    j = torch.arange(s_k, device=slopes.device).view(1, -1)
    dist = (i + (s_k - s_q) + shift - j).abs().to(dtype)
    return -slopes.view(b, h, 1, 1) * dist


def _repeat_kv(x: torch.Tensor, h: int) -> torch.Tensor:
    """(b, s, h_k, d) -> (b, s, h, d): query head ``hq`` uses kv head ``hq // (h // h_k)``."""
    return x.repeat_interleave(h // x.shape[2], dim=2)


def default_scale(d: int, qv: Optional[torch.Tensor] = None) -> float:
    """The default softmax scale: ``d ** -0.5``, and with FlashAttention-3's ``qv`` (width
    d_v) ``(d + d_v) ** -0.5``: the score then sums d + d_v products."""
    return 1.0 / math.sqrt(d + (0 if qv is None else qv.shape[-1]))


def attention_probs_ref(q: torch.Tensor, k: torch.Tensor, *, softmax_scale: Optional[float] = None,
                        causal: bool = False, window_size: tuple[int, int] = (-1, -1),
                        softcap: float = 0.0, alibi_slopes: Optional[torch.Tensor] = None,
                        upcast: bool = True, reorder_ops: bool = False,
                        attention_chunk: int = 0, qv: Optional[torch.Tensor] = None,
                        v: Optional[torch.Tensor] = None, alibi_shift: int = 0
                        ) -> tuple[torch.Tensor, torch.Tensor]:
    """Softmax probabilities (before dropout) and their log-sum-exp.

    q (b, s_q, h, d), k (b, s_k, h_k, d). With ``qv`` (b, s_q, h, d_v) (FlashAttention-3's
    latent query, multi-head latent attention) and ``v`` (b, s_k, h_k, d_v) the raw score is
    ``q.k + qv.v`` (the latent part scores against V itself) before the scale, softcap, ALiBi
    and mask; the default scale is then ``(d + d_v) ** -0.5``. Returns ``P`` (b, h, s_q, s_k)
    in the compute dtype (float64 if ``upcast`` else q's dtype), 0 where invisible and on rows
    with no visible key, and ``lse`` (b, h, s_q) natural log (float64 if ``upcast`` else
    float32), -inf on rows with no visible key.
    """
    b, s_q, h, d = q.shape
    s_k = k.shape[1]
    dtype = torch.float64 if upcast else q.dtype
    if qv is not None and v is None:
        raise ValueError("attention_probs_ref: qv needs v (the latent part scores against v)")
    if softmax_scale is None:
        softmax_scale = default_scale(d, qv)
    q = q.to(dtype)
    k = _repeat_kv(k.to(dtype), h)
    # reorder_ops scales k instead of q: a different rounding order for low-precision baselines
    if reorder_ops:
        scores = torch.einsum("bihd,bjhd->bhij", q, k * softmax_scale)
    else:
        scores = torch.einsum("bihd,bjhd->bhij", q * softmax_scale, k)
    if qv is not None:
        qv, v_rep = qv.to(dtype), _repeat_kv(v.to(dtype), h)
        if reorder_ops:
            scores = scores + torch.einsum("bihd,bjhd->bhij", qv, v_rep * softmax_scale)
        else:
            scores = scores + torch.einsum("bihd,bjhd->bhij", qv * softmax_scale, v_rep)
    if softcap > 0.0:
        scores = softcap * torch.tanh(scores / softcap)
    if alibi_slopes is not None:
        scores = scores + alibi_bias(alibi_slopes, b, h, s_q, s_k, dtype, alibi_shift)
    window_left, window_right = normalize_window(causal, window_size)
    visible = visible_mask(s_q, s_k, window_left, window_right, q.device, attention_chunk)
    scores = scores.masked_fill(~visible, float("-inf"))
    # The row max cancels in the softmax; detaching it keeps the gradient exact and free
    # of max's subgradient. Rows with no visible key subtract 0 instead of -inf (no NaN).
    m = scores.amax(dim=-1, keepdim=True).detach()
    m = torch.where(torch.isinf(m), torch.zeros_like(m), m)
    e = torch.exp(scores - m)
    l = e.sum(dim=-1, keepdim=True)
    has_key = l > 0
    # double where: the discarded branch must not produce inf/NaN gradients either
    l_safe = torch.where(has_key, l, torch.ones_like(l))
    probs = e / l_safe
    lse = torch.where(has_key, m + torch.log(l_safe), torch.full_like(l, float("-inf")))
    lse = lse.squeeze(-1)
    if not upcast:
        lse = lse.float()
    return probs, lse


def attention_ref(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *,
                  softmax_scale: Optional[float] = None, causal: bool = False,
                  window_size: tuple[int, int] = (-1, -1), softcap: float = 0.0,
                  alibi_slopes: Optional[torch.Tensor] = None, dropout_p: float = 0.0,
                  dropout_mask: Optional[torch.Tensor] = None, upcast: bool = True,
                  reorder_ops: bool = False, attention_chunk: int = 0,
                  qv: Optional[torch.Tensor] = None, alibi_shift: int = 0
                  ) -> tuple[torch.Tensor, torch.Tensor]:
    """Naive attention (flash-attn 2 semantics), differentiable.

    Args:
        q: (b, s_q, h, d); k: (b, s_k, h_k, d); v: (b, s_k, h_k, d_v); h % h_k == 0 (GQA).
        softmax_scale: defaults to ``d ** -0.5``.
        causal / window_size: bottom-right aligned visibility, see :func:`visible_mask`.
        softcap: 0 = off, else ``softcap * tanh(scores / softcap)`` after scaling.
        alibi_slopes: float32 (h,) or (b, h); bias added after softcap.
        dropout_p, dropout_mask: bool keep mask (b, h, s_q, s_k); kept probabilities are
            scaled by ``1 / (1 - dropout_p)``. No mask means no dropout.
        upcast: compute in float64 (the oracle) instead of the inputs' dtype (the
            "PyTorch's own low-precision error" baseline).
        reorder_ops: scale k instead of q (another rounding order for the baseline).
        attention_chunk: 0 = off, else chunked local attention (see :func:`visible_mask`).
        qv: None, or (b, s_q, h, d_v) (FlashAttention-3's latent query): the score is
            ``softmax_scale * (q.k + qv.v)``, the default scale ``(d + d_v) ** -0.5``.
        alibi_shift: moves ALiBi's diagonal (:func:`alibi_bias`), not the mask.

    Returns:
        out (b, s_q, h, d_v): float64 if ``upcast`` else q's dtype; 0 on rows with no key.
        lse (b, h, s_q): natural log; float64 if ``upcast`` else float32; -inf on rows with no key.
    """
    dtype = torch.float64 if upcast else q.dtype
    probs, lse = attention_probs_ref(q, k, softmax_scale=softmax_scale, causal=causal,
                                     window_size=window_size, softcap=softcap,
                                     alibi_slopes=alibi_slopes, upcast=upcast,
                                     reorder_ops=reorder_ops, attention_chunk=attention_chunk,
                                     qv=qv, v=v, alibi_shift=alibi_shift)
    if dropout_mask is not None:
        probs = probs.masked_fill(~dropout_mask, 0.0) / (1.0 - dropout_p)
    h = q.shape[2]
    v = _repeat_kv(v.to(dtype), h)
    out = torch.einsum("bhij,bjhd->bihd", probs, v)
    return out, lse


# ---------------------------------------------------------------------------------------------
# KV cache (flash_attn_with_kvcache): rotary embedding and the cache-attention oracle
# ---------------------------------------------------------------------------------------------
def rotary_ref(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, positions: torch.Tensor,
               interleaved: bool = True) -> torch.Tensor:
    """Rotary embedding of x (b, s, nh, d) at ``positions`` (b, s), in float64.

    cos / sin (s_ro, rotary_dim / 2). Interleaved pairs features (2k, 2k + 1), otherwise
    (k, k + rotary_dim / 2) (GPT-NeoX); both rotate by angle k:
    ``(x0, x1) -> (x0 cos - x1 sin, x0 sin + x1 cos)``. Features past rotary_dim pass through.
    """
    x = x.double()
    half = cos.shape[1]
    c = cos.double()[positions.long()].unsqueeze(2)  # (b, s, 1, half)
    s = sin.double()[positions.long()].unsqueeze(2)
    out = x.clone()
    if interleaved:
        i0 = torch.arange(0, 2 * half, 2)
        i1 = i0 + 1
    else:
        i0 = torch.arange(half)
        i1 = i0 + half
    x0, x1 = x[..., i0], x[..., i1]
    out[..., i0] = x0 * c - x1 * s
    out[..., i1] = x0 * s + x1 * c
    return out


def kvcache_ref(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                k: Optional[torch.Tensor] = None, v: Optional[torch.Tensor] = None,
                rotary_cos: Optional[torch.Tensor] = None,
                rotary_sin: Optional[torch.Tensor] = None,
                cache_seqlens: Optional[torch.Tensor] = None,
                cache_batch_idx: Optional[torch.Tensor] = None,
                cache_leftpad: Optional[torch.Tensor] = None,
                block_table: Optional[torch.Tensor] = None,
                softmax_scale: Optional[float] = None, causal: bool = False,
                window_size: tuple[int, int] = (-1, -1), softcap: float = 0.0,
                rotary_interleaved: bool = True, alibi_slopes: Optional[torch.Tensor] = None,
                upcast: bool = True, attention_chunk: int = 0, qv: Optional[torch.Tensor] = None
                ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Oracle of ``flash_attn_with_kvcache`` that never modifies its inputs.

    Returns ``(out, lse, k_cache_after, v_cache_after)``: the caches as the call must leave
    them (new k / v written at ``cache_seqlens[b] + i``, keys rotated at those positions,
    rounded to the cache dtype), and the attention of q (rotated at ``cache_seqlens[b] + i``
    if causal or windowed, else at ``cache_seqlens[b]``; rounded to q's dtype) over each
    row's keys ``[cache_leftpad[b], cache_seqlens[b] + s_new)`` by :func:`attention_ref`
    (float64 if ``upcast`` else q's dtype). Shapes as the public function; cache_seqlens a
    (b,) int tensor. Window sides >= the cache capacity count as unbounded (flash-attn 2 clamps
    them first: for the mask, and before the rotary positions of q are decided).
    ``attention_chunk`` > 0 makes the call local too (FlashAttention-3: q rotated token by
    token), chunks counted from ``cache_leftpad[b]``, the first key.
    """
    b, s_q, h, _ = q.shape
    k_after, v_after = k_cache.clone(), v_cache.clone()
    paged = block_table is not None
    page = k_cache.shape[1]
    lens = cache_seqlens.long().cpu()
    s_new = 0 if k is None else k.shape[1]

    def cache_index(row: int, pos: torch.Tensor):
        if paged:
            return block_table[row].long().cpu()[pos // page], pos % page
        r = row if cache_batch_idx is None else int(cache_batch_idx[row])
        return torch.full_like(pos, r), pos

    rotary = rotary_cos is not None
    if k is not None:
        k_new = k
        if rotary:
            pos = (lens.view(-1, 1) + torch.arange(s_new)).to(k.device)
            k_new = rotary_ref(k, rotary_cos, rotary_sin, pos, rotary_interleaved)
        for row in range(b):
            pos = int(lens[row]) + torch.arange(s_new)
            d0, d1 = cache_index(row, pos)
            k_after[d0, d1] = k_new[row].to(k_cache.dtype)
            v_after[d0, d1] = v[row].to(v_cache.dtype)
    # flash-attn 2 (mha_fwd_kvcache): window sides >= the cache capacity become -1 before
    # anything else, so they are unbounded for the mask too (which differs from the side
    # itself when seqlen_q exceeds the row's keys), and then "local" (and so per-token q
    # positions under rotary) is decided
    capacity = block_table.shape[1] * page if paged else k_cache.shape[1]
    clamped = tuple(-1 if w >= capacity else int(w) for w in window_size)
    q_in = q
    if rotary:
        step = 1 if (causal or clamped != (-1, -1) or attention_chunk > 0) else 0
        pos = (lens.view(-1, 1) + step * torch.arange(s_q)).to(q.device)
        q_in = rotary_ref(q, rotary_cos, rotary_sin, pos, rotary_interleaved).to(q.dtype)
    dtype = torch.float64 if upcast else q.dtype
    out = torch.zeros(b, s_q, h, v_cache.shape[3], dtype=dtype, device=q.device)
    lse = torch.full((b, h, s_q), float("-inf"), dtype=torch.float64 if upcast else torch.float32,
                     device=q.device)
    for row in range(b):
        start = 0 if cache_leftpad is None else int(cache_leftpad[row])
        end = int(lens[row]) + s_new
        if end <= start:
            continue
        d0, d1 = cache_index(row, torch.arange(start, end))
        k_row, v_row = k_after[d0, d1].unsqueeze(0), v_after[d0, d1].unsqueeze(0)
        slopes = None
        if alibi_slopes is not None:
            slopes = alibi_slopes if alibi_slopes.dim() == 1 else alibi_slopes[row:row + 1]
        o, l = attention_ref(q_in[row:row + 1], k_row, v_row, softmax_scale=softmax_scale,
                             causal=causal, window_size=clamped, softcap=softcap,
                             alibi_slopes=slopes, upcast=upcast,
                             attention_chunk=attention_chunk,
                             qv=None if qv is None else qv[row:row + 1])
        out[row] = o[0]
        lse[row] = l[0]
    return out, lse, k_after, v_after


def dequantize_fp8_ref(x8: torch.Tensor, descale: torch.Tensor, block: int) -> torch.Tensor:
    """float64 values of e4m3 ``x8`` (b, s, h, d) with block descales (b, h, n_blocks): row i
    of head h is scaled by descale[:, h, min(i // block, n_blocks - 1)]."""
    s = x8.shape[1]
    idx = torch.clamp(torch.arange(s) // block, max=descale.shape[2] - 1)
    per_row = descale.double().cpu()[:, :, idx].to(x8.device)
    return x8.double() * per_row.transpose(1, 2).unsqueeze(-1)


def attention_fp8_ref(q8: torch.Tensor, k8: torch.Tensor, v8: torch.Tensor,
                      q_descale: torch.Tensor, k_descale: torch.Tensor,
                      v_descale: torch.Tensor, block_m: int, block_n: int, *,
                      softmax_scale: Optional[float] = None, causal: bool = False,
                      window_size: tuple[int, int] = (-1, -1), softcap: float = 0.0,
                      p_scale: Optional[float] = 256.0, attention_chunk: int = 0
                      ) -> torch.Tensor:
    """What an FP8 attention kernel computes, in float64: the oracle for FP8 kernels that
    quantize the same way (FlashAttention-3's numerics).

    q8 (b, s_q, h, d), k8 (b, s_k, h_k, d), v8 (b, s_k, h_k, d_v) float8_e4m3fn with block
    descales (b, h, cdiv(s_q, block_m)) / (b, h_k, cdiv(s_k, block_n)): real value = fp8 ×
    descale (a block larger than the sequence: one descale per (batch, head)). S = Q K^T in
    exact arithmetic, masked / soft-capped as :func:`attention_ref`; P = exp(S - rowmax) is cast
    to e4m3 after scaling by ``p_scale`` (FA3 multiplies P by 2^8 to use e4m3's range; None: P
    stays exact), the row sum uses the unrounded P, O = P8 V / (p_scale · rowsum). Rows that see
    no key give 0. ``attention_chunk``: FA3's chunked local attention, as in
    :func:`attention_ref`. (A kernel with an online softmax rounds P against its running max, not the
    final one: the two agree to within the e4m3 rounding of P.)
    """
    q = dequantize_fp8_ref(q8, q_descale, block_m)
    k = dequantize_fp8_ref(k8, k_descale, block_n)
    v = dequantize_fp8_ref(v8, v_descale, block_n)
    # softmax(S) = exp(S - lse): P relative to the row max is exp(S - lse) * rowsum / exp(max)
    probs, _ = attention_probs_ref(q, k, softmax_scale=softmax_scale, causal=causal,
                                   window_size=window_size, softcap=softcap,
                                   attention_chunk=attention_chunk)
    v = _repeat_kv(v, q.shape[2])
    if p_scale is not None:
        # unnormalised P (max 1 per row), rounded after the 2^8 scaling, then renormalised by
        # the unrounded row sum
        row_max = probs.amax(dim=-1, keepdim=True)
        unnorm = torch.where(row_max > 0, probs / row_max.clamp_min(1e-300), probs)
        p8 = (unnorm * p_scale).to(torch.float8_e4m3fn).double() / p_scale
        denom = unnorm.sum(dim=-1, keepdim=True)
        probs = torch.where(denom > 0, p8 / denom.clamp_min(1e-300), torch.zeros_like(p8))
    return torch.einsum("bhij,bjhd->bihd", probs, v)