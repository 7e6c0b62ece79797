"""Ring attention over a process group (zigzag-balanced or contiguous sequence layout).

Each rank holds a shard of the queries, keys and values of one long sequence. K / V blocks
travel around the ring (rank r sends to r + 1 and receives from r - 1) while each rank
computes its queries against the block in hand with the one-GPU kernels (``flashattn::fwd`` /
``flashattn::bwd``); the partial outputs merge through their log-sum-exp. The calls of each
step come from :mod:`flashattn.parallel.blocks` (hidden blocks are skipped; a window that
hides every later block ends the ring early, so those blocks are not sent either).

Backward: the recomputation of FlashAttention with the *global* lse and output (so a block's
softmax weights are the global ones and each block's dQ / dK / dV are exact shares of the
sum). dQ accumulates at home in float32; each call's dK / dV partial goes straight home to
the block's owner, which sums them once at the end (:func:`.home.run_backward_home`).
:func:`run_backward` is the other schedule, for calls whose partials cover gathered rows
rather than row ranges (the banded varlen ring): float32 sums that travel with their K / V
and go home after their last visitor. Both compute the local block in two parts, one first
and one last, so no transfer waits at the end of the ring.
"""
from __future__ import annotations

from typing import Callable, NamedTuple, Optional, Tuple

import torch

from flashattn import ops as _ops
from flashattn.api import normalise as _p
from flashattn.api import validation as _v
from flashattn.parallel import blocks as _blocks
from flashattn.parallel import checks as _checks
from flashattn.parallel import comm as _comm
from flashattn.parallel.accumulate import RowSum, fresh
from flashattn.parallel.groups import Group, Ring, check_device, resolve
from flashattn.parallel.home import Partials, run_backward_home
from flashattn.parallel.merge import merge_into, ready_to_merge

Tensor = torch.Tensor
LAYOUTS = ("zigzag", "contiguous")


class RingOptions(NamedTuple):
    """The normalised options of one ring call (global semantics)."""

    softmax_scale: float
    left: Optional[int]   # global window sides, None = unbounded (causal: right == 0)
    right: Optional[int]
    softcap: float
    alibi_slopes: Optional[Tensor]  # (b, h) float32 or None
    deterministic: bool


def _alibi_shift(call: _blocks.BlockCall, opt: RingOptions) -> int:
    """The kernel's ALiBi shift for this block (0 without ALiBi: the argument is then moot)."""
    if opt.alibi_slopes is None:
        return 0
    assert call.alibi_shift is not None  # (the plan with ALiBi makes only one-offset calls)
    return call.alibi_shift


def _block_forward(q: Tensor, k: Tensor, v: Tensor, call: _blocks.BlockCall,
                   opt: RingOptions) -> Tuple[Tensor, Tensor]:
    out, lse, _ = _ops.fwd(q[:, call.q0:call.q1], k[:, call.k0:call.k1], v[:, call.k0:call.k1],
                           opt.alibi_slopes, None, opt.softmax_scale, call.causal,
                           call.window_left, call.window_right, opt.softcap, 0.0,
                           opt.deterministic, False, _alibi_shift(call, opt))
    return out, lse


def _block_backward(dout: Tensor, q: Tensor, k: Tensor, v: Tensor, out: Tensor, lse: Tensor,
                    call: _blocks.BlockCall, opt: RingOptions) -> Tuple[Tensor, Tensor, Tensor]:
    rows = slice(call.q0, call.q1)
    keys = slice(call.k0, call.k1)
    return _ops.bwd(dout[:, rows], q[:, rows], k[:, keys], v[:, keys], out[:, rows],
                    lse[:, :, rows].contiguous(), opt.alibi_slopes, None, opt.softmax_scale,
                    call.causal, call.window_left, call.window_right, opt.softcap, 0.0,
                    opt.deterministic, _alibi_shift(call, opt))


class RingPlan(NamedTuple):
    """The kernel calls of one rank's ring: ``steps[t]`` against the block of rank
    ``(rank - t) % world`` (:func:`flashattn.parallel.blocks.ring_plan`); ``own_first`` /
    ``own_last``: step 0's cells in the backward's two parts (:func:`.blocks.own_parts`);
    ``incoming[t]``: the (first key row, rows) of each call that rank ``(rank + t) % world``
    makes at step t, on this rank's block (the dK / dV partials it sends home,
    :func:`.blocks.incoming_spans`)."""

    steps: Tuple[Tuple[_blocks.BlockCall, ...], ...]
    own_first: Tuple[_blocks.BlockCall, ...]
    own_last: Tuple[_blocks.BlockCall, ...]
    incoming: Tuple[Tuple[Tuple[int, int], ...], ...]


def run_forward(kv: Tuple[Tensor, ...], steps: int, ring: Ring, compute: Callable) -> None:
    """The forward ring: ``compute(step, *kv)`` for the block of step ``step`` while the next
    block travels (``steps`` steps; blocks are sent only where a later step needs them)."""
    for step in range(steps):
        pending = (_comm.exchange(kv, ring.group, ring.rank, ring.world)
                   if step + 1 < steps else None)
        compute(step, *kv)
        if pending is not None:
            kv = tuple(pending.wait())


def run_backward(k: Tensor, v: Tensor, steps: int, ring: Ring, compute: Callable,
                 own_first: Callable, own_last: Callable, row_dim: int = 1
                 ) -> Tuple[Tensor, ...]:
    """The backward ring; returns dK / dV of the local K / V in their dtype.

    ``compute(step, *kv)`` (steps 1 .. ``steps`` - 1, the blocks of the other ranks) and
    ``own_first(*kv)`` / ``own_last(*kv)`` (the local block, in two parts) each return
    ``add(*dkv)``, which adds their dK / dV into the float32 sums (:class:`RowSum`, rows along
    ``row_dim``: the sequence) of the block they saw (and dQ into the caller's).

    Schedule: the local block is computed in two parts, one first and one last. Its first
    part covers the transfer of the first block from the rank before; the other blocks'
    accumulators travel with them (one step behind their block, overlapping the next step's
    compute) and, after their last visitor, go home, where that transfer overlaps the local
    block's second part. So no transfer is left uncovered at the end of the ring, where the
    plain schedule (local block first, then a home-send after the last step) waits for one.
    The local block's two parts are added last, into the sum that came home (their dK / dV
    wait in K / V's dtype: no float32 buffer of their own, no extra pass to add one)."""
    kv = (k.contiguous(), v.contiguous())
    kv_pending = _comm.exchange(kv, ring.group, ring.rank, ring.world) if steps > 1 else None
    first = own_first(*kv)
    dkv_pending = None
    if kv_pending is not None:
        held = tuple(kv_pending.wait())
        for step in range(1, steps):
            last = step + 1 == steps
            kv_pending = (None if last else
                          _comm.exchange(held, ring.group, ring.rank, ring.world))
            add = compute(step, *held)
            # this block's dK / dV so far, from the rank before (none: this rank is its first
            # visitor after its owner)
            dkv = (tuple(RowSum.of(x, row_dim) for x in dkv_pending.wait())
                   if dkv_pending is not None else fresh(held, row_dim))
            add(*dkv)
            # on to the next visitor, or after the last one home to its owner
            dkv_pending = _comm.exchange([x.tensor() for x in dkv], ring.group, ring.rank,
                                         ring.world, distance=-(steps - 1) if last else 1)
            if kv_pending is not None:
                held = tuple(kv_pending.wait())
    second = own_last(*kv)
    # the local block's dK / dV from every other rank (zeros on a ring of one step)
    acc = (tuple(RowSum.of(x, row_dim) for x in dkv_pending.wait())
           if dkv_pending is not None else fresh(kv, row_dim))
    first(*acc)
    second(*acc)
    return tuple(a.tensor().to(x.dtype) for a, x in zip(acc, kv))


def ring_forward(q: Tensor, k: Tensor, v: Tensor, plan, opt: RingOptions, ring: Ring
                 ) -> Tuple[Tensor, Tensor]:
    """out (b, s, h, d_v) in q's dtype and lse (b, h, s) float32 of the local queries.

    The first call's output becomes the running sum as it is when it covers every row (the
    local block's, under zigzag: no fill, no merge); see :func:`ready_to_merge` for its
    dtype. Each merge is one pass (:func:`merge_into`)."""
    s = q.shape[1]
    last = max(((t, len(calls) - 1) for t, calls in enumerate(plan.steps) if calls),
               default=None)
    acc: list = []  # [out, lse] once the first call has run

    def compute(step: int, k_blk: Tensor, v_blk: Tensor) -> None:
        for i, call in enumerate(plan.steps[step]):
            o_b, lse_b = _block_forward(q, k_blk, v_blk, call, opt)
            if not acc:
                if (call.q0, call.q1) == (0, s):
                    acc.extend((o_b, lse_b))
                    continue
                acc.extend((torch.zeros(*q.shape[:3], v.shape[-1], dtype=torch.float32,
                                        device=q.device),
                            torch.full((q.shape[0], q.shape[2], s), float("-inf"),
                                       dtype=torch.float32, device=q.device)))
            acc[0] = ready_to_merge(acc[0], (step, i) == last)
            out, lse = acc
            merge_into(out[:, call.q0:call.q1], lse[:, :, call.q0:call.q1], o_b, lse_b)

    run_forward((k.contiguous(), v.contiguous()), len(plan.steps), ring, compute)
    return acc[0].to(q.dtype), acc[1]


def ring_backward(dout: Tensor, q: Tensor, k: Tensor, v: Tensor, out: Tensor, lse: Tensor,
                  plan, opt: RingOptions, ring: Ring) -> Tuple[Tensor, Tensor, Tensor]:
    """(dq, dk, dv) of the local shards, typed like q, k, v. Each call's dK / dV partial goes
    straight home (:func:`.home.run_backward_home`); the owner knows their row ranges from
    the sender's plan."""
    dq = RowSum(q.shape, q.device)

    def grads(calls, k_blk: Tensor, v_blk: Tensor) -> Partials:
        done = [(c, _block_backward(dout, q, k_blk, v_blk, out, lse, c, opt)) for c in calls]

        def add_dq() -> None:
            for c, (dq_b, _, _) in done:
                dq.add(c.q0, dq_b)
        return Partials(tuple((c.k0, dk_b, dv_b) for c, (_, dk_b, dv_b) in done), add_dq)

    dk, dv = run_backward_home(
        k, v, len(plan.steps), ring, lambda step, *kv: grads(plan.steps[step], *kv),
        lambda *kv: grads(plan.own_first, *kv), lambda *kv: grads(plan.own_last, *kv),
        lambda step: plan.incoming[step])
    return dq.tensor().to(q.dtype), dk, dv


class RingFunction(torch.autograd.Function):
    """A ring call as an autograd Function: ``forward_fn(q, k, v, *args) -> (out, lse)`` and
    ``backward_fn(dout, q, k, v, out, lse, *args) -> (dq, dk, dv)``; lse is not
    differentiable. Shared by the dense and the varlen rings."""

    @staticmethod
    def forward(ctx, q, k, v, forward_fn, backward_fn, args):
        out, lse = forward_fn(q, k, v, *args)
        ctx.save_for_backward(q, k, v, out, lse)
        ctx.backward_fn, ctx.args = backward_fn, args
        ctx.mark_non_differentiable(lse)
        return out, lse

    @staticmethod
    def backward(ctx, dout, _dlse):
        q, k, v, out, lse = ctx.saved_tensors
        if dout.stride(-1) != 1:
            dout = dout.contiguous()
        dq, dk, dv = ctx.backward_fn(dout, q, k, v, out, lse, *ctx.args)
        return dq, dk, dv, None, None, None


def attend(q: Tensor, k: Tensor, v: Tensor, plan, opt: RingOptions, ring: Ring
           ) -> Tuple[Tensor, Tensor]:
    """The differentiable ring call on validated inputs: (out, lse), lse not differentiable."""
    return RingFunction.apply(q, k, v, ring_forward, ring_backward, (plan, opt, ring))


def normalise(q: Tensor, k: Tensor, v: Tensor, group: Group, causal: bool,
              window_size, softcap: float, alibi_slopes: Optional[Tensor],
              softmax_scale: Optional[float], deterministic: bool, layout: str, what: str):
    """Validation and normalisation shared by the dense ring entry points: returns
    (Ring, RingOptions)."""
    _v.check_qkv(q, k, v, ("q", "k", "v"))
    if layout not in LAYOUTS:
        raise ValueError(f"layout: expected one of {LAYOUTS}, got {layout!r}")
    scale, causal, window_left, window_right, softcap, deterministic = _v.check_options(
        softmax_scale, causal, window_size, softcap, deterministic)
    pg, rank, world = resolve(group)
    check_device(pg, q, "q")
    b, s_local, h, d = q.shape
    if k.shape[1] != s_local:
        raise ValueError(f"k: its local sequence length {k.shape[1]} differs from q's "
                         f"{s_local}; ring attention shards one sequence attending to itself")
    if layout == "zigzag" and s_local % 2:
        raise ValueError(f"q: local sequence length {s_local} is odd; the zigzag layout holds "
                         f"two equal chunks per rank (global length divisible by 2 * world = "
                         f"{2 * world}); pad the sequence or use layout='contiguous'")
    _v.check_alibi_slopes(alibi_slopes, b, h, q.device)
    _checks.same_on_every_rank(pg, world, q.device, [
        ("q.shape[0]", b), ("q.shape[1] (local sequence length)", s_local), ("q.shape[2]", h),
        ("q.shape[3]", d), ("k.shape[2]", k.shape[2]), ("v.shape[3]", v.shape[3]),
        ("q.dtype", _checks.dtype_code(q.dtype)), ("causal", int(causal)),
        ("window_size[0]", window_left), ("window_size[1]", window_right),
        ("softcap", _checks.float_bits(softcap)),
        ("softmax_scale", _checks.float_bits(-1.0 if scale is None else scale)),
        ("alibi_slopes given", int(alibi_slopes is not None)),
        ("deterministic", int(deterministic)), ("layout", LAYOUTS.index(layout))], what)
    scale = _p.softmax_scale_or_default(scale, d)
    wl, wr = _p.window(window_left, window_right, causal, s_local * world)
    opt = RingOptions(scale, None if wl < 0 else wl, None if wr < 0 else wr, softcap,
                      _p.alibi_bh(alibi_slopes, b, h), deterministic)
    return Ring(pg, rank, world), opt


def plan_for(layout: str, rank: int, world: int, s_local: int, opt: RingOptions) -> RingPlan:
    """The ring plan of this rank. With ALiBi every call covers cells of one global offset
    and carries the kernel's ALiBi shift for it (:class:`.blocks.BlockCall`)."""
    alibi = opt.alibi_slopes is not None
    plan = _blocks.ring_plan(layout, rank, world, s_local, opt.left, opt.right, alibi)
    first, last = _blocks.own_parts(layout, rank, world, s_local, opt.left, opt.right, alibi)
    incoming = _blocks.incoming_spans(layout, rank, world, s_local, opt.left, opt.right, alibi)
    return RingPlan(plan, first, last, incoming)


def ring_flash_attn_func(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    *,
    group: Group = None,
    causal: bool = False,
    window_size: Tuple[int, int] = (-1, -1),
    softcap: float = 0.0,
    alibi_slopes: Optional[Tensor] = None,
    softmax_scale: Optional[float] = None,
    deterministic: bool = False,
    layout: str = "zigzag",
    return_attn_probs: bool = False,
):
    """Attention of one sequence sharded over ``group`` (ring attention, forward and backward).

    Every rank passes its local shard; the result is flash-attn 2's attention of the whole
    (global) sequence attending to itself, for the local queries.

    Arguments:
        q: (batch, s_local, nheads, headdim) local queries, float16 / bfloat16 / float32.
        k, v: (batch, s_local, nheads_k, headdim / headdim_v) local keys and values (GQA / MQA:
            nheads % nheads_k == 0; only the nheads_k heads travel).
        group: ProcessGroup or 1-D DeviceMesh (default: the default group). NCCL for CUDA
            tensors, gloo for CPU tensors.
        causal, window_size, softcap, softmax_scale, deterministic: flash-attn 2's meaning on
            the global sequence (global length = s_local * world; causal / windows are
            aligned with the global positions). ``deterministic``: bitwise-repeatable results
            for a fixed world size (the ring sums in a fixed order).
        alibi_slopes: (nheads,) or (batch, nheads) float32: ALiBi over the global positions
            (each block's kernel call carries its global offset; the blocks the zigzag
            layout would merge into one call at two offsets run as one call each, so a
            non-causal ALiBi ring makes more, smaller calls). The kernels that take ALiBi
            are the portable ones (as on one GPU: the Hopper kernels take no ALiBi).
        layout: "zigzag" (default: rank r holds chunks r and 2 * world - 1 - r of 2 * world,
            see :func:`zigzag_shard`; equal causal work on every rank) or "contiguous"
            (rank r holds chunk r of world, :func:`contiguous_shard`).
        return_attn_probs: also return the local lse.

    Returns:
        out (batch, s_local, nheads, headdim_v) in q's dtype; with ``return_attn_probs``
        ``(out, lse, None)``, lse float32 (batch, nheads, s_local), natural log.

    Precision: each key block's output comes from the kernel in q's dtype and the lse merge
    (float32 math) rounds the sum again, so a 16-bit out can differ from a one-GPU call by one
    unit in the last place (ring-flash-attention merges the same way); lse stays float32.
    """
    return_attn_probs = _v.check_bool(return_attn_probs, "return_attn_probs")
    ring, opt = normalise(q, k, v, group, causal, window_size, softcap, alibi_slopes,
                                     softmax_scale, deterministic, layout,
                                     "ring_flash_attn_func")
    plan = plan_for(layout, ring.rank, ring.world, q.shape[1], opt)
    out, lse = attend(q, k, v, plan, opt, ring)
    return (out, lse, None) if return_attn_probs else out


__all__ = ["LAYOUTS", "Ring", "RingFunction", "RingOptions", "RingPlan", "attend", "normalise",
           "plan_for", "ring_backward", "ring_flash_attn_func", "ring_forward", "run_backward",
           "run_forward"]
