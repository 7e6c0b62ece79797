"""The process group of a context-parallel call: a ``torch.distributed`` ProcessGroup or a
1-D DeviceMesh, its rank and size, and the device its backend can carry."""
from __future__ import annotations

from typing import Any, NamedTuple, Optional, Tuple

import torch
import torch.distributed as dist

Group = Any  # a ProcessGroup, a 1-D DeviceMesh, or None (the default group)


class Ring(NamedTuple):
    """The group a ring runs over: process group, this rank, world size."""

    group: Optional[dist.ProcessGroup]
    rank: int
    world: int


def resolve(group: Group, name: str = "group") -> Tuple[Optional[dist.ProcessGroup], int, int]:
    """(process group, this process's rank in it, its size). ``group`` may be a ProcessGroup,
    a 1-D DeviceMesh or None (the default group). ValueError when torch.distributed is not
    initialised or a mesh has more than one dimension."""
    if not dist.is_available() or not dist.is_initialized():
        raise ValueError(f"{name}: torch.distributed is not initialised; call "
                         "torch.distributed.init_process_group first")
    mesh_type = _device_mesh_type()
    if mesh_type is not None and isinstance(group, mesh_type):
        if group.ndim != 1:
            raise ValueError(f"{name}: a DeviceMesh of {group.ndim} dimensions; pass a 1-D mesh "
                             "(mesh['ring']) or use usp_flash_attn_func for a 2-D one")
        group = group.get_group()
    if group is not None and not isinstance(group, dist.ProcessGroup):
        raise TypeError(f"{name}: expected a torch.distributed ProcessGroup, a 1-D DeviceMesh "
                        f"or None, got {type(group).__name__}")
    return group, dist.get_rank(group), dist.get_world_size(group)


def _device_mesh_type() -> Optional[type]:
    try:
        from torch.distributed.device_mesh import DeviceMesh
    except ImportError:  # older torch builds without the mesh
        return None
    return DeviceMesh


def check_device(group: Optional[dist.ProcessGroup], x: torch.Tensor, name: str) -> None:
    """ValueError when the group's backend cannot carry tensors on ``x``'s device (NCCL needs
    CUDA tensors; gloo is used here for CPU tensors only)."""
    backend = str(dist.get_backend(group)).lower()
    if "nccl" in backend and x.device.type != "cuda":
        raise ValueError(f"{name}: the group's backend is {backend!r}, which carries CUDA "
                         f"tensors only, but {name} is on {x.device}; move the tensors to the "
                         "GPU or use a gloo group")
    if backend == "gloo" and x.device.type == "cuda":
        raise ValueError(f"{name}: the group's backend is 'gloo' but {name} is on {x.device}; "
                         "use an NCCL group for CUDA tensors")


def global_rank(group: Optional[dist.ProcessGroup], rank: int) -> int:
    """The default-group rank of ``rank`` in ``group`` (P2P calls address global ranks)."""
    return rank if group is None else dist.get_global_rank(group, rank)


__all__ = ["Group", "Ring", "check_device", "global_rank", "resolve"]
