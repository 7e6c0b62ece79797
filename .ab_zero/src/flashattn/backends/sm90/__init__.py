"""Hopper (sm90) fast path written in Gluon: TMA, mbarrier pipelines, wgmma, warp specialisation.

    backend.py     the backend interface dispatch calls (backends/interface.py)
    support.py     can it run here / does it cover this call (reason strings, no kernel import)
    config.py      tile configurations per head dim
    tiles.py       key-block ranges, masks needed, persistent tile scheduler
    softmax.py     softcap, visibility mask, online softmax in exp2
    row_guard.py   rows past a packed sequence's end kept out of the GEMMs
    ptx.py         inline PTX run by every thread of a warpgroup (named barriers, fences)
    ring.py        one TMA load into a ring slot guarded by ready / empty mbarriers
    fwd_kernel.py  the warp-specialised forward kernel
    descriptors.py TMA descriptors over (b, s, h, d) views, shared by forward and backward
    fwd.py         host side: descriptors, grid, launch -> flash_fwd_hopper(...)
    varlen_rows.py the output rows of a packed forward that no sequence covers, Triton
    v_layout.py    V^T for the FP8 forward in wgmma key order, Triton
    bwd_kernel.py  the warp-specialised backward kernel, d <= 128 (dK/dV on chip, dQ by TMA
                   reduce-add)
    bwd_wide_kernel.py  the backward for d = 192 / 256 (dK/dV split by head-dim columns)
    bwd_producer.py     the backward kernels' load warp
    bwd_epilogue.py     the backward kernels' dK / dV epilogue
    bwd_preprocess.py   row statistics of the backward (delta, lse in log2 units), Triton
    bwd_postprocess.py  dq out of the fp32 dQ workspace, Triton
    bwd.py         host side of the backward -> flash_bwd_hopper(...)

The sm_90 ahead-of-time compile (CI, register and spill checks without a GPU) lives outside the
package, in ``tools/aot_sm90.py``.

Kernels are imported lazily (``flashattn.backends.sm90.fwd``), so importing this package is cheap.
"""
from flashattn.backends.sm90.support import call_unsupported, device_unavailable, gluon_unavailable, unsupported

__all__ = ["call_unsupported", "device_unavailable", "gluon_unavailable", "unsupported"]
