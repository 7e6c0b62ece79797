"""The ring backward with each visitor's dK / dV partials sent straight home.

At ring step t rank r holds the K / V block of rank r - t. The kernel calls that saw it return
that block's dK / dV partials in K / V's dtype, one per call, each over the range of the
block's rows the call read. Here they go straight to the owner (a P2P to rank r - t, which at
the same step receives from rank r + t the partials of its own block), and the owner sums
every partial of its block once, at the end, in one pass (``flashattn.ops.sum_rows``: the
terms in ring order, then the local block's own two parts, added in float32 and rounded once).

Against a float32 running sum that travels with its block (:func:`.ring.run_backward`, still
used where a call's partial covers gathered rows rather than a row range), the numerics are
the same (every term is the kernel's partial in K / V's dtype, summed in float32 in the same
order, rounded once) and the memory traffic is not: per tensor and world size N the travelling sum
is written by its first visitor, read and written by each later one and twice at home, and
converted once (about 26 block sizes of traffic for N = 4); here every partial is written by
its kernel and read once by the sum (N + 2), and the bytes on the wire are halved (16-bit
partials, not float32 sums). Measured on one H100 (2026-12-07, each rank's ring alone, 4
ranks, benchmarks/NOTES.md): the varlen ring at 128k tokens per rank 4.4 % faster, the dense
ring at 32k within noise. The price is memory: the owner holds the received partials until
the end, N - 1 blocks per tensor where every call covers the whole block (the varlen ring),
about 0.75 (N - 1) for the dense causal zigzag ring (half its steps see half the keys), against
an estimated 4 blocks' worth of float32 sums in flight and at home before: less at N = 4, more
from N = 6 (varlen) or N = 7 (dense causal) on.

Overlap: a step's partials are sent as soon as its calls are queued, so the transfer runs
under the next step's compute (the last step's under the local block's second part, which is
computed after the ring for that reason); the owner waits for them only before the sum.
"""
from __future__ import annotations

from typing import Callable, List, NamedTuple, Sequence, Tuple

import torch

from flashattn import ops as _ops
from flashattn.parallel import comm as _comm
from flashattn.parallel.groups import Ring

Tensor = torch.Tensor


class Partials(NamedTuple):
    """What the calls of one step (or one part of the local block) give back: ``pieces`` as
    (first row of the block, dK partial, dV partial), one per call in call order, rows along
    the ring's row dim; ``add_dq()`` adds their dQ into the caller's sum."""

    pieces: Tuple[Tuple[int, Tensor, Tensor], ...]
    add_dq: Callable[[], None]


def _received(spans: Sequence[Tuple[int, int]], k: Tensor, v: Tensor, row_dim: int
              ) -> List[Tensor]:
    """Empty dK then dV pieces of ``spans`` (start, rows), shaped like ``k`` / ``v`` but for
    their row counts along ``row_dim``."""
    def shaped(x: Tensor, rows: int) -> Tensor:
        shape = list(x.shape)
        shape[row_dim] = rows
        return torch.empty(shape, dtype=x.dtype, device=x.device)
    return [shaped(k, n) for _, n in spans] + [shaped(v, n) for _, n in spans]


def run_backward_home(k: Tensor, v: Tensor, steps: int, ring: Ring, compute: Callable,
                      own_first: Callable, own_last: Callable,
                      incoming: Callable[[int], Sequence[Tuple[int, int]]], row_dim: int = 1
                      ) -> Tuple[Tensor, Tensor]:
    """The backward ring; returns dK / dV of the local K / V in their dtype.

    ``compute(step, k_blk, v_blk)`` (steps 1 .. ``steps`` - 1, the blocks of the other ranks)
    and ``own_first(k, v)`` / ``own_last(k, v)`` (the local block in two parts) return
    :class:`Partials`. ``incoming(step)``: the (first row, rows) of the pieces that rank
    ``rank + step`` computes on this rank's block at ``step``, in its call order (its plan:
    the receiver allocates what the sender will send)."""
    kv = (k.contiguous(), v.contiguous())
    kv_pending = _comm.exchange(kv, ring.group, ring.rank, ring.world) if steps > 1 else None
    first = own_first(*kv)
    # per step: the exchange of partials in flight and the spans it receives (the sent
    # partials are not kept: torch.distributed holds a send's tensors until it completes)
    homeward: List[Tuple[_comm.Exchange, Sequence[Tuple[int, int]]]] = []
    if kv_pending is not None:
        held = tuple(kv_pending.wait())
        for step in range(1, steps):
            kv_pending = (None if step + 1 == steps else
                          _comm.exchange(held, ring.group, ring.rank, ring.world))
            part = compute(step, *held)
            part.add_dq()
            sent = ([dk.contiguous() for _, dk, _ in part.pieces]
                    + [dv.contiguous() for _, _, dv in part.pieces])
            spans = tuple(incoming(step))
            homeward.append((_comm.exchange(sent, ring.group, ring.rank, ring.world,
                                            distance=-step,
                                            into=_received(spans, *kv, row_dim)), spans))
            del part, sent
            if kv_pending is not None:
                held = tuple(kv_pending.wait())
    second = own_last(*kv)
    first.add_dq()
    second.add_dq()
    starts: List[int] = []
    dk_parts: List[Tensor] = []
    dv_parts: List[Tensor] = []
    for pending, spans in homeward:  # ring order: the block's first visitor first
        got = pending.wait()
        starts += [s for s, _ in spans]
        dk_parts += got[:len(spans)]
        dv_parts += got[len(spans):]
    for part in (first, second):
        starts += [s for s, _, _ in part.pieces]
        dk_parts += [dk for _, dk, _ in part.pieces]
        dv_parts += [dv for _, _, dv in part.pieces]
    n_rows = kv[0].shape[row_dim]
    return tuple(  # type: ignore[return-value]
        _ops.sum_rows(parts, starts, n_rows, row_dim, x.dtype) if parts else torch.zeros_like(x)
        for parts, x in ((dk_parts, kv[0]), (dv_parts, kv[1])))


__all__ = ["Partials", "run_backward_home"]
