"""Producer side of the Hopper kernels' shared-memory rings.

A ring is ``NUM_STAGES`` shared-memory slots, each with a *ready* mbarrier (completed by the TMA
transaction count) and an *empty* mbarrier (the consumers arrive when they are done reading).
Load number ``n`` goes to slot ``n % NUM_STAGES`` in phase ``(n // NUM_STAGES) & 1``.
"""
from __future__ import annotations

from triton.experimental import gluon
from triton.experimental.gluon.language.nvidia.hopper import mbarrier, tma

from flashattn.runtime.gluon_api import tma_load, tma_store  # noqa: F401 (version names)


@gluon.jit
def ring_load(desc, coords, ring, ready, empty, stage, phase):
    """One TMA load of ``desc``'s box at ``coords`` into ``ring`` slot ``stage``, once the
    consumers have released the slot's previous contents (``empty`` of the previous phase)."""
    mbarrier.wait(empty.index(stage), phase ^ 1)
    mbarrier.expect(ready.index(stage), desc.block_type.nbytes)
    tma_load(desc, coords, ready.index(stage), ring.index(stage))
