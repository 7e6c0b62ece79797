"""V^T in wgmma key order for the FP8 Hopper forward (fp8_format.wgmma_key_position,
sm90/v_layout.py): a permutation inside every group of 32 keys, padded with zeros to a
multiple of 32; the Triton pass (interpreter here) equals the torch formulation
(fp8_format.to_wgmma_order, the CPU path's) for V in the FA3 layout and in quantize's
keys-contiguous layout, and every key lands at its position."""
from __future__ import annotations

import pytest
import torch

from flashattn import fp8_format as F


def test_positions_are_a_permutation_inside_each_group():
    pos = F.wgmma_key_position(torch.arange(96))
    assert sorted(pos.tolist()) == list(range(96))
    assert torch.equal(pos // 32, torch.arange(96) // 32)
    # the thread that holds accumulator columns (2t, 2t + 1, 8 + 2t, 9 + 2t) gets operand
    # positions 4t .. 4t + 3 (t = 1 here)
    assert pos[[2, 3, 10, 11]].tolist() == [4, 5, 6, 7]


@pytest.mark.parametrize("shape", [(2, 37, 3, 8), (1, 64, 2, 16), (1, 5, 1, 24), (2, 130, 2, 256)])
def test_triton_pass_matches_torch(shape):
    pytest.importorskip("triton")
    from flashattn.sm90 import v_layout

    torch.manual_seed(0)
    v = torch.randn(*shape).to(torch.float8_e4m3fn)
    for layout in (v, F.keys_contiguous_empty(v.shape, v.device).copy_(v)):
        want = F.to_wgmma_order(layout)
        got = v_layout.wgmma_ordered_vt(layout)
        assert got.shape == want.shape and got.stride() == want.stride()
        assert torch.equal(got.permute(0, 2, 3, 1).contiguous().view(torch.uint8),
                           want.permute(0, 2, 3, 1).contiguous().view(torch.uint8))
        # every key lands at its position; the rest of the last group is zero
        pos = F.wgmma_key_position(torch.arange(shape[1]))
        assert torch.equal(got[:, pos].float(), v.float())
        rest = sorted(set(range(got.shape[1])) - set(pos.tolist()))
        assert (got[:, rest].float() == 0).all()
