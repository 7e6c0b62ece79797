"""Device buffers reused from call to call on one CUDA stream (host time).

A decode step allocated three device buffers per call: its output, a float32 workspace for
the split-KV partials, and the global scratch in which Triton's launcher lets a kernel build
its TMA descriptors. On the H100 host each ``torch.empty`` costs 4-6 µs of Python, a fifth of
a b = 1 decode step's host time (``benchmarks/probes/host_peel.py``). Buffers whose contents
live only for the duration of the work a call enqueues (the scratch; the workspace when the
caller does not want the LSE, which lives there) can be reused instead.

:func:`stream_buffer` hands out one buffer per (kind, device, current stream, host thread):

- the stream orders the work: the kernels of the previous call that used the buffer finish
  before the next call's kernels start, so reusing the memory is safe; a different stream
  gets its own buffer;
- a different host thread gets its own buffer too: two threads enqueueing onto one stream
  interleave their launches (a call's decode and combine launches are two), so they must not
  share partials;
- while a CUDA graph is being captured, every request gets a fresh ``torch.empty`` (the
  graph's private pool): the graph owns that memory, and its replays may run on another
  stream, concurrently with eager calls.

The cache is dropped whole when it holds MAX_BUFFERS entries (threads or streams that come and
go); dropping is safe because torch's allocator reuses a freed block only in the order of the
stream it was allocated on.
"""
from __future__ import annotations

import threading
from typing import Dict, Optional, Tuple

import torch

from flashattn.runtime import compat
from flashattn.runtime.device import capturing

MAX_BUFFERS = 64
_MIN_BYTES = 4096  # (small requests grow to this at once: no regrowth for small variations)

_BUFFERS: Dict[Tuple[str, int, int, int], torch.Tensor] = {}


def stream_buffer(kind: str, nbytes: int, device: int,
                  stream: Optional[int] = None) -> torch.Tensor:
    """A uint8 CUDA tensor of at least ``nbytes`` bytes on device index ``device``, the same
    memory for every request of this ``kind`` from this host thread on that device's current
    stream (see the module docstring for when that is safe), a fresh one during graph capture.
    Its contents are undefined; the caller must enqueue all use of it on that stream
    (``stream``: its raw handle when the caller has it, else the device's current stream)."""
    if capturing():
        return torch.empty(nbytes, dtype=torch.uint8, device=torch.device("cuda", device))
    if stream is None:
        stream = compat.current_stream(device)
    key = (kind, device, stream, threading.get_ident())
    buf = _BUFFERS.get(key)
    if buf is None or buf.numel() < nbytes:
        if len(_BUFFERS) >= MAX_BUFFERS:
            _BUFFERS.clear()
        buf = torch.empty(max(nbytes, _MIN_BYTES), dtype=torch.uint8,
                          device=torch.device("cuda", device))
        _BUFFERS[key] = buf
    return buf


def clear() -> None:
    """Drop every kept buffer (tests; memory)."""
    _BUFFERS.clear()


__all__ = ["MAX_BUFFERS", "clear", "stream_buffer"]
