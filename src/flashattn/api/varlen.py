"""flash-attn 2 compatible variable-length (packed) attention.

``flash_attn_varlen_func``, ``flash_attn_varlen_qkvpacked_func`` and
``flash_attn_varlen_kvpacked_func`` take flash-attn 2's arguments, defaults and return
conventions. Sequences are packed along the first dim: sequence ``b`` owns query rows
``[cu_seqlens_q[b], cu_seqlens_q[b+1])`` and the keys from ``cu_seqlens_k[b]`` on
(``cu_seqlens_k[b+1] - cu_seqlens_k[b]`` of them, or ``seqused_k[b]``). Inside a sequence
everything is the dense semantics of batch entry ``b``: causal / window bottom-right aligned
to its own lengths, ALiBi distances and dropout counters local to it (batch index = sequence
index, docs/internals.md).

No tensor value is read on the host for GPU tensors (the grids come from ``max_seqlen_*``),
so a call can be captured in a CUDA graph. The compute is the ``flashattn::varlen_fwd`` op
(:func:`flashattn.ops.varlen_attention`; its autograd formula calls ``flashattn::varlen_bwd``),
and the dropout seed is drawn as for the dense functions (a random op of a compiled graph).
"""
from __future__ import annotations

from typing import Optional, Sequence, Tuple, Union

import torch

from flashattn import metadata
from flashattn import ops as _ops
from flashattn.params import AttnParams
from flashattn.replay import autograd as _replay_autograd
from flashattn.api import fastpath as _fast
from flashattn.api import out as _out
from flashattn.api import chunked as _chunked
from flashattn.api import normalise as _p
from flashattn.api import fp8_attention as _fp8
from flashattn.api import segments as _segments
from flashattn.api import validation as _v
from flashattn.api import wide_v as _wide_v

Tensor = torch.Tensor
AttnOutput = Union[Tensor, Tuple[Tensor, Tensor, Optional[Tensor]]]

# ---------------------------------------------------------------------------------------------
# Validation and normalisation
# ---------------------------------------------------------------------------------------------
def check_values(cu_seqlens_q: Tensor, cu_seqlens_k: Tensor, seqused_k: Optional[Tensor],
                 max_seqlen_q: int, max_seqlen_k: int, total_q: int,
                 total_k: Optional[int]) -> None:
    """The value checks of the lengths where they sit in host memory (free), or on a device in
    the checked mode (flashattn.checks(): one sync); never during graph capture or compile
    tracing. ``total_k`` None: paged keys (no packed key rows to bound)."""
    if metadata.values_checkable(cu_seqlens_q, cu_seqlens_k, seqused_k):
        host_q, host_k, host_used = metadata.to_host(cu_seqlens_q, cu_seqlens_k, seqused_k)
        _v.check_varlen_values(host_q, host_k, host_used, max_seqlen_q, max_seqlen_k, total_q,
                               total_k)


def check_seqused_q_values(cu_seqlens_q: Tensor, seqused_q: Optional[Tensor]) -> None:
    """seqused_q[b] in [0, the rows of sequence b], where the values are checkable (as
    :func:`check_values`)."""
    if seqused_q is not None and metadata.values_checkable(cu_seqlens_q, seqused_q):
        host_q, host_used = metadata.to_host(cu_seqlens_q, seqused_q)
        rows = [e - s for s, e in zip(host_q.tolist(), host_q.tolist()[1:])]
        for b_idx, (used, n) in enumerate(zip(host_used.tolist(), rows)):
            if not 0 <= used <= n:
                raise ValueError(f"seqused_q[{b_idx}] = {used} must be in [0, {n}] (sequence "
                                 f"{b_idx} has {n} query rows in cu_seqlens_q)")


def _varlen_attention(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    cu_seqlens_q: Tensor,
    cu_seqlens_k: Tensor,
    max_seqlen_q: int,
    max_seqlen_k: int,
    dropout_p: float,
    softmax_scale: Optional[float],
    causal: bool,
    window_size: Sequence[int],
    softcap: float,
    alibi_slopes: Optional[Tensor],
    deterministic: bool,
    return_attn_probs: bool,
    block_table: Optional[Tensor],
    seqused_k: Optional[Tensor],
    names: Tuple[str, str, str],
    cu_names: Tuple[str, str] = ("cu_seqlens_q", "cu_seqlens_k"),
    max_names: Tuple[str, str] = ("max_seqlen_q", "max_seqlen_k"),
    descales: Tuple[Optional[Tensor], ...] = (None, None, None),
    out_dtype: Optional[torch.dtype] = None,
    learnable_sink: Optional[Tensor] = None,
    seqused_q: Optional[Tensor] = None,
    attention_chunk: int = 0,
    record: Optional[list] = None,
) -> AttnOutput:
    """Validate, normalise (flash-attn 2 semantics), run. q, k, v may be views of packed inputs.
    ``record``: a list that receives the normalised :class:`AttnParams` of a plain call (no
    dropout, ALiBi, block_table, sink or segments: the fast path's entry for its signature)."""
    fp8 = _fp8.is_fp8(q, k, v)
    attention_chunk = _v.check_attention_chunk(attention_chunk)
    segmented = seqused_q is not None or attention_chunk > 0
    if segmented and block_table is not None:
        raise NotImplementedError(
            "seqused_q / attention_chunk are not supported with block_table (paged KV: use "
            "flash_attn_with_kvcache, which takes attention_chunk) yet")
    _fp8.check_descales_need_fp8(fp8, descales, out_dtype)
    if fp8 and learnable_sink is not None:
        raise ValueError("learnable_sink is not supported with FP8 inputs")
    if fp8:
        if block_table is not None:
            raise ValueError("block_table (paged KV) is not supported with FP8 inputs")
        _fp8.check_fp8_qkv(q, k, v, names, varlen=True)
    elif block_table is None:
        _v.check_varlen_qkv(q, k, v, names, max_head_dim_v=_v.MAX_HEAD_DIM_V)
        if v.shape[-1] > _v.MAX_HEAD_DIM and _ops.grad_recorded(q, k, v, learnable_sink):
            # no backward kernel takes V this wide: by V's column slices (api/wide_v.py)
            _wide_v.refuse_dropout(_v.check_dropout_p(dropout_p))
            return _wide_v.by_slices(
                lambda v_s: _varlen_attention(
                    q, k, v_s, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k,
                    dropout_p, softmax_scale, causal, window_size, softcap, alibi_slopes,
                    deterministic, return_attn_probs, block_table, seqused_k, names, cu_names,
                    max_names, descales, out_dtype, learnable_sink, seqused_q,
                    attention_chunk), v)
    else:
        _v.check_paged_qkv(q, k, v, names)
    batch = _v.check_cu_seqlens(cu_seqlens_q, cu_seqlens_k, q.device, cu_names)
    max_seqlen_q = _v.check_max_seqlen(max_seqlen_q, max_names[0])
    max_seqlen_k = _v.check_max_seqlen(max_seqlen_k, max_names[1])
    _v.check_seqused_k(seqused_k, batch, q.device)
    _v.check_seqused_k(seqused_q, batch, q.device, "seqused_q")
    if block_table is not None:
        _v.check_block_table(block_table, batch, q.device)
    dropout_p = _v.check_dropout_p(dropout_p)
    scale, causal, window_left, window_right, softcap, deterministic = _v.check_options(
        softmax_scale, causal, window_size, softcap, deterministic)
    return_attn_probs = _v.check_bool(return_attn_probs, "return_attn_probs")
    h, d_qk = q.shape[1], q.shape[2]
    _v.check_alibi_slopes(alibi_slopes, batch, h, q.device)
    check_values(cu_seqlens_q, cu_seqlens_k, seqused_k, max_seqlen_q, max_seqlen_k, q.shape[0],
                 None if block_table is not None else k.shape[0])
    check_seqused_q_values(cu_seqlens_q, seqused_q)
    if fp8:
        return _fp8.varlen(q, k, v, cu_seqlens_q, cu_seqlens_k, seqused_k, max_seqlen_q,
                           max_seqlen_k, dropout_p=dropout_p, softmax_scale=softmax_scale,
                           causal=causal, window_size=(window_left, window_right),
                           softcap=softcap, alibi_slopes=alibi_slopes,
                           return_attn_probs=return_attn_probs, q_descale=descales[0],
                           k_descale=descales[1], v_descale=descales[2], out_dtype=out_dtype,
                           record=record, seqused_q=seqused_q, attention_chunk=attention_chunk)
    if block_table is not None and dropout_p > 0.0:
        raise ValueError(
            f"dropout_p must be 0.0 with block_table (the paged KV path is inference only), "
            f"got {dropout_p!r}")

    _v.check_learnable_sink(learnable_sink, h, q.device, dropout_p)
    scale = _p.softmax_scale_or_default(scale, d_qk)
    # flash-attn 2 (varlen): the window rule against max_seqlen_k (the batch maximum)
    window_left, window_right = _p.window(window_left, window_right, causal, max_seqlen_k)
    alibi_slopes = _p.alibi_bh(alibi_slopes, batch, h)
    philox_seed = _p.dropout_seed(dropout_p)
    # As flash-attn 2: S_dmask only exists with dropout.
    return_softmax = return_attn_probs and dropout_p > 0.0

    if segmented and not (seqused_q is None and _segments.chunk_is_noop(
            attention_chunk, max_seqlen_k, window_right, False)) and batch > 0:
        if return_softmax:
            raise NotImplementedError("return_attn_probs with dropout (S_dmask) is not "
                                      "supported together with seqused_q / attention_chunk")
        out, lse = _chunked.varlen(q, k, v, cu_seqlens_q, cu_seqlens_k, seqused_q, seqused_k,
                                   max_seqlen_q, max_seqlen_k, alibi_slopes, philox_seed, scale,
                                   causal, window_left, window_right, softcap, dropout_p,
                                   deterministic, attention_chunk, learnable_sink)
        return (out, lse, None) if return_attn_probs else out

    # Through the registered op (flashattn.ops): its autograd replays this seed in backward,
    # refuses gradients through the paged path, and torch.compile sees one opaque call.
    if learnable_sink is not None and block_table is None:
        out, lse = _ops.varlen_attention_with_sink(
            q, k, v, learnable_sink, cu_seqlens_q, cu_seqlens_k, seqused_k, alibi_slopes,
            max_seqlen_q, max_seqlen_k, scale, causal, window_left, window_right, softcap,
            deterministic)
        return (out, lse, None) if return_attn_probs else out
    if (record is not None and block_table is None and alibi_slopes is None
            and learnable_sink is None and dropout_p == 0.0):
        record.append(AttnParams(scale, causal, window_left, window_right, softcap, None, 0.0,
                                 0, deterministic))
    out, lse, s_dmask = _ops.varlen_attention(
        q, k, v, cu_seqlens_q, cu_seqlens_k, seqused_k, block_table, alibi_slopes,
        max_seqlen_q, max_seqlen_k, scale, causal, window_left, window_right, softcap,
        dropout_p, philox_seed, deterministic, return_softmax,
    )
    if learnable_sink is not None:  # the paged path: forward only
        out, lse = _ops.sink_apply(out, lse, learnable_sink, packed=True)
    if return_attn_probs:
        return out, lse, s_dmask
    return out


_NO_SIGNATURE = object()


def _recorded(q: Tensor, k: Tensor, v: Tensor, cu_seqlens_q: Tensor, cu_seqlens_k: Tensor,
              max_seqlen_q: int, max_seqlen_k: int, dropout_p: float,
              softmax_scale: Optional[float], causal: bool, window_size: Sequence[int],
              softcap: float, deterministic: bool, return_attn_probs: bool,
              seqused_k: Optional[Tensor], names: Tuple[str, str, str],
              cu_names: Tuple[str, str] = ("cu_seqlens_q", "cu_seqlens_k"),
              max_names: Tuple[str, str] = ("max_seqlen_q", "max_seqlen_k")) -> AttnOutput:
    """A packed call without ALiBi, block_table, sink, seqused_q, chunk or descales (the caller
    checks): a repeated call signature skips the checks and dispatch (api/fastpath.VARLEN;
    every layer of a packed training step, or of a serving loop's step, repeats one), its
    first call runs the full path and records it. :data:`_NO_SIGNATURE` for a call that has
    none (dropout, FP8, other types: the caller takes the full path)."""
    key = _fast.varlen_key(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k,
                           dropout_p, softmax_scale, causal, window_size, softcap,
                           deterministic, return_attn_probs, seqused_k)
    if key is None:
        return _NO_SIGNATURE
    runner = _fast.VARLEN.get(key)
    if runner is None:
        record: list = []
        res = _varlen_attention(
            q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, dropout_p,
            softmax_scale, causal, window_size, softcap, None, deterministic, return_attn_probs,
            None, seqused_k, names, cu_names, max_names, record=record)
        if record:
            _fast.varlen_record(key, q, k, v, cu_seqlens_q, seqused_k, max_seqlen_q,
                                max_seqlen_k, record[0])
        return res
    check_values(cu_seqlens_q, cu_seqlens_k, seqused_k, max_seqlen_q, max_seqlen_k, q.shape[0],
                 k.shape[0])
    out, lse = _replay_autograd.varlen_recorded(runner, q, k, v, cu_seqlens_q, cu_seqlens_k,
                                               seqused_k)
    return (out, lse, None) if return_attn_probs else out


def _packed_variant(q: Tensor, k: Tensor, v: Tensor, cu_seqlens_q: Tensor,
                    cu_seqlens_k: Tensor, max_seqlen_q: int, max_seqlen_k: int,
                    dropout_p: float, softmax_scale: Optional[float], causal: bool,
                    window_size: Sequence[int], softcap: float,
                    alibi_slopes: Optional[Tensor], deterministic: bool,
                    return_attn_probs: bool, names: Tuple[str, str, str],
                    cu_names: Tuple[str, str] = ("cu_seqlens_q", "cu_seqlens_k"),
                    max_names: Tuple[str, str] = ("max_seqlen_q", "max_seqlen_k")
                    ) -> AttnOutput:
    """The qkv- / kv-packed varlen functions' call on their views: the recorded call of a
    repeated signature (:func:`_recorded`), else the full path."""
    if alibi_slopes is None:
        res = _recorded(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k,
                        dropout_p, softmax_scale, causal, window_size, softcap, deterministic,
                        return_attn_probs, None, names, cu_names, max_names)
        if res is not _NO_SIGNATURE:
            return res
    return _varlen_attention(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k,
                             dropout_p, softmax_scale, causal, window_size, softcap,
                             alibi_slopes, deterministic, return_attn_probs, None, None, names,
                             cu_names, max_names)


# ---------------------------------------------------------------------------------------------
# Public API
# ---------------------------------------------------------------------------------------------
_COMMON_ARGS = """
        dropout_p: float in [0, 1). Dropout probability, applied as given (pass 0.0 at
            evaluation). The Philox seed is drawn from torch's default CPU generator
            (``torch.manual_seed`` reproduces it) only when dropout_p > 0. Dropout counters
            are per sequence: batch index = sequence index, rows/columns local to it.
        softmax_scale: float > 0 or None. Scaling of q @ k^T before softmax; default
            ``headdim ** -0.5``.
        causal: bool. Causal mask aligned to the bottom-right corner of each sequence
            (window_size (left, 0)).
        window_size: (left, right) ints >= -1, -1 = unbounded. Query i of a sequence attends
            to its keys ``[i + seqlen_k - seqlen_q - left, i + seqlen_k - seqlen_q + right]``
            (inclusive, that sequence's own lengths); as in flash-attn 2, a side
            >= max_seqlen_k counts as unbounded.
        softcap: float >= 0, 0.0 = off. Scores become ``softcap * tanh(scores / softcap)``.
        alibi_slopes: float32 tensor (nheads,) or (batch, nheads), or None. Adds
            ``-slope * |i + seqlen_k - seqlen_q - j|`` to the score of query i and key j
            (indices local to the sequence; batch = sequence).
        deterministic: bool. Bitwise-reproducible backward (may be slower).
        return_attn_probs: bool. Also return softmax_lse and S_dmask (S_dmask for testing only)."""

_RETURNS = """
    Returns:
        out: (total_q, nheads, headdim_v), dtype of q; 0 on rows outside every sequence.
        softmax_lse [if return_attn_probs]: float32 (nheads, total_q), natural log of the
            softmax denominator; -inf for a row that sees no key (its out row is 0).
        S_dmask [if return_attn_probs]: (batch, nheads, max_seqlen_q, max_seqlen_k), dtype of
            q, or None when dropout_p == 0 (as flash-attn 2). Sequence b's probabilities in
            [b, :, :seqlen_q, :seqlen_k] (before dropout scaling, negative where dropout
            dropped the entry), 0 elsewhere.

    The lengths in cu_seqlens / seqused_k are not read on the host for GPU tensors (the call
    stays CUDA-graph friendly), so they must be consistent: non-decreasing, within the packed
    tensors, and no sequence longer than max_seqlen_q / max_seqlen_k (checked for CPU
    tensors only).
    """


@_out.writes_out(_out.like_q("q", "v", 3, 3, "out_dtype"))
def flash_attn_varlen_func(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    cu_seqlens_q: Tensor,
    cu_seqlens_k: Tensor,
    max_seqlen_q: int,
    max_seqlen_k: int,
    dropout_p: float = 0.0,
    softmax_scale: Optional[float] = None,
    causal: bool = False,
    window_size: Tuple[int, int] = (-1, -1),  # -1 means infinite context window
    softcap: float = 0.0,  # 0.0 means deactivated
    alibi_slopes: Optional[Tensor] = None,
    deterministic: bool = False,
    return_attn_probs: bool = False,
    block_table: Optional[Tensor] = None,
    *,
    seqused_k: Optional[Tensor] = None,
    q_descale: Optional[Tensor] = None,
    k_descale: Optional[Tensor] = None,
    v_descale: Optional[Tensor] = None,
    out_dtype: Optional[torch.dtype] = None,
    learnable_sink: Optional[Tensor] = None,
    seqused_q: Optional[Tensor] = None,
    attention_chunk: int = 0,
) -> AttnOutput:
    if (block_table is None and alibi_slopes is None and learnable_sink is None
            and seqused_q is None and type(attention_chunk) is int and attention_chunk == 0
            and q_descale is None and k_descale is None and v_descale is None
            and out_dtype is None):
        res = _recorded(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k,
                        dropout_p, softmax_scale, causal, window_size, softcap, deterministic,
                        return_attn_probs, seqused_k, ("q", "k", "v"))
        if res is not _NO_SIGNATURE:
            return res
    if (block_table is None and learnable_sink is None and seqused_q is None
            and type(attention_chunk) is int and attention_chunk == 0):
        # FP8 inputs (FA3's descale API): the same, through replay.fp8.Fp8VarlenCall
        key = _fast.fa3_fp8_varlen_key(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q,
                                       max_seqlen_k, dropout_p, softmax_scale, causal,
                                       window_size, softcap, alibi_slopes, return_attn_probs,
                                       q_descale, k_descale, v_descale, out_dtype, seqused_k)
        if key is not None:
            run = _fast.FA3_FP8_VARLEN.get(key)
            if run:
                check_values(cu_seqlens_q, cu_seqlens_k, seqused_k, max_seqlen_q,
                             max_seqlen_k, q.shape[0], k.shape[0])
                return run(q, k, v, cu_seqlens_q, cu_seqlens_k, seqused_k, q_descale,
                           k_descale, v_descale)
            if run is None:  # (FP8_FULL_PATH: a signature no recorded call covers)
                record = []
                res = _varlen_attention(
                    q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, dropout_p,
                    softmax_scale, causal, window_size, softcap, None, deterministic,
                    return_attn_probs, None, seqused_k, ("q", "k", "v"),
                    descales=(q_descale, k_descale, v_descale), out_dtype=out_dtype,
                    record=record)
                if record:
                    params, out_dtype_ = record[0]
                    _fast.fa3_fp8_varlen_record(key, q, k, v, cu_seqlens_q, seqused_k,
                                                max_seqlen_k, (q_descale, k_descale, v_descale),
                                                params, out_dtype_)
                return res
    return _varlen_attention(
        q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, dropout_p,
        softmax_scale, causal, window_size, softcap, alibi_slopes, deterministic,
        return_attn_probs, block_table, seqused_k, ("q", "k", "v"),
        descales=(q_descale, k_descale, v_descale), out_dtype=out_dtype,
        learnable_sink=learnable_sink, seqused_q=seqused_q, attention_chunk=attention_chunk,
    )


flash_attn_varlen_func.__doc__ = """Exact attention over packed variable-length sequences.

    Sequence b has query rows ``cu_seqlens_q[b]:cu_seqlens_q[b+1]`` of q and keys/values
    ``cu_seqlens_k[b]:cu_seqlens_k[b+1]`` of k and v (or the first ``seqused_k[b]`` of them),
    and is attended exactly as batch entry b of :func:`flashattn.flash_attn_func`.
    Supports MQA/GQA (nheads % nheads_k == 0; query head i uses kv head
    ``i // (nheads // nheads_k)``), zero-length sequences and forward + backward.

    Arguments:
        q: (total_q, nheads, headdim), float16, bfloat16 or float32; last dim contiguous.
            headdim in 1..256.
        k: (total_k, nheads_k, headdim), same dtype and device as q; or, with block_table,
            the paged cache (num_blocks, page_size, nheads_k, headdim).
        v: (total_k, nheads_k, headdim_v), same dtype and device; headdim_v in 1..512 (past
            256 a call with a gradient runs by V's column slices, no dropout); or the paged cache
            (num_blocks, page_size, nheads_k, headdim_v), headdim_v in 1..256.
        cu_seqlens_q: (batch + 1,) torch.int32, cumulative query lengths (row offsets into q).
        cu_seqlens_k: (batch + 1,) torch.int32, cumulative key lengths (row offsets into k, v).
        max_seqlen_q: int >= 0, the longest query sequence (sizes the launch grid).
        max_seqlen_k: int >= 0, the longest key sequence (0: every key sequence is empty;
            out is 0 and lse -inf, as flash-attn).""" + _COMMON_ARGS + """
        block_table: None, or (batch, max_blocks_per_seq) torch.int32: pages of the KV cache
            for each sequence (paged KV, forward only: gradients raise NotImplementedError;
            dropout_p must be 0).
        seqused_k: None, or (batch,) torch.int32 (keyword only): the number of keys sequence
            b actually uses, counted from cu_seqlens_k[b]; its seqlen_k for masks and
            alignment. dk/dv of unused keys are 0.
        q_descale, k_descale, v_descale: None, or float32 (batch, nheads_k) (keyword only;
            FP8 inputs only, FlashAttention-3's convention): with float8_e4m3fn q, k, v the
            real values are fp8 × descale (None = 1). FP8 calls are forward only, without
            dropout, ALiBi, block_table or return_attn_probs.
        out_dtype: None or the output dtype of an FP8 call (keyword only; default bfloat16).
        learnable_sink: None, or a float (nheads,) tensor (keyword only): one extra softmax
            logit per head that attends to nothing (gpt-oss's sinks); differentiable.
        seqused_q: None, or (batch,) torch.int32 (keyword only; FlashAttention-3): the number
            of query rows sequence b actually uses, counted from cu_seqlens_q[b]; its seqlen_q
            for the alignment. Its other rows get out 0, lse -inf and dq 0.
        attention_chunk: int >= 0 (keyword only; FlashAttention-3's chunked local attention),
            0 = off: within each sequence, a query at key position p sees only keys j with
            ``j // attention_chunk == floor(p / attention_chunk)``. Not with block_table.
""" + _RETURNS + _out.OUT_DOC


@_out.writes_out(_out.packed_qkv("qkv", 1))
def flash_attn_varlen_qkvpacked_func(
    qkv: Tensor,
    cu_seqlens: Tensor,
    max_seqlen: int,
    dropout_p: float = 0.0,
    softmax_scale: Optional[float] = None,
    causal: bool = False,
    window_size: Tuple[int, int] = (-1, -1),  # -1 means infinite context window
    softcap: float = 0.0,  # 0.0 means deactivated
    alibi_slopes: Optional[Tensor] = None,
    deterministic: bool = False,
    return_attn_probs: bool = False,
) -> AttnOutput:
    _v.check_tensor(qkv, "qkv", 4, "(total, 3, nheads, headdim)")
    if qkv.shape[1] != 3:
        raise ValueError(
            f"qkv must have shape (total, 3, nheads, headdim) with size 3 in dim 1, got shape "
            f"{tuple(qkv.shape)}")
    q, k, v = qkv.unbind(dim=1)  # views: autograd assembles dqkv
    return _packed_variant(q, k, v, cu_seqlens, cu_seqlens, max_seqlen, max_seqlen, dropout_p,
                           softmax_scale, causal, window_size, softcap, alibi_slopes,
                           deterministic, return_attn_probs,
                           ("qkv[:, 0]", "qkv[:, 1]", "qkv[:, 2]"),
                           ("cu_seqlens", "cu_seqlens"), ("max_seqlen", "max_seqlen"))


flash_attn_varlen_qkvpacked_func.__doc__ = """Packed self-attention over variable-length sequences.

    Same as ``flash_attn_varlen_func(*qkv.unbind(1), cu_seqlens, cu_seqlens, max_seqlen,
    max_seqlen, ...)``; the gradient comes back as one (total, 3, nheads, headdim) tensor.

    Arguments:
        qkv: (total, 3, nheads, headdim), float16, bfloat16 or float32; last dim contiguous.
            headdim in 1..256.
        cu_seqlens: (batch + 1,) torch.int32, cumulative sequence lengths.
        max_seqlen: int >= 1, the longest sequence.""" + _COMMON_ARGS + "\n" + _RETURNS + _out.OUT_DOC


@_out.writes_out(_out.like_q("q", "kv", 4, 3))
def flash_attn_varlen_kvpacked_func(
    q: Tensor,
    kv: Tensor,
    cu_seqlens_q: Tensor,
    cu_seqlens_k: Tensor,
    max_seqlen_q: int,
    max_seqlen_k: int,
    dropout_p: float = 0.0,
    softmax_scale: Optional[float] = None,
    causal: bool = False,
    window_size: Tuple[int, int] = (-1, -1),  # -1 means infinite context window
    softcap: float = 0.0,  # 0.0 means deactivated
    alibi_slopes: Optional[Tensor] = None,
    deterministic: bool = False,
    return_attn_probs: bool = False,
) -> AttnOutput:
    _v.check_tensor(q, "q", 3, "(total_q, nheads, headdim)")
    _v.check_tensor(kv, "kv", 4, "(total_k, 2, nheads_k, headdim)")
    if kv.shape[1] != 2:
        raise ValueError(
            f"kv must have shape (total_k, 2, nheads_k, headdim) with size 2 in dim 1, got "
            f"shape {tuple(kv.shape)}")
    k, v = kv.unbind(dim=1)
    return _packed_variant(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k,
                           dropout_p, softmax_scale, causal, window_size, softcap, alibi_slopes,
                           deterministic, return_attn_probs, ("q", "kv[:, 0]", "kv[:, 1]"))


flash_attn_varlen_kvpacked_func.__doc__ = """Variable-length attention, k and v packed in one tensor.

    Same as ``flash_attn_varlen_func(q, *kv.unbind(1), ...)``. Supports MQA/GQA: nheads must
    be a multiple of nheads_k.

    Arguments:
        q: (total_q, nheads, headdim), float16, bfloat16 or float32; last dim contiguous.
            headdim in 1..256.
        kv: (total_k, 2, nheads_k, headdim), same dtype and device as q.
        cu_seqlens_q: (batch + 1,) torch.int32, cumulative query lengths.
        cu_seqlens_k: (batch + 1,) torch.int32, cumulative key lengths.
        max_seqlen_q: int >= 1, the longest query sequence.
        max_seqlen_k: int >= 1, the longest key sequence.""" + _COMMON_ARGS + "\n" + _RETURNS + _out.OUT_DOC


__all__ = [
    "flash_attn_varlen_func",
    "flash_attn_varlen_qkvpacked_func",
    "flash_attn_varlen_kvpacked_func",
]
