"""Padding helpers with flash-attn's ``flash_attn.bert_padding`` conventions.

Between a padded batch ``(batch, seqlen, ...)`` plus a 0/1 mask and the packed
``(total_tokens, ...)`` layout that :func:`flashattn.flash_attn_varlen_func` takes.
Return values follow flash-attn 2.7 and later (``unpad_input`` returns five values, the last
one ``seqused``; flash-attn <= 2.6 returned the first four), so
``from flash_attn.bert_padding import pad_input, unpad_input`` becomes
``from flashattn.api.bert_padding import pad_input, unpad_input`` with nothing else changed.

Everything is plain torch indexing (autograd flows through the gathers and scatters).
``unpad_input`` reads the longest length with ``.item()`` (the varlen API wants a Python int),
which synchronises a GPU once per call, as flash-attn's does.
"""
from __future__ import annotations

from typing import Optional, Tuple

import torch
import torch.nn.functional as F

Tensor = torch.Tensor


def _check_mask(mask: object, name: str, hidden_states: Tensor) -> Tensor:
    if not isinstance(mask, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor of shape (batch, seqlen), got "
                        f"{type(mask).__name__}")
    if mask.dtype.is_floating_point or mask.dtype.is_complex:
        raise TypeError(f"{name} must be a bool or integer tensor (1 = keep), got dtype "
                        f"{mask.dtype}")
    if mask.dim() != 2 or tuple(mask.shape) != tuple(hidden_states.shape[:2]):
        raise ValueError(
            f"{name} must have shape (batch, seqlen) = {tuple(hidden_states.shape[:2])} (the "
            f"first two dims of hidden_states), got {tuple(mask.shape)}")
    return mask


def _check_hidden(hidden_states: object) -> Tensor:
    if not isinstance(hidden_states, torch.Tensor) or hidden_states.dim() < 2:
        got = (f"shape {tuple(hidden_states.shape)}" if isinstance(hidden_states, torch.Tensor)
               else type(hidden_states).__name__)
        raise ValueError(f"hidden_states must be a tensor of shape (batch, seqlen, ...), got {got}")
    return hidden_states


def _cu_seqlens(seqlens: Tensor) -> Tensor:
    """(batch,) lengths -> (batch + 1,) int32 offsets starting at 0."""
    return F.pad(torch.cumsum(seqlens, dim=0, dtype=torch.int32), (1, 0))


def _max_len(seqlens: Tensor) -> int:
    return int(seqlens.max().item()) if seqlens.numel() else 0


def index_first_axis(input: Tensor, indices: Tensor) -> Tensor:
    """``input[indices]`` along dim 0: input (n, ...), indices int64 (m,) -> (m, ...)."""
    return input.index_select(0, indices)


def index_put_first_axis(values: Tensor, indices: Tensor, first_axis_dim: int) -> Tensor:
    """Scatter rows into zeros: values (m, ...), indices int64 (m,) -> (first_axis_dim, ...)
    with ``out[indices] = values`` and 0 elsewhere."""
    out = values.new_zeros((first_axis_dim, *values.shape[1:]))
    return out.index_put((indices,), values)


def unpad_input(
    hidden_states: Tensor, attention_mask: Tensor, unused_mask: Optional[Tensor] = None
) -> Tuple[Tensor, Tensor, Tensor, int, Tensor]:
    """Pack the kept tokens of a padded batch.

    Args:
        hidden_states: (batch, seqlen, ...), any dtype.
        attention_mask: (batch, seqlen) bool or integer, 1 = real token, 0 = padding.
        unused_mask: optional (batch, seqlen) bool or integer, 1 = a slot that is allocated
            (kept in the packed tensor and counted in cu_seqlens) but not used; such slots
            should follow the used tokens of their row.

    Returns:
        hidden_states: (total_nnz, ...) the kept tokens (attention_mask + unused_mask), in
            row-major order.
        indices: int64 (total_nnz,), their positions in the flattened (batch * seqlen) input.
        cu_seqlens: int32 (batch + 1,), cumulative kept lengths (offsets into the packed rows).
        max_seqlen_in_batch: int, the longest kept length.
        seqused: int32 (batch,), the number of used tokens per row (attention_mask only), for
            ``seqused_k``.
    """
    hidden_states = _check_hidden(hidden_states)
    attention_mask = _check_mask(attention_mask, "attention_mask", hidden_states)
    kept = attention_mask.bool()
    if unused_mask is not None:
        kept = kept | _check_mask(unused_mask, "unused_mask", hidden_states).bool()
    seqlens = kept.sum(dim=-1, dtype=torch.int32)
    seqused = attention_mask.bool().sum(dim=-1, dtype=torch.int32)
    indices = torch.nonzero(kept.flatten(), as_tuple=False).flatten()
    flat = hidden_states.reshape(-1, *hidden_states.shape[2:])
    return (index_first_axis(flat, indices), indices, _cu_seqlens(seqlens), _max_len(seqlens),
            seqused)


def unpad_input_for_concatenated_sequences(
    hidden_states: Tensor, attention_mask_in_length: Tensor
) -> Tuple[Tensor, Tensor, Tensor, int]:
    """Pack rows that each hold several sequences back to back (flash-attn's helper).

    Args:
        hidden_states: (batch, seqlen, ...).
        attention_mask_in_length: (batch, seqlen) integer: row b holds sequences of lengths
            ``attention_mask_in_length[b, 0], [b, 1], ...`` (nonzero entries, in order) at the
            start of the row; the rest of the row is padding. E.g. ``[2, 3, 0, 0, 0, 0]`` is a
            row with a 2-token and a 3-token sequence and one pad.

    Returns:
        hidden_states (total_nnz, ...), indices int64 (total_nnz,), cu_seqlens int32
        (num_sequences + 1,) with one entry per packed sequence, max_seqlen_in_batch int.
    """
    hidden_states = _check_hidden(hidden_states)
    lengths = _check_mask(attention_mask_in_length, "attention_mask_in_length", hidden_states)
    seqlen = lengths.shape[1]
    row_len = lengths.sum(dim=-1)
    kept = torch.arange(seqlen, device=lengths.device).unsqueeze(0) < row_len.unsqueeze(1)
    flat_lengths = lengths.flatten()
    seqlens = flat_lengths[flat_lengths != 0].to(torch.int32)
    indices = torch.nonzero(kept.flatten(), as_tuple=False).flatten()
    flat = hidden_states.reshape(-1, *hidden_states.shape[2:])
    return index_first_axis(flat, indices), indices, _cu_seqlens(seqlens), _max_len(seqlens)


def pad_input(hidden_states: Tensor, indices: Tensor, batch: int, seqlen: int) -> Tensor:
    """Inverse of :func:`unpad_input`: hidden_states (total_nnz, ...) back to
    (batch, seqlen, ...), zeros at the positions not in ``indices``."""
    if not isinstance(hidden_states, torch.Tensor) or hidden_states.dim() < 1:
        raise ValueError("hidden_states must be a tensor of shape (total_nnz, ...), got "
                         f"{hidden_states!r:.80}")
    if not isinstance(indices, torch.Tensor) or indices.dim() != 1 or \
            indices.shape[0] != hidden_states.shape[0]:
        raise ValueError(
            f"indices must be a 1-d integer tensor with one entry per row of hidden_states "
            f"({hidden_states.shape[0]}), got "
            f"{tuple(indices.shape) if isinstance(indices, torch.Tensor) else indices!r:.80}")
    out = index_put_first_axis(hidden_states, indices, batch * seqlen)
    return out.view(batch, seqlen, *hidden_states.shape[1:])


__all__ = [
    "index_first_axis",
    "index_put_first_axis",
    "pad_input",
    "unpad_input",
    "unpad_input_for_concatenated_sequences",
]
