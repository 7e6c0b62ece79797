"""The checked mode: ``flashattn.checks()``."""
from __future__ import annotations

import contextlib
from typing import Iterator

from flashattn.runtime import env


@contextlib.contextmanager
def checks(enabled: bool = True) -> Iterator[None]:
    """Check the values of device metadata inside the ``with`` block (or not, with False).

    Metadata on the CPU is always checked (reading it is free). Metadata on a GPU
    (``cu_seqlens_q`` / ``cu_seqlens_k`` / ``seqused_k`` / ``max_seqlen_*`` of the varlen
    functions; ``cache_seqlens``, ``cache_batch_idx``, ``cache_leftpad``, ``block_table`` of
    ``flash_attn_with_kvcache``) is read on the host only in this mode, at the cost of a device
    synchronisation per call, and never while a CUDA graph is captured or torch.compile
    traces (as flash-attn, the kernels trust it otherwise). A bad value raises ValueError
    naming the argument. ``FLASHATTN_CHECKS=1`` turns the mode on for the whole process.
    """
    if not isinstance(enabled, bool):
        raise TypeError(f"checks: enabled must be a bool, got {enabled!r}")
    with env.override(checks=enabled):
        yield


__all__ = ["checks"]
