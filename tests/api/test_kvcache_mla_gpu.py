"""Multi-head latent attention decoding (FlashAttention-3's ``qv``) on a CUDA GPU, at DeepSeek's
sizes: 128 query heads over one latent KV head, q 64 wide (rotary part), qv and v_cache 512
wide, pages of 64, 8k keys, bf16, with and without an FP8 (e4m3) latent cache; CUDA-graph
capture and replay of a decode step.

Run on the device machine: ``python3 -m pytest -q -m gpu tests/api/test_kvcache_mla_gpu.py``.
"""
from __future__ import annotations

from dataclasses import replace

import pytest
import torch

from tests.accuracy import assert_close_rule
from tests.api.test_kvcache_mla import (MLACase, _expected_caches, check_mla, mla_inputs,
                                        mla_reference)
from flashattn import fa3

pytestmark = pytest.mark.gpu

DEEPSEEK = MLACase(b=4, h=128, h_k=1, d=64, d_v=512, page=64, s_cache=8192, s_new=1,
                   num_splits=0, dtype=torch.bfloat16)

GPU_CASES = {
    "decode": DEEPSEEK,
    "decode-fp8": replace(DEEPSEEK, fp8=True),
    "no-append-empty-row": replace(DEEPSEEK, s_new=0, empty_row=True),
    "mtp-sq2-causal": replace(DEEPSEEK, s_q=2, s_new=2, causal=True),  # speculative decode
    "fp8-sq4-causal-splits": replace(DEEPSEEK, fp8=True, s_q=4, s_new=4, causal=True,
                                     num_splits=7),
    "fp16-contiguous": replace(DEEPSEEK, page=None, s_cache=4096, dtype=torch.float16),
    "page1": replace(DEEPSEEK, b=2, page=1, s_cache=600),
    "gqa-2-kv-heads": replace(DEEPSEEK, h=32, h_k=2, num_splits=3),
    "packed-append": replace(DEEPSEEK, packed=True, s_q=2, s_new=2, causal=True),
    "noqv-dv512": replace(DEEPSEEK, latent=False),
    "noqv-dv512-fp8": replace(DEEPSEEK, latent=False, fp8=True),
}


@pytest.mark.parametrize("case", list(GPU_CASES.values()), ids=list(GPU_CASES))
def test_mla_kvcache_gpu(case: MLACase) -> None:
    check_mla(case, "cuda")


@pytest.mark.parametrize("fp8", [False, True], ids=["bf16", "fp8"])
def test_cuda_graph_mla_decode_step(fp8: bool) -> None:
    """Capture append + MLA attention once (FA3's API, page_table); replay with new
    cache_seqlens values, new tokens, new q / qv: each replay matches the oracle."""
    c = replace(DEEPSEEK, fp8=fp8, s_cache=2048)
    x = {k: v.cuda() if isinstance(v, torch.Tensor) else v for k, v in mla_inputs(c).items()}

    def step():
        return fa3.flash_attn_with_kvcache(
            x["q"], x["k_cache"], x["v_cache"], x["k"], x["v"], qv=x["qv"],
            cache_seqlens=x["cache_seqlens"], page_table=x["block_table"],
            k_descale=x.get("k_descale"), v_descale=x.get("v_descale"),
            return_softmax_lse=True)

    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):  # (warm-up: compiles outside the capture)
        for _ in range(2):
            step()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out, lse = step()
    for i in range(3):
        x["cache_seqlens"].copy_(torch.randint(0, 2047, (c.b,), dtype=torch.int32))
        for n in ("q", "qv", "k", "v"):
            x[n].copy_(torch.randn_like(x[n]))
        before = {n: t.cpu() if isinstance(t, torch.Tensor) else t for n, t in x.items()}
        graph.replay()
        torch.cuda.synchronize()
        k_after, v_after = _expected_caches(before, c)
        bits = (lambda t: t.view(torch.uint8)) if fp8 else (lambda t: t)
        assert torch.equal(bits(x["k_cache"].cpu()), bits(k_after)), f"k_cache, replay {i}"
        assert torch.equal(bits(x["v_cache"].cpu()), bits(v_after)), f"v_cache, replay {i}"
        ref, ref_lse = mla_reference(before, c, k_after, v_after, upcast=True)
        low, low_lse = mla_reference(before, c, k_after, v_after, upcast=False)
        assert_close_rule(out, ref, low, name=f"out, replay {i}")
        assert_close_rule(lse, ref_lse, low_lse.float(), atol=1e-4, name=f"lse, replay {i}")


@pytest.mark.parametrize("fp8", [False, True], ids=["bf16", "fp8"])
def test_repeated_qv_calls_replay_the_recorded_decode(fp8: bool, monkeypatch) -> None:
    """MLA decode steps of one signature at DeepSeek's sizes (FA3's API, pages of 64): calls 2
    and 3, with fresh q / qv and new lengths, replay the recorded decode launches (the eager
    fast path), give the full path's bits, and match the oracle."""
    from flashattn.api import fastpath
    from flashattn.runtime.launch import LaunchPlan

    replays = []
    replay = LaunchPlan.replay
    monkeypatch.setattr(LaunchPlan, "replay",
                        lambda self, values: replays.append(1) or replay(self, values))
    c = replace(DEEPSEEK, fp8=fp8, s_new=0, s_cache=4096)
    x = {k: v.cuda() if isinstance(v, torch.Tensor) else v for k, v in mla_inputs(c).items()}
    kw = dict(cache_seqlens=x["cache_seqlens"], page_table=x["block_table"],
              k_descale=x.get("k_descale"), v_descale=x.get("v_descale"),
              return_softmax_lse=True)
    fastpath.KVCACHE.clear()
    try:
        for i in range(3):
            x["cache_seqlens"].copy_(torch.randint(1, 4096, (c.b,), dtype=torch.int32))
            for n in ("q", "qv"):
                x[n].copy_(torch.randn_like(x[n]))
            before = {n: t.cpu() if isinstance(t, torch.Tensor) else t for n, t in x.items()}
            out, lse = fa3.flash_attn_with_kvcache(x["q"], x["k_cache"], x["v_cache"],
                                                   qv=x["qv"], **kw)
            assert len(fastpath.KVCACHE._entries) == 1, f"call {i}: one signature"
            if i > 0:
                assert replays, f"call {i} did not replay the recorded launch"
                fastpath.KVCACHE.clear()  # the full path, for its bits
                full, full_lse = fa3.flash_attn_with_kvcache(x["q"], x["k_cache"], x["v_cache"],
                                                             qv=x["qv"], **kw)
                assert torch.equal(out, full) and torch.equal(lse, full_lse), f"call {i}"
            k_after, v_after = _expected_caches(before, c)
            ref, ref_lse = mla_reference(before, c, k_after, v_after, upcast=True)
            low, low_lse = mla_reference(before, c, k_after, v_after, upcast=False)
            assert_close_rule(out, ref, low, name=f"out, call {i}")
            assert_close_rule(lse, ref_lse, low_lse.float(), atol=1e-4, name=f"lse, call {i}")
    finally:
        fastpath.KVCACHE.clear()
