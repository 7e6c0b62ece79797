"""Host-side integer helpers for grids and tile counts.

``triton.cdiv`` / ``triton.next_power_of_2`` are JIT functions: each host-side call costs ~2 us,
several per attention call, so the host code uses these instead.
"""
from __future__ import annotations

# CUDA limits grid axes 1 and 2 to 65535 blocks (axis 0: 2**31 - 1)
MAX_GRID_YZ = 65535


def cdiv(a: int, b: int) -> int:
    """ceil(a / b) for host ints."""
    return -(-a // b)


def next_pow2(n: int) -> int:
    """Smallest power of two >= n, for host ints n >= 1 (1 for n <= 1)."""
    return 1 << max(0, int(n) - 1).bit_length()


def bh_on_axis0(n_bh: int, varlen: bool) -> bool:
    """Whether a kernel's (sequence, head) index goes on grid axis 0 instead of axis 1: always
    in varlen mode, and for dense calls whose b * h would pass axis 1's limit. (Dense calls keep
    the query / key blocks on axis 0 otherwise: the blocks of one head then run together and
    share its K / V in L2.)"""
    return varlen or n_bh > MAX_GRID_YZ


__all__ = ["MAX_GRID_YZ", "bh_on_axis0", "cdiv", "next_pow2"]
