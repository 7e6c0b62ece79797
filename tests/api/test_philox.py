"""flashattn.philox: bit-exact with triton.language.random.philox and with Random123's KATs."""
import os
import subprocess
import sys
import textwrap

import pytest
import torch

from flashattn.philox import (dropout_keep, dropout_keep_mask, dropout_threshold, philox4x32,
                              philox_uint32)

# Known-answer vectors of Philox4x32-10 from Random123 (kat_vectors):
# (key k0, k1), counter (c0..c3) -> output words.
KAT = [
    ((0x00000000, 0x00000000), (0, 0, 0, 0),
     (0x6627E8D5, 0xE169C58D, 0xBC57AC4C, 0x9B00DBD8)),
    ((0xFFFFFFFF, 0xFFFFFFFF), (0xFFFFFFFF,) * 4,
     (0x408F276D, 0x41C83B0E, 0xA20BC7C6, 0x6D5451FD)),
    ((0xA4093822, 0x299F31D0), (0x243F6A88, 0x85A308D3, 0x13198A2E, 0x03707344),
     (0xD16CFE09, 0x94FDCCEB, 0x5001E420, 0x24126EA1)),
]


@pytest.mark.parametrize("key, counter, expected", KAT)
def test_known_answers(key, counter, expected):
    seed = key[0] | (key[1] << 32)
    words = philox4x32(seed, *counter)
    assert tuple(int(w) for w in words) == expected


# The Triton side runs in a fresh interpreter process: TRITON_INTERPRET must be set before
# triton is first imported, and other test modules may already have imported it here.
_TRITON_SCRIPT = textwrap.dedent(r"""
    import sys
    import torch
    import triton
    import triton.language as tl

    @triton.jit
    def full_range_kernel(out_ptr, ctr_ptr, seed, N: tl.constexpr):
        # counters stored as int64 in [0, 2**32): truncate to uint32 like a cast
        offs = tl.arange(0, N)
        c0 = tl.load(ctr_ptr + offs * 4 + 0).to(tl.uint32)
        c1 = tl.load(ctr_ptr + offs * 4 + 1).to(tl.uint32)
        c2 = tl.load(ctr_ptr + offs * 4 + 2).to(tl.uint32)
        c3 = tl.load(ctr_ptr + offs * 4 + 3).to(tl.uint32)
        r0, r1, r2, r3 = tl.random.philox(seed, c0, c1, c2, c3)
        tl.store(out_ptr + offs * 4 + 0, r0.to(tl.int64))
        tl.store(out_ptr + offs * 4 + 1, r1.to(tl.int64))
        tl.store(out_ptr + offs * 4 + 2, r2.to(tl.int64))
        tl.store(out_ptr + offs * 4 + 3, r3.to(tl.int64))

    @triton.jit
    def dropout_tile_kernel(out_ptr, seed, bh, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
        # the way the attention kernels form counters: int32 indices bitcast to uint32
        rows = tl.arange(0, BLOCK_M)[:, None]
        cols = tl.arange(0, BLOCK_N)[None, :]
        zero = rows * 0 + cols * 0
        c0 = (cols + zero).to(tl.uint32, bitcast=True)
        c1 = (rows + zero).to(tl.uint32, bitcast=True)
        c2 = (zero + bh).to(tl.uint32, bitcast=True)
        c3 = zero.to(tl.uint32, bitcast=True)
        r, _, _, _ = tl.random.philox(seed, c0, c1, c2, c3)
        tl.store(out_ptr + rows * BLOCK_N + cols, r.to(tl.int64))

    path = sys.argv[1]
    case = torch.load(path)
    results = {"full": [], "tile": []}
    for seed in case["seeds"]:
        out = torch.empty_like(case["counters"])
        full_range_kernel[(1,)](out, case["counters"], seed, N=case["counters"].shape[0])
        results["full"].append(out)
    for seed, bh in case["tile_args"]:
        out = torch.empty(16, 32, dtype=torch.int64)
        dropout_tile_kernel[(1,)](out, seed, bh, BLOCK_M=16, BLOCK_N=32)
        results["tile"].append(out)
    torch.save(results, path)
""")


@pytest.fixture(scope="module")
def triton_case(tmp_path_factory):
    pytest.importorskip("triton")
    gen = torch.Generator().manual_seed(int(torch.randint(0, 2**31, ()).item()))
    n = 64
    counters = torch.randint(0, 2**32, (n, 4), generator=gen, dtype=torch.int64)
    counters[:4] = torch.tensor([[0, 0, 0, 0], [2**32 - 1] * 4, [1, 2, 3, 4], [2**31, 0, 2**31, 7]])
    # seeds across Triton's argument specialisations: int32 range, [2**31, 2**32), full int64
    seeds = [0, 1, 12345, 2**31 - 1, 2**31 + 5, 2**32 - 1,
             int(torch.randint(2**32, 2**62, (), generator=gen)),
             int(torch.randint(0, 2**62, (), generator=gen)) + 2**62,
             2**63 - 1]
    tile_args = [(int(torch.randint(0, 2**62, (), generator=gen)) * 2 + 1, 5), (42, 0), (2**40 + 3, 1023)]
    case = {"counters": counters, "seeds": seeds, "tile_args": tile_args}
    path = tmp_path_factory.mktemp("philox") / "case.pt"
    torch.save(case, path)
    env = dict(os.environ, TRITON_INTERPRET="1")
    proc = subprocess.run([sys.executable, "-c", _TRITON_SCRIPT, str(path)], env=env,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-4000:]
    return case, torch.load(path)


def test_matches_triton_full_range_counters(triton_case):
    case, results = triton_case
    c = case["counters"]
    assert len(results["full"]) == len(case["seeds"])
    for seed, got in zip(case["seeds"], results["full"]):
        ours = torch.stack(philox4x32(seed, c[:, 0], c[:, 1], c[:, 2], c[:, 3]), dim=1)
        bad = (ours != got).any(dim=1).nonzero().flatten().tolist()
        assert not bad, (f"seed {seed:#x}: {len(bad)} counters differ, first {c[bad[0]].tolist()}: "
                         f"ours {ours[bad[0]].tolist()} triton {got[bad[0]].tolist()}")


def test_matches_triton_dropout_tile(triton_case):
    case, results = triton_case
    assert len(results["tile"]) == len(case["tile_args"])
    for (seed, bh), got in zip(case["tile_args"], results["tile"]):
        rows = torch.arange(16).view(16, 1)
        cols = torch.arange(32).view(1, 32)
        ours = philox_uint32(seed, cols, rows, bh, 0)
        assert torch.equal(ours, got), f"seed {seed:#x} bh {bh}"


def test_dropout_threshold():
    assert dropout_threshold(0.0) == 0
    assert dropout_threshold(0.5) == 2**31
    assert dropout_threshold(0.25) == 2**30
    assert dropout_threshold(1.0 - 2**-40) == 2**32 - 1  # clamped: rounds to 2**32
    assert dropout_threshold(1e-12) == round(1e-12 * 2**32)


def test_keep_mask_counters_and_ranges():
    seed, p, b, h, s_q, s_k = 0x1234_5678_9ABC, 0.3, 2, 3, 5, 7
    keep = dropout_keep_mask(seed, p, b, h, s_q, s_k)
    assert keep.shape == (b, h, s_q, s_k) and keep.dtype == torch.bool
    thr = dropout_threshold(p)
    for bi, hi, i, j in [(0, 0, 0, 0), (1, 2, 4, 6), (1, 0, 3, 2), (0, 2, 1, 5)]:
        r = int(philox_uint32(seed, j, i, bi * h + hi, 0))
        assert bool(keep[bi, hi, i, j]) == (r >= thr)
    # a tile equals the matching slice of the full mask
    tile = dropout_keep_mask(seed, p, b, h, s_q, s_k, q_range=(1, 4), k_range=(2, 7))
    assert torch.equal(tile, keep[:, :, 1:4, 2:7])
    # broadcastable-counter form
    bh = torch.arange(b * h).view(b, h, 1, 1)
    assert torch.equal(dropout_keep(seed, p, bh, torch.arange(s_q).view(-1, 1), torch.arange(s_k)), keep)
    # p = 0 keeps everything
    assert dropout_keep_mask(seed, 0.0, b, h, s_q, s_k).all()


def test_keep_rate_is_close_to_one_minus_p():
    seed = int(torch.randint(0, 2**62, ()))
    for p in (0.1, 0.5, 0.9):
        keep = dropout_keep_mask(seed, p, 2, 4, 64, 64)
        rate = keep.float().mean().item()
        # 32768 Bernoulli draws: std of the rate is < 0.003
        assert abs(rate - (1 - p)) < 0.02, (p, rate)
