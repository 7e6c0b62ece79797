"""Which kernel calls one ring step needs: the causal / window band of the global sequence, cut
to the rows a rank holds and the key rows it has in hand, as calls of the one-GPU kernel.

A rank holds its queries as *segments*: runs of consecutive global positions laid one after
the other in its local tensor (zigzag: two chunks, contiguous: one). The key / value block in
hand at a ring step is segmented the same way. Query ``i`` (global position ``p``) sees key
``j`` (global ``P``) iff ``-left <= P - p <= right`` (``None`` = unbounded; causal is
``right = 0``), the global mask of flash-attn 2 for a sequence attending to itself.

Inside one segment pair that band is a diagonal band of local ``j - i`` values, and the
one-GPU kernel computes exactly such bands: window ``(wl, wr)`` on an ``Lq x Lk`` call keeps
``j - i`` in ``[Lk - Lq - wl, Lk - Lq + wr]`` (bottom-right aligned). :func:`plan_step` looks
for the fewest rectangles of the local (query, key) grid, each one kernel call whose band
selects exactly the visible cells of every pair it covers: the whole grid first (zigzag's
diagonal step is one causal call), then one call per query or per key segment (zigzag's other
steps: all queries against the early key chunk, or the late query chunk against all keys),
then one call per pair. Each rectangle is first shrunk to the bounding box of its visible
cells, so a fully hidden block is never computed, and a pair's band always fits its bounding
box (its last row sees its last key and its first row its first key).
"""
from __future__ import annotations

import functools
from typing import List, NamedTuple, Optional, Sequence, Tuple

_INF = 1 << 62  # an unbounded window side, as a band bound


class Segment(NamedTuple):
    """``length`` consecutive global positions from ``global_start``, stored at local rows
    ``[local_start, local_start + length)``."""

    local_start: int
    length: int
    global_start: int


class BlockCall(NamedTuple):
    """One kernel call of a ring step: local query rows ``[q0, q1)`` against local key rows
    ``[k0, k1)`` of the block in hand, with the kernel's own (bottom-right aligned) mask.

    ``causal``: the kernel's causal route (``window_left == -1``, ``window_right == 0``);
    window sides are -1 (unbounded) or >= 0. ``alibi_shift``: the kernel's ALiBi shift
    (AttnParams.alibi_shift) that makes its distance ``|i + Lk - Lq + shift - j|`` the global
    ``|p - P|`` on every visible cell, or None where the call's cells lie at more than one
    global offset (a plan with ALiBi has none of those).
    """

    q0: int
    q1: int
    k0: int
    k1: int
    causal: bool
    window_left: int
    window_right: int
    alibi_shift: Optional[int]


class _Pair(NamedTuple):
    r0: int
    r1: int
    c0: int
    c1: int
    lo_band: int  # visible iff lo_band <= j - i <= hi_band (local rows / key rows)
    hi_band: int
    offset: int   # global (p - P) = local (i - j) + offset


def _pairs(q_segs: Sequence[Segment], k_segs: Sequence[Segment], left: Optional[int],
           right: Optional[int]) -> List[_Pair]:
    out = []
    for qs in q_segs:
        for ks in k_segs:
            # P - p = (j - i) - shift, shift = (k.local - k.global) - (q.local - q.global)
            shift = (ks.local_start - ks.global_start) - (qs.local_start - qs.global_start)
            lo = -_INF if left is None else shift - left
            hi = _INF if right is None else shift + right
            out.append(_Pair(qs.local_start, qs.local_start + qs.length, ks.local_start,
                             ks.local_start + ks.length, lo, hi, shift))
    return out


def _clip(p: _Pair, r0: int, r1: int, c0: int, c1: int) -> Optional[_Pair]:
    r0, r1, c0, c1 = max(r0, p.r0), min(r1, p.r1), max(c0, p.c0), min(c1, p.c1)
    if r0 >= r1 or c0 >= c1:
        return None
    return _Pair(r0, r1, c0, c1, p.lo_band, p.hi_band, p.offset)


def _visible_box(p: _Pair) -> Optional[Tuple[int, int, int, int]]:
    """Bounding box (rows, cols, half-open) of the cells of ``p`` inside its band."""
    r0 = max(p.r0, p.c0 - p.hi_band)
    r1 = min(p.r1, p.c1 - p.lo_band)  # rows i with i + lo <= c1 - 1
    if r0 >= r1:
        return None
    c0 = max(p.c0, r0 + p.lo_band)
    c1 = min(p.c1, r1 - 1 + p.hi_band + 1)
    if c0 >= c1:
        return None
    return r0, r1, c0, c1


def _span(p: _Pair) -> Tuple[int, int]:
    """The j - i values of p's cells."""
    return p.c0 - (p.r1 - 1), (p.c1 - 1) - p.r0


def _fit(pairs: Sequence[_Pair], r0: int, r1: int, c0: int, c1: int, alibi: bool
         ) -> Tuple[bool, Optional[BlockCall]]:
    """One kernel call over rows [r0, r1) x cols [c0, c1) for the pairs inside it: (True, call),
    (True, None) when nothing there is visible, (False, None) when no single band fits (or,
    with ``alibi``, when its visible cells lie at more than one global offset: one shift
    cannot give them all their distance)."""
    parts = [c for c in (_clip(p, r0, r1, c0, c1) for p in pairs) if c is not None]
    boxes = [b for b in (_visible_box(p) for p in parts) if b is not None]
    if not boxes:
        return True, None
    r0, r1 = min(b[0] for b in boxes), max(b[1] for b in boxes)
    c0, c1 = min(b[2] for b in boxes), max(b[3] for b in boxes)
    parts = [c for c in (_clip(p, r0, r1, c0, c1) for p in parts) if c is not None]
    lows, highs, empties = [], [], []
    low_exact, high_exact = set(), set()
    for p in parts:
        lo, hi = _span(p)
        a, b = max(p.lo_band, lo), min(p.hi_band, hi)
        if a > b:
            empties.append((lo, hi))
            continue
        (low_exact.add(a) if p.lo_band > lo else lows.append(lo))
        (high_exact.add(b) if p.hi_band < hi else highs.append(hi))
    if len(low_exact) > 1 or len(high_exact) > 1:
        return False, None
    band_lo = low_exact.pop() if low_exact else -_INF
    band_hi = high_exact.pop() if high_exact else _INF
    if any(band_lo > lo for lo in lows) or any(band_hi < hi for hi in highs):
        return False, None
    if not all(band_lo > hi or band_hi < lo for lo, hi in empties):
        return False, None
    base = c1 - r1  # the kernel's diagonal (Lk - Lq) in local j - i
    wl = -1 if band_lo == -_INF else base - band_lo
    wr = -1 if band_hi == _INF else band_hi - base
    if wl < -1 or wr < -1 or (wl == -1 and band_lo != -_INF) or (wr == -1 and band_hi != _INF):
        return False, None
    # global p - P = local (i - j) + offset; the kernel's distance is |i - j + base + shift|
    offsets = {p.offset for p in parts if _visible_box(p) is not None}
    shift = offsets.pop() - base if len(offsets) == 1 else None
    if alibi and shift is None:
        return False, None
    return True, BlockCall(r0, r1, c0, c1, wl == -1 and wr == 0, wl, wr, shift)


def _cover(pairs: Sequence[_Pair], rects: Sequence[Tuple[int, int, int, int]], alibi: bool
           ) -> Optional[List[BlockCall]]:
    calls = []
    for rect in rects:
        ok, call = _fit(pairs, *rect, alibi)
        if not ok:
            return None
        if call is not None:
            calls.append(call)
    return calls


@functools.lru_cache(maxsize=4096)
def plan_step(q_segs: Tuple[Segment, ...], k_segs: Tuple[Segment, ...], left: Optional[int],
              right: Optional[int], alibi: bool = False) -> Tuple[BlockCall, ...]:
    """The kernel calls that compute every visible (query, key) cell of one ring step once.

    ``q_segs`` / ``k_segs``: the local query rows and the key rows in hand, as segments
    ordered by ``local_start`` and tiling ``[0, s_local)``; ``left`` / ``right``: the global
    window sides (None = unbounded; causal: ``right = 0``); ``alibi``: every call's cells at
    one global offset (its ``alibi_shift`` set). Empty when nothing is visible.
    """
    pairs = _pairs(q_segs, k_segs, left, right)
    sq = sum(s.length for s in q_segs)
    sk = sum(s.length for s in k_segs)
    candidates = [[(0, sq, 0, sk)],
                  [(s.local_start, s.local_start + s.length, 0, sk) for s in q_segs],
                  [(0, sq, s.local_start, s.local_start + s.length) for s in k_segs]]
    best: Optional[List[BlockCall]] = None
    for rects in candidates:
        calls = _cover(pairs, rects, alibi)
        if calls is not None and (best is None or len(calls) < len(best)):
            best = calls
    if best is None:  # one call per segment pair always fits (its band fits its box, and a
        # pair is at one offset)
        best = _cover(pairs, [(p.r0, p.r1, p.c0, p.c1) for p in pairs], alibi)
        assert best is not None
    return tuple(best)


def zigzag_segments(rank: int, world: int, s_local: int) -> Tuple[Segment, ...]:
    """Rank ``rank``'s two chunks of the zigzag layout: chunks ``rank`` and
    ``2 * world - 1 - rank`` of ``2 * world`` equal chunks (``s_local`` = 2 chunks)."""
    half = s_local // 2
    return (Segment(0, half, rank * half), Segment(half, half, (2 * world - 1 - rank) * half))


def contiguous_segments(rank: int, world: int, s_local: int) -> Tuple[Segment, ...]:
    """Rank ``rank``'s one chunk of the contiguous layout."""
    del world
    return (Segment(0, s_local, rank * s_local),)


def segments(layout: str, rank: int, world: int, s_local: int) -> Tuple[Segment, ...]:
    """The segments of ``layout`` ("zigzag" or "contiguous") held by ``rank``."""
    return (zigzag_segments if layout == "zigzag" else contiguous_segments)(rank, world, s_local)


@functools.lru_cache(maxsize=256)
def ring_plan(layout: str, rank: int, world: int, s_local: int, left: Optional[int],
              right: Optional[int], alibi: bool = False) -> Tuple[Tuple[BlockCall, ...], ...]:
    """The calls of every ring step of ``rank``: step t holds the keys of rank
    ``(rank - t) % world``. The ring stops after the last step at which any rank still sees a
    key (a window can end it early: those blocks are then neither computed nor sent).
    ``alibi``: as :func:`plan_step`'s."""
    mine = segments(layout, rank, world, s_local)
    steps = 0
    for r in range(world):
        q = segments(layout, r, world, s_local)
        for t in range(world):
            if plan_step(q, segments(layout, (r - t) % world, world, s_local), left, right):
                steps = max(steps, t + 1)
    return tuple(plan_step(mine, segments(layout, (rank - t) % world, world, s_local), left, right,
                           alibi)
                 for t in range(max(steps, 1)))



@functools.lru_cache(maxsize=256)
def incoming_spans(layout: str, rank: int, world: int, s_local: int, left: Optional[int],
                   right: Optional[int], alibi: bool = False
                   ) -> Tuple[Tuple[Tuple[int, int], ...], ...]:
    """Per ring step t, the (first key row, rows) of each call that rank ``(rank + t) % world``
    makes on ``rank``'s block (its :func:`ring_plan` step t, in call order): the dK / dV
    partials that come home to ``rank`` at step t. Step 0 is ``rank``'s own."""
    steps = len(ring_plan(layout, rank, world, s_local, left, right, alibi))
    return tuple(
        tuple((c.k0, c.k1 - c.k0) for c in ring_plan(
            layout, (rank + t) % world, world, s_local, left, right, alibi)[t])
        for t in range(steps))


@functools.lru_cache(maxsize=256)
def split_rows(q_segs: Tuple[Segment, ...], k_segs: Tuple[Segment, ...], left: Optional[int],
               right: Optional[int], at: int, alibi: bool = False
               ) -> Tuple[Tuple[BlockCall, ...], Tuple[BlockCall, ...]]:
    """The cells of :func:`plan_step` in two groups of calls: local query rows ``[0, at)`` and
    ``[at, s_q)`` (each as few calls as fit: one per group where a band does, else one per
    segment pair). The ring's backward computes the local block this way, one part first and
    one last (see :func:`flashattn.parallel.home.run_backward_home`)."""
    pairs = _pairs(q_segs, k_segs, left, right)
    sq = sum(s.length for s in q_segs)
    sk = sum(s.length for s in k_segs)

    def group(r0: int, r1: int) -> Tuple[BlockCall, ...]:
        if r0 >= r1:
            return ()
        calls = _cover(pairs, [(r0, r1, 0, sk)], alibi)
        if calls is None:  # one call per pair, clipped to the rows: a pair's band always fits
            calls = _cover(pairs, [(max(p.r0, r0), min(p.r1, r1), p.c0, p.c1) for p in pairs
                                   if max(p.r0, r0) < min(p.r1, r1)], alibi)
            assert calls is not None
        return tuple(calls)

    return group(0, at), group(at, sq)


def own_parts(layout: str, rank: int, world: int, s_local: int, left: Optional[int],
              right: Optional[int], alibi: bool = False
              ) -> Tuple[Tuple[BlockCall, ...], Tuple[BlockCall, ...]]:
    """The local block's calls (step 0 of :func:`ring_plan`) cut at the middle row: zigzag's
    two chunks (early queries against early keys, then the late chunk against both), or the
    two halves of a contiguous shard. ``alibi``: as :func:`plan_step`'s."""
    mine = segments(layout, rank, world, s_local)
    return split_rows(mine, mine, left, right, s_local // 2, alibi)


LAYOUTS = ("zigzag", "contiguous")

__all__ = ["BlockCall", "LAYOUTS", "Segment", "contiguous_segments", "incoming_spans",
           "own_parts", "plan_step", "ring_plan", "segments", "split_rows", "zigzag_segments"]
