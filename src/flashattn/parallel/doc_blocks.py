"""The kernel calls of the varlen ring when a document's visible band is not one of zigzag's
three whole-chunk cases: sliding windows and ALiBi over packed documents.

Under the varlen zigzag layout every document of local length ``2c`` holds its global chunks
``rank`` and ``2 * world - 1 - rank`` of ``c`` tokens, so the (query, key) band one ring step
sees in a document is the band :func:`flashattn.parallel.blocks.plan_step` plans for one
dense sequence of ``2c`` local tokens per rank. The band's global offsets scale with ``c``:
documents of different lengths need different windows / ALiBi shifts in one kernel call,
which the kernels do not take. So the plan is made once per distinct ``c`` and its calls run
over every document of that length at once: each :class:`DocCall` gathers, from every such
document, the local query rows and key rows of one :class:`~.blocks.BlockCall` (the same
window, the same ALiBi shift), a batch of equal-shaped sequences. Without ALiBi the calls of
all lengths that share a window merge further into one varlen call (the kernels' masks are
per sequence, bottom-right aligned, and the window's sides are the same numbers); with ALiBi
each length keeps its own call (its shift differs), a dense call over its documents.
"""
from __future__ import annotations

import functools
from collections import defaultdict
from typing import Dict, List, NamedTuple, Optional, Tuple

import torch

from flashattn.parallel import blocks as _blocks

Tensor = torch.Tensor


class DocCall(NamedTuple):
    """One kernel call of a ring step over gathered rows of several documents.

    ``q_rows`` (n_q,) / ``k_rows`` (n_k,) int64: the local query rows and the rows of the
    block in hand, document after document; ``cu_q`` / ``cu_k`` (n_seq + 1,) int32 their
    cumulative lengths per document, ``max_q`` / ``max_k`` the longest; ``docs`` (n_seq,)
    int64 the documents' indices (their ALiBi slopes). ``equal``: every document has the same
    ``max_q`` x ``max_k`` shape (a dense batch). Mask and ALiBi shift as
    :class:`~.blocks.BlockCall`'s (``alibi_shift`` set only in a plan with ALiBi).
    """

    q_rows: Tensor
    k_rows: Tensor
    cu_q: Tensor
    cu_k: Tensor
    max_q: int
    max_k: int
    docs: Tensor
    equal: bool
    causal: bool
    window_left: int
    window_right: int
    alibi_shift: Optional[int]


class DocPlan(NamedTuple):
    """The calls of one rank's varlen ring: ``steps[t]`` against the block of rank
    ``(rank - t) % world``; ``own_first`` / ``own_last``: step 0's cells in the backward's two
    parts (each document's early query chunk, then its late one: :func:`.blocks.own_parts`)."""

    steps: Tuple[Tuple[DocCall, ...], ...]
    own_first: Tuple[DocCall, ...]
    own_last: Tuple[DocCall, ...]


def _by_length(bounds: Tuple[int, ...], world: int) -> Dict[int, List[Tuple[int, int]]]:
    """Chunk length c -> [(document index, local start)] (documents of length 0 dropped)."""
    groups: Dict[int, List[Tuple[int, int]]] = defaultdict(list)
    start = 0
    for i, (a, e) in enumerate(zip(bounds[:-1], bounds[1:])):
        local = (e - a) // world
        if local:
            groups[local // 2].append((i, start))
        start += local
    return groups


def _gather(parts: List[Tuple[int, int, _blocks.BlockCall]], device: torch.device,
            alibi: bool) -> DocCall:
    """One call over ``parts``: (document, local start, its block call), all with one mask."""
    q_rows, k_rows, lq, lk = [], [], [], []
    for _doc, start, call in parts:
        q_rows.append(torch.arange(start + call.q0, start + call.q1))
        k_rows.append(torch.arange(start + call.k0, start + call.k1))
        lq.append(call.q1 - call.q0)
        lk.append(call.k1 - call.k0)
    cu = (lambda ls: torch.tensor([0] + ls, dtype=torch.int64).cumsum(0).to(torch.int32))
    first = parts[0][2]
    return DocCall(torch.cat(q_rows).to(device), torch.cat(k_rows).to(device),
                   cu(lq).to(device), cu(lk).to(device), max(lq), max(lk),
                   torch.tensor([p[0] for p in parts], dtype=torch.int64, device=device),
                   len(set(lq)) == 1 and len(set(lk)) == 1, first.causal, first.window_left,
                   first.window_right, first.alibi_shift if alibi else None)


def _calls(per_length: Dict[int, Tuple[_blocks.BlockCall, ...]],
           groups: Dict[int, List[Tuple[int, int]]], device: torch.device, alibi: bool
           ) -> Tuple[DocCall, ...]:
    """The block calls of every length, over its documents, merged into as few kernel calls
    as keep a document's query rows distinct within each (its calls of one mask go to
    successive kernel calls): one per (mask, rank among the length's calls of that mask),
    and per length too with ALiBi."""
    buckets: Dict[tuple, List[Tuple[int, int, _blocks.BlockCall]]] = defaultdict(list)
    for c, calls in sorted(per_length.items()):
        seen: Dict[tuple, int] = defaultdict(int)
        for call in calls:
            mask = (call.causal, call.window_left, call.window_right)
            key = mask + ((c, call.alibi_shift) if alibi else ()) + (seen[mask],)
            seen[mask] += 1
            buckets[key].extend((doc, start, call) for doc, start in groups[c])
    return tuple(_gather(parts, device, alibi) for _key, parts in sorted(
        buckets.items(), key=lambda kv: tuple(-1 if x is None else x for x in kv[0])))


@functools.lru_cache(maxsize=64)
def doc_plan(bounds: Tuple[int, ...], rank: int, world: int, left: Optional[int],
             right: Optional[int], alibi: bool, device: torch.device) -> DocPlan:
    """The varlen ring's calls of ``rank`` for global document bounds ``bounds``
    (cu_seqlens; every length divisible by ``2 * world``) under the global band
    ``-left <= P - p <= right`` of each document (None: unbounded; causal: ``right = 0``).
    The ring runs as many steps as the longest one any document needs (a window can end it
    before ``world``). Built once per batch shape (a training loop repeats its packing)."""
    groups = _by_length(bounds, world)
    plans = {c: _blocks.ring_plan("zigzag", rank, world, 2 * c, left, right, alibi)
             for c in groups}
    steps = max((len(p) for p in plans.values()), default=1)
    by_step = tuple(
        _calls({c: p[t] for c, p in plans.items() if t < len(p)}, groups, device, alibi)
        for t in range(steps))
    parts = {c: _blocks.own_parts("zigzag", rank, world, 2 * c, left, right, alibi)
             for c in groups}
    return DocPlan(by_step, _calls({c: p[0] for c, p in parts.items()}, groups, device, alibi),
                   _calls({c: p[1] for c, p in parts.items()}, groups, device, alibi))


__all__ = ["DocCall", "DocPlan", "doc_plan"]
