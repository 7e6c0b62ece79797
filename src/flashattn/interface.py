"""flash-attn 2 compatible public API.

``flash_attn_func``, ``flash_attn_qkvpacked_func`` and ``flash_attn_kvpacked_func`` take the
same arguments, defaults and return conventions as flash-attn 2 (``flash_attn`` package).
This module validates arguments, turns them into the normalised parameters of
``docs/internals.md`` and wires autograd; it does no tensor math beyond views. The compute
happens in the backend that :mod:`flashattn.dispatch` picks.

The autograd Function calls the backends in exactly two places, :func:`_attn_forward` and
:func:`_attn_backward`; a ``torch.library`` custom op can replace either without touching
anything else.
"""
from __future__ import annotations

from typing import Optional, Sequence, Tuple, Union

import torch

from flashattn import dispatch
from flashattn import validation as _v

Tensor = torch.Tensor
AttnOutput = Union[Tensor, Tuple[Tensor, Tensor, Optional[Tensor]]]

# Seeds are drawn in [0, 2**63 - 1): non-negative int64, and in the [0, 2**63) the
# backends accept.
_SEED_HIGH = 2**63 - 1


# ---------------------------------------------------------------------------------------------
# The two backend call sites (to become torch.library ops).
# ---------------------------------------------------------------------------------------------
def _attn_forward(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    alibi_slopes: Optional[Tensor],
    softmax_scale: float,
    causal: bool,
    window_left: int,
    window_right: int,
    softcap: float,
    dropout_p: float,
    philox_seed: int,
    return_softmax: bool,
) -> Tuple[Tensor, Tensor, Optional[Tensor]]:
    return dispatch.forward(
        q,
        k,
        v,
        softmax_scale=softmax_scale,
        causal=causal,
        window_left=window_left,
        window_right=window_right,
        softcap=softcap,
        alibi_slopes=alibi_slopes,
        dropout_p=dropout_p,
        philox_seed=philox_seed,
        return_softmax=return_softmax,
    )


def _attn_backward(
    dout: Tensor,
    q: Tensor,
    k: Tensor,
    v: Tensor,
    out: Tensor,
    lse: Tensor,
    alibi_slopes: Optional[Tensor],
    softmax_scale: float,
    causal: bool,
    window_left: int,
    window_right: int,
    softcap: float,
    dropout_p: float,
    philox_seed: int,
    deterministic: bool,
) -> Tuple[Tensor, Tensor, Tensor]:
    return dispatch.backward(
        dout,
        q,
        k,
        v,
        out,
        lse,
        softmax_scale=softmax_scale,
        causal=causal,
        window_left=window_left,
        window_right=window_right,
        softcap=softcap,
        alibi_slopes=alibi_slopes,
        dropout_p=dropout_p,
        philox_seed=philox_seed,
        deterministic=deterministic,
    )


class _FlashAttnFunction(torch.autograd.Function):
    """out, lse, S_dmask = attention(q, k, v); gradients for q, k, v only."""

    @staticmethod
    def forward(  # type: ignore[override]
        ctx,
        q: Tensor,
        k: Tensor,
        v: Tensor,
        alibi_slopes: Optional[Tensor],
        softmax_scale: float,
        causal: bool,
        window_left: int,
        window_right: int,
        softcap: float,
        dropout_p: float,
        philox_seed: int,
        deterministic: bool,
        return_softmax: bool,
    ) -> Tuple[Tensor, Tensor, Optional[Tensor]]:
        out, lse, s_dmask = _attn_forward(
            q, k, v, alibi_slopes, softmax_scale, causal, window_left, window_right,
            softcap, dropout_p, philox_seed, return_softmax,
        )
        ctx.save_for_backward(q, k, v, out, lse, alibi_slopes)
        # The seed is saved, not redrawn: backward must replay forward's dropout mask.
        ctx.params = (softmax_scale, causal, window_left, window_right, softcap, dropout_p,
                      philox_seed, deterministic)
        ctx.mark_non_differentiable(lse)
        if s_dmask is not None:
            ctx.mark_non_differentiable(s_dmask)
        return out, lse, s_dmask

    @staticmethod
    def backward(ctx, dout: Tensor, _dlse: Optional[Tensor], _ds: Optional[Tensor]):  # type: ignore[override]
        q, k, v, out, lse, alibi_slopes = ctx.saved_tensors
        (softmax_scale, causal, window_left, window_right, softcap, dropout_p, philox_seed,
         deterministic) = ctx.params
        if dout.stride(-1) != 1 and dout.shape[-1] > 1:
            # e.g. the expanded gradient of out.sum(); backends need unit last-dim stride.
            dout = dout.contiguous()
        dq, dk, dv = _attn_backward(
            dout, q, k, v, out, lse, alibi_slopes, softmax_scale, causal, window_left,
            window_right, softcap, dropout_p, philox_seed, deterministic,
        )
        return dq, dk, dv, None, None, None, None, None, None, None, None, None, None


# ---------------------------------------------------------------------------------------------
# Argument normalisation
# ---------------------------------------------------------------------------------------------
def _draw_philox_seed() -> int:
    # From torch's default CPU generator, so torch.manual_seed reproduces dropout; a CPU
    # tensor's .item() never synchronises a GPU.
    return int(torch.randint(0, _SEED_HIGH, (1,), dtype=torch.int64).item())


def _attention(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    dropout_p: float,
    softmax_scale: Optional[float],
    causal: bool,
    window_size: Sequence[int],
    softcap: float,
    alibi_slopes: Optional[Tensor],
    deterministic: bool,
    return_attn_probs: bool,
    names: Tuple[str, str, str],
) -> AttnOutput:
    """Validate, normalise (flash-attn 2 semantics), run. q, k, v may be views of packed inputs."""
    _v.check_qkv(q, k, v, names)
    dropout_p = _v.check_dropout_p(dropout_p)
    scale = _v.check_softmax_scale(softmax_scale)
    causal = _v.check_causal(causal)
    window_left, window_right = _v.check_window_size(window_size)
    softcap = _v.check_softcap(softcap)
    deterministic = _v.check_bool(deterministic, "deterministic")
    return_attn_probs = _v.check_bool(return_attn_probs, "return_attn_probs")
    b, _, h, d_qk = q.shape
    seqlen_k = k.shape[1]
    _v.check_alibi_slopes(alibi_slopes, b, h, q.device)

    if scale is None:
        scale = d_qk ** -0.5
    # flash-attn 2 (flash_api.cpp): windows reaching past seqlen_k mean "unbounded", then
    # causal forces window_right = 0 (bottom-right aligned).
    if window_left >= seqlen_k:
        window_left = -1
    if window_right >= seqlen_k:
        window_right = -1
    if causal:
        window_right = 0
    if alibi_slopes is not None:
        if alibi_slopes.dim() == 1:
            alibi_slopes = alibi_slopes.unsqueeze(0).expand(b, h)  # (b, h), batch stride 0
        elif alibi_slopes.stride(-1) != 1 and h > 1:
            alibi_slopes = alibi_slopes.contiguous()
    philox_seed = _draw_philox_seed() if dropout_p > 0.0 else 0
    # Like flash-attn 2: S_dmask only exists with dropout; return_attn_probs=True without
    # dropout is commonly used just to get softmax_lse, so never materialise (b, h, s_q, s_k).
    return_softmax = return_attn_probs and dropout_p > 0.0

    out, lse, s_dmask = _FlashAttnFunction.apply(
        q, k, v, alibi_slopes, scale, causal, window_left, window_right, softcap, dropout_p,
        philox_seed, deterministic, return_softmax,
    )
    if return_attn_probs:
        return out, lse, s_dmask
    return out


# ---------------------------------------------------------------------------------------------
# Public API
# ---------------------------------------------------------------------------------------------
def flash_attn_func(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    dropout_p: float = 0.0,
    softmax_scale: Optional[float] = None,
    causal: bool = False,
    window_size: Tuple[int, int] = (-1, -1),  # -1 means infinite context window
    softcap: float = 0.0,  # 0.0 means deactivated
    alibi_slopes: Optional[Tensor] = None,
    deterministic: bool = False,
    return_attn_probs: bool = False,
) -> AttnOutput:
    """Exact attention ``softmax(q @ k^T * softmax_scale) @ v`` (FlashAttention-2).

    Supports multi-query and grouped-query attention (MQA/GQA): k and v may have fewer heads
    than q; nheads must be a multiple of nheads_k, and query head i uses kv head
    ``i // (nheads // nheads_k)``.

    Arguments:
        q: (batch, seqlen_q, nheads, headdim), float16, bfloat16 or float32; last dim
            contiguous, other strides arbitrary. headdim in 1..256.
        k: (batch, seqlen_k, nheads_k, headdim), same dtype and device as q.
        v: (batch, seqlen_k, nheads_k, headdim_v), same dtype and device; headdim_v in 1..256.
        dropout_p: float in [0, 1). Dropout probability, applied as given (pass 0.0 at
            evaluation, as flash-attn's modules do). The Philox seed is drawn from torch's
            default CPU generator (``torch.manual_seed`` reproduces it) only when dropout_p > 0.
        softmax_scale: float > 0 or None. Scaling of q @ k^T before softmax; default
            ``headdim ** -0.5``.
        causal: bool. Causal mask aligned to the bottom-right corner (window_size (left, 0)).
        window_size: (left, right) ints >= -1, -1 = unbounded. Query i attends to keys
            ``[i + seqlen_k - seqlen_q - left, i + seqlen_k - seqlen_q + right]`` (inclusive);
            as in flash-attn 2, a side >= seqlen_k counts as unbounded.
        softcap: float >= 0, 0.0 = off. Scores become ``softcap * tanh(scores / softcap)``.
        alibi_slopes: float32 tensor (nheads,) or (batch, nheads), or None. Adds
            ``-slope * |i + seqlen_k - seqlen_q - j|`` to the score of query i and key j.
        deterministic: bool. Bitwise-reproducible backward (may be slower).
        return_attn_probs: bool. Also return softmax_lse and S_dmask (S_dmask for testing only).

    Returns:
        out: (batch, seqlen_q, nheads, headdim_v), dtype of q.
        softmax_lse [if return_attn_probs]: float32 (batch, nheads, seqlen_q), natural log of
            the softmax denominator; -inf for a row that sees no key (its out row is 0).
        S_dmask [if return_attn_probs]: (batch, nheads, seqlen_q, seqlen_k), dtype of q, or
            None when dropout_p == 0 (as flash-attn 2). The softmax probabilities before
            dropout scaling, negative where dropout dropped the entry, 0 where masked.
    """
    return _attention(
        q, k, v, dropout_p, softmax_scale, causal, window_size, softcap, alibi_slopes,
        deterministic, return_attn_probs, ("q", "k", "v"),
    )


def flash_attn_qkvpacked_func(
    qkv: Tensor,
    dropout_p: float = 0.0,
    softmax_scale: Optional[float] = None,
    causal: bool = False,
    window_size: Tuple[int, int] = (-1, -1),  # -1 means infinite context window
    softcap: float = 0.0,  # 0.0 means deactivated
    alibi_slopes: Optional[Tensor] = None,
    deterministic: bool = False,
    return_attn_probs: bool = False,
) -> AttnOutput:
    """Self-attention with q, k, v packed in one tensor.

    Same as ``flash_attn_func(*qkv.unbind(2), ...)``; the gradient comes back as one
    (batch, seqlen, 3, nheads, headdim) tensor.

    Arguments:
        qkv: (batch, seqlen, 3, nheads, headdim), float16, bfloat16 or float32; last dim
            contiguous. headdim in 1..256.
        dropout_p: float in [0, 1). Dropout probability, applied as given (pass 0.0 at
            evaluation, as flash-attn's modules do). The Philox seed is drawn from torch's
            default CPU generator (``torch.manual_seed`` reproduces it) only when dropout_p > 0.
        softmax_scale: float > 0 or None. Scaling of q @ k^T before softmax; default
            ``headdim ** -0.5``.
        causal: bool. Causal mask aligned to the bottom-right corner (window_size (left, 0)).
        window_size: (left, right) ints >= -1, -1 = unbounded. Query i attends to keys
            ``[i + seqlen_k - seqlen_q - left, i + seqlen_k - seqlen_q + right]`` (inclusive);
            as in flash-attn 2, a side >= seqlen_k counts as unbounded.
        softcap: float >= 0, 0.0 = off. Scores become ``softcap * tanh(scores / softcap)``.
        alibi_slopes: float32 tensor (nheads,) or (batch, nheads), or None. Adds
            ``-slope * |i + seqlen_k - seqlen_q - j|`` to the score of query i and key j.
        deterministic: bool. Bitwise-reproducible backward (may be slower).
        return_attn_probs: bool. Also return softmax_lse and S_dmask (S_dmask for testing only).

    Returns:
        out: (batch, seqlen_q, nheads, headdim_v), dtype of q.
        softmax_lse [if return_attn_probs]: float32 (batch, nheads, seqlen_q), natural log of
            the softmax denominator; -inf for a row that sees no key (its out row is 0).
        S_dmask [if return_attn_probs]: (batch, nheads, seqlen_q, seqlen_k), dtype of q, or
            None when dropout_p == 0 (as flash-attn 2). The softmax probabilities before
            dropout scaling, negative where dropout dropped the entry, 0 where masked.
    """
    _v.check_qkvpacked(qkv)
    q, k, v = qkv.unbind(dim=2)  # views: autograd assembles dqkv
    return _attention(
        q, k, v, dropout_p, softmax_scale, causal, window_size, softcap, alibi_slopes,
        deterministic, return_attn_probs, ("qkv[:, :, 0]", "qkv[:, :, 1]", "qkv[:, :, 2]"),
    )


def flash_attn_kvpacked_func(
    q: Tensor,
    kv: Tensor,
    dropout_p: float = 0.0,
    softmax_scale: Optional[float] = None,
    causal: bool = False,
    window_size: Tuple[int, int] = (-1, -1),  # -1 means infinite context window
    softcap: float = 0.0,  # 0.0 means deactivated
    alibi_slopes: Optional[Tensor] = None,
    deterministic: bool = False,
    return_attn_probs: bool = False,
) -> AttnOutput:
    """Attention with k and v packed in one tensor (e.g. cross-attention, KV cache).

    Same as ``flash_attn_func(q, *kv.unbind(2), ...)``. Supports MQA/GQA: nheads must be a
    multiple of nheads_k.

    Arguments:
        q: (batch, seqlen_q, nheads, headdim), float16, bfloat16 or float32; last dim
            contiguous. headdim in 1..256.
        kv: (batch, seqlen_k, 2, nheads_k, headdim), same dtype and device as q.
        dropout_p: float in [0, 1). Dropout probability, applied as given (pass 0.0 at
            evaluation, as flash-attn's modules do). The Philox seed is drawn from torch's
            default CPU generator (``torch.manual_seed`` reproduces it) only when dropout_p > 0.
        softmax_scale: float > 0 or None. Scaling of q @ k^T before softmax; default
            ``headdim ** -0.5``.
        causal: bool. Causal mask aligned to the bottom-right corner (window_size (left, 0)).
        window_size: (left, right) ints >= -1, -1 = unbounded. Query i attends to keys
            ``[i + seqlen_k - seqlen_q - left, i + seqlen_k - seqlen_q + right]`` (inclusive);
            as in flash-attn 2, a side >= seqlen_k counts as unbounded.
        softcap: float >= 0, 0.0 = off. Scores become ``softcap * tanh(scores / softcap)``.
        alibi_slopes: float32 tensor (nheads,) or (batch, nheads), or None. Adds
            ``-slope * |i + seqlen_k - seqlen_q - j|`` to the score of query i and key j.
        deterministic: bool. Bitwise-reproducible backward (may be slower).
        return_attn_probs: bool. Also return softmax_lse and S_dmask (S_dmask for testing only).

    Returns:
        out: (batch, seqlen_q, nheads, headdim_v), dtype of q.
        softmax_lse [if return_attn_probs]: float32 (batch, nheads, seqlen_q), natural log of
            the softmax denominator; -inf for a row that sees no key (its out row is 0).
        S_dmask [if return_attn_probs]: (batch, nheads, seqlen_q, seqlen_k), dtype of q, or
            None when dropout_p == 0 (as flash-attn 2). The softmax probabilities before
            dropout scaling, negative where dropout dropped the entry, 0 where masked.
    """
    _v.check_tensor(q, "q", 4, "(batch, seqlen_q, nheads, headdim)")
    _v.check_kvpacked(kv)
    k, v = kv.unbind(dim=2)
    return _attention(
        q, k, v, dropout_p, softmax_scale, causal, window_size, softcap, alibi_slopes,
        deterministic, return_attn_probs, ("q", "kv[:, :, 0]", "kv[:, :, 1]"),
    )


__all__ = ["flash_attn_func", "flash_attn_qkvpacked_func", "flash_attn_kvpacked_func"]
