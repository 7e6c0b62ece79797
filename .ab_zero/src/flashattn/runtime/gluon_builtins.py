"""Gluon builtins that Gluon 3.6 has no wrapper for, built from Triton's IR builder (private
API: ``triton._C`` and the ``_semantic`` object). Imported only by the sm90 kernels."""
from __future__ import annotations

from triton._C.libtriton import ir
from triton.experimental.gluon.language._core import builtin


@builtin
def tma_reduce_add(desc, coord, value, _semantic=None):
    """TMA bulk reduce-add of a register tile into global memory (cp.reduce.async.bulk.tensor):
    Triton's TMA lowering stages ``value`` through shared memory and waits until the copy engine
    has read it. Gluon 3.6 has no wrapper for it, so this builds the descriptor_reduce op."""
    coord = _semantic._convert_to_ir_values(coord, require_i64=False)
    _semantic.builder.create_descriptor_reduce(ir.DESCRIPTOR_REDUCE_KIND.ADD, desc.handle,
                                               value.handle, coord)


@builtin
def tma_reduce_add_from_shared(desc, coord, src, _semantic=None):
    """Asynchronous TMA bulk reduce-add of a shared-memory tile into global memory; the bulk
    group completes like a TMA store (``tma.store_wait``)."""
    coord = _semantic._convert_to_ir_values(coord, require_i64=False)
    _semantic.builder.create_async_tma_reduce(ir.DESCRIPTOR_REDUCE_KIND.ADD, desc.handle, coord,
                                              src.handle)


__all__ = ["tma_reduce_add", "tma_reduce_add_from_shared"]
