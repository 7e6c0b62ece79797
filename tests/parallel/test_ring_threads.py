"""The rings of flashattn.parallel with their ranks as threads of one process on one device
(tests/parallel/threads.py): on a single GPU through the Hopper kernels (``-m gpu``), and a
few cases on CPU that keep the thread harness itself tested in CI. Every rank's output, lse
and gradients, put back in the global order, against the float64 oracle on the whole
sequence (flash-attn's rule, as in tests/parallel/cases.py); deterministic rings repeated
bitwise."""
from __future__ import annotations

from typing import List, Sequence

import pytest
import torch

import flashattn
import flashattn.parallel as fp
from flashattn.parallel import ring as _ring
from tests.parallel import cases as c
from tests.parallel import threads

BF16 = torch.bfloat16


def _randn(shape, dtype, device, g):
    return torch.randn(*shape, generator=g, dtype=torch.float32).to(device, dtype)


def _zigzag_rows(s: int, rank: int, world: int) -> torch.Tensor:
    """The global positions of rank ``rank``'s zigzag shard of a length-``s`` sequence (the
    varlen layout's index of one document is the dense zigzag layout)."""
    return fp.zigzag_varlen_index(torch.tensor([0, s], dtype=torch.int32), rank, world)[0]


def _gathered(parts: Sequence[torch.Tensor], rows: Sequence[torch.Tensor], dim: int
              ) -> torch.Tensor:
    """The global tensor from every rank's ``parts`` at global positions ``rows`` on ``dim``."""
    shape = list(parts[0].shape)
    shape[dim] = sum(p.shape[dim] for p in parts)
    full = parts[0].new_empty(shape)
    for p, r in zip(parts, rows):
        full.index_copy_(dim, r.to(p.device), p)
    return full


def _run_and_check(world: int, rank_call, rows, seq_dim: int, ref, lp, deterministic: bool
                   ) -> None:
    """``rank_call(rank) -> (out, lse, dq, dk, dv)`` on ``world`` threads (twice when
    ``deterministic``: bitwise equal), put back in the global order (``rows``: each rank's
    global positions along ``seq_dim``; lse's sequence dim is the next one) and checked
    against the oracle ``ref`` / ``lp``."""
    results = [threads.run(world, rank_call) for _ in range(2 if deterministic else 1)]
    got = [_gathered([r[i] for r in results[0]], rows, seq_dim + (i == 1)) for i in range(5)]
    c._check((got[0], got[1], got[2:]), ref, lp, lambda x: x, merged=world > 1)
    if deterministic:
        for a, b in zip(results[0], results[1]):
            assert all(torch.equal(x, y) for x, y in zip(a, b))


def ring_dense(world: int, device: str, *, b=1, s_per_rank=64, h=4, hk=2, d=64, dtype=BF16,
               causal=True, window_size=(-1, -1), softcap=0.0, alibi=False,
               deterministic=False):
    s = s_per_rank * world
    g = torch.Generator().manual_seed(7)
    q, dout = (_randn((b, s, h, d), dtype, device, g) for _ in range(2))
    k, v = (_randn((b, s, hk, d), dtype, device, g) for _ in range(2))
    slopes = (torch.rand(h, generator=g) * 0.5).to(device) if alibi else None
    kw = dict(causal=causal, window_size=window_size, softcap=softcap, alibi_slopes=slopes)
    ref, lp = c._oracle(q, k, v, dout, **kw)
    rows = [_zigzag_rows(s, r, world) for r in range(world)]

    def rank_call(rank: int):
        idx = rows[rank].to(device)
        local = [x.index_select(1, idx).requires_grad_() for x in (q, k, v)]
        out, lse, _ = fp.ring_flash_attn_func(*local, deterministic=deterministic,
                                              return_attn_probs=True, **kw)
        grads = torch.autograd.grad(out, local, dout.index_select(1, idx))
        return (out.detach(), lse) + tuple(grads)

    _run_and_check(world, rank_call, rows, 1, ref, lp, deterministic)


def ring_varlen(world: int, device: str, *, lengths=(64, 256, 128, 512), h=4, hk=2, d=64,
                dtype=BF16, causal=True, window_size=(-1, -1), softcap=0.0, alibi=None,
                deterministic=False):
    """``lengths``: each document's local length (global: ``world`` times it); ``alibi``:
    None, "heads" ((nheads,) slopes) or "docs" ((n_docs, nheads))."""
    lengths = [n * world for n in lengths]
    cu = torch.tensor([0] + lengths).cumsum(0).to(torch.int32)
    total = int(cu[-1])
    g = torch.Generator().manual_seed(11)
    q, dout = (_randn((total, h, d), dtype, device, g) for _ in range(2))
    k, v = (_randn((total, hk, d), dtype, device, g) for _ in range(2))
    slopes = (None if alibi is None else
              (torch.rand(*((h,) if alibi == "heads" else (len(lengths), h)), generator=g)
               * 0.5).to(device))
    kw = dict(causal=causal, window_size=window_size, softcap=softcap)
    ref, lp = c._varlen_oracle(q, k, v, dout, cu, alibi_slopes=slopes, **kw)
    kw["alibi_slopes"] = slopes
    cu_d = cu.to(device)
    rows = [fp.zigzag_varlen_index(cu_d, r, world)[0] for r in range(world)]

    def rank_call(rank: int):
        idx = rows[rank]
        local = [x.index_select(0, idx).requires_grad_() for x in (q, k, v)]
        out, lse, _ = fp.ring_flash_attn_varlen_func(*local, cu_d, max(lengths),
                                                     deterministic=deterministic,
                                                     return_attn_probs=True, **kw)
        grads = torch.autograd.grad(out, local, dout.index_select(0, idx))
        return (out.detach(), lse) + tuple(grads)

    _run_and_check(world, rank_call, rows, 0, ref, lp, deterministic)


def test_threads_deliver_in_issue_order():
    """The stand-in exchange: each rank's message reaches rank + distance, in issue order per
    pair, whatever order the threads run in; the receiver gets a copy."""
    def rank_call(rank: int) -> List[List[float]]:
        mine = [torch.tensor([rank * 10.0 + i]) for i in range(3)]
        pending = fp.comm.exchange(mine[:2], None, rank, 3)
        mine[0].add_(100.0)  # after the send: the receiver's copy does not change
        first = pending.wait()
        home = fp.comm.exchange(mine[2:], None, rank, 3, distance=-1).wait()
        return [t.item() for t in first + home]

    got = threads.run(3, rank_call)
    assert got == [[20.0, 21.0, 12.0], [0.0, 1.0, 22.0], [10.0, 11.0, 2.0]]


def test_threads_report_the_failing_rank():
    def rank_call(rank: int) -> None:
        if rank == 1:
            raise ValueError("boom")

    with pytest.raises(RuntimeError, match="rank 1 of 2 raised ValueError: boom"):
        threads.run(2, rank_call)


@pytest.mark.parametrize("world", [2, 3])
def test_rings_on_threads_cpu(world):
    """The harness on the CPU attention path (the multi-process gloo tests cover the rings
    themselves on CPU; this keeps the one-GPU harness honest in CI)."""
    with flashattn.use_backend("cpu"):
        ring_dense(world, "cpu", s_per_rank=8, h=4, hk=2, d=16, dtype=torch.float32)
        ring_varlen(world, "cpu", lengths=(8, 4, 12), h=4, hk=2, d=16, dtype=torch.float32)
        ring_varlen(world, "cpu", lengths=(8, 4), h=4, hk=1, d=16, dtype=BF16, softcap=5.0,
                    deterministic=True)
        ring_varlen(world, "cpu", lengths=(6, 10), h=4, hk=2, d=16, dtype=torch.float32,
                    alibi="docs", window_size=(7, 0))


def _travelling_sums(dout, q, k, v, out, lse, plan, opt, ring):
    """dK / dV of the ring's calls summed in float32 sums that travel with their blocks
    (``ring.run_backward``, the schedule the partials sent home replaced)."""
    def grads(calls, k_blk, v_blk):
        done = [(c, _ring._block_backward(dout, q, k_blk, v_blk, out, lse, c, opt))
                for c in calls]

        def add(dk_acc, dv_acc):
            for call, (_, dk_b, dv_b) in done:
                dk_acc.add(call.k0, dk_b)
                dv_acc.add(call.k0, dv_b)
        return add

    return _ring.run_backward(k, v, len(plan.steps), ring,
                              lambda step, *kv: grads(plan.steps[step], *kv),
                              lambda *kv: grads(plan.own_first, *kv),
                              lambda *kv: grads(plan.own_last, *kv))


@pytest.mark.parametrize("world,kw", [
    (4, dict(causal=True)), (3, dict(causal=False)), (4, dict(causal=True, window_size=(20, 0))),
    (3, dict(causal=False, alibi=True, window_size=(9, 5)))])
def test_partials_home_give_the_travelling_sums_bits(world, kw):
    """The same dK / dV partials, summed in float32 in the same order (ring order, then the
    local block's two parts) and rounded once: the partials sent home give the bits of the
    float32 sums that travelled with their blocks, for every rank (deterministic calls;
    ALiBi's calls at two offsets on the same keys test the order within a step)."""
    s_per_rank, h, hk, d = 16, 4, 2, 16
    g = torch.Generator().manual_seed(world)
    # float32: a float32 sum of a few bf16 terms is usually exact in any order; float32
    # partials make the order visible in the bits
    q, dout = (_randn((1, s_per_rank * world, h, d), torch.float32, "cpu", g) for _ in range(2))
    k, v = (_randn((1, s_per_rank * world, hk, d), torch.float32, "cpu", g) for _ in range(2))
    slopes = torch.rand(h, generator=g) * 0.5 if kw.get("alibi") else None
    rows = [_zigzag_rows(s_per_rank * world, r, world) for r in range(world)]

    def rank_call(rank: int):
        local = [x.index_select(1, rows[rank]) for x in (q, k, v, dout)]
        ring, opt = _ring.normalise(*local[:3], None, kw["causal"],
                                    kw.get("window_size", (-1, -1)), 0.0, slopes, None, True,
                                    "zigzag", "test")
        plan = _ring.plan_for("zigzag", ring.rank, ring.world, s_per_rank, opt)
        out, lse = _ring.ring_forward(*local[:3], plan, opt, ring)
        _, dk, dv = _ring.ring_backward(local[3], *local[:3], out, lse, plan, opt, ring)
        dk_t, dv_t = _travelling_sums(local[3], *local[:3], out, lse, plan, opt, ring)
        return dk, dv, dk_t, dv_t

    with flashattn.use_backend("cpu"):
        for dk, dv, dk_t, dv_t in threads.run(world, rank_call):
            assert dk.abs().sum() > 0
            assert torch.equal(dk, dk_t) and torch.equal(dv, dv_t)


GPU_DENSE = [
    dict(),
    dict(causal=False, d=128, hk=4),
    dict(window_size=(150, 0)),
    dict(deterministic=True, d=128),
    dict(d=256, hk=1, dtype=torch.float16),
    dict(alibi=True, d=128),
    dict(alibi=True, causal=False, window_size=(100, 40)),
]
GPU_VARLEN = [
    dict(),
    dict(d=128, hk=4),
    dict(causal=False, d=128),
    dict(deterministic=True, d=128, hk=1),
    dict(softcap=20.0, lengths=(96, 32, 512, 256)),
    dict(window_size=(200, 0), lengths=(64, 256, 0, 512)),
    dict(lengths=(1024, 64, 2048, 320), d=128, hk=4),
    dict(alibi="docs", deterministic=True, lengths=(128, 64, 128)),
    dict(alibi="heads", window_size=(150, 0), d=128),
]


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU")
@pytest.mark.parametrize("world", [2, 4])
@pytest.mark.parametrize("case", range(len(GPU_DENSE)))
def test_ring_on_threads_gpu(world: int, case: int):
    with flashattn.use_backend("hopper"):  # (at these lengths "auto" may pick the portable)
        ring_dense(world, "cuda", **GPU_DENSE[case])


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU")
@pytest.mark.parametrize("world", [2, 4])
@pytest.mark.parametrize("case", range(len(GPU_VARLEN)))
def test_varlen_ring_on_threads_gpu(world: int, case: int):
    with flashattn.use_backend("hopper"):
        ring_varlen(world, "cuda", **GPU_VARLEN[case])
