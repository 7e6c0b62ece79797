"""Device properties the host code asks on every call, cached per device index, and whether
the current stream is capturing a CUDA graph.

``torch.cuda.get_device_properties`` / ``get_device_capability`` cost microseconds per call on
the H100 host (measured ~10 us), several times per attention call without the cache.
"""
from __future__ import annotations

import functools

import torch


@functools.lru_cache(maxsize=None)
def _sm_count(index: int) -> int:
    return torch.cuda.get_device_properties(index).multi_processor_count


def sm_count(device: torch.device) -> int:
    """Multiprocessors of ``device`` (a small fixed number, 16, under the interpreter / on
    CPU: the split heuristics then still produce several splits to test)."""
    if device.type != "cuda":
        return 16
    return _sm_count(device.index if device.index is not None else torch.cuda.current_device())


@functools.lru_cache(maxsize=None)
def capability(index: int) -> tuple:
    """(major, minor) compute capability of CUDA device ``index``."""
    return tuple(torch.cuda.get_device_capability(index))


def capability_major(index: int) -> int:
    """Major compute capability of CUDA device ``index`` (9 on Hopper)."""
    return capability(index)[0]


def device_index(device: torch.device) -> int:
    """The CUDA index of ``device`` (the current device when it has none)."""
    return device.index if device.index is not None else torch.cuda.current_device()


def capturing() -> bool:
    """Whether a CUDA graph is being captured on the current stream (False without CUDA)."""
    return torch.cuda.is_available() and torch.cuda.is_current_stream_capturing()


__all__ = ["capability", "capability_major", "capturing", "device_index", "sm_count"]
