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
    from flashattn.backends.sm90 import v_layout

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


@pytest.mark.parametrize("lens,block_n", [((37, 0, 1, 64, 100), 64), ((130,), 128),
                                          ((5, 33, 31), 128)])
def test_varlen_pass_starts_every_sequence_on_a_key_group(lens, block_n):
    """The packed V^T (v_layout.wgmma_ordered_vt_varlen): sequence b's keys in wgmma order from
    position 32 (b + cu_k[b] // 32), every other position up to where the forward's key
    blocks read (block_n past each end) zero, whatever the memory held before."""
    pytest.importorskip("triton")
    from flashattn.backends.sm90 import v_layout

    torch.manual_seed(0)
    cu = torch.tensor([0, *torch.tensor(lens).cumsum(0).tolist()], dtype=torch.int32)
    total, h, d = int(cu[-1]), 2, 24
    v = torch.randn(total, h, d).to(torch.float8_e4m3fn)
    junk = torch.full((1 << 16,), 255, dtype=torch.uint8)  # NaN bytes in the allocator's pool
    del junk
    got = v_layout.wgmma_ordered_vt_varlen(v, cu, max(lens), block_n)
    s_total = v_layout.varlen_vt_positions(len(lens), total)
    assert got.shape == (1, s_total, h, d)
    assert got.permute(0, 2, 3, 1).is_contiguous()
    filled = torch.zeros(s_total, dtype=torch.bool)
    for b, n in enumerate(lens):
        k0 = int(cu[b])
        start = 32 * (b + k0 // 32)
        pos = start + F.wgmma_key_position(torch.arange(n))
        assert torch.equal(got[0, pos].float(), v[k0:k0 + n].float()), b
        filled[pos] = True
        # what this sequence's key blocks may read past its keys: zeros or the next one's keys
        reach = min(s_total, start + -(-max(n, 1) // block_n) * block_n)
        rest = [p for p in range(start, reach) if not filled[p]]
        later = set()
        for b2 in range(b + 1, len(lens)):
            s2 = 32 * (b2 + int(cu[b2]) // 32)
            later |= set((s2 + F.wgmma_key_position(torch.arange(lens[b2]))).tolist())
        rest = [p for p in rest if p not in later]
        assert (got[0, rest].float() == 0).all(), b


def test_varlen_pass_copies_only_the_used_keys():
    """With seqused_k, keys past seqused_k[b] (unused cache slots, here NaN bytes) are not
    copied: those positions are zeros like the gaps (the FP8 forward's masked P is 0 there,
    and 0 x NaN would be NaN)."""
    pytest.importorskip("triton")
    from flashattn.backends.sm90 import v_layout

    lens, used = (40, 70, 5), (33, 0, 5)
    cu = torch.tensor([0, *torch.tensor(lens).cumsum(0).tolist()], dtype=torch.int32)
    total, h, d = int(cu[-1]), 2, 16
    v = torch.randn(total, h, d).to(torch.float8_e4m3fn)
    bits = v.view(torch.uint8)
    for b, (n, u) in enumerate(zip(lens, used)):
        bits[int(cu[b]) + u:int(cu[b]) + n] = 0x7F  # e4m3 NaN in the unused keys
    got = v_layout.wgmma_ordered_vt_varlen(v, cu, max(lens), 64,
                                           torch.tensor(used, dtype=torch.int32))
    assert not torch.isnan(got.float()).any()
    for b, u in enumerate(used):
        start = 32 * (b + int(cu[b]) // 32)
        pos = start + F.wgmma_key_position(torch.arange(u))
        assert torch.equal(got[0, pos].float(), v[int(cu[b]):int(cu[b]) + u].float()), b


@pytest.mark.parametrize("cu,total", [([0, 5, 9], 20), ([3, 5, 9], 9), ([0, 9], 9), ([4], 70),
                                      ([0, 100, 1000], 50)])
def test_clear_uncovered_rows(cu, total):
    """sm90/varlen_rows.py (interpreter): rows outside [cu[0], cu[-1]) become 0 / -inf, the
    others keep what the forward wrote; offsets past total_q are clamped."""
    pytest.importorskip("triton")
    from flashattn.backends.sm90.varlen_rows import clear_uncovered_rows

    h, d = 3, 40
    out = torch.full((total, h, d), 7.0, dtype=torch.bfloat16)
    lse = torch.full((h, total), 5.0)
    counter = torch.full((1,), 123, dtype=torch.int32)
    clear_uncovered_rows(out, lse, torch.tensor(cu, dtype=torch.int32), counter)
    assert counter.item() == 0
    first, last = min(cu[0], total), min(cu[-1], total)
    covered = torch.zeros(total, dtype=torch.bool)
    covered[first:last] = True
    assert (out[covered] == 7).all() and (out[~covered] == 0).all()
    assert (lse[:, covered] == 5).all() and torch.isneginf(lse[:, ~covered]).all()
