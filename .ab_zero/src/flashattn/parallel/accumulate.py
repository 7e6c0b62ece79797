"""Float32 sums over row ranges that write the first term of a row instead of adding it.

The ring's backward sums each block's dQ / dK / dV over several kernel calls (and, for dK /
dV, over ranks). Starting from zeros costs a fill pass and turns the first term into an add
(read both, write one); most rows of a fresh sum get exactly one or two terms, so writing the
first one (a converting copy) and adding only where a row already holds a term saves a pass
over the buffer for every fresh sum. Rows that no term reached are zeroed once, at the end.
"""
from __future__ import annotations

from typing import List, Sequence, Tuple

import torch

Tensor = torch.Tensor


class RowSum:
    """A float32 sum of terms over row ranges of dimension ``dim`` of ``shape``.

    ``RowSum(shape, device)``: fresh (no row written; storage uninitialised);
    ``RowSum.of(tensor)``: a float32 tensor whose every row already holds a sum (e.g. one
    received from another rank), added to in place.
    """

    def __init__(self, shape: Sequence[int], device: torch.device, dim: int = 1):
        self.data = torch.empty(tuple(shape), dtype=torch.float32, device=device)
        self.dim = dim
        self._written: List[Tuple[int, int]] = []  # disjoint, sorted half-open row ranges

    @classmethod
    def of(cls, tensor: Tensor, dim: int = 1) -> "RowSum":
        s = cls.__new__(cls)
        s.data, s.dim = tensor, dim
        s._written = [(0, tensor.shape[dim])]
        return s

    def _pieces(self, lo: int, hi: int) -> List[Tuple[int, int, bool]]:
        """[lo, hi) cut into (start, end, already written) pieces."""
        out, at = [], lo
        for a, b in self._written:
            if b <= at or a >= hi:
                continue
            if a > at:
                out.append((at, a, False))
            out.append((max(a, at), min(b, hi), True))
            at = min(b, hi)
        if at < hi:
            out.append((at, hi, False))
        return out

    def _mark(self, lo: int, hi: int) -> None:
        spans = sorted(self._written + [(lo, hi)])
        merged: List[Tuple[int, int]] = []
        for a, b in spans:
            if merged and a <= merged[-1][1]:
                merged[-1] = (merged[-1][0], max(merged[-1][1], b))
            else:
                merged.append((a, b))
        self._written = merged

    def add(self, lo: int, value: Tensor) -> None:
        """Rows ``[lo, lo + value.shape[dim])`` += ``value`` (any float dtype)."""
        hi = lo + value.shape[self.dim]
        for a, b, seen in self._pieces(lo, hi):
            dst = self.data.narrow(self.dim, a, b - a)
            src = value.narrow(self.dim, a - lo, b - a)
            dst.add_(src) if seen else dst.copy_(src)
        self._mark(lo, hi)

    def index_add(self, index: Tensor, value: Tensor) -> None:
        """Rows ``index`` (int64, distinct) += ``value``: the rows not yet written are zeroed
        first (an index gives no ranges to write into)."""
        self.tensor()
        self.data.index_add_(self.dim, index, value.float())

    def tensor(self) -> Tensor:
        """The sum, every row: rows no term reached are zeroed now."""
        n = self.data.shape[self.dim]
        for a, b, seen in self._pieces(0, n):
            if not seen:
                self.data.narrow(self.dim, a, b - a).zero_()
        self._written = [(0, n)] if n else []
        return self.data


def fresh(like: Sequence[Tensor], dim: int = 1) -> Tuple[RowSum, ...]:
    """A fresh :class:`RowSum` shaped like each of ``like``."""
    return tuple(RowSum(x.shape, x.device, dim) for x in like)


__all__ = ["RowSum", "fresh"]
