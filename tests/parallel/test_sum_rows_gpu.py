"""ops.sum_rows on the GPU (the Triton kernel) at the ring's sizes, against the cpu backend's
torch ops on the same pieces: bitwise equal (the same float32 sum in the same order, rounded
to nearest once), for batched and packed layouts, pieces that are not 16-byte aligned (the
scalar-load path) and a float32 output."""
from __future__ import annotations

import pytest
import torch

from flashattn import ops
from flashattn.backends.cpu import backend as cpu_backend

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")]


def _want(parts, starts, n_rows, row_dim, dtype):
    shape = list(parts[0].shape)
    shape[row_dim] = n_rows
    out = torch.empty(shape, dtype=dtype, device="cuda")
    outer = 1
    for n in shape[:row_dim]:
        outer *= n
    views = [p.contiguous().view(outer, p.shape[row_dim], -1) for p in parts]
    cpu_backend.sum_rows(views, starts, out.view(outer, n_rows, -1))
    return out


@pytest.mark.parametrize("row_dim,shape", [(1, (2, 0, 8, 128)), (0, (0, 32, 128)),
                                           (1, (1, 0, 3, 80))])
@pytest.mark.parametrize("out_dtype", [torch.bfloat16, torch.float32])
def test_sum_rows_gpu_matches_torch(row_dim, shape, out_dtype):
    gen = torch.Generator(device="cuda").manual_seed(0)
    n_rows = 4096
    spans = [(0, 4096), (0, 2048), (2048, 2048), (1000, 7), (0, 4096), (4095, 1)]

    def piece(rows):
        s = list(shape)
        s[row_dim] = rows
        return torch.randn(s, device="cuda", generator=gen).bfloat16()

    parts = [piece(n) for _, n in spans]
    starts = [s for s, _ in spans]
    got = ops.sum_rows(parts, starts, n_rows, row_dim, out_dtype)
    assert torch.equal(got, _want(parts, starts, n_rows, row_dim, out_dtype))


def test_sum_rows_gpu_unaligned_pieces():
    """A piece starting one element into its allocation: no 16-byte vector loads."""
    gen = torch.Generator(device="cuda").manual_seed(1)
    flat = torch.randn(1 + 300 * 2 * 64, device="cuda", generator=gen).bfloat16()
    odd = flat[1:].view(300, 2, 64)
    even = torch.randn(500, 2, 64, device="cuda", generator=gen).bfloat16()
    got = ops.sum_rows([even, odd], [0, 100], 500, 0, torch.bfloat16)
    assert torch.equal(got, _want([even, odd], [0, 100], 500, 0, torch.bfloat16))
