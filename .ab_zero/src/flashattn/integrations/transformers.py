"""Hugging Face transformers backend: ``attn_implementation="fa_triton"``.

Usage::

    import flashattn.integrations.transformers as fa_hf
    fa_hf.register()                      # returns the name, "fa_triton"
    model = AutoModelForCausalLM.from_config(cfg, attn_implementation="fa_triton")
    # or: model.set_attn_implementation("fa_triton")

Why not "flashattn": transformers 5 treats every implementation name that contains "flash"
as a flash-attention request and tries to import flash-attn (or a Hub kernel of that name)
for it, which fails for a registered function. On transformers 4.x, where that check does
not exist, :func:`register` also registers the earlier name "flashattn" (an alias).

:func:`register` adds the name to transformers' ``AttentionInterface`` (the attention call
of every model written against it: Llama, Mistral, Gemma-2, Qwen, ...) and to its
``AttentionMaskInterface`` with transformers' own flash-attention mask builder, so the model
hands :func:`attention_forward` what flash-attn 2 gets: ``None`` (no padding: dense
causal path) or the 2D padding mask (batch, kv_length) (then the packed varlen path).

What :func:`attention_forward` covers (the semantics of transformers' ``flash_attention_2``):

- padding masks -> unpad, :func:`flashattn.flash_attn_varlen_func`, pad back (left or right
  padding; with a KV cache the queries are the last ``q_len`` positions of each row);
- packed sequences without padding (``cu_seq_lens_q`` / ``cu_seq_lens_k`` / ``max_length_q``
  / ``max_length_k`` kwargs, e.g. from ``DataCollatorWithFlattening``, or ``position_ids``
  that restart at 0 inside one row) -> varlen, no attention across sequences;
- GQA / MQA (k, v keep their own head count, never repeated), ``scaling``, causal or not
  (``module.is_causal`` or an ``is_causal`` kwarg), sliding windows (Mistral / Gemma-2:
  ``sliding_window`` w -> window (w - 1, w - 1), so with causal a query sees itself and the
  w - 1 keys before it), ``softcap`` (Gemma-2 ``attn_logit_softcapping``), dropout in training
  (``dropout`` as the model passes it), ``deterministic`` (kwarg or
  ``FLASH_ATTENTION_DETERMINISTIC=1``);
- fp32 as well as fp16 / bf16 (no down-cast: flashattn computes fp32 natively);
- attention sinks (``s_aux``, gpt-oss) as flashattn's ``learnable_sink``, with gradients.

Context parallelism: inside ``with context_parallel(group):`` every call of a model registered
with this backend runs over ``group`` (:mod:`flashattn.parallel`): the model is fed its local
shard of the sequence (``input_ids`` and the matching global ``position_ids``, laid out by
:func:`flashattn.parallel.zigzag_shard` for the ring or ``contiguous_shard`` for Ulysses) and
each attention layer computes attention over the whole sequence. No padding mask there
(pack documents instead); the loss is the caller's (labels shifted before sharding).

Not supported: ``output_attentions`` (the weights come back as ``None``, as with
flash-attention 2), ``head_mask`` and
custom 4D masks (ValueError: use ``sdpa`` or ``eager`` for those).

The dense path traces under ``torch.compile(fullgraph=True)`` (packed rows then need the
``cu_seq_lens_*`` kwargs: position ids are not inspected while compiling); the padded path
reads the longest sequence length on the host (``.item()``), as transformers'
flash-attention 2 path does, which breaks the graph there.
"""
from __future__ import annotations

import contextlib
import warnings
from typing import Any, Callable, Iterator, Optional, Tuple

import torch

from flashattn.api.dense import flash_attn_func
from flashattn.api.kvcache import flash_attn_with_kvcache
from flashattn.runtime import env
from flashattn.api.bert_padding import index_first_axis, pad_input, unpad_input

Tensor = torch.Tensor

NAME = "fa_triton"
# The name of the first releases (2026-11-22); transformers >= 5 cannot use it (see the module docstring).
LEGACY_NAME = "flashattn"


def _varlen_function() -> Optional[Callable[..., Any]]:
    """flashattn's ``flash_attn_varlen_func`` (flash-attn 2 signature), looked up at call time
    so that the packed kernels are used as soon as they are importable; None if they are not."""
    try:
        from flashattn.api.varlen import flash_attn_varlen_func
    except ImportError:
        return None
    return flash_attn_varlen_func


def _masked_varlen(q: Tensor, k: Tensor, v: Tensor, cu_seqlens_q: Tensor, cu_seqlens_k: Tensor,
                   max_seqlen_q: int, max_seqlen_k: int, **kwargs: Any) -> Tensor:
    """Exact fallback for ``flash_attn_varlen_func``: each packed sequence through the dense
    kernel on its own (same per-sequence semantics, one launch per sequence)."""
    del max_seqlen_q, max_seqlen_k
    bounds_q, bounds_k = cu_seqlens_q.tolist(), cu_seqlens_k.tolist()
    out = q.new_zeros((q.shape[0], q.shape[1], v.shape[-1]))
    for b in range(len(bounds_q) - 1):
        q0, q1, k0, k1 = bounds_q[b], bounds_q[b + 1], bounds_k[b], bounds_k[b + 1]
        if q1 > q0:
            out[q0:q1] = flash_attn_func(q[None, q0:q1], k[None, k0:k1], v[None, k0:k1],
                                         **kwargs)[0]
    return out


def _run_varlen(q: Tensor, k: Tensor, v: Tensor, cu_seqlens_q: Tensor, cu_seqlens_k: Tensor,
                max_seqlen_q: int, max_seqlen_k: int, **kwargs: Any) -> Tensor:
    cu_seqlens_q = cu_seqlens_q.to(device=q.device, dtype=torch.int32)
    cu_seqlens_k = cu_seqlens_k.to(device=q.device, dtype=torch.int32)
    varlen = _varlen_function()
    if varlen is None:
        return _masked_varlen(q, k, v, cu_seqlens_q, cu_seqlens_k, int(max_seqlen_q),
                              int(max_seqlen_k), **kwargs)
    return varlen(q, k, v, cu_seqlens_q, cu_seqlens_k, int(max_seqlen_q), int(max_seqlen_k),
                  **kwargs)


def _unpad_qkv(q: Tensor, k: Tensor, v: Tensor, mask: Tensor):
    """Pack the real tokens. q (b, s_q, h, d), k / v (b, s_k, h_k, d), mask (b, s_mask) with
    s_mask >= s_q: key j of a row is real where mask[:, j] (a longer static cache is cut to
    the mask); queries are the last s_q positions (left padding, or decoding with a cache)."""
    b, s_q = q.shape[:2]
    s_mask = mask.shape[1]
    if k.shape[1] > s_mask:
        k, v = k[:, :s_mask], v[:, :s_mask]
    k_u, indices_k, cu_k, max_k, _ = unpad_input(k, mask)
    v_u = index_first_axis(v.reshape(-1, *v.shape[2:]), indices_k)
    if s_q == k.shape[1]:
        q_u = index_first_axis(q.reshape(-1, *q.shape[2:]), indices_k)
        return q_u, k_u, v_u, indices_k, cu_k, cu_k, max_k, max_k
    if s_q == 1:
        # one new token per row (decoding): every row has exactly one query
        cu_q = torch.arange(b + 1, dtype=torch.int32, device=q.device)
        return q[:, 0], k_u, v_u, cu_q[:-1].long(), cu_q, cu_k, 1, max_k
    q_u, indices_q, cu_q, max_q, _ = unpad_input(q, mask[:, -s_q:])
    return q_u, k_u, v_u, indices_q, cu_q, cu_k, max_q, max_k


def _decode_left_padded(q: Tensor, k: Tensor, v: Tensor, mask: Tensor, params: dict
                        ) -> Optional[Tensor]:
    """One new token per row against a cache whose padding is a prefix of each row (left
    padding, the only padding generate() decodes with; an all-ones mask included): the KV-cache
    decode kernel over each row's keys [pad, s_k), with ``cache_leftpad`` = pad, instead of
    packing the whole cache into a varlen batch every step (a gather of all of K and V per
    layer and token). The mask's shape is checked with one device read (the varlen path's
    nonzero synchronises too); any other mask returns None (the varlen path)."""
    if torch.compiler.is_compiling():
        return None
    s_k = min(k.shape[1], mask.shape[1])
    m = mask[:, :s_k].bool()
    pad = (s_k - m.sum(dim=1)).to(torch.int32)
    positions = torch.arange(s_k, device=m.device)
    if not bool((m == (positions[None, :] >= pad[:, None])).all()):
        return None
    params = {key: value for key, value in params.items()
              if key not in ("dropout_p", "deterministic")}
    return flash_attn_with_kvcache(q, k[:, :s_k], v[:, :s_k], cache_seqlens=s_k,
                                   cache_leftpad=pad, **params)


def _packed_from_position_ids(position_ids: Tensor) -> Tuple[Tensor, int]:
    """cu_seqlens (int32) and the longest length of sequences packed in one row, from
    position ids that restart at 0 where a new sequence starts."""
    flat = position_ids.reshape(-1)
    starts = (flat == 0).nonzero().flatten().to(torch.int32)
    if starts.numel() == 0 or int(starts[0]) != 0:
        starts = torch.cat([starts.new_zeros(1), starts])
    cu = torch.cat([starts, starts.new_tensor([flat.numel()])])
    return cu, int(cu.diff().max().item())


def _is_packed_row(position_ids: Optional[Tensor], batch: int) -> bool:
    """One row whose positions are not 0, 1, 2, ... (several sequences packed in it).

    Reads the positions on the host, so it is skipped for a single new token (decoding: one
    token is never packed, and a GPU sync per layer and token would cost) and under
    torch.compile (a data-dependent branch breaks the graph): there, packed sequences must
    come with the cu_seq_lens_* / max_length_* kwargs.
    """
    if position_ids is None or batch != 1 or position_ids.dim() != 2:
        return False
    if position_ids.shape[-1] <= 1 or torch.compiler.is_compiling():
        return False
    ramp = torch.arange(position_ids.shape[-1], device=position_ids.device)
    return bool((position_ids[0] - position_ids[0, 0] != ramp).any())


_warned: set = set()


_CP_STATE: dict = {}  # the active context_parallel(...) settings (empty: one process)


@contextlib.contextmanager
def context_parallel(group: Any = None, *, method: str = "ring", layout: str = "zigzag"
                     ) -> Iterator[None]:
    """Run the registered attention over ``group`` while the block is active.

    Args:
        group: a torch.distributed ProcessGroup or 1-D DeviceMesh (default: the default group).
        method: "ring" (:func:`flashattn.parallel.ring_flash_attn_func`; windows, softcap,
            GQA) or "ulysses" (:func:`flashattn.parallel.ulysses_flash_attn_func`; also dropout).
        layout: the ring's sequence layout, "zigzag" (default) or "contiguous"; Ulysses takes
            contiguous shards.
    """
    if method not in ("ring", "ulysses"):
        raise ValueError(f"method: expected 'ring' or 'ulysses', got {method!r}")
    previous = dict(_CP_STATE)
    _CP_STATE.clear()
    _CP_STATE.update(group=group, method=method, layout=layout)
    try:
        yield
    finally:
        _CP_STATE.clear()
        _CP_STATE.update(previous)


def _context_parallel_attention(q: Tensor, k: Tensor, v: Tensor, attention_mask, params: dict,
                                sliding_window: Optional[int]) -> Tensor:
    """The attention of the whole sharded sequence (inside :func:`context_parallel`)."""
    import torch.distributed as dist

    from flashattn import parallel

    if attention_mask is not None:
        raise ValueError("attention_mask: padding masks are not supported under "
                         "context_parallel(); pack the documents without padding")
    if params.pop("learnable_sink", None) is not None:
        raise NotImplementedError("attention sinks (s_aux) under context_parallel()")
    group, method = _CP_STATE["group"], _CP_STATE["method"]
    world = dist.get_world_size(group.get_group() if hasattr(group, "get_group") else group)
    if sliding_window is not None and k.shape[1] * world > sliding_window:
        params["window_size"] = (sliding_window - 1, sliding_window - 1)
    if method == "ulysses":
        return parallel.ulysses_flash_attn_func(q, k, v, group=group, **params)
    if params.pop("dropout_p") > 0.0:
        raise NotImplementedError("attention dropout with context_parallel(method='ring'); "
                                  "use method='ulysses' or dropout 0")
    return parallel.ring_flash_attn_func(q, k, v, group=group, layout=_CP_STATE["layout"],
                                         **params)


def _warn_once(message: str) -> None:
    if message not in _warned:
        _warned.add(message)
        warnings.warn(message, UserWarning, stacklevel=3)


def attention_forward(
    module: torch.nn.Module,
    query: Tensor,
    key: Tensor,
    value: Tensor,
    attention_mask: Optional[Tensor],
    dropout: float = 0.0,
    scaling: Optional[float] = None,
    sliding_window: Optional[int] = None,
    softcap: Optional[float] = None,
    **kwargs: Any,
) -> Tuple[Tensor, None]:
    """transformers' attention-interface call on flashattn's kernels.

    Args:
        module: the attention module (``is_causal`` read from it unless an ``is_causal``
            kwarg is given).
        query: (batch, nheads, q_len, head_dim); key / value: (batch, nheads_kv, kv_len,
            head_dim), nheads % nheads_kv == 0. fp16, bf16 or fp32.
        attention_mask: None, or the (batch, kv_len_or_more) bool padding mask built by
            transformers' flash-attention mask function (True = real token).
        dropout: attention dropout probability (the model passes 0.0 in eval mode).
        scaling: softmax scale (default head_dim ** -0.5).
        sliding_window: None, or the window w of Mistral / Gemma-2 sliding layers.
        softcap: None / 0.0, or the logit soft-capping value.
        kwargs: ``cu_seq_lens_q``, ``cu_seq_lens_k``, ``max_length_q``, ``max_length_k``
            (packed sequences), ``position_ids``, ``is_causal``, ``deterministic``; others
            are ignored.

    Returns:
        (attn_output (batch, q_len, nheads, head_dim) in query's dtype, None).
    """
    if kwargs.get("output_attentions", False) or kwargs.get("head_mask") is not None:
        _warn_once("attn_implementation='fa_triton' does not return attention weights or "
                   "apply head_mask; use 'eager' for those.")
    if attention_mask is not None and attention_mask.dim() != 2:
        raise ValueError(
            f"attn_implementation='fa_triton' takes a 2D padding mask (batch, kv_len); got an "
            f"attention_mask of shape {tuple(attention_mask.shape)} (a custom 4D mask); use "
            "attn_implementation='sdpa' or 'eager' for custom masks.")
    # (b, h, s, d) -> flash-attn's (b, s, h, d): views, last dim stays unit-stride
    q, k, v = query.transpose(1, 2), key.transpose(1, 2), value.transpose(1, 2)
    if k.dtype != q.dtype:
        k, v = k.to(q.dtype), v.to(q.dtype)
    batch, q_len = q.shape[:2]

    is_causal = kwargs.get("is_causal")
    if is_causal is None:
        is_causal = getattr(module, "is_causal", True)
    window = (-1, -1)
    if sliding_window is not None and k.shape[1] > sliding_window:
        window = (sliding_window - 1, sliding_window - 1)
    deterministic = kwargs.get("deterministic")
    if deterministic is None:
        deterministic = env.hf_deterministic()
    params = dict(dropout_p=float(dropout), softmax_scale=scaling, causal=bool(is_causal),
                  window_size=window, softcap=float(softcap or 0.0),
                  deterministic=bool(deterministic))
    if kwargs.get("s_aux") is not None:  # attention sinks (gpt-oss): one logit per head
        params["learnable_sink"] = kwargs["s_aux"].to(device=q.device)
    if _CP_STATE:
        params["window_size"] = (-1, -1)  # the global length decides, below
        return _context_parallel_attention(q, k, v, attention_mask, params,
                                           sliding_window), None

    cu_q, cu_k = kwargs.get("cu_seq_lens_q"), kwargs.get("cu_seq_lens_k")
    max_q, max_k = kwargs.get("max_length_q"), kwargs.get("max_length_k")
    position_ids = kwargs.get("position_ids")
    decoded = None
    if attention_mask is not None and q_len == 1 and dropout == 0:
        decoded = _decode_left_padded(q, k, v, attention_mask, params)
    if decoded is not None:
        out = decoded
    elif attention_mask is not None:
        q_u, k_u, v_u, indices_q, cu_seqlens_q, cu_seqlens_k, max_sq, max_sk = _unpad_qkv(
            q, k, v, attention_mask.bool())
        out_u = _run_varlen(q_u, k_u, v_u, cu_seqlens_q, cu_seqlens_k, max_sq, max_sk, **params)
        out = pad_input(out_u, indices_q, batch, q_len)
    elif all(x is not None for x in (cu_q, cu_k, max_q, max_k)) or \
            _is_packed_row(position_ids, batch):
        if cu_q is None or cu_k is None or max_q is None or max_k is None:
            cu_q, max_q = _packed_from_position_ids(position_ids)
            cu_k, max_k = cu_q, max_q
        flat = [t.reshape(-1, *t.shape[2:]) for t in (q, k, v)]
        out = _run_varlen(*flat, cu_q, cu_k, max_q, max_k, **params)
        out = out.view(batch, -1, *out.shape[1:])
    else:
        out = flash_attn_func(q, k, v, **params)
    return out, None


def _flash_in_name_is_reserved() -> bool:
    """True when this transformers treats names containing "flash" as flash-attn requests."""
    try:
        from transformers.utils import generic
    except ImportError:  # pragma: no cover
        return False
    return hasattr(generic, "is_flash_attention_requested")


def register(name: str = NAME) -> str:
    """Register ``name`` (default "fa_triton") with transformers' AttentionInterface and
    AttentionMaskInterface; on transformers without the "flash" name check (4.x) also the
    alias "flashattn". Idempotent; returns ``name``. Needs ``transformers`` >= 4.56 (tested
    with 4.57.1 and 5.23.0).

    Raises:
        ValueError: ``name`` contains "flash" on a transformers that reserves such names.
    """
    reserved = _flash_in_name_is_reserved()
    if reserved and "flash" in name:
        raise ValueError(
            f"register(name={name!r}): this transformers treats implementation names that "
            "contain 'flash' as flash-attn requests and would not call flashattn; use a name "
            f"without 'flash' (default {NAME!r}).")
    try:
        from transformers import AttentionInterface
        from transformers.masking_utils import AttentionMaskInterface, flash_attention_mask
    except ImportError as e:  # pragma: no cover - depends on the environment
        raise ImportError(
            "flashattn.integrations.transformers.register() needs the 'transformers' package "
            f"with AttentionInterface and AttentionMaskInterface (>= 4.56): {e}") from e
    names = [name] if reserved or name == LEGACY_NAME else [name, LEGACY_NAME]
    for registered in names:
        AttentionInterface.register(registered, attention_forward)
        AttentionMaskInterface.register(registered, flash_attention_mask)
    return name


__all__ = ["LEGACY_NAME", "NAME", "attention_forward", "context_parallel", "register"]
