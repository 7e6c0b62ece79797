"""ops.lse_merge on the GPU (the Triton kernel) at the ring's sizes, against the cpu backend's
torch ops on the same inputs: a row-slice accumulator with NaN where its lse is -inf, rows
empty on one side and on both, a bf16 other side, float32 and bf16 destinations, and a head
dim that is not a power of two."""
from __future__ import annotations

import pytest
import torch

from flashattn import ops
from flashattn.backends.cpu import backend as cpu_backend

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")]


@pytest.mark.parametrize("h,d", [(32, 128), (16, 80)])
@pytest.mark.parametrize("dest_dtype", [torch.float32, torch.bfloat16])
def test_lse_merge_gpu_matches_torch(dest_dtype, h, d):
    gen = torch.Generator(device="cuda").manual_seed(0)
    b, s = 1, 4096
    out_a = torch.randn(b, s + 64, h, d, device="cuda", generator=gen)[:, 32:32 + s]
    out_b = torch.randn(b, s, h, d, device="cuda", generator=gen).bfloat16()
    lse_a = torch.randn(b, h, s, device="cuda", generator=gen) * 4
    lse_b = torch.randn(b, h, s, device="cuda", generator=gen) * 4
    lse_a[:, :, :100] = float("-inf")
    out_a[:, :100] = float("nan")
    lse_b[:, :, 50:150] = float("-inf")
    want_out = torch.empty(b, s, h, d, dtype=dest_dtype, device="cuda")
    want_lse = lse_a.clone()
    cpu_backend.lse_merge(out_a, want_lse, out_b, lse_b, want_out)
    dest = torch.empty(b, s, h, d, dtype=dest_dtype, device="cuda")
    ops.lse_merge(out_a, lse_a, out_b, lse_b, dest)
    assert not torch.isnan(dest).any()
    assert (dest[:, 50:100] == 0).all() and (lse_a[:, :, 50:100] == float("-inf")).all()
    torch.testing.assert_close(lse_a, want_lse, atol=1e-6, rtol=1e-6)
    # Both sides merge in float32 and round once to the destination. Their float32 values may
    # differ in the last bits (the kernel's exp2 and FMA order against torch's), so a bf16 value
    # at a rounding boundary can land on either neighbour: one bf16 ulp, 2^-8 to 2^-7 of the
    # value (2026-11-29, H200: one element of 5.2 M at 2^-7.2 with d = 80).
    tol = 1e-6 if dest_dtype == torch.float32 else 2.0 ** -7
    torch.testing.assert_close(dest.float(), want_out.float(), atol=tol, rtol=tol)
