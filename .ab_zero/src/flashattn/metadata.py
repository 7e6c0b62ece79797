"""Value checks of device metadata (cache_seqlens, cache_batch_idx, cache_leftpad, block_table):
pure functions that read the values on the host and raise a ValueError naming the argument.

They run where reading is free (CPU tensors) always; for GPU tensors only in the checked mode
(``flashattn.checks()`` or ``FLASHATTN_CHECKS=1``), outside CUDA-graph capture and
torch.compile tracing, since reading them costs a device sync.
Used by the api layer (CPU metadata, before the op) and by dispatch (in the op's body).
"""
from __future__ import annotations

from typing import Optional, Tuple

import torch

from flashattn.runtime import device, env


def cache_capacity(k_cache: torch.Tensor, block_table: Optional[torch.Tensor]) -> int:
    """Positions a KV-cache row can hold: s_cache, or max_blocks * page_size when paged."""
    if block_table is not None:
        return block_table.shape[1] * k_cache.shape[1]
    return k_cache.shape[1]


def values_checkable(*tensors: Optional[torch.Tensor]) -> bool:
    """Whether value checks run: CPU tensors always; other devices only in the checked mode,
    not while a CUDA graph is being captured or torch.compile traces."""
    ts = [t for t in tensors if t is not None]
    if not ts:
        return False
    if all(t.device.type == "cpu" for t in ts):
        return True
    if not env.settings().checks or torch.compiler.is_compiling():
        return False
    return not device.capturing()


def to_host(*tensors: Optional[torch.Tensor]) -> Tuple[Optional[torch.Tensor], ...]:
    """CPU copies of integer metadata tensors in ONE device-to-host transfer (one sync);
    CPU tensors and None pass through."""
    on_device = [t for t in tensors if t is not None and t.device.type != "cpu"]
    if not on_device:
        return tensors
    flat = torch.cat([t.reshape(-1).to(torch.int64) for t in on_device]).cpu()
    out, i = [], 0
    for t in tensors:
        if t is None or t.device.type == "cpu":
            out.append(t)
        else:
            out.append(flat[i:i + t.numel()].view(t.shape).to(t.dtype))
            i += t.numel()
    return tuple(out)


def capacity_message(what: str, s_new: int, capacity: int,
                     block_table: Optional[torch.Tensor], page_size: int) -> str:
    """The error for keys past a cache row's capacity; for a paged cache it names block_table
    (its column count is the capacity: flash-attn 2.8's guard)."""
    if block_table is not None:
        return (f"block_table has {block_table.shape[1]} pages of {page_size} positions per "
                f"sequence ({capacity} positions), but {what} plus seqlen_new = {s_new} needs "
                f"more: give block_table more columns")
    return (f"the cache is too short for the new tokens: {what} plus seqlen_new = {s_new} "
            f"exceeds the {capacity} positions of the cache")


def check_values(seqlens: torch.Tensor, s_new: int, capacity: int,
                 leftpad: Optional[torch.Tensor], batch_idx: Optional[torch.Tensor],
                 batch_cache: int, block_table: Optional[torch.Tensor], num_blocks: int,
                 page_size: int, rotary_len: Optional[int], q_positions: int,
                 rot_base: Optional[torch.Tensor] = None) -> None:
    """Value checks (host reads: see the module docstring for when they run).

    seqlens (b,) int32 cache_seqlens; the rows' keys end at seqlens + s_new <= capacity;
    leftpad[b] in [0, seqlens[b]]; cache_batch_idx in [0, batch_cache); block_table entries
    covering positions [0, seqlens + s_new) in [0, num_blocks); positions touched by
    rotary (seqlens, or ``rot_base`` (FA3's rotary_seqlens) when given, + max(s_new,
    q_positions)) within the table's rotary_len rows.
    """
    lens = seqlens.tolist()
    for i, n in enumerate(lens):
        if n < 0:
            raise ValueError(f"cache_seqlens[{i}] = {n} must be >= 0")
        if n + s_new > capacity:
            raise ValueError(capacity_message(f"cache_seqlens[{i}] = {n}", s_new, capacity,
                                              block_table, page_size))
    if leftpad is not None:
        for i, (p, n) in enumerate(zip(leftpad.tolist(), lens)):
            if not 0 <= p <= n:
                raise ValueError(f"cache_leftpad[{i}] = {p} must be in [0, cache_seqlens[{i}] = "
                                 f"{n}]")
    if batch_idx is not None:
        for i, r in enumerate(batch_idx.tolist()):
            if not 0 <= r < batch_cache:
                raise ValueError(f"cache_batch_idx[{i}] = {r} is out of range: k_cache has "
                                 f"{batch_cache} rows (allowed 0..{batch_cache - 1})")
    if block_table is not None:
        table = block_table.tolist()
        for i, (row, n) in enumerate(zip(table, lens)):
            used = -(-(n + s_new) // page_size)
            for j in range(min(used, len(row))):
                if not 0 <= row[j] < num_blocks:
                    raise ValueError(
                        f"block_table[{i}, {j}] = {row[j]} is out of range: the paged cache "
                        f"has {num_blocks} blocks (allowed 0..{num_blocks - 1}); the entry "
                        f"holds positions of the {n + s_new} keys of sequence {i}")
    if rotary_len is not None:
        need = max(s_new, q_positions)
        base, what = (lens, "cache_seqlens") if rot_base is None else (
            to_host(rot_base)[0].tolist(), "rotary_seqlens")
        for i, n in enumerate(base):
            if n + need > rotary_len:
                raise ValueError(
                    f"rotary_cos / rotary_sin have {rotary_len} positions but sequence {i} "
                    f"needs positions up to {n + need - 1} ({what}[{i}] = {n} plus "
                    f"{need} new tokens)")


def check_varlen_kvcache(cache_seqlens: torch.Tensor, seqlens_end: torch.Tensor, capacity: int,
                         cu_seqlens_q: Optional[torch.Tensor], total_q: Optional[int],
                         cu_seqlens_k_new: Optional[torch.Tensor], total_new: Optional[int],
                         rot_base: Optional[torch.Tensor], rotary_len: Optional[int],
                         q_step: int, dense_q_rows: int = 1) -> None:
    """Value checks of a KV-cache call with packed queries / new keys (FlashAttention-3's
    cu_seqlens_q, cu_seqlens_k_new, rotary_seqlens): the cumulative lengths start at 0, never
    decrease and end within the packed tensors; each sequence's keys (cache_seqlens plus its
    new keys) fit the cache; rotary positions stay within the table."""
    start, end = to_host(cache_seqlens, seqlens_end)
    start, end = start.tolist(), end.tolist()
    per_seq = {}
    for name, cu, total in (("cu_seqlens_q", cu_seqlens_q, total_q),
                            ("cu_seqlens_k_new", cu_seqlens_k_new, total_new)):
        if cu is None:
            continue
        vals = to_host(cu)[0].tolist()
        if vals[0] != 0 or any(b < a for a, b in zip(vals, vals[1:])) or vals[-1] > total:
            raise ValueError(f"{name} must start at 0, never decrease and end at most at the "
                             f"packed length {total}, got {vals}")
        per_seq[name] = [b - a for a, b in zip(vals, vals[1:])]
    for i, (n, e) in enumerate(zip(start, end)):
        if n < 0:
            raise ValueError(f"cache_seqlens[{i}] = {n} must be >= 0")
        if e > capacity:
            raise ValueError(f"cache_seqlens[{i}] = {n} plus {e - n} new keys pass the cache "
                             f"capacity {capacity}")
    if rotary_len is not None:
        base = start if rot_base is None else to_host(rot_base)[0].tolist()
        q_rows = per_seq.get("cu_seqlens_q", [dense_q_rows] * len(base))
        for i, n in enumerate(base):
            need = max(end[i] - start[i], q_rows[i] if q_step else 1)
            if n + need > rotary_len:
                raise ValueError(f"rotary_cos / rotary_sin have {rotary_len} positions but "
                                 f"sequence {i} needs positions up to {n + need - 1}")


__all__ = ["capacity_message", "cache_capacity", "check_values", "check_varlen_kvcache",
           "to_host", "values_checkable"]
