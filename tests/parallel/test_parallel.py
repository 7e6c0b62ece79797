"""flashattn.parallel on CPU processes joined by gloo: every call against the float64 oracle
on the unsharded tensors (tests/parallel/cases.py), plus the block planner against a brute
mask. Each world size spawns its processes once for all of its cases."""
from __future__ import annotations

import itertools
import os
import zlib

import numpy as np
import pytest
import torch

from flashattn.parallel import blocks
from tests.parallel import cases as c
from tests.parallel.harness import run

F32, BF16 = torch.float32, torch.bfloat16


# every case on 2 and 4 ranks; a subset on 1 and 3 (odd ring sizes, the one-rank ring)
_SUBSET = {"ring causal fp32", "ring sliding window", "ring contiguous causal",
           "varlen ring causal", "varlen ring sliding window", "varlen ring alibi causal",
           "ulysses causal", "ring alibi causal", "ring alibi full bf16",
           "bad inputs"}


def _cases(world):
    out = [
        ("ring causal fp32", c.ring_dense, dict()),
        ("ring causal bf16", c.ring_dense, dict(dtype=BF16)),
        ("ring full", c.ring_dense, dict(causal=False)),
        ("ring sliding window", c.ring_dense, dict(window_size=(5, 0))),
        ("ring two-sided window", c.ring_dense, dict(causal=False, window_size=(3, 6))),
        ("ring MQA softcap", c.ring_dense, dict(hk=1, softcap=2.0)),
        ("ring odd shapes", c.ring_dense, dict(b=1, s_per_rank=6, h=3, hk=3, d=24)),
        ("ring contiguous causal", c.ring_dense, dict(layout="contiguous", s_per_rank=5)),
        ("ring contiguous window", c.ring_dense, dict(layout="contiguous", window_size=(3, 0))),
        ("ring deterministic", c.ring_dense, dict(deterministic=True, dtype=BF16)),
        # ALiBi over the global positions: each block's call carries its offset
        ("ring alibi causal", c.ring_dense, dict(alibi=True)),
        ("ring alibi full bf16", c.ring_dense, dict(alibi=True, causal=False, dtype=BF16)),
        ("ring alibi window contiguous", c.ring_dense,
         dict(alibi=True, causal=False, window_size=(5, 2), layout="contiguous")),
        ("ring alibi MQA softcap deterministic", c.ring_dense,
         dict(alibi=True, hk=1, softcap=2.0, deterministic=True)),
        ("varlen ring causal", c.ring_varlen, dict()),
        ("varlen ring full bf16", c.ring_varlen, dict(causal=False, dtype=BF16)),
        ("varlen ring MQA softcap", c.ring_varlen, dict(hk=1, softcap=3.0, lengths=(2, 6))),
        # windows / ALiBi: calls per document length (two documents share one, one is empty)
        ("varlen ring sliding window", c.ring_varlen,
         dict(window_size=(5, 0), lengths=(8, 2, 0, 8, 6))),
        ("varlen ring two-sided window bf16", c.ring_varlen,
         dict(causal=False, window_size=(3, 7), dtype=BF16, lengths=(4, 10, 4))),
        ("varlen ring alibi causal", c.ring_varlen, dict(alibi="docs", lengths=(6, 2, 6))),
        ("varlen ring alibi window full MQA deterministic", c.ring_varlen,
         dict(alibi="heads", causal=False, window_size=(6, 2), hk=1, deterministic=True,
              lengths=(2, 8))),
        ("ulysses causal", c.ulysses_dense, dict()),
        ("ulysses window alibi", c.ulysses_dense, dict(window_size=(4, 1), alibi=True)),
        ("ulysses GQA bf16", c.ulysses_dense, dict(dtype=BF16, hk=2 if world % 2 == 0 else 1)),
        ("ulysses MQA", c.ulysses_dense, dict(hk=1, causal=False, softcap=1.5)),
        ("ulysses varlen", c.ulysses_varlen, dict()),
        ("ulysses varlen window", c.ulysses_varlen, dict(window_size=(3, 0), hk=1)),
        ("bad inputs", c.bad_inputs, dict()),
    ]
    if world == 2:
        out.append(("training loop (Hugging Face Llama)", c.training_loop, dict()))
    if world == 4:
        out.append(("usp 2x2 causal", c.usp, dict()))
        out.append(("usp 2x2 window", c.usp, dict(window_size=(6, 0), hk=1)))
        out.append(("usp 2x2 alibi full", c.usp, dict(causal=False, alibi=True)))
    if world in (1, 3):
        out = [case for case in out if case[0] in _SUBSET]
    return out


@pytest.mark.parametrize("world", [1, 2, 3, 4])
def test_parallel_calls(world, request):
    # the suite's base seed (printed in pytest's header) mixed with the world size
    seed = zlib.crc32(f"{os.environ.get('FLASHATTN_TEST_SEED', '0')}-{world}".encode())
    failures = run(world, _cases(world), seed=seed)
    assert not failures, "\n".join(failures)


def _global(layout, r, world, s_local):
    segs = blocks.segments(layout, r, world, s_local)
    return np.concatenate([np.arange(s.global_start, s.global_start + s.length) for s in segs])


def _kernel_mask(lq, lk, window_left, window_right):
    """(i, j, mask) of one kernel call's lq x lk grid: its bottom-right aligned window."""
    i, j = np.arange(lq)[:, None], np.arange(lk)[None, :]
    m = np.ones((lq, lk), bool)
    if window_left >= 0:
        m &= j - i >= lk - lq - window_left
    if window_right >= 0:
        m &= j - i <= lk - lq + window_right
    return i, j, m


def _check_cover(calls, gq, gk, left, right, where, alibi=False):
    """``calls`` compute every visible (query, key) cell of global positions gq x gk once."""
    dist = gk[None, :] - gq[:, None]
    want = np.ones_like(dist, bool)
    if left is not None:
        want &= dist >= -left
    if right is not None:
        want &= dist <= right
    got = np.zeros(want.shape, int)
    for call in calls:
        lq, lk = call.q1 - call.q0, call.k1 - call.k0
        i, j, m = _kernel_mask(lq, lk, call.window_left, call.window_right)
        assert call.causal == (call.window_left == -1 and call.window_right == 0)
        got[call.q0:call.q1, call.k0:call.k1] += m
        if call.alibi_shift is not None:  # (the kernel's ALiBi distance is the global one)
            d = np.abs(gq[call.q0:call.q1, None] - gk[None, call.k0:call.k1])
            assert (np.abs(i + lk - lq + call.alibi_shift - j)[m] == d[m]).all()
        elif alibi:
            raise AssertionError((where, "a call at two offsets in an ALiBi plan", call))
    assert (got <= 1).all(), (where, calls)
    assert ((got == 1) == want).all(), (where, calls)


def _brute(layout, world, s_local, left, right, alibi=False):
    for r in range(world):
        plan = blocks.ring_plan(layout, r, world, s_local, left, right, alibi)
        gq = _global(layout, r, world, s_local)
        for t in range(world):
            gk = _global(layout, (r - t) % world, world, s_local)
            _check_cover(plan[t] if t < len(plan) else (), gq, gk, left, right, (r, t), alibi)
        first, last = blocks.own_parts(layout, r, world, s_local, left, right, alibi)
        _check_cover(first + last, gq, gq, left, right, (r, "own parts"), alibi)
        half = s_local // 2
        assert all(c.q1 <= half for c in first) and all(c.q0 >= half for c in last)


def test_block_plan_covers_the_global_mask_once():
    """Every visible cell of every ring step is computed by exactly one call, no hidden one;
    with ALiBi every call's shift gives each of its visible cells its global distance."""
    for layout, world, s_local, left, right, alibi in itertools.product(
            blocks.LAYOUTS, [1, 2, 3, 4, 8], [2, 6, 10, 16], [None, 0, 1, 3, 7, 20],
            [None, 0, 2, 5, 40], [False, True]):
        _brute(layout, world, s_local, left, right, alibi)


def test_zigzag_causal_plan_is_one_call_per_step():
    """Zigzag's balance: under a causal mask every rank makes one call per step, over the
    same number of (query, key) cells at every step after the first."""
    world, s_local = 4, 8
    for r in range(world):
        plan = blocks.ring_plan("zigzag", r, world, s_local, None, 0)
        assert len(plan) == world and all(len(calls) == 1 for calls in plan)
        assert plan[0][0].causal
        areas = {(c.q1 - c.q0) * (c.k1 - c.k0) for calls in plan[1:] for c in calls}
        assert areas == {s_local * s_local // 2}


def test_zigzag_causal_local_block_splits_into_its_chunks():
    """The backward's two parts of the local block under a causal mask: the early query chunk
    against the early key chunk (causal), then the late query chunk against both (causal,
    bottom-right aligned): one call each, a quarter and three quarters of the cells."""
    first, last = blocks.own_parts("zigzag", 1, 4, 8, None, 0)
    assert [tuple(c[:6]) for c in first] == [(0, 4, 0, 4, True, -1)]
    assert [tuple(c[:6]) for c in last] == [(4, 8, 0, 8, True, -1)]


def test_window_ends_the_ring_early():
    """A window shorter than one rank's shard needs only the neighbour's block."""
    plan = blocks.ring_plan("contiguous", 0, 4, 8, 3, 0)
    assert len(plan) == 2


def test_bench_cp_local_block_ablation():
    """``bench_cp --local-block whole`` computes the local block in one part, first (the
    schedule the split replaces), and restores the library's split afterwards."""
    from flashattn import bench_cp

    split = blocks.own_parts("zigzag", 0, 2, 8, None, 0)
    with bench_cp._local_block("whole"):
        assert blocks.own_parts("zigzag", 0, 2, 8, None, 0) == (
            blocks.ring_plan("zigzag", 0, 2, 8, None, 0)[0], ())
    assert blocks.own_parts("zigzag", 0, 2, 8, None, 0) == split and split[1]
    with pytest.raises(SystemExit, match="--local-block"):
        with bench_cp._local_block("halves"):
            pass


def _doc_global(rows, bounds, owner, world):
    """Global (document, position) of local packed rows of ``owner``'s zigzag varlen shard."""
    doc_of, pos = np.empty(len(rows), int), np.empty(len(rows), int)
    start = 0
    for i, (a, e) in enumerate(zip(bounds[:-1], bounds[1:])):
        local = (e - a) // world
        c = local // 2
        sel = (rows >= start) & (rows < start + local)
        o = rows[sel] - start
        doc_of[sel] = i
        pos[sel] = np.where(o < c, owner * c + o, (2 * world - 1 - owner) * c + o - c)
        start += local
    return doc_of, pos


def _check_doc_calls(calls, bounds, rank, src, world, left, right, alibi, got):
    """Adds each call's visible cells into ``got[(doc, p, P)]``; checks the rows of a call are
    distinct (the ring merges them by index) and ALiBi shifts give the global distance."""
    for call in calls:
        q_rows, k_rows = call.q_rows.numpy(), call.k_rows.numpy()
        assert len(set(q_rows.tolist())) == len(q_rows) and len(set(k_rows.tolist())) == len(k_rows)
        cu_q, cu_k = call.cu_q.tolist(), call.cu_k.tolist()
        assert len(cu_q) == len(cu_k) == call.docs.numel() + 1
        if alibi:
            assert call.equal and call.alibi_shift is not None
        for s, doc in enumerate(call.docs.tolist()):
            qr, kr = q_rows[cu_q[s]:cu_q[s + 1]], k_rows[cu_k[s]:cu_k[s + 1]]
            dq, gq = _doc_global(qr, bounds, rank, world)
            dk, gk = _doc_global(kr, bounds, src, world)
            assert (dq == doc).all() and (dk == doc).all()
            lq, lk = len(qr), len(kr)
            assert lq <= call.max_q and lk <= call.max_k
            i, j, m = _kernel_mask(lq, lk, call.window_left, call.window_right)
            if call.alibi_shift is not None:
                d = np.abs(gq[:, None] - gk[None, :])
                assert (np.abs(i + lk - lq + call.alibi_shift - j)[m] == d[m]).all()
            for a, b in zip(*np.nonzero(m)):
                key = (doc, gq[a], gk[b])
                got[key] = got.get(key, 0) + 1


def test_doc_plan_covers_every_document_band_once():
    """The varlen ring's banded plan (windows / ALiBi over packed documents): every visible
    (query, key) cell of every document is computed once over the ring's steps, none hidden,
    and the backward's two parts of the local block cover its step 0 exactly."""
    from flashattn.parallel.doc_blocks import doc_plan

    for world, lengths, left, right, alibi in itertools.product(
            [1, 2, 3], [(4, 2, 0, 4, 6), (2, 10)], [None, 0, 3, 7], [None, 0, 2], [False, True]):
        if left is None and right in (None, 0) and not alibi:
            continue  # (the plain varlen ring's cases: not planned per document)
        bounds = tuple(int(x) for x in np.cumsum([0] + [n * 2 * world for n in lengths]))
        for rank in range(world):
            plan = doc_plan(bounds, rank, world, left, right, alibi, torch.device("cpu"))
            got, own = {}, {}
            for t in range(world):
                calls = plan.steps[t] if t < len(plan.steps) else ()
                _check_doc_calls(calls, bounds, rank, (rank - t) % world, world, left, right,
                                 alibi, got)
            _check_doc_calls(plan.own_first + plan.own_last, bounds, rank, rank, world, left,
                             right, alibi, own)
            want, want_own = set(), set()
            gq_doc, gq = _doc_global(np.arange(bounds[-1] // world), bounds, rank, world)
            for src in range(world):
                gk_doc, gk = _doc_global(np.arange(bounds[-1] // world), bounds, src, world)
                for a in range(len(gq)):
                    for b in range(len(gk)):
                        d = gk[b] - gq[a]
                        if gq_doc[a] == gk_doc[b] and (left is None or d >= -left) and (
                                right is None or d <= right):
                            want.add((gq_doc[a], gq[a], gk[b]))
                            if src == rank:
                                want_own.add((gq_doc[a], gq[a], gk[b]))
            where = (world, lengths, left, right, alibi, rank)
            assert set(got) == want and all(n == 1 for n in got.values()), where
            assert set(own) == want_own and all(n == 1 for n in own.values()), where
