"""FP8 KV cache (and FA3's FP8 query) in flash_attn_with_kvcache on a CUDA GPU: the CPU grid's
checks (tests/api/test_kvcache_fp8.py: float64 reference on the dequantized cache by
flash-attn's rule, appended bytes by the quantize rule) at realistic sizes, then the replays
that must equal the full call bit for bit: the recorded-call fast path, plan_decode's run and
CUDA-graph capture.

Run on the device machine: ``python3 -m pytest -q -m gpu tests/api/test_kvcache_fp8_gpu.py``.
"""
from __future__ import annotations

from dataclasses import replace

import pytest
import torch

import flashattn
from flashattn import flash_attn_with_kvcache
from tests.api.test_kvcache import KVCase
from tests.api.test_kvcache_fp8 import (FP8, _fp8_inputs, check_case, check_k_casts,
                                        check_v_byte_pairs, k_byte_pairs)

pytestmark = pytest.mark.gpu

# GQA 32 / 8, d 128, bf16 (q's dtype, or the reference's for an FP8 q), 8 sequences
BIG = KVCase(b=8, s_cache=4096, h=32, h_k=8, d=128, dtype=torch.bfloat16, num_splits=0)

# (case, FP8 q, FP8 new k / v)
_CASES = {
    "contig-16k": (replace(BIG, s_cache=16384), False, False),
    "contig-16k-fp16": (replace(BIG, s_cache=16384, dtype=torch.float16), False, False),
    "page1": (replace(BIG, page=1), False, False),
    "page3": (replace(BIG, page=3, s_cache=4098, s_new=1), False, False),
    "page64-8k": (replace(BIG, page=64, s_cache=8192, s_new=1), False, True),
    "append-rotary": (replace(BIG, s_new=1, rotary="neox"), False, False),
    "append4-causal-rotary": (replace(BIG, s_q=4, s_new=4, causal=True, rotary="interleaved"),
                              False, True),
    "mqa-splits7": (replace(BIG, h=16, h_k=1, num_splits=7, s_cache=8192), False, False),
    "one-split": (replace(BIG, num_splits=1), False, False),
    "b1-16k-splits": (replace(BIG, b=1, s_cache=16384), False, False),
    "d64-fp16": (replace(BIG, d=64, dtype=torch.float16, s_new=1), False, False),
    "d256": (replace(BIG, d=256, s_new=1, s_cache=2048), False, False),
    "window-leftpad": (replace(BIG, s_q=4, causal=True, window=(300, 0), leftpad=True),
                       False, False),
    "q8-contig": (replace(BIG, s_cache=16384), True, False),
    "q8-page16-rotary": (replace(BIG, page=16, s_new=1, rotary="neox"), True, True),
    "q8-page1-splits3": (replace(BIG, page=1, num_splits=3, s_new=1), True, False),
    "q8-append4-causal": (replace(BIG, s_q=4, s_new=4, causal=True, page=64), True, True),
    "q8-b1-16k": (replace(BIG, b=1, s_cache=16384), True, False),
}


@pytest.mark.parametrize("case,fp8_q,fp8_new", _CASES.values(), ids=list(_CASES))
def test_kvcache_fp8_gpu(case: KVCase, fp8_q: bool, fp8_new: bool) -> None:
    check_case(case, fp8_q=fp8_q, fp8_new=fp8_new, device="cuda")


@pytest.mark.parametrize("case", [BIG, replace(BIG, page=64, num_splits=3),
                                  replace(BIG, d=64, page=1, dtype=torch.float16),
                                  replace(BIG, d=96, b=2, s_cache=1000)],
                         ids=["contig", "page64-splits3", "d64-fp16-page1", "d96"])
def test_v_byte_pairs_gpu(case: KVCase, monkeypatch) -> None:
    check_v_byte_pairs(case, monkeypatch, device="cuda")


@pytest.mark.parametrize("case,fp8_q", [(BIG, False), (replace(BIG, page=64, s_new=1), False),
                                        (replace(BIG, d=64, page=1, dtype=torch.float16), False),
                                        (replace(BIG, d=256, s_cache=2048), False),
                                        (replace(BIG, page=16, s_new=1, rotary="neox"), True)],
                         ids=["contig", "page64-append", "d64-fp16-page1", "d256", "q8-page16"])
def test_k_byte_pairs_gpu(case: KVCase, fp8_q: bool, monkeypatch) -> None:
    """decode.K_PAIRS (the default) at real sizes: the accuracy rule."""
    with k_byte_pairs(monkeypatch) as taken:
        check_case(case, fp8_q=fp8_q, device="cuda")
    assert taken and all(taken)


@pytest.mark.parametrize("case", [BIG, replace(BIG, page=64, num_splits=3)],
                         ids=["contig", "page64-splits3"])
def test_k_casts_gpu(case: KVCase, monkeypatch) -> None:
    check_k_casts(case, monkeypatch, device="cuda")


def test_fa3_kvcache_fp8_query_gpu() -> None:
    check_case(replace(BIG, page=16, s_new=2, s_q=2, causal=True, rotary="interleaved"),
               fa3_api=True, fp8_q=True, fp8_new=True, device="cuda")


def _step_inputs(c: KVCase, fp8_q: bool, fp8_new: bool, steps: int):
    """``steps`` call inputs of one signature: the first call's, then new queries, new rows,
    new lengths and new descale values (same shapes, same tensors' metadata)."""
    x = _fp8_inputs(c, fp8_q, fp8_new, "cuda")
    out = []
    for _ in range(steps):
        out.append(dict(x))
        x = dict(x)
        x["q"] = (torch.randn_like(x["q"].float()) * 4).to(x["q"].dtype)
        if x["k"] is not None:
            hi = c.s_cache - c.s_new
            x["cache_seqlens"] = torch.randint(0, hi + 1, (c.b,), dtype=torch.int32,
                                               device="cuda")
            for n in ("k", "v"):
                x[n] = (torch.randn_like(x[n].float()) * 4).to(x[n].dtype)
        for n in ("q_descale", "k_descale", "v_descale"):
            if x[n] is not None:
                x[n] = torch.rand_like(x[n]) + 0.25
    return out


def _call(c: KVCase, x: dict, kc: torch.Tensor, vc: torch.Tensor):
    return flash_attn_with_kvcache(
        x["q"], kc, vc, x["k"], x["v"], rotary_cos=x["rotary_cos"], rotary_sin=x["rotary_sin"],
        cache_seqlens=x["cache_seqlens"], block_table=x["block_table"], causal=c.causal,
        rotary_interleaved=c.rotary != "neox", num_splits=c.num_splits,
        return_softmax_lse=True, q_descale=x["q_descale"], k_descale=x["k_descale"],
        v_descale=x["v_descale"])


def _same(a: torch.Tensor, b: torch.Tensor) -> bool:
    if a.dtype == FP8:
        a, b = a.view(torch.uint8), b.view(torch.uint8)
    return torch.equal(a, b)


_REPLAY = {
    "contig-append-rotary": (replace(BIG, b=2, s_new=1, rotary="neox"), False, False),
    "paged16-fp8-rows": (replace(BIG, b=2, page=16, s_new=1), False, True),
    "q8-paged64-rotary": (replace(BIG, b=2, page=64, s_new=1, rotary="interleaved"),
                          True, True),
    "q8-b1-splits": (replace(BIG, b=1, s_cache=16384), True, False),
}


@pytest.mark.parametrize("case,fp8_q,fp8_new", _REPLAY.values(), ids=list(_REPLAY))
def test_fast_path_replays_the_full_path_bitwise(case, fp8_q, fp8_new, monkeypatch) -> None:
    """Calls 2.. of an FP8 signature replay the recorded decode launch (LaunchPlan.replay
    ran) and equal the full path bit for bit: out, lse and the appended cache bytes."""
    from flashattn.api import fastpath
    from flashattn.runtime.launch import LaunchPlan

    replays = []
    replay = LaunchPlan.replay
    monkeypatch.setattr(LaunchPlan, "replay",
                        lambda self, values: replays.append(1) or replay(self, values))
    steps = _step_inputs(case, fp8_q, fp8_new, 4)
    init = (steps[0]["k_cache"], steps[0]["v_cache"])
    fastpath.KVCACHE.clear()
    kc, vc = init[0].clone(), init[1].clone()
    fast = []
    for x in steps:
        out, lse = _call(case, x, kc, vc)
        fast.append((out.clone(), lse.clone(), kc.clone(), vc.clone()))
    assert replays, "the repeated FP8 calls never replayed the recorded launch"
    kc, vc = init[0].clone(), init[1].clone()
    for i, x in enumerate(steps):
        fastpath.KVCACHE.clear()  # the full path
        out, lse = _call(case, x, kc, vc)
        for got, want, n in zip(fast[i], (out, lse, kc, vc), ("out", "lse", "k_cache",
                                                              "v_cache")):
            assert _same(got, want), f"{n} differs at step {i}"
    fastpath.KVCACHE.clear()


@pytest.mark.parametrize("page", [None, 16], ids=["contiguous", "paged16"])
@pytest.mark.parametrize("fp8_q", [False, True], ids=["q16", "q8"])
def test_plan_decode_fp8_bitwise_and_in_a_cuda_graph(page, fp8_q) -> None:
    """plan_decode(kv_dtype=float8_e4m3fn).run equals the call bit for bit; captured once in
    a CUDA graph and replayed with new lengths and descale values written into the captured
    tensors, it equals the eager call at those values."""
    c = replace(BIG, b=4, page=page, s_cache=8192)
    x = _fp8_inputs(c, fp8_q, False, "cuda")
    cap = c.s_cache if page is None else x["block_table"].shape[1] * page
    plan = flashattn.plan_decode(c.b, c.h, c.h_k, c.d, max_seqlen_k=cap, page_size=page,
                                 dtype=x["q"].dtype, kv_dtype=FP8, causal=False)
    fp8 = {n: x[n] for n in ("q_descale", "k_descale", "v_descale")}
    args = (x["q"], x["k_cache"], x["v_cache"], x["cache_seqlens"], x["block_table"])

    def call():
        return flash_attn_with_kvcache(x["q"], x["k_cache"], x["v_cache"],
                                       cache_seqlens=x["cache_seqlens"],
                                       block_table=x["block_table"], return_softmax_lse=True,
                                       **fp8)

    out, lse = plan.run(*args, return_softmax_lse=True, **fp8)
    want, want_lse = call()
    assert torch.equal(out, want) and torch.equal(lse, want_lse)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        g_out, g_lse = plan.run(*args, return_softmax_lse=True, **fp8)
    for _ in range(3):
        x["cache_seqlens"].copy_(torch.randint(1, cap + 1, (c.b,), dtype=torch.int32))
        for d in fp8.values():
            if d is not None:
                d.copy_(torch.rand_like(d) + 0.25)
        graph.replay()
        want, want_lse = call()
        torch.cuda.synchronize()
        assert torch.equal(g_out, want) and torch.equal(g_lse, want_lse)


@pytest.mark.parametrize("page", [None, 16], ids=["contiguous", "paged16"])
@pytest.mark.parametrize("fp8_q", [False, True], ids=["q16", "q8"])
def test_cuda_graph_decode_step_equals_eager(page, fp8_q) -> None:
    """An FP8 decode step (append with rotary + attention) captured once after warm-up
    calls, replayed with new lengths, rows, queries and descale values: out and both caches
    equal the eager call's on the same inputs, bit for bit (no host read in the step: the
    capture itself would fail on one)."""
    c = replace(BIG, b=4, s_new=1, rotary="neox", page=page, s_cache=4096)
    static = _fp8_inputs(c, fp8_q, fp8_q, "cuda")
    kc, vc = static["k_cache"], static["v_cache"]
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):  # warm-up: compiles, records the signature
        for _ in range(2):
            _call(c, static, kc, vc)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        g_out, g_lse = _call(c, static, kc, vc)
    for step in range(3):
        static["cache_seqlens"].copy_(torch.randint(0, c.s_cache - 1, (c.b,),
                                                    dtype=torch.int32))
        for n in ("q", "k", "v"):
            t = static[n]
            t.copy_((torch.randn_like(t.float()) * 4).to(t.dtype))
        for n in ("q_descale", "k_descale", "v_descale"):
            if static[n] is not None:
                static[n].copy_(torch.rand_like(static[n]) + 0.25)
        kc0, vc0 = kc.clone(), vc.clone()
        graph.replay()
        out, lse = _call(c, static, kc0, vc0)
        torch.cuda.synchronize()
        assert _same(g_out, out) and _same(g_lse, lse), f"graph replay {step}"
        assert _same(kc, kc0) and _same(vc, vc0), f"caches after graph replay {step}"
