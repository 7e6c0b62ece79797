"""The Gluon (Hopper) API names the sm90 kernels use, across the Triton versions flashattn
supports: the kernels import these instead of the version-specific names, so nothing in them
branches on the Triton version.

Differences handled here (found by compiling every Gluon variant for sm_90 on each version):

- TMA copies: Triton 3.6 / 3.7 ``tma.async_copy_global_to_shared`` /
  ``tma.async_copy_shared_to_global``; 3.8 / 3.9 renamed them ``tma.async_load`` /
  ``tma.async_store`` (the old names remain and raise).
- The CTA-wide barrier: 3.6 ``gl.thread_barrier()``; 3.7+ ``gl.barrier()`` (thread_barrier gone).
- A shared-memory descriptor's bytes seen as another dtype / shape / layout: 3.6-3.8
  ``desc._reinterpret(...)``; 3.9 ``desc.reinterpret(...)`` (the private name gone).
"""
from __future__ import annotations

from triton.experimental.gluon import language as _gl
from triton.experimental.gluon import jit as _jit
from triton.experimental.gluon.language._core import builtin as _builtin
from triton.experimental.gluon.language._core import shared_memory_descriptor as _smem_desc
from triton.experimental.gluon.language.nvidia.ampere import async_copy as _async_copy
from triton.experimental.gluon.language.nvidia.hopper import tma as _tma


def _first(module, *names):
    """The first attribute of ``module`` among ``names`` (newest name first)."""
    for name in names:
        fn = getattr(module, name, None)
        if fn is not None:
            return fn
    raise ImportError(f"{module.__name__} has none of {names}")


# tma_load(desc, coord, barrier, result_smem), tma_store(desc, coord, src_smem)
tma_load = _first(_tma, "async_load", "async_copy_global_to_shared")
tma_store = _first(_tma, "async_store", "async_copy_shared_to_global")

# cta_barrier(): every thread of the CTA (of the partition) reaches it before any goes on
cta_barrier = _first(_gl, "barrier", "thread_barrier")

_REINTERPRET = "reinterpret" if hasattr(_smem_desc, "reinterpret") else "_reinterpret"


@_builtin
def smem_reinterpret(desc, dtype, shape, layout, _semantic=None):
    """``desc``'s shared memory as ``dtype`` / ``shape`` / ``layout`` (no copy): the method
    each Triton version names (see the module doc)."""
    return getattr(desc, _REINTERPRET)(dtype, shape, layout, _semantic=_semantic)



@_jit
def mbarrier_arrive_per_thread(bar):
    """Every calling thread arrives once on mbarrier ``bar`` (init its count accordingly),
    with no CTA / warpgroup barrier first: ``cp.async.mbarrier.arrive.noinc``, which arrives
    once the calling thread's own cp.async copies are done (none in a thread that issues
    none). The same builtin on 3.6-3.9. (``mbarrier.arrive`` is one thread's arrive after a
    ``bar.sync`` of the partition.)"""
    _async_copy.mbarrier_arrive(bar, increment_count=False)


__all__ = ["cta_barrier", "mbarrier_arrive_per_thread", "smem_reinterpret", "tma_load",
           "tma_store"]
