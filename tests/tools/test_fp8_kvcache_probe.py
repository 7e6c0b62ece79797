"""benchmarks/probes/fp8_kvcache_probe.py's pure parts on CPU (the probe itself needs a GPU):
the bytes it divides by, the round summary, the cache quantization it times against and the
page scatter; it parses its defaults and declines politely without CUDA."""
import os
import sys

import pytest
import torch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "benchmarks", "probes"))

import fp8_kvcache_probe as probe  # noqa: E402


def test_cache_bytes_counts_k_and_v_once():
    assert probe.cache_bytes(64, 32768, 8, 128, 1) == 64 * 32768 * 8 * 128 * 2
    assert probe.cache_bytes(1, 131072, 8, 128, 2) == 2 * probe.cache_bytes(1, 131072, 8, 128, 1)


def test_summarize_is_min_and_median_of_rounds():
    assert probe.summarize([3.0, 1.0, 2.0]) == (1.0, 2.0)


def test_quantize_cache_round_trips_within_e4m3():
    x = torch.randn(2, 64, 3, 16, dtype=torch.bfloat16)
    x[1, :, 2] = 0  # an all-zero (sequence, head): descale 1, no NaN
    x8, descale = probe.quantize_cache(x)
    assert x8.dtype == torch.float8_e4m3fn and descale.shape == (2, 3)
    assert descale[1, 2] == 1.0
    back = probe.dequantize(x8, descale, torch.float32)
    err = (back - x.float()).abs()
    assert torch.isfinite(back).all()
    assert (err <= 2.0**-4 * x.float().abs() + descale[:, None, :, None] * 2.0**-9).all()


def test_paged_scatter_matches_the_block_table():
    x = torch.randn(2, 8, 1, 4)
    perm = torch.randperm(8)
    pages = probe.paged(x, 2, perm)
    table = perm.view(2, 4)
    for b in range(2):
        assert torch.equal(pages[table[b]].reshape(8, 1, 4), x[b])


def test_defaults_and_no_cuda_exit():
    args = probe.parse_args(["--out", "x.json"])
    assert (args.rounds, args.shapes, args.page) == (3, "64x32768,1x131072", 0)
    if torch.cuda.is_available():
        pytest.skip("a GPU is present: the probe would run")
    assert probe.main(["--out", os.devnull]) == 2
