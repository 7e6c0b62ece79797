"""Argument checks of the context-parallel calls that need every rank's view: a local shape
that differs between ranks would hang or silently misalign a collective, so each rank's
signature is gathered and compared once per (group, signature) and every rank raises the same
ValueError naming the argument."""
from __future__ import annotations

from typing import Dict, List, Optional, Sequence, Tuple

import torch
import torch.distributed as dist

_SEEN: Dict[Tuple, bool] = {}


def same_on_every_rank(group: Optional[dist.ProcessGroup], world: int, device: torch.device,
                       fields: Sequence[Tuple[str, int]], what: str) -> None:
    """ValueError on every rank when some ``(name, value)`` field differs between ranks; the
    first differing field is named with each rank's value. Checked once per group and
    signature (later calls with the same signature skip the collective)."""
    key = (id(group), str(device), what, tuple(fields))
    if world == 1 or key in _SEEN:
        return
    mine = torch.tensor([v for _, v in fields], dtype=torch.int64, device=device)
    parts = [torch.empty_like(mine) for _ in range(world)]
    dist.all_gather(parts, mine, group=group)
    table = torch.stack(parts).cpu()
    for col, (name, _) in enumerate(fields):
        values = table[:, col].tolist()
        if len(set(values)) > 1:
            raise ValueError(f"{what}: {name} differs between ranks ({values} for ranks "
                             f"0..{world - 1}); every rank must pass the same shapes and "
                             "options")
    _SEEN[key] = True


def global_cu_seqlens(cu_seqlens, local_tokens: int, world: int, device: torch.device,
                      max_seqlen) -> List[int]:
    """The bounds of a varlen context-parallel call's *global* ``cu_seqlens`` (1-D int32 on
    the inputs' device, from 0, never decreasing, ending at ``local_tokens * world``), with
    ``max_seqlen`` at least its longest document; ValueError naming the argument otherwise."""
    if not isinstance(cu_seqlens, torch.Tensor) or cu_seqlens.dim() != 1 or \
            cu_seqlens.dtype != torch.int32:
        raise ValueError("cu_seqlens: expected a 1-D int32 tensor of global document bounds")
    if cu_seqlens.device != device:
        raise ValueError(f"cu_seqlens: on {cu_seqlens.device}, q on {device}")
    bounds = cu_seqlens.tolist()
    if bounds[0] != 0 or any(b > a for a, b in zip(bounds[1:], bounds[:-1])):
        raise ValueError("cu_seqlens: must start at 0 and never decrease")
    if bounds[-1] != local_tokens * world:
        raise ValueError(f"cu_seqlens: its last entry {bounds[-1]} must equal the global token "
                         f"count q.shape[0] * world = {local_tokens} * {world}")
    longest = max((b - a for a, b in zip(bounds[:-1], bounds[1:])), default=0)
    if int(max_seqlen) < longest:
        raise ValueError(f"max_seqlen: {max_seqlen} is shorter than the longest document "
                         f"({longest})")
    return bounds


def dtype_code(dtype: torch.dtype) -> int:
    """A stable small integer per dtype, for :func:`same_on_every_rank`."""
    return [torch.float16, torch.bfloat16, torch.float32, torch.float64].index(dtype) \
        if dtype in (torch.float16, torch.bfloat16, torch.float32, torch.float64) else 99


def float_bits(x: float) -> int:
    """A float as its IEEE-754 bits (exact comparison across ranks)."""
    import struct
    return struct.unpack("<q", struct.pack("<d", float(x)))[0]


__all__ = ["dtype_code", "float_bits", "global_cu_seqlens", "same_on_every_rank"]
