"""flashattn.fa3: FlashAttention-3's interface (names, argument order, returns, the LSE layout of
its combine), checked against FA3's documented conventions and the float64 oracle."""
from __future__ import annotations

import inspect

import pytest
import torch

import flashattn
from flashattn import fa3
from flashattn.reference import attention_ref

FA3_PARAMS = {
    "flash_attn_func": ["q", "k", "v", "softmax_scale", "causal", "qv", "q_descale",
                        "k_descale", "v_descale", "window_size", "attention_chunk", "softcap",
                        "num_splits", "pack_gqa", "deterministic", "sm_margin",
                        "return_attn_probs"],
    "flash_attn_varlen_func": ["q", "k", "v", "cu_seqlens_q", "cu_seqlens_k", "max_seqlen_q",
                               "max_seqlen_k", "seqused_q", "seqused_k", "softmax_scale",
                               "causal", "qv", "q_descale", "k_descale", "v_descale",
                               "window_size", "attention_chunk", "softcap", "num_splits",
                               "pack_gqa", "deterministic", "sm_margin", "return_attn_probs"],
    "flash_attn_with_kvcache": ["q", "k_cache", "v_cache", "k", "v", "qv", "rotary_cos",
                                "rotary_sin", "cache_seqlens", "cache_batch_idx",
                                "cache_leftpad", "page_table", "cu_seqlens_q",
                                "cu_seqlens_k_new", "max_seqlen_q", "rotary_seqlens",
                                "q_descale", "k_descale", "v_descale", "softmax_scale",
                                "causal", "window_size", "attention_chunk", "softcap",
                                "rotary_interleaved", "scheduler_metadata", "num_splits",
                                "pack_gqa", "sm_margin", "return_softmax_lse"],
    "flash_attn_combine": ["out_partial", "lse_partial", "out", "out_dtype"],
}


@pytest.mark.parametrize("name", sorted(FA3_PARAMS))
def test_fa3_signatures(name):
    params = inspect.signature(getattr(fa3, name)).parameters
    # FA3's names in FA3's order; flashattn's one extension, out=, is keyword-only after them
    extra = [] if name == "flash_attn_combine" else ["out"]
    assert list(params) == FA3_PARAMS[name] + extra
    for n in extra:
        assert params[n].kind is inspect.Parameter.KEYWORD_ONLY


def test_dense_returns_out_or_out_and_lse_and_is_differentiable():
    torch.manual_seed(0)
    q = torch.randn(2, 30, 4, 32, requires_grad=True)
    k = torch.randn(2, 40, 2, 32, requires_grad=True)
    v = torch.randn(2, 40, 2, 32, requires_grad=True)
    with flashattn.use_backend("cpu"):
        out = fa3.flash_attn_func(q, k, v, causal=True, window_size=(8, 0), softcap=3.0)
        out2, lse = fa3.flash_attn_func(q, k, v, causal=True, window_size=(8, 0), softcap=3.0,
                                        return_attn_probs=True)
    ref, ref_lse = attention_ref(q.double(), k.double(), v.double(), causal=True,
                                 window_size=(8, 0), softcap=3.0)
    torch.testing.assert_close(out.double(), ref, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(out2, out)
    torch.testing.assert_close(lse.double(), ref_lse, atol=1e-5, rtol=1e-5)
    out.sum().backward()
    assert q.grad is not None and torch.isfinite(q.grad).all()


def test_varlen_and_kvcache_with_page_table():
    torch.manual_seed(1)
    h, h_k, d = 4, 2, 16
    cu = torch.tensor([0, 5, 12], dtype=torch.int32)
    q, k = torch.randn(12, h, d), torch.randn(12, h_k, d)
    with flashattn.use_backend("cpu"):
        out, lse = fa3.flash_attn_varlen_func(q, k, k, cu, cu, 7, 7, causal=True,
                                              return_attn_probs=True)
        ref = flashattn.flash_attn_varlen_func(q, k, k, cu, cu, 7, 7, causal=True)
    torch.testing.assert_close(out, ref)
    assert lse.shape == (h, 12)
    # paged cache through FA3's page_table name
    qd = torch.randn(2, 1, h, d)
    cache = torch.randn(4, 8, h_k, d)
    table = torch.tensor([[2, 0], [3, 1]], dtype=torch.int32)
    seqlens = torch.tensor([9, 3], dtype=torch.int32)
    with flashattn.use_backend("cpu"):
        a = fa3.flash_attn_with_kvcache(qd, cache, cache, cache_seqlens=seqlens,
                                        page_table=table, causal=True)
        b = flashattn.flash_attn_with_kvcache(qd, cache, cache, cache_seqlens=seqlens,
                                              block_table=table, causal=True)
    torch.testing.assert_close(a, b)


def test_combine_takes_fa3s_lse_layout():
    """Two key halves attended separately, merged by fa3.flash_attn_combine with the LSE as
    (splits, batch, seqlen, nheads): full attention."""
    torch.manual_seed(2)
    q, k, v = torch.randn(2, 5, 3, 16), torch.randn(2, 20, 3, 16), torch.randn(2, 20, 3, 16)
    parts = [attention_ref(q.double(), k[:, sl].double(), v[:, sl].double())
             for sl in (slice(0, 9), slice(9, 20))]
    out_partial = torch.stack([o for o, _ in parts]).float()
    lse_fa3 = torch.stack([lse.transpose(1, 2) for _, lse in parts]).float()  # (2, b, s, h)
    res, lse = fa3.flash_attn_combine(out_partial, lse_fa3)  # FA3 returns (out, lse)
    ref, ref_lse = attention_ref(q.double(), k.double(), v.double())
    torch.testing.assert_close(res.double(), ref, atol=1e-5, rtol=1e-5)
    assert lse.shape == (2, 5, 3)  # FA3's (batch, seqlen, nheads)
    torch.testing.assert_close(lse.double(), ref_lse.transpose(1, 2), atol=1e-5, rtol=1e-5)
    with pytest.raises(ValueError, match="lse_partial"):
        fa3.flash_attn_combine(out_partial, lse_fa3[0])


def test_scheduler_metadata_round_trip():
    meta = fa3.get_scheduler_metadata(2, 1, 64, 4, 2, 16, num_splits=3)
    assert meta.dtype == torch.int32 and meta.device.type == "cpu" and int(meta[0]) == 3
    meta = fa3.get_scheduler_metadata(2, 1, 64, 4, 2, 16)
    assert int(meta[0]) >= 1
    q, cache = torch.randn(2, 1, 4, 16), torch.randn(2, 64, 2, 16)
    seqlens = torch.tensor([64, 10], dtype=torch.int32)
    with flashattn.use_backend("cpu"):
        a = fa3.flash_attn_with_kvcache(q, cache, cache, cache_seqlens=seqlens,
                                        scheduler_metadata=meta)
        b = flashattn.flash_attn_with_kvcache(q, cache, cache, cache_seqlens=seqlens)
    torch.testing.assert_close(a, b)


def _fp8_varlen(q8, **kw):
    cu = torch.tensor([0, 4], dtype=torch.int32)
    return fa3.flash_attn_varlen_func(q8[0], q8[0], q8[0], cu, cu, 4, 4, **kw)


@pytest.mark.parametrize("call,name", [
    (lambda q8: _fp8_varlen(q8, return_attn_probs=True), "return_attn_probs"),
], ids=["fp8-varlen-lse"])
def test_unsupported_fa3_arguments_raise_naming_them(call, name):
    """What flashattn.fa3 does not implement yet raises NotImplementedError naming it (qv in
    the dense / varlen calls: tests/api/test_fa3_qv.py; attention_chunk / seqused_q with FP8
    inputs: tests/api/test_fp8_attention.py)."""
    q8 = torch.randn(1, 4, 2, 16).to(torch.float8_e4m3fn)
    with flashattn.use_backend("cpu"), pytest.raises(NotImplementedError, match=name):
        call(q8)


def test_kvcache_q_descale_needs_an_fp8_query():
    """FP8 queries (and KV caches) in the KV-cache call: tests/api/test_kvcache_fp8.py; a
    q_descale beside a 16/32-bit q names the argument."""
    q = torch.randn(1, 4, 2, 16)
    with flashattn.use_backend("cpu"), pytest.raises(ValueError, match="q_descale was given"):
        fa3.flash_attn_with_kvcache(q, q, q, q_descale=torch.ones(1, 2))


def test_fp8_through_fa3_returns_out_and_lse():
    torch.manual_seed(3)
    q8, k8 = (torch.randn(1, 20, 2, 16) * 3).to(torch.float8_e4m3fn), \
        (torch.randn(1, 20, 2, 16) * 3).to(torch.float8_e4m3fn)
    d = torch.full((1, 2), 0.5)
    with flashattn.use_backend("cpu"):
        out, lse = fa3.flash_attn_func(q8, k8, k8, q_descale=d, k_descale=d, v_descale=d,
                                       causal=True, return_attn_probs=True)
    x = q8.double() * 0.5
    ref, ref_lse = attention_ref(x, k8.double() * 0.5, k8.double() * 0.5, causal=True)
    assert out.dtype == torch.bfloat16
    torch.testing.assert_close(out.double(), ref, atol=2e-2, rtol=1e-2)
    torch.testing.assert_close(lse.double(), ref_lse, atol=1e-4, rtol=1e-4)


def test_window_sides_follow_fa3_or_raise(cpu_backend):
    """FA3 masks with a window side as given; flash-attn 2 (the library's rule) counts a side
    >= seqlen_k as unbounded. Where the two masks agree the call matches the oracle with the
    side as given (attention_ref applies no clamp); where they differ (a right side in
    [seqlen_k, seqlen_q - 1): more queries than keys) every entry point raises naming it."""
    torch.manual_seed(0)
    s_q, s_k, h, d = 10, 3, 2, 16
    q, k, v = torch.randn(1, s_q, h, d), torch.randn(1, s_k, h, d), torch.randn(1, s_k, h, d)
    for window in [(-1, 2), (-1, 9), (-1, 20), (1, 1), (5, -1), (2, 12)]:
        out, lse = fa3.flash_attn_func(q, k, v, window_size=window, return_attn_probs=True)
        ref, ref_lse = attention_ref(q.double(), k.double(), v.double(), window_size=window)
        torch.testing.assert_close(out.double(), ref, atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(lse.double(), ref_lse, atol=1e-5, rtol=1e-5)
    cu_q = torch.tensor([0, s_q], dtype=torch.int32)
    cu_k = torch.tensor([0, s_k], dtype=torch.int32)
    for window in [(-1, 3), (-1, 8)]:
        with pytest.raises(NotImplementedError, match=r"window_size\[1\]"):
            fa3.flash_attn_func(q, k, v, window_size=window)
        with pytest.raises(NotImplementedError, match=r"window_size\[1\].*max_seqlen_k"):
            fa3.flash_attn_varlen_func(q[0], k[0], v[0], cu_q, cu_k, s_q, s_k,
                                       window_size=window)
        with pytest.raises(NotImplementedError, match=r"window_size\[1\].*cache capacity"):
            fa3.flash_attn_with_kvcache(q, k, v, cache_seqlens=s_k, window_size=window)
    # causal sets the right side to 0: any window with it is flash-attn 2's and FA3's mask
    fa3.flash_attn_func(q, k, v, causal=True, window_size=(-1, 8))
