"""A ring of ``world`` ranks in one process, one thread per rank, on one device: the rings of
flashattn.parallel run with their real data flow (K / V blocks and dK / dV partials or sums
passed between the ranks) through the kernels of that device, so the Hopper kernels' path through
the ring is checked on a machine with a single GPU, where NCCL (one GPU per rank) cannot run.

What stands in for torch.distributed, for the duration of :func:`run`:

- ``parallel.comm.exchange``: a queue per (sender, receiver) pair; a send puts a copy (as an
  NCCL send leaves the sender's tensor its own), a receive takes the pair's oldest message,
  so messages match in issue order as NCCL's P2P calls do;
- ``resolve``: this thread's rank and the world size (the group is None);
- ``check_device`` and ``checks.same_on_every_rank``: nothing (the argument checks that need
  every rank's view are tested over gloo, tests/parallel/test_parallel.py).

One rank runs at a time: a thread holds the baton until it waits for a message that has not
come, so the library's caches, launch plans and Triton's compiler never see two threads at
once. All ranks share the device's current stream: a message's copy is queued on it before
the receiver can queue its first use, so stream order is data order. The backward runs on
the calling thread (autograd's device threads would serve one rank's backward at a time and
deadlock the ring).
"""
from __future__ import annotations

import contextlib
import queue
import threading
from typing import Callable, Dict, Iterator, List, Optional, Sequence, Tuple, Union

import torch

from flashattn.parallel import checks as _checks
from flashattn.parallel import comm as _comm
from flashattn.parallel import ring as _ring
from flashattn.parallel import ring_varlen as _ring_varlen

Tensor = torch.Tensor
TIMEOUT_S = 120.0  # a rank that died leaves the others waiting this long, then they raise


class _World:
    def __init__(self, world: int):
        self.world = world
        self.baton = threading.Lock()
        self.boxes: Dict[Tuple[int, int], "queue.Queue[Tensor]"] = {
            (s, d): queue.Queue() for s in range(world) for d in range(world)}
        self.local = threading.local()

    def receive(self, src: int, dst: int) -> Tensor:
        box = self.boxes[(src, dst)]
        try:
            return box.get_nowait()
        except queue.Empty:
            pass
        self.baton.release()  # let the other ranks run until the message comes
        try:
            return box.get(timeout=TIMEOUT_S)
        finally:
            self.baton.acquire()

    def exchange(self, tensors: Sequence[Tensor], group, rank: int, world: int,
                 distance: int = 1, into: Optional[Sequence[Tensor]] = None) -> "_Pending":
        assert world == self.world
        dst, src = (rank + distance) % world, (rank - distance) % world
        for t in tensors:
            self.boxes[(rank, dst)].put(t.clone())
        return _Pending(self, src, rank, len(tensors) if into is None else list(into))

    def resolve(self, group, name: str = "group"):
        return None, self.local.rank, self.world


class _Pending:
    """``comm.Exchange``'s interface: ``wait()`` returns the received tensors (copied into the
    receiver's buffers when it gave them: a shape or dtype that differs from the sender's is
    an error, as NCCL would read a size the sender did not send)."""

    def __init__(self, world: _World, src: int, dst: int, into: Union[int, List[Tensor]]):
        self._world, self._src, self._dst, self._into = world, src, dst, into

    def wait(self) -> List[Tensor]:
        if isinstance(self._into, int):
            return [self._world.receive(self._src, self._dst) for _ in range(self._into)]
        for buf in self._into:
            got = self._world.receive(self._src, self._dst)
            if got.shape != buf.shape or got.dtype != buf.dtype:
                raise RuntimeError(f"rank {self._dst} expected {tuple(buf.shape)} {buf.dtype} "
                                   f"from rank {self._src}, got {tuple(got.shape)} {got.dtype}")
            buf.copy_(got)
        return self._into


@contextlib.contextmanager
def _standing_in(w: _World) -> Iterator[None]:
    patches = [(_comm, "exchange", w.exchange),
               (_ring, "resolve", w.resolve), (_ring_varlen, "resolve", w.resolve),
               (_ring, "check_device", lambda *a, **k: None),
               (_ring_varlen, "check_device", lambda *a, **k: None),
               (_checks, "same_on_every_rank", lambda *a, **k: None)]
    saved = [(m, name, getattr(m, name)) for m, name, _ in patches]
    for m, name, value in patches:
        setattr(m, name, value)
    try:
        yield
    finally:
        for m, name, value in saved:
            setattr(m, name, value)


def run(world: int, fn: Callable[[int], object]) -> List[object]:
    """``fn(rank)`` on ``world`` threads standing for the ranks of one ring; their results in
    rank order. Raises the first rank's exception (with its rank) if any rank raised."""
    w = _World(world)
    results: List[object] = [None] * world
    errors: List[Tuple[int, BaseException]] = []

    def body(rank: int) -> None:
        w.local.rank = rank
        with w.baton, torch.autograd.set_multithreading_enabled(False):
            try:
                results[rank] = fn(rank)
            except BaseException as e:  # noqa: BLE001 - re-raised on the caller's thread
                errors.append((rank, e))

    with _standing_in(w):
        threads = [threading.Thread(target=body, args=(r,), daemon=True)
                   for r in range(world)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    if errors:
        rank, e = min(errors, key=lambda x: x[0])
        raise RuntimeError(f"rank {rank} of {world} raised {type(e).__name__}: {e}") from e
    return results


__all__ = ["TIMEOUT_S", "run"]
