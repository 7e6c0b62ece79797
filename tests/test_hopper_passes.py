"""The Hopper backward's plain-Triton passes (row statistics in, dQ out) under the Triton
interpreter: they need no sm90, so CI checks them on CPU."""
from __future__ import annotations

import pytest
import torch

from flashattn.hopper.bwd_postprocess import dq_from_workspace
from flashattn.hopper.bwd_preprocess import row_stats


@pytest.mark.parametrize("transposed", [False, True])
@pytest.mark.parametrize("b,s,h,d", [(2, 37, 3, 64), (1, 130, 2, 96), (1, 5, 1, 192)])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_dq_from_workspace(transposed, b, s, h, d, dtype):
    """dq (b, s, h, d) equals the workspace's first s rows / d columns, cast: both layouts,
    lengths and head dims that are not multiples of the tiles."""
    s_pad, d_pad = -(-s // 64) * 64, 1 << (d - 1).bit_length()
    shape = (b, h, d_pad, s_pad) if transposed else (b, h, s_pad, d_pad)
    acc = torch.randn(shape, dtype=torch.float32)
    q = torch.empty((b, s, h, d), dtype=dtype)
    dq = dq_from_workspace(acc, q, transposed)
    view = acc.permute(0, 3, 1, 2) if transposed else acc.transpose(1, 2)
    want = view[:, :s, :, :d].to(dtype)
    assert dq.shape == q.shape and dq.dtype == dtype and dq.is_contiguous()
    # one unit in the last place: the interpreter's float32 -> bfloat16 cast may round
    # differently from torch's round-to-nearest-even (the GPU's cvt.rn matches torch)
    ulp = 2.0 ** -7 if dtype == torch.bfloat16 else 2.0 ** -10
    torch.testing.assert_close(dq, want, rtol=ulp, atol=1e-6)


@pytest.mark.parametrize("d,transposed", [(64, False), (96, False), (192, True)])
def test_row_stats(d, transposed):
    """lse2 = lse * log2(e) (+inf where lse = -inf and on padding rows), delta = rowsum(dO * O)
    (0 on padding rows), and the dQ workspace zeroed in either layout."""
    b, s, h, s_pad = 2, 70, 3, 128
    d_pad = 1 << (d - 1).bit_length()
    out = torch.randn(b, s, h, d, dtype=torch.bfloat16)
    dout = torch.randn(b, s, h, d, dtype=torch.bfloat16)
    lse = torch.randn(b, h, s, dtype=torch.float32)
    lse[0, 1, 5] = float("-inf")
    shape = (b, h, d_pad, s_pad) if transposed else (b, h, s_pad, d_pad)
    dq_acc = torch.full(shape, float("nan"))
    lse2, delta = row_stats(out, dout, lse, s_pad, dq_acc, transposed)
    assert lse2.shape == delta.shape == (b, h, s_pad)
    assert lse2.is_contiguous() and delta.is_contiguous()
    want_delta = (out.float() * dout.float()).sum(-1).transpose(1, 2)
    torch.testing.assert_close(delta[:, :, :s], want_delta, rtol=1e-5, atol=1e-4)
    assert torch.all(delta[:, :, s:] == 0)
    want_lse2 = lse * 1.4426950408889634
    want_lse2[0, 1, 5] = float("inf")
    torch.testing.assert_close(lse2[:, :, :s], want_lse2)
    assert torch.all(lse2[:, :, s:] == float("inf"))
    assert torch.all(dq_acc == 0)
