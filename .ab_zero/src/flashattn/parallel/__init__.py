"""flashattn.parallel: one attention call across many processes (context parallelism).

The sequence is sharded over a ``torch.distributed`` group; each rank passes its shard and gets
its shard of flash-attn 2's attention of the whole sequence, forward and backward:

- :func:`ring_flash_attn_func`: ring attention (K / V travel around the ring, overlapped with
  compute), zigzag-balanced by default; :func:`ring_flash_attn_varlen_func` for packed
  documents, each document zigzag-split across the ranks;
- :func:`ulysses_flash_attn_func` / :func:`ulysses_flash_attn_varlen_func`: all-to-all from
  sequence shards to head shards, one-GPU attention over the whole sequence, and back;
- :func:`usp_flash_attn_func`: both (a 2-D DeviceMesh: Ulysses over one dimension, ring over
  the other);
- layout helpers: :func:`zigzag_shard` / :func:`zigzag_unshard`, :func:`contiguous_shard` /
  :func:`contiguous_unshard`, the varlen zigzag ones and :func:`usp_shard` / :func:`usp_unshard`.

Built on the one-GPU ops (``flashattn::fwd`` / ``bwd`` / ``varlen_fwd`` / ``varlen_bwd``, their
lse for the merges) and torch.distributed (NCCL on GPUs, gloo on CPUs): no transport of its own.
"""
from flashattn.parallel.layout import (
    contiguous_shard,
    contiguous_unshard,
    zigzag_shard,
    zigzag_unshard,
    zigzag_varlen_index,
    zigzag_varlen_shard,
    zigzag_varlen_unshard,
)
from flashattn.parallel.ring import ring_flash_attn_func
from flashattn.parallel.ring_varlen import ring_flash_attn_varlen_func
from flashattn.parallel.ulysses import ulysses_flash_attn_func, ulysses_flash_attn_varlen_func
from flashattn.parallel.usp import usp_flash_attn_func, usp_shard, usp_unshard

__all__ = [
    "contiguous_shard",
    "contiguous_unshard",
    "ring_flash_attn_func",
    "ring_flash_attn_varlen_func",
    "ulysses_flash_attn_func",
    "ulysses_flash_attn_varlen_func",
    "usp_flash_attn_func",
    "usp_shard",
    "usp_unshard",
    "zigzag_shard",
    "zigzag_unshard",
    "zigzag_varlen_index",
    "zigzag_varlen_shard",
    "zigzag_varlen_unshard",
]
