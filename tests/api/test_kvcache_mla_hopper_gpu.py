"""The Hopper MLA decode kernel (``flashattn/backends/sm90/latent_kernel.py``) on an sm90 GPU:
KV-cache calls with FlashAttention-3's ``qv`` that it covers (16-bit, one latent KV head of
64 + 512, pages of a multiple of 64 keys or a contiguous cache, causal or not) run on it and
match the float64 oracle by flash-attn's rule; unused cache slots holding NaN change nothing;
calls it does not cover still run (the portable decode kernel).

Run on the device machine: ``python3 -m pytest -q -m gpu tests/api/test_kvcache_mla_hopper_gpu.py``.
"""
from __future__ import annotations

from dataclasses import replace

import pytest
import torch

from tests.accuracy import assert_close_rule
from tests.api.test_kvcache_mla import MLACase, check_mla, mla_inputs, mla_reference
from flashattn import fa3

pytestmark = pytest.mark.gpu

DEEPSEEK = MLACase(b=4, h=128, h_k=1, d=64, d_v=512, page=64, s_cache=8192, s_new=1,
                   num_splits=0, dtype=torch.bfloat16)

COVERED = {
    "page64-append": DEEPSEEK,
    "page128-empty-row": replace(DEEPSEEK, b=3, page=128, s_cache=1000, s_new=0,
                                 empty_row=True),
    "contiguous-one-split": replace(DEEPSEEK, page=None, s_cache=3000, num_splits=1),
    "contiguous-splits-past-short-rows": replace(DEEPSEEK, page=None, s_cache=700,
                                                 num_splits=9),
    "fp16-sq3-causal": replace(DEEPSEEK, s_q=3, s_new=3, causal=True, s_cache=1500,
                               dtype=torch.float16),
    # 16 heads x 8 positions: a 64-row tile holds 4 query positions, each with its own diagonal
    "h16-sq8-causal-splits": replace(DEEPSEEK, h=16, s_q=8, s_new=8, causal=True,
                                     s_cache=900, num_splits=4),
    "batch64-one-wave": replace(DEEPSEEK, b=64, s_cache=1024, s_new=0),
    # pages smaller than a key block: one TMA box per page
    "page16-append": replace(DEEPSEEK, b=3, page=16, s_cache=1000),
    "page32-sq2-causal-splits": replace(DEEPSEEK, b=3, page=32, s_cache=700, s_q=2, s_new=2,
                                        causal=True, num_splits=5),
    "page8-empty-row": replace(DEEPSEEK, b=3, page=8, s_cache=300, s_new=0, empty_row=True),
    # e4m3 latent caches, widened in shared memory (appends quantized with the descales)
    "fp8-page64-append": replace(DEEPSEEK, b=3, fp8=True, s_cache=1000),
    "fp8-contiguous-sq2-causal-splits": replace(DEEPSEEK, b=3, fp8=True, page=None,
                                                s_cache=700, s_q=2, s_new=2, causal=True,
                                                num_splits=5),
    "fp8-page16": replace(DEEPSEEK, b=2, fp8=True, page=16, s_cache=600),
}
NOT_COVERED = {
    "page12": replace(DEEPSEEK, b=2, page=12, s_cache=600),
    "two-kv-heads": replace(DEEPSEEK, b=2, h=32, h_k=2, s_cache=600),
}


@pytest.fixture
def hopper_calls(monkeypatch):
    """The MLA decode kernel's full launches during the test (a list that grows by one per
    launch that is not a replay: every call here is its signature's first, the eager fast
    path's cache emptied first)."""
    from flashattn.api import fastpath
    from flashattn.backends.sm90 import latent

    fastpath.KVCACHE.clear()
    calls = []
    launch = latent.latent_decode
    monkeypatch.setattr(latent, "latent_decode",
                        lambda *a, **kw: calls.append(1) or launch(*a, **kw))
    return calls


@pytest.mark.parametrize("case", list(COVERED.values()), ids=list(COVERED))
def test_covered_calls_run_the_hopper_kernel(case: MLACase, hopper_calls) -> None:
    check_mla(case, "cuda")
    assert hopper_calls, "the Hopper MLA decode kernel did not run"


@pytest.mark.parametrize("case", list(NOT_COVERED.values()), ids=list(NOT_COVERED))
def test_other_calls_run_the_portable_kernel(case: MLACase, hopper_calls) -> None:
    check_mla(case, "cuda")
    assert not hopper_calls


@pytest.mark.parametrize("page", [64, 16, None], ids=["page64", "page16", "contiguous"])
def test_nan_in_unused_cache_slots_changes_nothing(page, hopper_calls) -> None:
    """Cache slots past each row's keys hold NaN (a freshly allocated cache may): the last
    key block of a row reads them, masks their scores and must zero their V rows before
    P V multiplies them by 0; the result is the oracle's on the clean cache."""
    c = replace(DEEPSEEK, b=4, page=page, s_cache=777, s_new=0)
    x = mla_inputs(c)
    x["cache_seqlens"] = torch.tensor([1, 65, 777, 300], dtype=torch.int32)
    ref, ref_lse = mla_reference(x, c, x["k_cache"], x["v_cache"], upcast=True)
    low, low_lse = mla_reference(x, c, x["k_cache"], x["v_cache"], upcast=False)
    kc, vc = x["k_cache"].clone(), x["v_cache"].clone()
    for row, n in enumerate(x["cache_seqlens"].tolist()):
        span = kc.shape[1] * (x["block_table"].shape[1] if page else 1)
        pos = torch.arange(n, span)
        if page:
            pages = x["block_table"][row].long()[pos // page]
            kc[pages, pos % page] = float("nan")
            vc[pages, pos % page] = float("nan")
        else:
            kc[row, pos] = float("nan")
            vc[row, pos] = float("nan")
    dev = lambda t: None if t is None else t.cuda()  # noqa: E731
    out, lse = fa3.flash_attn_with_kvcache(
        dev(x["q"]), kc.cuda(), vc.cuda(), qv=dev(x["qv"]), cache_seqlens=dev(x["cache_seqlens"]),
        page_table=dev(x["block_table"]), return_softmax_lse=True)
    assert hopper_calls
    assert torch.isfinite(out).all() and torch.isfinite(lse).all()
    assert_close_rule(out.cpu(), ref, low, name="out")
    assert_close_rule(lse.cpu(), ref_lse, low_lse.float(), atol=1e-4, name="lse")


def test_hopper_and_portable_kernels_agree() -> None:
    """The same decode step on both kernel families (``use_backend("portable")`` for the
    second): LSE within 1e-4, outputs within 2 % of their largest value."""
    import flashattn

    c = replace(DEEPSEEK, b=8, s_cache=4096, s_new=0)
    x = {k: v.cuda() if isinstance(v, torch.Tensor) else v for k, v in mla_inputs(c).items()}
    kw = dict(qv=x["qv"], cache_seqlens=x["cache_seqlens"], page_table=x["block_table"],
              return_softmax_lse=True)
    out_h, lse_h = fa3.flash_attn_with_kvcache(x["q"], x["k_cache"], x["v_cache"], **kw)
    with flashattn.use_backend("portable"):
        out_p, lse_p = fa3.flash_attn_with_kvcache(x["q"], x["k_cache"], x["v_cache"], **kw)
    assert (lse_h - lse_p).abs().max().item() < 1e-4
    scale = out_p.float().abs().max().item()
    assert (out_h.float() - out_p.float()).abs().max().item() < 2e-2 * scale
