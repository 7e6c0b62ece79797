"""flash-attn 2 compatible public API.

``flash_attn_func``, ``flash_attn_qkvpacked_func`` and ``flash_attn_kvpacked_func`` take the
same arguments, defaults and return conventions as flash-attn 2 (``flash_attn`` package).
This module validates arguments and turns them into the normalised parameters of
``docs/internals.md``; it does no tensor math beyond views. The compute is the
``torch.library`` op ``flashattn::fwd`` (:mod:`flashattn.ops`; its autograd formula calls
``flashattn::bwd``), which runs the backend that :mod:`flashattn.dispatch` picks. Being ops
with fake kernels, the three functions here trace under ``torch.compile(fullgraph=True)``
without graph breaks, with static or dynamic sequence lengths, ``return_attn_probs=True``
and dropout included (the dropout seed is a random op of the graph, see
:func:`flashattn.api.normalise.draw_philox_seed`).
"""
from __future__ import annotations

from typing import Optional, Sequence, Tuple, Union

import torch

from flashattn import ops as _ops
from flashattn.api import out as _out
from flashattn.api import chunked as _chunked
from flashattn.api import fastpath as _fast
from flashattn.api import fp8_attention as _fp8
from flashattn.api import normalise as _p
from flashattn.api import segments as _segments
from flashattn.api import validation as _v
from flashattn.api import wide_v as _wide_v
from flashattn.params import AttnParams

Tensor = torch.Tensor
AttnOutput = Union[Tensor, Tuple[Tensor, Tensor, Optional[Tensor]]]


# ---------------------------------------------------------------------------------------------
# Validation and normalisation
# ---------------------------------------------------------------------------------------------
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
    learnable_sink: Optional[Tensor] = None,
    attention_chunk: int = 0,
    record: Optional[list] = None,
) -> AttnOutput:
    """Validate, normalise (flash-attn 2 semantics), run. q, k, v may be views of packed inputs.
    ``record``: a list that receives the normalised :class:`AttnParams` of a plain call (the
    fast path's entry for this call signature)."""
    _v.check_qkv(q, k, v, names, max_head_dim_v=_v.MAX_HEAD_DIM_V)
    if v.shape[-1] > _v.MAX_HEAD_DIM and (
            _ops.grad_recorded(q, k, v, learnable_sink)
            or _wide_v.faster_by_slices(q, v, alibi_slopes, _v.check_dropout_p(dropout_p))):
        # no backward kernel takes V this wide, and the Hopper forward does not either: by
        # V's column slices (api/wide_v.py)
        _wide_v.refuse_dropout(_v.check_dropout_p(dropout_p))
        return _wide_v.by_slices(
            lambda v_s: _attention(q, k, v_s, dropout_p, softmax_scale, causal, window_size,
                                   softcap, alibi_slopes, deterministic, return_attn_probs,
                                   names, learnable_sink, attention_chunk), v)
    attention_chunk = _v.check_attention_chunk(attention_chunk)
    dropout_p = _v.check_dropout_p(dropout_p)
    scale, causal, window_left, window_right, softcap, deterministic = _v.check_options(
        softmax_scale, causal, window_size, softcap, deterministic)
    return_attn_probs = _v.check_bool(return_attn_probs, "return_attn_probs")
    b, _, h, d_qk = q.shape
    seqlen_k = k.shape[1]
    _v.check_alibi_slopes(alibi_slopes, b, h, q.device)

    scale = _p.softmax_scale_or_default(scale, d_qk)
    window_left, window_right = _p.window(window_left, window_right, causal, seqlen_k)
    alibi_slopes = _p.alibi_bh(alibi_slopes, b, h)
    _v.check_learnable_sink(learnable_sink, h, q.device, dropout_p)
    s_q = q.shape[1]
    if (not _segments.chunk_is_noop(attention_chunk, seqlen_k, window_right, s_q <= seqlen_k)
            and b > 0 and s_q > 0 and seqlen_k > 0):
        if return_attn_probs and dropout_p > 0.0:
            raise NotImplementedError("return_attn_probs with dropout (S_dmask) is not "
                                      "supported together with attention_chunk")
        out, lse = _chunked.dense(q, k, v, alibi_slopes, _p.dropout_seed(dropout_p), scale,
                                  causal, window_left, window_right, softcap, dropout_p,
                                  deterministic, attention_chunk, learnable_sink)
        return (out, lse, None) if return_attn_probs else out
    if record is not None:
        record.append(AttnParams(scale, causal, window_left, window_right, softcap, alibi_slopes,
                                 dropout_p, 0, deterministic))
    if learnable_sink is not None:
        out, lse = _ops.attention_with_sink(q, k, v, learnable_sink, alibi_slopes, scale,
                                            causal, window_left, window_right, softcap,
                                            deterministic)
        return (out, lse, None) if return_attn_probs else out
    philox_seed = _p.dropout_seed(dropout_p)
    # Like flash-attn 2: S_dmask only exists with dropout; return_attn_probs=True without
    # dropout is commonly used just to get softmax_lse, so never materialise (b, h, s_q, s_k).
    return_softmax = return_attn_probs and dropout_p > 0.0

    out, lse, s_dmask = _ops.attention(
        q, k, v, alibi_slopes, philox_seed, scale, causal, window_left, window_right, softcap,
        dropout_p, deterministic, return_softmax,
    )
    if return_attn_probs:
        return out, lse, s_dmask
    return out


# ---------------------------------------------------------------------------------------------
# Public API
# ---------------------------------------------------------------------------------------------
_NO_SIGNATURE = object()


def _recorded(q: Tensor, k: Tensor, v: Tensor, dropout_p: float, softmax_scale: Optional[float],
              causal: bool, window_size: Sequence[int], softcap: float, deterministic: bool,
              return_attn_probs: bool, names: Tuple[str, str, str]) -> AttnOutput:
    """A dense call without ALiBi, sink, chunk or descales (the caller checks): a repeated call
    signature skips the checks and dispatch (api/fastpath.py; with a gradient to record too:
    replay.dense.DenseTrainEntry), its first call runs the full path and records it.
    :data:`_NO_SIGNATURE` for a call that has none (dropout, FP8, other types: the caller
    takes the full path)."""
    key = _fast.dense_key(q, k, v, dropout_p, softmax_scale, causal, window_size, softcap,
                          deterministic, return_attn_probs)
    if key is None:
        return _NO_SIGNATURE
    run = _fast.DENSE.get(key)
    if run is None:
        record: list = []
        res = _attention(q, k, v, dropout_p, softmax_scale, causal, window_size, softcap, None,
                         deterministic, return_attn_probs, names, record=record)
        if record:
            _fast.DENSE.put(key, _fast.dense_entry(q, k, v, record[0], bool(return_attn_probs)))
        return res
    out, lse = run(q, k, v)
    return (out, lse, None) if return_attn_probs else out


@_out.writes_out(_out.like_q("q", "v", 4, 4, "out_dtype"))
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
    *,
    q_descale: Optional[Tensor] = None,
    k_descale: Optional[Tensor] = None,
    v_descale: Optional[Tensor] = None,
    out_dtype: Optional[torch.dtype] = None,
    learnable_sink: Optional[Tensor] = None,
    attention_chunk: int = 0,
) -> AttnOutput:
    """Exact attention ``softmax(q @ k^T * softmax_scale) @ v`` (FlashAttention-2).

    Supports multi-query and grouped-query attention (MQA/GQA): k and v may have fewer heads
    than q; nheads must be a multiple of nheads_k, and query head i uses kv head
    ``i // (nheads // nheads_k)``.

    Arguments:
        q: (batch, seqlen_q, nheads, headdim), float16, bfloat16 or float32; last dim
            contiguous, other strides arbitrary. headdim in 1..256.
        k: (batch, seqlen_k, nheads_k, headdim), same dtype and device as q.
        v: (batch, seqlen_k, nheads_k, headdim_v), same dtype and device; headdim_v in 1..512
            (past 256 a call with a gradient runs by V's column slices; no dropout then).
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
        q_descale, k_descale, v_descale: None, or float32 (batch, nheads_k) (keyword only; FP8
            inputs only, FlashAttention-3's convention): with float8_e4m3fn q, k, v the real
            values are fp8 × descale (None = 1). FP8 calls are forward only (inputs may
            require grad, as in FA3; a backward raises NotImplementedError), without dropout,
            ALiBi or return_attn_probs; v may also have its
            key axis contiguous (the layout ``flashattn.fp8.quantize`` writes).
        out_dtype: None or the output dtype of an FP8 call (keyword only; default bfloat16).
        learnable_sink: None, or a float tensor (nheads,) (keyword only; gpt-oss's attention
            sinks): one extra logit per head in every row's softmax denominator, attending to
            nothing; differentiable (its gradient comes back in ``.grad``). softmax_lse then
            includes it. Not with dropout or FP8 inputs.
        attention_chunk: int >= 0 (keyword only; FlashAttention-3's chunked local attention,
            Llama-4), 0 = off. A query at key position ``p = i + seqlen_k - seqlen_q`` sees only
            keys j with ``j // attention_chunk == floor(p / attention_chunk)``, besides the
            causal / window mask (a query at a negative position sees no key). Differentiable.

    Returns:
        out: (batch, seqlen_q, nheads, headdim_v), dtype of q (FP8 inputs: out_dtype).
        softmax_lse [if return_attn_probs]: float32 (batch, nheads, seqlen_q), natural log of
            the softmax denominator; -inf for a row that sees no key (its out row is 0).
        S_dmask [if return_attn_probs]: (batch, nheads, seqlen_q, seqlen_k), dtype of q, or
            None when dropout_p == 0 (as flash-attn 2). The softmax probabilities before
            dropout scaling, negative where dropout dropped the entry, 0 where masked.
    """
    if (alibi_slopes is None and learnable_sink is None and type(attention_chunk) is int
            and attention_chunk == 0
            and q_descale is None and k_descale is None and v_descale is None
            and out_dtype is None):
        res = _recorded(q, k, v, dropout_p, softmax_scale, causal, window_size, softcap,
                        deterministic, return_attn_probs, ("q", "k", "v"))
        if res is not _NO_SIGNATURE:
            return res
    fp8 = _fp8.is_fp8(q, k, v)
    _fp8.check_descales_need_fp8(fp8, (q_descale, k_descale, v_descale), out_dtype)
    if fp8 and learnable_sink is not None:
        raise ValueError("learnable_sink is not supported with FP8 inputs")
    if fp8:
        return _fp8.dense(q, k, v, dropout_p=dropout_p, softmax_scale=softmax_scale,
                          causal=causal, window_size=window_size, softcap=softcap,
                          alibi_slopes=alibi_slopes, return_attn_probs=return_attn_probs,
                          q_descale=q_descale, k_descale=k_descale, v_descale=v_descale,
                          out_dtype=out_dtype, attention_chunk=attention_chunk)
    return _attention(
        q, k, v, dropout_p, softmax_scale, causal, window_size, softcap, alibi_slopes,
        deterministic, return_attn_probs, ("q", "k", "v"), learnable_sink, attention_chunk,
    )


def _packed_variant(q: Tensor, k: Tensor, v: Tensor, dropout_p: float,
                    softmax_scale: Optional[float], causal: bool, window_size: Sequence[int],
                    softcap: float, alibi_slopes: Optional[Tensor], deterministic: bool,
                    return_attn_probs: bool, names: Tuple[str, str, str]) -> AttnOutput:
    """The qkv- / kv-packed functions' call on their views: the recorded call of a repeated
    signature (:func:`_recorded`), else the full path."""
    if alibi_slopes is None:
        res = _recorded(q, k, v, dropout_p, softmax_scale, causal, window_size, softcap,
                        deterministic, return_attn_probs, names)
        if res is not _NO_SIGNATURE:
            return res
    return _attention(q, k, v, dropout_p, softmax_scale, causal, window_size, softcap,
                      alibi_slopes, deterministic, return_attn_probs, names)


@_out.writes_out(_out.packed_qkv("qkv", 2))
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
    return _packed_variant(q, k, v, dropout_p, softmax_scale, causal, window_size, softcap,
                           alibi_slopes, deterministic, return_attn_probs, ("qkv[:, :, 0]", "qkv[:, :, 1]", "qkv[:, :, 2]"))


@_out.writes_out(_out.like_q("q", "kv", 5, 4))
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
    return _packed_variant(q, k, v, dropout_p, softmax_scale, causal, window_size, softcap,
                           alibi_slopes, deterministic, return_attn_probs, ("q", "kv[:, :, 0]", "kv[:, :, 1]"))


__all__ = ["flash_attn_func", "flash_attn_qkvpacked_func", "flash_attn_kvpacked_func"]
