"""The per-stream workspace of a recorded call: named regions of one reused buffer
(``runtime.buffers``), and the setup the recorded FP8 calls share."""
from __future__ import annotations

import math
from typing import Dict, Optional, Tuple

import torch


class Workspace:
    """The layout of a recorded call's per-stream workspace (``runtime.buffers``): named
    regions, each laid out as its meta tensor (dtype, shape, strides; a strided view must
    cover all of its storage) at a 256-byte-aligned offset."""

    def __init__(self, regions: "list[Tuple[str, torch.Tensor]]") -> None:
        self._regions: Dict[str, tuple] = {}
        offset = 0
        for name, meta in regions:
            nbytes = meta.dtype.itemsize * math.prod(meta.shape)
            self._regions[name] = (offset, nbytes, meta.dtype, tuple(meta.shape), meta.stride())
            offset += -(-nbytes // 256) * 256
        self.nbytes = offset

    def offset(self, name: str) -> int:
        return self._regions[name][0]

    def view(self, ws: torch.Tensor, name: str) -> torch.Tensor:
        """Region ``name`` of the workspace ``ws`` (a uint8 buffer of >= :attr:`nbytes`)."""
        offset, nbytes, dtype, shape, strides = self._regions[name]
        return ws.narrow(0, offset, nbytes).view(dtype).as_strided(shape, strides)


def meta(shape: Tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
    return torch.empty(shape, dtype=dtype, device="meta")


class WorkspaceCall:
    """What the recorded FP8 calls share: a per-(stream, thread) workspace of named regions
    (one of them "counter", the forward's tile queue), a fresh ``out`` and, when the
    signature returns it, a fresh ``lse`` per call. A subclass sets ``self._fwd`` (an
    sm90/fwd.Fp8FwdCall) and calls :meth:`_setup` in its constructor."""

    def _setup(self, kind: str, regions: "list[Tuple[str, torch.Tensor]]",
               out_shape: Tuple[int, ...], out_dtype: torch.dtype, lse_shape: Tuple[int, ...],
               device: torch.device, need_lse: bool) -> None:
        self._kind, self._ws = kind, Workspace(regions)
        self._counter_at = self._ws.offset("counter")
        self._out_shape, self._out_dtype, self._lse_shape = out_shape, out_dtype, lse_shape
        self._device, self._index, self._need_lse = device, device.index, need_lse
        # (imported here: runtime.buffers needs Triton, and dispatch must import without it)
        from flashattn.runtime import buffers

        self._buffers = buffers
        self._recorded = False

    def _begin(self) -> Tuple[torch.Tensor, torch.Tensor, Optional[torch.Tensor]]:
        """(workspace, out, lse or None) of this call; the tile-queue counter zeroed when the
        forward takes its tiles from it (it starts at zero on every call)."""
        ws = self._buffers.stream_buffer(self._kind, self._ws.nbytes, self._index)
        out = torch.empty(self._out_shape, dtype=self._out_dtype, device=self._device)
        lse = (torch.empty(self._lse_shape, dtype=torch.float32, device=self._device)
               if self._need_lse else None)
        if self._fwd.uses_counter:
            ws.narrow(0, self._counter_at, 4).zero_()
        return ws, out, lse


__all__ = ["meta", "Workspace", "WorkspaceCall"]
