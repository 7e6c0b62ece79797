"""ops.sum_rows, the ring backward's one-pass sum of dK / dV partials that each cover a range
of a block's rows: both backends ('cpu' torch ops, 'portable' Triton under the interpreter)
against a float64 sum; the float32 order of the terms (bitwise equal to a sequential float32
sum), rows no piece covers, overlapping pieces, packed (row dim 0) and batched (row dim 1)
layouts, non-contiguous pieces and the argument errors."""
from __future__ import annotations

import pytest
import torch

from flashattn import ops


def _sequential(parts, starts, n_rows, row_dim, dtype):
    """The reference: a float32 running sum, term by term in the order given."""
    shape = list(parts[0].shape)
    shape[row_dim] = n_rows
    acc = torch.zeros(shape, dtype=torch.float32)
    for p, s in zip(parts, starts):
        acc.narrow(row_dim, s, p.shape[row_dim]).add_(p.float())
    return acc.to(dtype)


@pytest.mark.parametrize("row_dim,shape", [(1, (2, 0, 3, 16)), (0, (0, 4, 24))])  # 0: rows
def test_sum_rows_matches_a_sequential_float32_sum(row_dim, shape, backend):
    gen = torch.Generator().manual_seed(row_dim)
    n_rows = 37
    spans = [(0, 37), (5, 12), (0, 20), (30, 7), (12, 1)]  # overlapping, rows 0-36 all covered

    def piece(rows):
        s = list(shape)
        s[row_dim] = rows
        return (torch.randn(s, generator=gen) * 3).bfloat16()

    parts = [piece(n) for _, n in spans]
    starts = [s for s, _ in spans]
    got32 = ops.sum_rows(parts, starts, n_rows, row_dim, torch.float32)
    assert torch.equal(got32, _sequential(parts, starts, n_rows, row_dim, torch.float32))
    got = ops.sum_rows(parts, starts, n_rows, row_dim, torch.bfloat16)
    assert got.dtype == torch.bfloat16 and got.shape[row_dim] == n_rows
    if backend == "cpu":
        assert torch.equal(got, got32.bfloat16())
    else:  # the interpreter truncates fp32 -> bf16 (1 ulp, not 0.5; a GPU rounds to nearest)
        torch.testing.assert_close(got.float(), got32, atol=0.0, rtol=2.0 ** -7)
    exact = torch.zeros(got.shape, dtype=torch.float64)
    for p, s in zip(parts, starts):
        exact.narrow(row_dim, s, p.shape[row_dim]).add_(p.double())
    torch.testing.assert_close(got32.double(), exact, atol=1e-5, rtol=2.0 ** -20)


def test_sum_rows_uncovered_rows_are_zero_and_float32_out(backend):
    parts = [torch.full((1, 3, 2, 8), 1.5, dtype=torch.float16),
             torch.full((1, 2, 2, 8), -0.25, dtype=torch.float16)]
    got = ops.sum_rows(parts, [2, 8], 12, 1, torch.float32)
    want = torch.zeros(1, 12, 2, 8)
    want[:, 2:5] = 1.5
    want[:, 8:10] = -0.25
    assert torch.equal(got, want)


def test_sum_rows_views_and_many_pieces(backend):
    """Pieces that are row slices of larger tensors (copied to contiguous first), more pieces
    than any fixed unrolling, and a head width that is not a power of two."""
    gen = torch.Generator().manual_seed(3)
    big = torch.randn(2, 40, 3, 20, generator=gen).bfloat16()
    parts = [big[:, i:i + 9] for i in range(0, 31, 3)]
    starts = [i % 7 for i in range(len(parts))]
    got = ops.sum_rows(parts, starts, 16, 1, torch.float32)
    assert torch.equal(got, _sequential(parts, starts, 16, 1, torch.float32))


@pytest.mark.parametrize("parts,starts,n_rows,row_dim,match", [
    ([], [], 4, 0, "parts is empty"),
    ([torch.zeros(3, 2)], [2], 4, 0, r"rows \[2, 5\) outside \[0, 4\)"),
    ([torch.zeros(3, 2)], [-1], 4, 0, r"outside"),
    ([torch.zeros(3, 2), torch.zeros(3, 5)], [0, 0], 4, 0, r"parts\[1\]"),
    ([torch.zeros(3, 2), torch.zeros(3, 2).half()], [0, 0], 4, 0, r"parts\[1\]"),
    ([torch.zeros(3, 2)], [0, 1], 4, 0, "2 starts for 1 parts"),
    ([torch.zeros(3, 2)], [0], 4, 2, "row_dim 2"),
])
def test_sum_rows_bad_arguments(parts, starts, n_rows, row_dim, match):
    with pytest.raises(ValueError, match=match):
        ops.sum_rows(parts, starts, n_rows, row_dim, torch.float32)
