"""Moving blocks between the ranks of a group: ring P2P (``batch_isend_irecv``) and the
all-to-all of Ulysses, on torch.distributed (NCCL on GPUs, gloo on CPUs).

Overlap: NCCL runs P2P on its own internal stream, which waits for the work queued on the
caller's stream when the call is issued and which the caller's stream waits for at
``wait()``. Issuing the exchange of the next block before computing the block in hand, and
waiting only before the next block is used, overlaps the transfer with that compute: the
side stream is NCCL's, not one of ours (a stream of ours would add events, not overlap).
"""
from __future__ import annotations

from typing import List, Optional, Sequence

import torch
import torch.distributed as dist

from flashattn.parallel.groups import global_rank

Tensor = torch.Tensor


class Exchange:
    """Tensors in flight: ``wait()`` returns the received ones (ready on the caller's stream)."""

    def __init__(self, works: List[dist.Work], received: List[Tensor]):
        self._works = works
        self._received = received

    def wait(self) -> List[Tensor]:
        for w in self._works:
            w.wait()
        return self._received


def exchange(tensors: Sequence[Tensor], group: Optional[dist.ProcessGroup], rank: int,
             world: int, distance: int = 1, into: Optional[Sequence[Tensor]] = None
             ) -> Exchange:
    """Send ``tensors`` (contiguous) to rank ``rank + distance`` and receive from rank ``rank -
    distance`` (ranks modulo ``world``), asynchronously: into ``into`` (contiguous tensors
    whose shapes the sender's match, in order) when given, else into tensors shaped like
    ``tensors``. A call with nothing to send or receive issues nothing."""
    dst = global_rank(group, (rank + distance) % world)
    src = global_rank(group, (rank - distance) % world)
    received = list(into) if into is not None else [torch.empty_like(t) for t in tensors]
    ops = [dist.P2POp(dist.isend, t, dst, group) for t in tensors]
    ops += [dist.P2POp(dist.irecv, t, src, group) for t in received]
    return Exchange(dist.batch_isend_irecv(ops) if ops else [], received)


def all_to_all(x: Tensor, group: Optional[dist.ProcessGroup], world: int) -> Tensor:
    """``x`` (world, ...) contiguous: slice i goes to rank i; returns (world, ...) whose slice i
    came from rank i."""
    out = torch.empty_like(x)
    dist.all_to_all_single(out, x, group=group)
    return out


def all_gather(x: Tensor, group: Optional[dist.ProcessGroup], world: int) -> List[Tensor]:
    """Every rank's ``x`` (same shape on every rank), in rank order."""
    parts = [torch.empty_like(x) for _ in range(world)]
    dist.all_gather(parts, x.contiguous(), group=group)
    return parts


__all__ = ["Exchange", "all_gather", "all_to_all", "exchange"]
