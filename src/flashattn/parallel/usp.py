"""Ulysses and ring at once (USP): a 2-D DeviceMesh with dimensions ("ulysses", "ring").

Layout: the sequence is zigzag-split over the ring dimension (ring rank j holds chunks j and
``2 R - 1 - j`` of ``2 R``), and each ring shard is split contiguously over the Ulysses
dimension (:func:`usp_shard`). A call all-to-alls inside each Ulysses group (sequence shards
-> head shards: the ring shard whole, for ``nheads / U`` heads), runs the zigzag ring across
the ring group, and all-to-alls back. Put the Ulysses dimension inside a node (its
all-to-alls are the heavier, latency-bound traffic) and the ring across nodes.
"""
from __future__ import annotations

from typing import Any, Optional, Tuple

import torch

from flashattn.api import validation as _v
from flashattn.parallel import checks as _checks
from flashattn.parallel.groups import check_device
from flashattn.parallel.layout import contiguous_shard, contiguous_unshard, zigzag_shard, \
    zigzag_unshard
from flashattn.parallel.ring import attend, normalise, plan_for
from flashattn.parallel.ulysses import alibi_for_rank, check_heads, head_parallel

Tensor = torch.Tensor
DIMS = ("ulysses", "ring")


def _groups(mesh: Any):
    """(ulysses group, its size, ulysses rank, ring sub-mesh) of a ("ulysses", "ring") mesh."""
    names = getattr(mesh, "mesh_dim_names", None)
    if names is None or set(names) != set(DIMS) or getattr(mesh, "ndim", 0) != 2:
        raise ValueError(f"mesh: expected a 2-D DeviceMesh with mesh_dim_names {DIMS}, got "
                         f"{names!r}")
    ulysses = mesh["ulysses"]
    return ulysses.get_group(), ulysses.size(), ulysses.get_local_rank(), mesh["ring"]


def usp_shard(x: Tensor, mesh: Any, seq_dim: int = 1) -> Tensor:
    """This rank's USP shard of the full ``x``: the zigzag shard of its ring coordinate, then
    the contiguous chunk of its Ulysses coordinate."""
    _, _, _, ring = _groups(mesh)
    return contiguous_shard(zigzag_shard(x, ring, seq_dim), mesh["ulysses"], seq_dim)


def usp_unshard(x: Tensor, mesh: Any, seq_dim: int = 1) -> Tensor:
    """The full tensor from every rank's USP shard (all-gathers; not differentiable)."""
    _, _, _, ring = _groups(mesh)
    return zigzag_unshard(contiguous_unshard(x, mesh["ulysses"], seq_dim), ring, seq_dim)


def usp_flash_attn_func(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    *,
    mesh: Any,
    causal: bool = False,
    window_size: Tuple[int, int] = (-1, -1),
    softcap: float = 0.0,
    alibi_slopes: Optional[Tensor] = None,
    softmax_scale: Optional[float] = None,
    deterministic: bool = False,
    return_attn_probs: bool = False,
):
    """Attention of one sequence over a 2-D ("ulysses", "ring") DeviceMesh (fwd and bwd).

    Arguments:
        q, k, v: (batch, s_local, nheads / nheads_k, headdim) shards as :func:`usp_shard`
            lays them out; nheads divisible by the Ulysses size, nheads_k dividing or divided
            by it.
        mesh: ``init_device_mesh(device, (U, R), mesh_dim_names=("ulysses", "ring"))`` (or
            the names in the other order).
        causal, window_size, softcap, alibi_slopes, softmax_scale, deterministic: as
            :func:`ring_flash_attn_func`, on the global sequence (each Ulysses rank's ring
            takes the slopes of the heads it holds).
        return_attn_probs: also return the local lse (batch, nheads, s_local).

    Returns:
        out (batch, s_local, nheads, headdim_v), or ``(out, lse, None)``.
    """
    u_group, u_world, u_rank, ring_mesh = _groups(mesh)
    _v.check_qkv(q, k, v, ("q", "k", "v"))
    check_device(u_group, q, "q")
    check_heads(q, k, u_world)
    _v.check_alibi_slopes(alibi_slopes, q.shape[0], q.shape[2], q.device)
    return_attn_probs = _v.check_bool(return_attn_probs, "return_attn_probs")
    _checks.same_on_every_rank(u_group, u_world, q.device, [
        ("q.shape[1] (local sequence length)", q.shape[1]), ("q.shape[2]", q.shape[2]),
        ("alibi_slopes given", int(alibi_slopes is not None))], "usp_flash_attn_func")
    alibi = alibi_for_rank(alibi_slopes, u_rank, u_world)

    def ring_attention(qh: Tensor, kh: Tensor, vh: Tensor) -> Tuple[Tensor, Tensor]:
        ring, opt = normalise(qh, kh, vh, ring_mesh, causal, window_size, softcap, alibi,
                              softmax_scale, deterministic, "zigzag", "usp_flash_attn_func")
        plan = plan_for("zigzag", ring.rank, ring.world, qh.shape[1], opt)
        return attend(qh, kh, vh, plan, opt, ring)

    out, lse = head_parallel(q, k, v, u_group, u_world, ring_attention)
    return (out, lse, None) if return_attn_probs else out


__all__ = ["DIMS", "usp_flash_attn_func", "usp_shard", "usp_unshard"]
