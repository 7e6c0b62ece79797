"""Moving blocks between the ranks of a group: ring P2P (``batch_isend_irecv``) and the
all-to-all of Ulysses, on torch.distributed (NCCL on GPUs, gloo on CPUs).

Overlap: NCCL runs P2P on its own internal stream, which waits for the work queued on the
*issuing* stream when the call is issued and which the caller's stream waits for at
``wait()``. Issued from the caller's stream, a transfer starts only when the compute queued
before it ends, at the same moment as the compute queued after it, and the two race for the
SMs: when the attention kernel's persistent CTAs win, the transfer waits for the whole kernel
(the ring's forward lost 10-20 % so at 32k tokens per GPU). Blocks that no pending compute
writes (K / V received by an earlier exchange) are therefore sent from a side stream that
waits only for that earlier transfer (:func:`exchange` with ``stream``): each transfer starts
as soon as its block has arrived, ahead of the compute that will need it.
"""
from __future__ import annotations

from typing import Dict, List, Optional, Sequence

import torch
import torch.distributed as dist

from flashattn.parallel.groups import global_rank

Tensor = torch.Tensor


class Exchange:
    """Tensors in flight: ``wait()`` returns the received ones (ready on the caller's stream)."""

    def __init__(self, works: List[dist.Work], received: List[Tensor],
                 side: Optional["torch.cuda.Stream"] = None):
        self._works = works
        self._received = received
        self._side = side

    def wait(self) -> List[Tensor]:
        for w in self._works:
            w.wait()
        if self._side is not None:  # allocated on the side stream, used on the caller's
            stream = torch.cuda.current_stream(self._received[0].device)
            for t in self._received:
                t.record_stream(stream)
        return self._received

    def wait_on(self, stream: "torch.cuda.Stream") -> None:
        """Make ``stream`` (not the caller's) wait for the transfer."""
        with torch.cuda.stream(stream):
            for w in self._works:
                w.wait()


_SIDE_STREAMS: Dict[torch.device, "torch.cuda.Stream"] = {}


def side_stream(x: Tensor) -> Optional["torch.cuda.Stream"]:
    """The side stream that :func:`exchange` issues from for ``x``'s CUDA device (one per
    device, made on first use); None for CPU tensors (gloo: no streams)."""
    if x.device.type != "cuda":
        return None
    stream = _SIDE_STREAMS.get(x.device)
    if stream is None:
        stream = _SIDE_STREAMS[x.device] = torch.cuda.Stream(x.device)
    return stream


def exchange(tensors: Sequence[Tensor], group: Optional[dist.ProcessGroup], rank: int,
             world: int, distance: int = 1, *, stream: Optional["torch.cuda.Stream"] = None,
             after: Optional[Exchange] = None) -> Exchange:
    """Send ``tensors`` to rank ``rank + distance`` and receive tensors of the same shapes from
    rank ``rank - distance`` (ranks modulo ``world``), asynchronously.

    ``stream`` (CUDA only, from :func:`side_stream`): issue from that stream instead of the
    caller's, so the transfer waits for none of the caller's queued work. Only for tensors no
    pending work of the caller's stream writes: ``tensors`` must be ready on ``stream`` (the
    ones ``after`` received, which the stream waits for here, or ones the stream was made to
    wait for)."""
    dst = global_rank(group, (rank + distance) % world)
    src = global_rank(group, (rank - distance) % world)
    if stream is None:
        received = [torch.empty_like(t) for t in tensors]
        ops = [dist.P2POp(dist.isend, t, dst, group) for t in tensors]
        ops += [dist.P2POp(dist.irecv, t, src, group) for t in received]
        return Exchange(dist.batch_isend_irecv(ops), received)
    with torch.cuda.stream(stream):
        if after is not None:
            after.wait_on(stream)
        received = [torch.empty_like(t) for t in tensors]
        ops = [dist.P2POp(dist.isend, t, dst, group) for t in tensors]
        ops += [dist.P2POp(dist.irecv, t, src, group) for t in received]
        works = dist.batch_isend_irecv(ops)
    return Exchange(works, received, stream)


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


__all__ = ["Exchange", "all_gather", "all_to_all", "exchange", "side_stream"]
