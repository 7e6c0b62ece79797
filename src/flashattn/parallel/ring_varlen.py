"""Ring attention over packed documents, each document zigzag-split across the ranks.

Every rank holds, for every document of length n, its chunks ``rank`` and
``2 * world - 1 - rank`` of ``2 * world`` (``n / (2 * world)`` tokens each): the local
``cu_seqlens`` is the same on every rank and every rank has the same causal work whatever the
mix of lengths. At ring step t the block in hand comes from rank ``src = (rank - t) % world``,
and under a causal mask the three zigzag cases hold for every document at once, so each step's
kernel calls cover every document:

- t = 0: the local queries against the local keys, causal;
- src < rank: every local query against the *early* chunk of each document's keys (the late
  chunk lies after both query chunks);
- src > rank: the *late* query chunk of each document against all its keys.

The causal ring works on the query *halves*: each document's early chunk, packed after the
previous document's, and its late chunk likewise (dO, Q, O and lse gathered once per call;
outputs and dQ summed per half and put back in the local row order once, at the end). A step
that sees the late chunks then reads one whole tensor and adds into a row range, where the
local order would gather the rows and add by index at every such step. Steps that see both
halves run one kernel call per half in the forward, one call in the local order in the
backward (whose dK / dV would otherwise come as two partials). The early key chunks are never
gathered: a document's early chunk is the first half of its local rows, so the calls take
the block as it is with ``seqused_k`` = the half lengths (the kernels read only those keys,
and give dK / dV = 0 past them). Without a causal mask every step is one full varlen call.

Sliding windows and ALiBi cut each document's band at offsets that scale with its length, so
those rings run the calls :mod:`flashattn.parallel.doc_blocks` plans per document length
(:func:`banded_forward` / :func:`banded_backward`): gathered rows, merged into the running
output by row index.

Backward: the dense and causal rings send each call's dK / dV partial (block-shaped) straight
home, where the owner sums them once (:func:`.home.run_backward_home`); the banded ring's
partials cover gathered rows, so it keeps float32 sums that travel with their block
(:func:`.ring.run_backward`), added by row index.
"""
from __future__ import annotations

import functools
from typing import Callable, NamedTuple, Optional, Tuple

import torch

from flashattn import ops as _ops
from flashattn.api import normalise as _p
from flashattn.api import validation as _v
from flashattn.parallel import checks as _checks
from flashattn.parallel.accumulate import RowSum
from flashattn.parallel.doc_blocks import DocCall, DocPlan, doc_plan
from flashattn.parallel.groups import Group, check_device, resolve
from flashattn.parallel.home import Partials, run_backward_home
from flashattn.parallel.layout import zigzag_doc_lengths
from flashattn.parallel.merge import merge_varlen_into, ready_to_merge
from flashattn.parallel.ring import Ring, RingFunction, run_backward, run_forward

Tensor = torch.Tensor


class VarlenLayout(NamedTuple):
    """The local packed layout (the same on every rank)."""

    cu_local: Tensor      # (n_docs + 1,) int32: each document's 2 local chunks
    max_local: int
    cu_half: Tensor       # (n_docs + 1,) int32: one chunk per document
    max_half: int
    early: Tensor         # (total_local / 2,) int64 local rows of the early chunks
    late: Tensor          # (total_local / 2,) int64 local rows of the late chunks
    used_half: Tensor     # (n_docs,) int32: seqused_k selecting each document's early chunk


@functools.lru_cache(maxsize=64)
def _layout(bounds: Tuple[int, ...], world: int, device: torch.device) -> VarlenLayout:
    """The local layout of global document bounds ``bounds`` (the same on every rank), built
    once per batch shape: a training loop repeats its packing, and this is host work plus
    small copies to the device."""
    local = [n // world for n in zigzag_doc_lengths(bounds, world)]
    starts = [0]
    for n in local:
        starts.append(starts[-1] + n)
    early = [torch.arange(s, s + n // 2) for s, n in zip(starts[:-1], local)]
    late = [torch.arange(s + n // 2, s + n) for s, n in zip(starts[:-1], local)]
    halves = [n // 2 for n in local]
    cu_half = [0]
    for n in halves:
        cu_half.append(cu_half[-1] + n)
    as_device = (lambda xs: (torch.cat(xs) if xs else torch.zeros(0, dtype=torch.int64)
                             ).to(device))
    i32 = (lambda xs: torch.tensor(xs, dtype=torch.int32, device=device))
    return VarlenLayout(i32(starts), max(local, default=0), i32(cu_half),
                        max(halves, default=0), as_device(early), as_device(late), i32(halves))


class _Options(NamedTuple):
    softmax_scale: float
    causal: bool
    softcap: float
    deterministic: bool


def _fwd(q, k, v, cu_q, cu_k, max_q, max_k, causal, opt: _Options, used_k=None):
    out, lse, _ = _ops.varlen_fwd(q, k, v, cu_q, cu_k, used_k, None, None, None, max_q, max_k,
                                  opt.softmax_scale, causal, -1, 0 if causal else -1,
                                  opt.softcap, 0.0, opt.deterministic, False)
    return out, lse


def _bwd(dout, q, k, v, out, lse, cu_q, cu_k, max_q, max_k, causal, opt: _Options,
         used_k=None):
    return _ops.varlen_bwd(dout, q, k, v, out, lse, cu_q, cu_k, used_k, None, None, max_q,
                           max_k, opt.softmax_scale, causal, -1, 0 if causal else -1,
                           opt.softcap, 0.0, opt.deterministic)


def _case(step: int, ring: Ring, causal: bool) -> str:
    """Which rows meet which keys at ``step``: "diagonal", "all", "early_keys", "late_queries"."""
    if not causal:
        return "all"
    if step == 0:
        return "diagonal"
    src = (ring.rank - step) % ring.world
    return "early_keys" if src < ring.rank else "late_queries"


def varlen_forward(q: Tensor, k: Tensor, v: Tensor, lay: VarlenLayout, opt: _Options,
                   ring: Ring) -> Tuple[Tensor, Tensor]:
    """out (total, h, d_v) in q's dtype and lse (h, total) float32 of the local rows."""
    if opt.causal:
        return _causal_forward(q, k, v, lay, opt, ring)
    acc: list = []  # [out, lse] after step 0

    def compute(step: int, k_blk: Tensor, v_blk: Tensor) -> None:
        o_b, lse_b = _fwd(q, k_blk, v_blk, lay.cu_local, lay.cu_local, lay.max_local,
                          lay.max_local, False, opt)
        if step == 0:  # the local block: every row (the running sum as it is: ready_to_merge)
            acc.extend((o_b, lse_b))
            return
        acc[0] = ready_to_merge(acc[0], step + 1 == ring.world)
        merge_varlen_into(acc[0], acc[1], o_b, lse_b)

    run_forward((k.contiguous(), v.contiguous()), ring.world, ring, compute)
    return acc[0].to(q.dtype), acc[1]


class _Halves(NamedTuple):
    """A causal ring's local rows as two packed tensors: each document's early chunk
    (``lay.early``) and its late chunk (``lay.late``), every document's chunk in order, so a
    step that sees one chunk of every document reads a whole tensor, not gathered rows."""

    early: Tensor
    late: Tensor


def _halves(x: Tensor, lay: VarlenLayout, dim: int = 0) -> _Halves:
    """``x``'s rows (along ``dim``) split into the early and late chunks (two gathers, once
    per call of the ring)."""
    return _Halves(x.index_select(dim, lay.early), x.index_select(dim, lay.late))


def _unsplit(early: Tensor, late: Tensor, lay: VarlenLayout, dim: int = 0) -> Tensor:
    """The inverse of :func:`_halves`: the local row order (each document's two chunks)."""
    shape = list(early.shape)
    shape[dim] = early.shape[dim] + late.shape[dim]
    out = torch.empty(shape, dtype=early.dtype, device=early.device)
    out.index_copy_(dim, lay.early, early)
    out.index_copy_(dim, lay.late, late)
    return out


def _causal_forward(q: Tensor, k: Tensor, v: Tensor, lay: VarlenLayout, opt: _Options,
                    ring: Ring) -> Tuple[Tensor, Tensor]:
    """:func:`varlen_forward` under a causal mask, on the query halves (:class:`_Halves`):
    step 0 the early chunks against their own keys (``seqused_k``, causal) and the late
    chunks against both (causal, bottom-right aligned per document); a block from a lower
    rank both halves against its early key chunks; one from a higher rank the late halves
    against all its keys. Each half keeps its running output and lse; the local row order
    comes back once, at the end."""
    qh = _halves(q, lay)
    acc: list = []  # [(out, lse) of the early half, (out, lse) of the late half]

    def half_call(x: Tensor, k_blk: Tensor, v_blk: Tensor, causal: bool, early_keys: bool):
        return _fwd(x, k_blk, v_blk, lay.cu_half, lay.cu_local, lay.max_half, lay.max_local,
                    causal, opt, lay.used_half if early_keys else None)

    def merge(i: int, o_b: Tensor, lse_b: Tensor, last: bool) -> None:
        out = ready_to_merge(acc[i][0], last)
        merge_varlen_into(out, acc[i][1], o_b, lse_b)
        acc[i] = (out, acc[i][1])

    def compute(step: int, k_blk: Tensor, v_blk: Tensor) -> None:
        case = _case(step, ring, True)
        last = step + 1 == ring.world
        if case == "diagonal":
            acc.append(half_call(qh.early, k_blk, v_blk, True, True))
            acc.append(half_call(qh.late, k_blk, v_blk, True, False))
        elif case == "early_keys":
            merge(0, *half_call(qh.early, k_blk, v_blk, False, True), last)
            merge(1, *half_call(qh.late, k_blk, v_blk, False, True), last)
        else:  # late_queries
            merge(1, *half_call(qh.late, k_blk, v_blk, False, False), last)

    run_forward((k.contiguous(), v.contiguous()), ring.world, ring, compute)
    (out_e, lse_e), (out_l, lse_l) = acc
    return (_unsplit(out_e.to(q.dtype), out_l.to(q.dtype), lay),
            _unsplit(lse_e, lse_l, lay, dim=1))


def varlen_backward(dout: Tensor, q: Tensor, k: Tensor, v: Tensor, out: Tensor, lse: Tensor,
                    lay: VarlenLayout, opt: _Options, ring: Ring
                    ) -> Tuple[Tensor, Tensor, Tensor]:
    if opt.causal:
        return _causal_backward(dout, q, k, v, out, lse, lay, opt, ring)
    dq = RowSum(q.shape, q.device, dim=0)

    def grads(rows: Optional[Tensor], k_blk: Tensor, v_blk: Tensor) -> Callable:
        """The gradients of the local query rows ``rows`` (None: every row; else ``lay.early``
        / ``lay.late``, one chunk of every document, gathered) against every key of the block
        in hand, and their ``add`` into dQ and the block's accumulators."""
        pick = (lambda x: x if rows is None else x.index_select(0, rows))
        cu_q, max_q = ((lay.cu_local, lay.max_local) if rows is None
                       else (lay.cu_half, lay.max_half))
        dq_b, dk_b, dv_b = _bwd(pick(dout), pick(q), k_blk, v_blk, pick(out),
                                lse if rows is None else lse[:, rows].contiguous(),
                                cu_q, lay.cu_local, max_q, lay.max_local, False, opt)

        def add_dq() -> None:
            if rows is None:
                dq.add(0, dq_b)
            else:
                dq.index_add(rows, dq_b)
        return Partials(((0, dk_b, dv_b),), add_dq)

    # the local block in two parts (see run_backward_home): early query chunks, then late
    dk, dv = run_backward_home(k, v, ring.world, ring, lambda step, *kv: grads(None, *kv),
                               lambda *kv: grads(lay.early, *kv),
                               lambda *kv: grads(lay.late, *kv), _whole_block(k), row_dim=0)
    return dq.tensor().to(q.dtype), dk, dv


def _whole_block(k: Tensor) -> Callable:
    """``incoming`` of :func:`.home.run_backward_home` for rings whose every step is one call
    over the whole block (its dK / dV block-shaped, zeros past the keys it read)."""
    spans = ((0, k.shape[0]),)
    return lambda step: spans


def _causal_backward(dout: Tensor, q: Tensor, k: Tensor, v: Tensor, out: Tensor, lse: Tensor,
                     lay: VarlenLayout, opt: _Options, ring: Ring
                     ) -> Tuple[Tensor, Tensor, Tensor]:
    """:func:`varlen_backward` under a causal mask. The calls that see one half of every
    document's queries (the local block's two parts, see run_backward_home: the early halves
    against their own keys, then the late halves against all keys, both causal; the late
    halves against a block from a higher rank) run on the query halves (:class:`_Halves`)
    of dO, Q, O and lse, gathered once, and add dQ per half by row range. A block from a
    lower rank meets every local query (against its early key chunks): one call in the local
    order, its dQ in a local-order sum (two half calls would send two dK / dV partials).
    The dQ sums meet once, at the end."""
    dh, qh, oh = _halves(dout, lay), _halves(q, lay), _halves(out, lay)
    lh = _halves(lse, lay, dim=1)
    dq_half = (RowSum(qh.early.shape, q.device, dim=0), RowSum(qh.late.shape, q.device, dim=0))
    dq_local: list = []  # the local-order dQ sum, made by the first early-keys step

    def half_grads(i: int, k_blk: Tensor, v_blk: Tensor, causal: bool, early_keys: bool):
        """Half ``i`` (0 early, 1 late) of every document's local queries against the block
        in hand's keys (``early_keys``: each document's early chunk, by ``seqused_k``, so dK /
        dV come back block-shaped with zeros past it)."""
        return _bwd(dh[i], qh[i], k_blk, v_blk, oh[i], lh[i], lay.cu_half, lay.cu_local,
                    lay.max_half, lay.max_local, causal, opt,
                    lay.used_half if early_keys else None)

    def added(dq_sum: RowSum, dq_b: Tensor, dk_b: Tensor, dv_b: Tensor) -> Partials:
        """One call's dK / dV partials (block-shaped) and the add of its dQ into ``dq_sum``."""
        return Partials(((0, dk_b, dv_b),), lambda: dq_sum.add(0, dq_b))

    def compute(step: int, k_blk: Tensor, v_blk: Tensor) -> Partials:
        if _case(step, ring, True) == "late_queries":
            return added(dq_half[1], *half_grads(1, k_blk, v_blk, False, False))
        if not dq_local:
            dq_local.append(RowSum(q.shape, q.device, dim=0))
        return added(dq_local[0], *_bwd(dout, q, k_blk, v_blk, out, lse, lay.cu_local,
                                        lay.cu_local, lay.max_local, lay.max_local, False,
                                        opt, lay.used_half))

    dk, dv = run_backward_home(
        k, v, ring.world, ring, compute,
        lambda k_own, v_own: added(dq_half[0], *half_grads(0, k_own, v_own, True, True)),
        lambda k_own, v_own: added(dq_half[1], *half_grads(1, k_own, v_own, True, False)),
        _whole_block(k), row_dim=0)
    if not dq_local:  # (no block from a lower rank: rank 0)
        return (_unsplit(dq_half[0].tensor().to(q.dtype), dq_half[1].tensor().to(q.dtype),
                         lay), dk, dv)
    dq = dq_local[0].tensor()
    dq.index_add_(0, lay.early, dq_half[0].tensor())
    dq.index_add_(0, lay.late, dq_half[1].tensor())
    return dq.to(q.dtype), dk, dv


class _Band(NamedTuple):
    """The banded ring's options: ``alibi`` (n_docs, nheads) float32 slopes or None."""

    alibi: Optional[Tensor]


def _doc_fwd(q: Tensor, k_blk: Tensor, v_blk: Tensor, call: DocCall, opt: _Options,
             band: _Band) -> Tuple[Tensor, Tensor]:
    """One :class:`DocCall`: out (n_q, h, d_v) and lse (h, n_q) float32 of its rows."""
    qg, kg, vg = q[call.q_rows], k_blk[call.k_rows], v_blk[call.k_rows]
    if band.alibi is None:
        out, lse, _ = _ops.varlen_fwd(qg, kg, vg, call.cu_q, call.cu_k, None, None, None, None,
                                      call.max_q, call.max_k, opt.softmax_scale, call.causal,
                                      call.window_left, call.window_right, opt.softcap, 0.0,
                                      opt.deterministic, False)
        return out, lse
    # ALiBi: the dense kernel (it takes the shift) over the call's equal-shaped documents
    assert call.equal and call.alibi_shift is not None
    n, h = call.docs.numel(), q.shape[1]
    out, lse, _ = _ops.fwd(qg.view(n, call.max_q, h, -1), kg.view(n, call.max_k, *kg.shape[1:]),
                           vg.view(n, call.max_k, *vg.shape[1:]), band.alibi[call.docs], None,
                           opt.softmax_scale, call.causal, call.window_left, call.window_right,
                           opt.softcap, 0.0, opt.deterministic, False, call.alibi_shift)
    return out.reshape(-1, h, out.shape[-1]), lse.transpose(0, 1).reshape(h, -1)


def _doc_bwd(dout: Tensor, q: Tensor, k_blk: Tensor, v_blk: Tensor, out: Tensor, lse: Tensor,
             call: DocCall, opt: _Options, band: _Band) -> Tuple[Tensor, Tensor, Tensor]:
    """(dq (n_q, h, d), dk / dv (n_k, h_k, d / d_v)) of one :class:`DocCall`'s rows."""
    pick = (lambda x: x[call.q_rows])
    qg, kg, vg = q[call.q_rows], k_blk[call.k_rows], v_blk[call.k_rows]
    lse_g = lse[:, call.q_rows]
    if band.alibi is None:
        return _ops.varlen_bwd(pick(dout), qg, kg, vg, pick(out), lse_g.contiguous(), call.cu_q,
                               call.cu_k, None, None, None, call.max_q, call.max_k,
                               opt.softmax_scale, call.causal, call.window_left,
                               call.window_right, opt.softcap, 0.0, opt.deterministic)
    n, h = call.docs.numel(), q.shape[1]
    rows = (lambda x: x.view(n, call.max_q, h, -1))
    keys = (lambda x: x.view(n, call.max_k, *x.shape[1:]))
    dq, dk, dv = _ops.bwd(rows(pick(dout)), rows(qg), keys(kg), keys(vg), rows(pick(out)),
                          lse_g.view(h, n, call.max_q).transpose(0, 1).contiguous(),
                          band.alibi[call.docs], None, opt.softmax_scale, call.causal,
                          call.window_left, call.window_right, opt.softcap, 0.0,
                          opt.deterministic, call.alibi_shift)
    return dq.reshape(qg.shape), dk.reshape(kg.shape), dv.reshape(vg.shape)


def banded_forward(q: Tensor, k: Tensor, v: Tensor, plan: DocPlan, opt: _Options, band: _Band,
                   ring: Ring) -> Tuple[Tensor, Tensor]:
    """The varlen ring under windows / ALiBi: out (total, h, d_v) in q's dtype and lse
    (h, total) float32 of the local rows. The running output is float32, each call's rows
    merged in by index (a call's rows are distinct: :mod:`.doc_blocks`)."""
    out = torch.zeros(*q.shape[:2], v.shape[-1], dtype=torch.float32, device=q.device)
    lse = torch.full((q.shape[1], q.shape[0]), float("-inf"), dtype=torch.float32,
                     device=q.device)

    def compute(step: int, k_blk: Tensor, v_blk: Tensor) -> None:
        for call in plan.steps[step]:
            o_b, lse_b = _doc_fwd(q, k_blk, v_blk, call, opt, band)
            rows, rows_lse = out[call.q_rows], lse[:, call.q_rows]
            merge_varlen_into(rows, rows_lse, o_b, lse_b)
            out.index_copy_(0, call.q_rows, rows)
            lse.index_copy_(1, call.q_rows, rows_lse)

    run_forward((k.contiguous(), v.contiguous()), len(plan.steps), ring, compute)
    return out.to(q.dtype), lse


def banded_backward(dout: Tensor, q: Tensor, k: Tensor, v: Tensor, out: Tensor, lse: Tensor,
                    plan: DocPlan, opt: _Options, band: _Band, ring: Ring
                    ) -> Tuple[Tensor, Tensor, Tensor]:
    """(dq, dk, dv) of the local rows, typed like q, k, v; the schedule of
    :func:`~flashattn.parallel.ring.run_backward`, each call's gradients added by row index."""
    dq = RowSum(q.shape, q.device, dim=0)

    def grads(calls: Tuple[DocCall, ...], k_blk: Tensor, v_blk: Tensor) -> Callable:
        done = [(c, _doc_bwd(dout, q, k_blk, v_blk, out, lse, c, opt, band)) for c in calls]

        def add(dk_acc: RowSum, dv_acc: RowSum) -> None:
            for c, (dq_b, dk_b, dv_b) in done:
                dq.index_add(c.q_rows, dq_b)
                dk_acc.index_add(c.k_rows, dk_b)
                dv_acc.index_add(c.k_rows, dv_b)
        return add

    dk, dv = run_backward(k, v, len(plan.steps), ring,
                          lambda step, *kv: grads(plan.steps[step], *kv),
                          lambda *kv: grads(plan.own_first, *kv),
                          lambda *kv: grads(plan.own_last, *kv), row_dim=0)
    return dq.tensor().to(q.dtype), dk, dv


def ring_flash_attn_varlen_func(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    cu_seqlens: Tensor,
    max_seqlen: int,
    *,
    group: Group = None,
    causal: bool = False,
    window_size: Tuple[int, int] = (-1, -1),
    softcap: float = 0.0,
    alibi_slopes: Optional[Tensor] = None,
    softmax_scale: Optional[float] = None,
    deterministic: bool = False,
    return_attn_probs: bool = False,
):
    """Ring attention of packed documents, each zigzag-split over ``group`` (fwd and bwd).

    Arguments:
        q: (total / world, nheads, headdim): this rank's rows, as
            :func:`zigzag_varlen_shard` lays them out (per document: its chunk ``rank``, then
            its chunk ``2 * world - 1 - rank``).
        k, v: (total / world, nheads_k, headdim / headdim_v), laid out like q.
        cu_seqlens: (n_docs + 1,) int32 *global* cumulative document lengths, the same on
            every rank; every document's length divisible by ``2 * world``.
        max_seqlen: the longest global document (validated against cu_seqlens).
        causal, window_size, softcap, softmax_scale, deterministic: flash-attn 2's meaning
            per document (windows over each document's global positions).
        alibi_slopes: (nheads,) or (n_docs, nheads) float32: ALiBi over each document's
            global positions. Windows and ALiBi run one kernel call per distinct document
            length and mask (:mod:`flashattn.parallel.doc_blocks`); with ALiBi through the
            portable kernels (as on one GPU: the Hopper kernels take no ALiBi).
        return_attn_probs: also return the local lse (nheads, total / world).

    Returns:
        out (total / world, nheads, headdim_v) in q's dtype, or ``(out, lse, None)``.
    """
    for x, name in ((q, "q"), (k, "k"), (v, "v")):
        _v.check_tensor(x, name, 3, "(total_tokens, nheads, headdim)")
    _v.check_qkv(q.unsqueeze(0), k.unsqueeze(0), v.unsqueeze(0), ("q", "k", "v"))
    ring = Ring(*resolve(group))
    check_device(ring.group, q, "q")
    scale, causal, window_left, window_right, softcap, deterministic = _v.check_options(
        softmax_scale, causal, window_size, softcap, deterministic)
    return_attn_probs = _v.check_bool(return_attn_probs, "return_attn_probs")
    bounds = _checks.global_cu_seqlens(cu_seqlens, q.shape[0], ring.world, q.device,
                                       max_seqlen)
    _v.check_alibi_slopes(alibi_slopes, len(bounds) - 1, q.shape[1], q.device)
    _checks.same_on_every_rank(ring.group, ring.world, q.device, [
        ("q.shape[0] (local tokens)", q.shape[0]), ("q.shape[1]", q.shape[1]),
        ("q.shape[2]", q.shape[2]), ("k.shape[1]", k.shape[1]), ("v.shape[2]", v.shape[2]),
        ("q.dtype", _checks.dtype_code(q.dtype)), ("causal", int(causal)),
        ("window_size[0]", window_left), ("window_size[1]", window_right),
        ("softcap", _checks.float_bits(softcap)),
        ("softmax_scale", _checks.float_bits(-1.0 if scale is None else scale)),
        ("alibi_slopes given", int(alibi_slopes is not None)),
        ("deterministic", int(deterministic)),
        ("len(cu_seqlens)", len(bounds)), ("cu_seqlens[-1]", bounds[-1])],
        "ring_flash_attn_varlen_func")
    opt = _Options(_p.softmax_scale_or_default(scale, q.shape[-1]), causal, softcap,
                   deterministic)
    # flash-attn's varlen rule: a side reaching max_seqlen (the longest document) is unbounded
    wl, wr = _p.window(window_left, window_right, causal, max_seqlen)
    if wl < 0 and (wr < 0 or causal) and alibi_slopes is None:
        lay = _layout(tuple(bounds), ring.world, q.device)
        out, lse = RingFunction.apply(q, k, v, varlen_forward, varlen_backward,
                                      (lay, opt, ring))
    else:
        plan = doc_plan(tuple(bounds), ring.rank, ring.world, None if wl < 0 else wl,
                        None if wr < 0 else wr, alibi_slopes is not None, q.device)
        band = _Band(_p.alibi_bh(alibi_slopes, len(bounds) - 1, q.shape[1]))
        out, lse = RingFunction.apply(q, k, v, banded_forward, banded_backward,
                                      (plan, opt, band, ring))
    return (out, lse, None) if return_attn_probs else out


__all__ = ["VarlenLayout", "banded_backward", "banded_forward", "ring_flash_attn_varlen_func",
           "varlen_backward", "varlen_forward"]
