"""Argument checks of the context-parallel calls that need every rank's view: a local shape
that differs between ranks would hang or silently misalign a collective, so each rank's
signature is gathered and compared once per (group, signature) and every rank raises the same
ValueError naming the argument."""
from __future__ import annotations

from typing import Dict, Optional, Sequence, Tuple

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


def dtype_code(dtype: torch.dtype) -> int:
    """A stable small integer per dtype, for :func:`same_on_every_rank`."""
    return [torch.float16, torch.bfloat16, torch.float32, torch.float64].index(dtype) \
        if dtype in (torch.float16, torch.bfloat16, torch.float32, torch.float64) else 99


def float_bits(x: float) -> int:
    """A float as its IEEE-754 bits (exact comparison across ranks)."""
    import struct
    return struct.unpack("<q", struct.pack("<d", float(x)))[0]


__all__ = ["dtype_code", "float_bits", "same_on_every_rank"]
