"""Sequence layouts of context parallelism: which tokens each rank holds, and the helpers that
cut a full tensor into a rank's shard and gather the shards back.

- contiguous: rank r holds chunk r of ``world`` equal chunks (Ulysses; the plain ring).
- zigzag: the sequence is cut into ``2 * world`` equal chunks and rank r holds chunks r and
  ``2 * world - 1 - r``, so that under a causal mask every rank has the same work (an early
  chunk with little to see and a late one with much).
- varlen zigzag: every document of a packed batch is zigzag-split on its own, so every rank
  holds an equal share of every document whatever the mix of lengths.
"""
from __future__ import annotations

from typing import List, Sequence, Tuple

import torch

from flashattn.parallel import comm as _comm
from flashattn.parallel.groups import Group, resolve

Tensor = torch.Tensor


def _seq_len(x: Tensor, seq_dim: int, parts: int, name: str, what: str) -> int:
    if not isinstance(x, Tensor):
        raise TypeError(f"{name}: expected a torch.Tensor, got {type(x).__name__}")
    if not -x.dim() <= seq_dim < x.dim():
        raise ValueError(f"seq_dim: {seq_dim} is out of range for {name} of {x.dim()} dims")
    s = x.shape[seq_dim]
    if s % parts:
        raise ValueError(f"{name}: sequence length {s} (dim {seq_dim}) is not divisible by "
                         f"{parts} ({what}); pad the sequence")
    return s


def zigzag_shard(x: Tensor, group: Group = None, seq_dim: int = 1) -> Tensor:
    """This rank's zigzag shard of the full ``x``: chunks r and 2 * world - 1 - r of 2 * world
    along ``seq_dim``, concatenated (a new contiguous tensor)."""
    _, rank, world = resolve(group)
    s = _seq_len(x, seq_dim, 2 * world, "x", "2 * world chunks for the zigzag layout")
    chunks = x.chunk(2 * world, dim=seq_dim) if s else (x, x)
    return torch.cat([chunks[rank], chunks[2 * world - 1 - rank]], dim=seq_dim).contiguous()


def zigzag_unshard(x: Tensor, group: Group = None, seq_dim: int = 1) -> Tensor:
    """The full tensor from every rank's zigzag shard ``x`` (an all-gather; every rank gets it).
    Not differentiable."""
    pg, _, world = resolve(group)
    _seq_len(x, seq_dim, 2, "x", "the two chunks of a zigzag shard")
    shards = _comm.all_gather(x, pg, world)
    halves = [sh.chunk(2, dim=seq_dim) for sh in shards]
    order = [halves[r][0] for r in range(world)] + [halves[r][1] for r in reversed(range(world))]
    return torch.cat(order, dim=seq_dim)


def contiguous_shard(x: Tensor, group: Group = None, seq_dim: int = 1) -> Tensor:
    """This rank's chunk r of ``world`` equal chunks of ``x`` along ``seq_dim`` (contiguous)."""
    _, rank, world = resolve(group)
    _seq_len(x, seq_dim, world, "x", "world chunks for the contiguous layout")
    return x.chunk(world, dim=seq_dim)[rank].contiguous() if x.shape[seq_dim] else x


def contiguous_unshard(x: Tensor, group: Group = None, seq_dim: int = 1) -> Tensor:
    """The full tensor from every rank's contiguous chunk (an all-gather). Not differentiable."""
    pg, _, world = resolve(group)
    return torch.cat(_comm.all_gather(x, pg, world), dim=seq_dim)


def zigzag_doc_lengths(bounds: Sequence[int], world: int) -> List[int]:
    """The document lengths of global bounds ``bounds`` (cu_seqlens as a list); ValueError
    naming cu_seqlens when one is not divisible by ``2 * world``."""
    lengths = [e - s for s, e in zip(bounds[:-1], bounds[1:])]
    bad = [i for i, n in enumerate(lengths) if n % (2 * world)]
    if bad:
        raise ValueError(f"cu_seqlens: document {bad[0]} has length {lengths[bad[0]]}, not "
                         f"divisible by 2 * world = {2 * world} (the varlen zigzag layout "
                         "splits every document in 2 * world equal chunks); pad the documents")
    return lengths


def zigzag_varlen_index(cu_seqlens: Tensor, rank: int, world: int
                        ) -> Tuple[Tensor, Tensor, int]:
    """The varlen zigzag layout of a packed batch, for one rank.

    Args:
        cu_seqlens: (n_docs + 1,) int32 global cumulative document lengths; every length
            divisible by ``2 * world``.
    Returns:
        index: (total / world,) int64, the global rows this rank holds, in local order (per
            document: its chunk ``rank`` then its chunk ``2 * world - 1 - rank``);
        cu_seqlens_local: (n_docs + 1,) int32 on cu_seqlens' device (every rank's is the same);
        max_seqlen_local: the longest local document.
    """
    bounds = cu_seqlens.tolist()
    lengths = zigzag_doc_lengths(bounds, world)
    pieces: List[Tensor] = []
    for start, n in zip(bounds[:-1], lengths):
        c = n // (2 * world)
        pieces.append(torch.arange(start + rank * c, start + (rank + 1) * c))
        late = 2 * world - 1 - rank
        pieces.append(torch.arange(start + late * c, start + (late + 1) * c))
    index = torch.cat(pieces) if pieces else torch.zeros(0, dtype=torch.int64)
    local = [n // world for n in lengths]
    cu_local = torch.tensor([0] + local, dtype=torch.int64).cumsum(0).to(torch.int32)
    return (index.to(cu_seqlens.device), cu_local.to(cu_seqlens.device),
            max(local, default=0))


def zigzag_varlen_shard(x: Tensor, cu_seqlens: Tensor, group: Group = None) -> Tensor:
    """This rank's rows (dim 0) of the packed ``x`` (total, ...) in the varlen zigzag layout."""
    _, rank, world = resolve(group)
    index, _, _ = zigzag_varlen_index(cu_seqlens, rank, world)
    return x.index_select(0, index.to(x.device))


def zigzag_varlen_unshard(x: Tensor, cu_seqlens: Tensor, group: Group = None) -> Tensor:
    """The packed (total, ...) tensor from every rank's varlen zigzag rows (an all-gather)."""
    pg, _, world = resolve(group)
    shards = _comm.all_gather(x, pg, world)
    full = x.new_empty((int(cu_seqlens[-1]),) + tuple(x.shape[1:]))
    for r, sh in enumerate(shards):
        full[zigzag_varlen_index(cu_seqlens, r, world)[0].to(x.device)] = sh
    return full


__all__ = ["contiguous_shard", "contiguous_unshard", "zigzag_doc_lengths", "zigzag_shard",
           "zigzag_unshard",
           "zigzag_varlen_index", "zigzag_varlen_shard", "zigzag_varlen_unshard"]
