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
                 device: torch.device | str = "cpu") -> torch.Tensor:
    """Bool (s_q, s_k): True where key j is visible from query i.

    Visible iff ``window_left < 0 or j >= i + s_k - s_q - window_left`` and
    ``window_right < 0 or j <= i + s_k - s_q + window_right`` (bottom-right aligned).
    """
    i = torch.arange(s_q, device=device).view(-1, 1)
    j = torch.arange(s_k, device=device).view(1, -1)
    diag = i + (s_k - s_q)  # the key aligned with query i
    mask = torch.ones(s_q, s_k, dtype=torch.bool, device=device)
    if window_left >= 0:
        mask &= j >= diag - window_left
    if window_right >= 0:
        mask &= j <= diag + window_right
    return mask


def alibi_bias(alibi_slopes: torch.Tensor, b: int, h: int, s_q: int, s_k: int,
               dtype: torch.dtype) -> torch.Tensor:
    """ALiBi bias (b, h, s_q, s_k) in ``dtype``: ``-slope * |i + s_k - s_q - j|``.

    alibi_slopes: float32 (h,) or (b, h).
    """
    slopes = alibi_slopes.to(dtype)
    if slopes.dim() == 1:
        slopes = slopes.view(1, h).expand(b, h)
    i = torch.arange(s_q, device=slopes.device).view(-1, 1)
    j = torch.arange(s_k, device=slopes.device).view(1, -1)
    dist = (i + (s_k - s_q) - j).abs().to(dtype)
    return -slopes.view(b, h, 1, 1) * dist


def _repeat_kv(x: torch.Tensor, h: int) -> torch.Tensor:
    """(b, s, h_k, d) -> (b, s, h, d): query head ``hq`` uses kv head ``hq // (h // h_k)``."""
    return x.repeat_interleave(h // x.shape[2], dim=2)


def attention_probs_ref(q: torch.Tensor, k: torch.Tensor, *, softmax_scale: Optional[float] = None,
                        causal: bool = False, window_size: tuple[int, int] = (-1, -1),
                        softcap: float = 0.0, alibi_slopes: Optional[torch.Tensor] = None,
                        upcast: bool = True, reorder_ops: bool = False
                        ) -> tuple[torch.Tensor, torch.Tensor]:
    """Softmax probabilities (before dropout) and their log-sum-exp.

    q (b, s_q, h, d), k (b, s_k, h_k, d). Returns ``P`` (b, h, s_q, s_k) in the compute dtype
    (float64 if ``upcast`` else q's dtype), 0 where invisible and on rows with no visible key,
    and ``lse`` (b, h, s_q) natural log (float64 if ``upcast`` else float32), -inf on rows with
    no visible key.
    """
    b, s_q, h, d = q.shape
    s_k = k.shape[1]
    dtype = torch.float64 if upcast else q.dtype
    if softmax_scale is None:
        softmax_scale = 1.0 / math.sqrt(d)
    q = q.to(dtype)
    k = _repeat_kv(k.to(dtype), h)
    # reorder_ops scales k instead of q: a different rounding order for low-precision baselines
    if reorder_ops:
        scores = torch.einsum("bihd,bjhd->bhij", q, k * softmax_scale)
    else:
        scores = torch.einsum("bihd,bjhd->bhij", q * softmax_scale, k)
    if softcap > 0.0:
        scores = softcap * torch.tanh(scores / softcap)
    if alibi_slopes is not None:
        scores = scores + alibi_bias(alibi_slopes, b, h, s_q, s_k, dtype)
    window_left, window_right = normalize_window(causal, window_size)
    visible = visible_mask(s_q, s_k, window_left, window_right, q.device)
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
                  reorder_ops: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
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

    Returns:
        out (b, s_q, h, d_v): float64 if ``upcast`` else q's dtype; 0 on rows with no key.
        lse (b, h, s_q): natural log; float64 if ``upcast`` else float32; -inf on rows with no key.
    """
    dtype = torch.float64 if upcast else q.dtype
    probs, lse = attention_probs_ref(q, k, softmax_scale=softmax_scale, causal=causal,
                                     window_size=window_size, softcap=softcap,
                                     alibi_slopes=alibi_slopes, upcast=upcast,
                                     reorder_ops=reorder_ops)
    if dropout_mask is not None:
        probs = probs.masked_fill(~dropout_mask, 0.0) / (1.0 - dropout_p)
    h = q.shape[2]
    v = _repeat_kv(v.to(dtype), h)
    out = torch.einsum("bhij,bjhd->bihd", probs, v)
    return out, lse
