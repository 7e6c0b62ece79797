"""Philox4x32-10 counter-based RNG in torch, bit-exact with ``triton.language.random.philox``.

The Triton kernels draw their dropout decisions with ``tl.random.philox``; the chunked CPU
path and the tests must reproduce those decisions bit for bit, so this module re-implements
the same generator with torch integer ops.

Representation: 32-bit words are held in ``int64`` tensors with values in ``[0, 2**32)``.
torch has no ``umulhi`` and only partial ``uint32`` support, and a full 32x32-bit product
does not fit in a signed 64-bit integer, so products are formed from 16-bit halves of one
factor (each partial product is below 2**48 and never overflows).

Dropout contract (docs/internals.md): for batch ``b``, query head ``h`` (of ``H``), query row
``i`` and key column ``j``, ``r = philox(seed, c0=j, c1=i, c2=b*H + h, c3=0)[0]`` and the entry is
dropped iff ``r < dropout_threshold(p)``.
"""
from __future__ import annotations

from typing import Union

import torch

_MASK32 = 0xFFFFFFFF
# Philox4x32 constants (Salmon et al., "Parallel random numbers: as easy as 1, 2, 3").
_KEY_A = 0x9E3779B9  # golden-ratio Weyl increment of key word 0
_KEY_B = 0xBB67AE85  # sqrt(3) - 1 Weyl increment of key word 1
_ROUND_A = 0xD2511F53  # multiplies counter word 0
_ROUND_B = 0xCD9E8D57  # multiplies counter word 2
_N_ROUNDS = 10

Counter = Union[int, torch.Tensor]


def _mul_hi_lo(const: int, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """High and low 32-bit words of ``const * x`` for a 32-bit constant and int64 words ``x``.

    x = x_hi * 2**16 + x_lo, so const * x = (const * x_hi) * 2**16 + const * x_lo where both
    partial products are < 2**48: exact in int64.
    """
    x_lo = x & 0xFFFF
    x_hi = x >> 16
    p_lo = const * x_lo  # < 2**48
    p_hi = const * x_hi  # < 2**48
    hi = (p_hi + (p_lo >> 16)) >> 16
    lo = ((p_hi << 16) + p_lo) & _MASK32
    return hi, lo


def _as_word(c: Counter, device: torch.device | str | None) -> torch.Tensor:
    """A counter word as an int64 tensor reduced modulo 2**32 (like Triton's bitcast to uint32)."""
    if isinstance(c, torch.Tensor):
        return c.to(device=device if device is not None else c.device, dtype=torch.int64) & _MASK32
    return torch.tensor(int(c) & _MASK32, dtype=torch.int64, device=device)


def philox4x32(seed: int, c0: Counter, c1: Counter, c2: Counter, c3: Counter,
               device: torch.device | str | None = None
               ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """All four output words of Philox4x32-10 with key ``(seed & 0xffffffff, seed >> 32)``.

    Counters are Python ints or integer tensors (any shapes that broadcast together; values
    are taken modulo 2**32). Returns four int64 tensors of the broadcast shape, each with
    values in ``[0, 2**32)``. ``device`` defaults to the device of the first tensor counter.
    """
    if device is None:
        device = next((c.device for c in (c0, c1, c2, c3) if isinstance(c, torch.Tensor)), "cpu")
    seed = int(seed)
    if not 0 <= seed < 2**64:
        raise ValueError(f"seed must be in [0, 2**64), got {seed}")
    k0 = seed & _MASK32
    k1 = (seed >> 32) & _MASK32
    x0, x1, x2, x3 = torch.broadcast_tensors(*(_as_word(c, device) for c in (c0, c1, c2, c3)))
    for _ in range(_N_ROUNDS):
        hi_b, lo_b = _mul_hi_lo(_ROUND_B, x2)
        hi_a, lo_a = _mul_hi_lo(_ROUND_A, x0)
        x0, x1, x2, x3 = hi_b ^ x1 ^ k0, lo_b, hi_a ^ x3 ^ k1, lo_a
        # the key schedule is scalar: bump it in Python, modulo 2**32
        k0 = (k0 + _KEY_A) & _MASK32
        k1 = (k1 + _KEY_B) & _MASK32
    return x0, x1, x2, x3


def philox_uint32(seed: int, c0: Counter, c1: Counter, c2: Counter, c3: Counter,
                  device: torch.device | str | None = None) -> torch.Tensor:
    """First output word of Philox4x32-10, i.e. ``tl.random.philox(seed, c0, c1, c2, c3)[0]``.

    Returns an int64 tensor (broadcast shape of the counters) with values in ``[0, 2**32)``.
    """
    return philox4x32(seed, c0, c1, c2, c3, device=device)[0]


def dropout_threshold(p: float) -> int:
    """Integer threshold of the dropout decision: an entry is dropped iff ``r < threshold``.

    ``min(round(p * 2**32), 2**32 - 1)``; 0 (drop nothing) for ``p == 0``.
    """
    if p <= 0.0:
        return 0
    return min(int(round(p * 2**32)), 2**32 - 1)


def dropout_keep(seed: int, p: float, bh: Counter, rows: Counter, cols: Counter,
                 device: torch.device | str | None = None) -> torch.Tensor:
    """Bool keep mask for broadcastable counter tensors (the building block for chunked callers).

    bh: flat batch-head index ``b * H + h``; rows: query indices i; cols: key indices j.
    Shapes broadcast, e.g. bh (n, 1, 1), rows (1, m, 1), cols (1, 1, k) -> (n, m, k).
    True where the entry is kept.
    """
    threshold = dropout_threshold(p)
    r = philox_uint32(seed, cols, rows, bh, 0, device=device)
    return r >= threshold


def dropout_keep_mask(seed: int, p: float, b: int, h: int, s_q: int, s_k: int,
                      device: torch.device | str = "cpu", *,
                      q_range: tuple[int, int] | None = None,
                      k_range: tuple[int, int] | None = None) -> torch.Tensor:
    """Bool keep mask (b, h, s_q, s_k) of dropout with probability ``p`` and key ``seed``.

    ``q_range=(i0, i1)`` / ``k_range=(j0, j1)`` restrict the result to those query rows / key
    columns (shape (b, h, i1 - i0, j1 - j0)) with the counters of the full problem, so callers
    can build the mask one tile at a time.
    """
    i0, i1 = q_range if q_range is not None else (0, s_q)
    j0, j1 = k_range if k_range is not None else (0, s_k)
    bh = torch.arange(b * h, dtype=torch.int64, device=device).view(b, h, 1, 1)
    rows = torch.arange(i0, i1, dtype=torch.int64, device=device).view(1, 1, -1, 1)
    cols = torch.arange(j0, j1, dtype=torch.int64, device=device).view(1, 1, 1, -1)
    return dropout_keep(seed, p, bh, rows, cols, device=device)
