"""RowSum: the ring backward's float32 sums, which write a row's first term and add the rest."""
from __future__ import annotations

import torch

from flashattn.parallel.accumulate import RowSum, fresh


def test_row_sum_matches_a_sum_from_zeros():
    """Overlapping, disjoint and repeated ranges of bf16 terms, rows never reached: the same
    float32 sum as adding every term into zeros; the untouched rows come out 0."""
    gen = torch.Generator().manual_seed(0)
    shape = (2, 20, 3, 4)
    ranges = [(4, 10), (0, 6), (8, 14), (4, 10), (16, 18)]
    want = torch.zeros(shape)
    s = RowSum(shape, torch.device("cpu"))
    s.data.fill_(float("nan"))  # uninitialised storage must never reach the result
    for lo, hi in ranges:
        term = torch.randn(2, hi - lo, 3, 4, generator=gen).bfloat16()
        want[:, lo:hi] += term.float()
        s.add(lo, term)
    got = s.tensor()
    assert got.dtype == torch.float32
    assert torch.equal(got, want)
    assert (got[:, 14:16] == 0).all() and (got[:, 18:] == 0).all()


def test_row_sum_of_a_received_tensor_adds_in_place_and_index_add():
    base = torch.arange(12.0).reshape(12, 1)
    s = RowSum.of(base.clone(), dim=0)
    s.add(2, torch.ones(3, 1))
    s.index_add(torch.tensor([0, 11]), torch.full((2, 1), 10.0, dtype=torch.bfloat16))
    want = base.clone()
    want[2:5] += 1
    want[[0, 11]] += 10
    assert torch.equal(s.tensor(), want)


def test_fresh_row_sum_index_add_zeroes_the_rest_first():
    (s,) = fresh([torch.empty(6, 2)], dim=0)
    s.add(0, torch.ones(2, 2))
    s.index_add(torch.tensor([1, 4]), torch.ones(2, 2))
    assert torch.equal(s.tensor(), torch.tensor([[1.0, 1], [2, 2], [0, 0], [0, 0], [1, 1],
                                                 [0, 0]]))
