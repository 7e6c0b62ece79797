"""Ulysses (DeepSpeed-Ulysses) attention: all-to-all from sequence shards to head shards, the
one-GPU attention over the whole sequence for ``nheads / world`` heads, and all-to-all back.

Every feature of the one-GPU call carries over unchanged (each rank sees whole sequences):
causal, windows, softcap, ALiBi (each rank takes its heads' slopes), dropout, GQA.
Communication is all-to-alls of q, k, v forward (and of out), the same backward; it does not
grow with the sequence's square, so it scales well inside a node.

GQA / MQA: the KV heads are split like the query heads when ``nheads_k % world == 0``. With
fewer KV heads than ranks (``world % nheads_k == 0``) each rank needs one KV head, so the KV
heads are replicated ``world / nheads_k`` times before the all-to-all (their gradients sum
back through the replication): more bytes sent, never more than q's.
"""
from __future__ import annotations

from typing import Callable, Optional, Tuple

import torch
import torch.distributed as dist

from flashattn.api import validation as _v
from flashattn.api.dense import flash_attn_func
from flashattn.api.varlen import flash_attn_varlen_func
from flashattn.parallel import checks as _checks
from flashattn.parallel import comm as _comm
from flashattn.parallel.groups import Group, check_device, resolve

Tensor = torch.Tensor


def _seq_to_heads(x: Tensor, group: Optional[dist.ProcessGroup], world: int) -> Tensor:
    """(b, s_local, H, d) sequence shard -> (b, s_local * world, H / world, d) head shard."""
    b, s, h, d = x.shape
    send = x.reshape(b, s, world, h // world, d).permute(2, 0, 1, 3, 4).contiguous()
    recv = _comm.all_to_all(send, group, world)  # slice i: rank i's sequence chunk, my heads
    return recv.permute(1, 0, 2, 3, 4).reshape(b, world * s, h // world, d)


def _heads_to_seq(y: Tensor, group: Optional[dist.ProcessGroup], world: int) -> Tensor:
    """(b, S, H / world, d) head shard -> (b, S / world, H, d) sequence shard."""
    b, s_all, hw, d = y.shape
    s = s_all // world
    send = y.reshape(b, world, s, hw, d).permute(1, 0, 2, 3, 4).contiguous()
    recv = _comm.all_to_all(send, group, world)  # slice i: my sequence chunk, rank i's heads
    return recv.permute(1, 2, 0, 3, 4).reshape(b, s, world * hw, d)


class _SeqToHeads(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, group, world):
        ctx.args = (group, world)
        return _seq_to_heads(x, group, world)

    @staticmethod
    def backward(ctx, g):
        return _heads_to_seq(g.contiguous(), *ctx.args), None, None


class _HeadsToSeq(torch.autograd.Function):
    @staticmethod
    def forward(ctx, y, group, world):
        ctx.args = (group, world)
        return _heads_to_seq(y, group, world)

    @staticmethod
    def backward(ctx, g):
        return _seq_to_heads(g.contiguous(), *ctx.args), None, None


def seq_to_heads(x: Tensor, group: Optional[dist.ProcessGroup], world: int) -> Tensor:
    """Differentiable all-to-all: (b, s_local, H, d) -> (b, s_local * world, H / world, d)."""
    return x if world == 1 else _SeqToHeads.apply(x, group, world)


def heads_to_seq(y: Tensor, group: Optional[dist.ProcessGroup], world: int) -> Tensor:
    """Differentiable all-to-all: (b, S, H / world, d) -> (b, S / world, H, d)."""
    return y if world == 1 else _HeadsToSeq.apply(y, group, world)


def lse_heads_to_seq(lse: Tensor, group: Optional[dist.ProcessGroup], world: int) -> Tensor:
    """lse (b, H / world, S) of the head shard -> (b, H, S / world) of the sequence shard."""
    if world == 1:
        return lse
    b, hw, s_all = lse.shape
    s = s_all // world
    send = lse.reshape(b, hw, world, s).permute(2, 0, 1, 3).contiguous()
    recv = _comm.all_to_all(send, group, world)
    return recv.permute(1, 0, 2, 3).reshape(b, world * hw, s)


def kv_heads_for_ranks(k: Tensor, nheads: int, world: int, name: str) -> Tensor:
    """k / v with a head count the all-to-all can split: as given when nheads_k % world == 0,
    else each rank's one KV head replicated in rank order (world % nheads_k == 0)."""
    hk = k.shape[2]
    if hk % world == 0:
        return k
    if world % hk:
        raise ValueError(f"{name}: nheads_k = {hk} neither divides nor is divisible by the "
                         f"group size {world}; Ulysses splits heads across ranks")
    group_size = nheads // hk
    index = torch.tensor([(r * nheads // world) // group_size for r in range(world)],
                         device=k.device)
    return k.index_select(2, index)


def check_heads(q: Tensor, k: Tensor, world: int) -> None:
    """ValueError when the heads cannot be split over ``world`` ranks."""
    h, hk = q.shape[-2], k.shape[-2]
    if h % world:
        raise ValueError(f"q: nheads = {h} is not divisible by the group size {world}; Ulysses "
                         "gives each rank nheads / world query heads")
    if hk % world and world % hk:
        raise ValueError(f"k: nheads_k = {hk} neither divides nor is divisible by the group "
                         f"size {world}")


def alibi_for_rank(alibi_slopes: Optional[Tensor], rank: int, world: int) -> Optional[Tensor]:
    """The slopes of the heads rank ``rank`` holds after :func:`seq_to_heads` ((h,) or (b, h)
    in, the same with h / world columns out), or None."""
    if alibi_slopes is None:
        return None
    h = alibi_slopes.shape[-1]
    return alibi_slopes[..., rank * h // world:(rank + 1) * h // world]


def head_parallel(q: Tensor, k: Tensor, v: Tensor, group: Optional[dist.ProcessGroup],
                  world: int, attend: Callable[[Tensor, Tensor, Tensor], Tuple[Tensor, Tensor]]
                  ) -> Tuple[Tensor, Tensor]:
    """Sequence shards (b, s_local, heads, d) -> head shards of the whole sequence ->
    ``attend(q, k, v) -> (out, lse (b, heads / world, S))`` -> sequence shards again:
    (out (b, s_local, nheads, d_v), lse (b, nheads, s_local)). Differentiable in q, k, v."""
    h = q.shape[2]
    qh = seq_to_heads(q, group, world)
    kh = seq_to_heads(kv_heads_for_ranks(k, h, world, "k"), group, world)
    vh = seq_to_heads(kv_heads_for_ranks(v, h, world, "v"), group, world)
    out, lse = attend(qh, kh, vh)
    return heads_to_seq(out, group, world), lse_heads_to_seq(lse, group, world)


def _prepare(q: Tensor, k: Tensor, group: Group, alibi_slopes: Optional[Tensor], batch: int,
             window_size, return_attn_probs):
    """The checks both Ulysses calls share: (process group, rank, world, window_size,
    return_attn_probs). ``batch``: the dense batch or the number of packed documents (a
    (batch, nheads) ALiBi table's rows)."""
    pg, rank, world = resolve(group)
    check_device(pg, q, "q")
    check_heads(q, k, world)
    _v.check_alibi_slopes(alibi_slopes, batch, q.shape[-2], q.device)
    return (pg, rank, world, _v.check_window_size(window_size),
            _v.check_bool(return_attn_probs, "return_attn_probs"))


def _signature(q: Tensor, k: Tensor, v: Tensor, causal, window_size, dropout_p, softcap,
               alibi_slopes, deterministic):
    return [("q.shape[0]", q.shape[0]), ("q.shape[1] (local sequence length)", q.shape[-3]),
            ("q.shape[-2]", q.shape[-2]), ("q.shape[-1]", q.shape[-1]),
            ("k.shape[-2]", k.shape[-2]), ("v.shape[-1]", v.shape[-1]),
            ("q.dtype", _checks.dtype_code(q.dtype)), ("causal", int(bool(causal))),
            ("window_size[0]", int(window_size[0])), ("window_size[1]", int(window_size[1])),
            ("dropout_p", _checks.float_bits(dropout_p)),
            ("softcap", _checks.float_bits(softcap)),
            ("alibi_slopes given", int(alibi_slopes is not None)),
            ("deterministic", int(bool(deterministic)))]


def ulysses_flash_attn_func(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    *,
    group: Group = None,
    dropout_p: float = 0.0,
    softmax_scale: Optional[float] = None,
    causal: bool = False,
    window_size: Tuple[int, int] = (-1, -1),
    softcap: float = 0.0,
    alibi_slopes: Optional[Tensor] = None,
    deterministic: bool = False,
    return_attn_probs: bool = False,
):
    """Attention of one sequence sharded contiguously over ``group`` (Ulysses, fwd and bwd).

    Arguments:
        q: (batch, s_local, nheads, headdim): rank r holds positions
            ``[r * s_local, (r + 1) * s_local)`` (:func:`contiguous_shard`); nheads divisible
            by the group size.
        k, v: (batch, s_local, nheads_k, headdim / headdim_v); nheads_k divides or is divided
            by the group size (fewer KV heads than ranks are replicated, see the module).
        group: ProcessGroup or 1-D DeviceMesh (default: the default group).
        dropout_p, softmax_scale, causal, window_size, softcap, alibi_slopes, deterministic:
            flash-attn 2's meaning on the global sequence.
        return_attn_probs: also return the local lse (batch, nheads, s_local).

    Returns:
        out (batch, s_local, nheads, headdim_v), or ``(out, lse, None)``.
    """
    _v.check_qkv(q, k, v, ("q", "k", "v"))
    pg, rank, world, window_size, return_attn_probs = _prepare(
        q, k, group, alibi_slopes, q.shape[0], window_size, return_attn_probs)
    _checks.same_on_every_rank(pg, world, q.device, _signature(
        q, k, v, causal, window_size, dropout_p, softcap, alibi_slopes, deterministic),
        "ulysses_flash_attn_func")
    alibi = alibi_for_rank(alibi_slopes, rank, world)
    out, lse = head_parallel(q, k, v, pg, world, lambda qh, kh, vh: flash_attn_func(
        qh, kh, vh, dropout_p, softmax_scale, causal, window_size, softcap, alibi,
        deterministic, return_attn_probs=True)[:2])
    return (out, lse, None) if return_attn_probs else out


def ulysses_flash_attn_varlen_func(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    cu_seqlens: Tensor,
    max_seqlen: int,
    *,
    group: Group = None,
    dropout_p: float = 0.0,
    softmax_scale: Optional[float] = None,
    causal: bool = False,
    window_size: Tuple[int, int] = (-1, -1),
    softcap: float = 0.0,
    alibi_slopes: Optional[Tensor] = None,
    deterministic: bool = False,
    return_attn_probs: bool = False,
):
    """Packed documents sharded contiguously over ``group`` (Ulysses, fwd and bwd).

    Arguments:
        q: (total / world, nheads, headdim): rank r holds packed rows
            ``[r * total / world, (r + 1) * total / world)`` of the global packed batch
            (:func:`contiguous_shard` with ``seq_dim=0``); documents may cross rank borders.
        k, v: (total / world, nheads_k, headdim / headdim_v).
        cu_seqlens: (n_docs + 1,) int32, the *global* cumulative document lengths (the same on
            every rank); ``cu_seqlens[-1] == total``.
        max_seqlen: the longest document.
        The rest: as :func:`ulysses_flash_attn_func` (and flash_attn_varlen_func).

    Returns:
        out (total / world, nheads, headdim_v), or ``(out, lse (nheads, total / world), None)``.
    """
    for x, name in ((q, "q"), (k, "k"), (v, "v")):
        _v.check_tensor(x, name, 3, "(total_tokens, nheads, headdim)")
    n_docs = cu_seqlens.shape[0] - 1 if isinstance(cu_seqlens, Tensor) else 0
    pg, rank, world, window_size, return_attn_probs = _prepare(
        q, k, group, alibi_slopes, n_docs, window_size, return_attn_probs)
    _checks.global_cu_seqlens(cu_seqlens, q.shape[0], world, q.device, max_seqlen)
    _checks.same_on_every_rank(pg, world, q.device, _signature(
        q.unsqueeze(0), k.unsqueeze(0), v, causal, window_size, dropout_p, softcap,
        alibi_slopes, deterministic), "ulysses_flash_attn_varlen_func")
    alibi = alibi_for_rank(alibi_slopes, rank, world)

    def attend(qh: Tensor, kh: Tensor, vh: Tensor) -> Tuple[Tensor, Tensor]:
        out, lse, _ = flash_attn_varlen_func(
            qh[0], kh[0], vh[0], cu_seqlens, cu_seqlens, max_seqlen, max_seqlen, dropout_p,
            softmax_scale, causal, window_size, softcap, alibi, deterministic,
            return_attn_probs=True)
        return out.unsqueeze(0), lse.unsqueeze(0)

    out, lse = head_parallel(q.unsqueeze(0), k.unsqueeze(0), v.unsqueeze(0), pg, world, attend)
    return (out[0], lse[0], None) if return_attn_probs else out[0]


__all__ = ["check_heads", "head_parallel", "heads_to_seq", "kv_heads_for_ranks",
           "lse_heads_to_seq", "seq_to_heads", "ulysses_flash_attn_func",
           "ulysses_flash_attn_varlen_func"]
