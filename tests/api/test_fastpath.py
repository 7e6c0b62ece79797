"""The repeated-call fast path (api/fastpath.py, issue 21): a call signature seen before skips
the argument checks and dispatch. It must give the full path's results, and it must never
skip a check whose outcome could differ: other types, settings, alignment, gradients or
metadata values take the full path (or keep being checked)."""
from __future__ import annotations

import pytest
import torch

import flashattn
from flashattn import dispatch
from flashattn.api import fastpath


@pytest.fixture(autouse=True)
def _empty_caches():
    fastpath.DENSE.clear()
    fastpath.KVCACHE.clear()
    yield
    fastpath.DENSE.clear()
    fastpath.KVCACHE.clear()


def test_dense_hits_and_matches_the_full_path():
    torch.manual_seed(0)
    q, k, v = (torch.randn(2, 9, 4, 16) for _ in range(3))
    first, lse1, _ = flashattn.flash_attn_func(q, k, v, causal=True, return_attn_probs=True)
    assert len(fastpath.DENSE._entries) == 1
    calls = []
    real = fastpath.DENSE.get
    fastpath.DENSE.get = lambda key: calls.append(key) or real(key)
    try:
        q2, k2, v2 = (torch.randn(2, 9, 4, 16) for _ in range(3))
        out, lse, none = flashattn.flash_attn_func(q2, k2, v2, causal=True,
                                                   return_attn_probs=True)
    finally:
        fastpath.DENSE.get = real
    assert calls and none is None
    fastpath.DENSE.clear()  # a miss: the full path
    full, full_lse, _ = flashattn.flash_attn_func(q2, k2, v2, causal=True,
                                                 return_attn_probs=True)
    torch.testing.assert_close(out, full, atol=1e-6, rtol=1e-6)
    torch.testing.assert_close(lse, full_lse, atol=1e-5, rtol=1e-5)


def test_the_lse_flags_are_part_of_the_signature():
    """A signature that drops the LSE may run without one (need_lse=False: the decode path then
    keeps it in a reused workspace); the same shapes asking for it are another signature and
    get the LSE, equal to the full path's."""
    torch.manual_seed(1)
    q, k, v = (torch.randn(2, 9, 4, 16) for _ in range(3))
    for _ in range(2):
        out = flashattn.flash_attn_func(q, k, v, causal=True)
    assert isinstance(out, torch.Tensor) and len(fastpath.DENSE._entries) == 1
    for _ in range(2):
        out2, lse, _ = flashattn.flash_attn_func(q, k, v, causal=True, return_attn_probs=True)
    assert len(fastpath.DENSE._entries) == 2 and isinstance(lse, torch.Tensor)
    fastpath.DENSE.clear()
    full, full_lse, _ = flashattn.flash_attn_func(q, k, v, causal=True, return_attn_probs=True)
    torch.testing.assert_close(out, full)
    torch.testing.assert_close(out2, full)
    torch.testing.assert_close(lse, full_lse)

    qd = torch.randn(2, 1, 4, 16)
    kc, vc = torch.randn(2, 12, 2, 16), torch.randn(2, 12, 2, 16)
    lens = torch.tensor([5, 11], dtype=torch.int32)
    for _ in range(2):
        out = flashattn.flash_attn_with_kvcache(qd, kc, vc, cache_seqlens=lens, causal=True)
    assert isinstance(out, torch.Tensor)
    for _ in range(2):
        out2, lse = flashattn.flash_attn_with_kvcache(qd, kc, vc, cache_seqlens=lens,
                                                      causal=True, return_softmax_lse=True)
    assert len(fastpath.KVCACHE._entries) == 2 and lse.shape == (2, 4, 1)
    fastpath.KVCACHE.clear()
    full, full_lse = flashattn.flash_attn_with_kvcache(qd, kc, vc, cache_seqlens=lens,
                                                       causal=True, return_softmax_lse=True)
    torch.testing.assert_close(out, full)
    torch.testing.assert_close(out2, full)
    torch.testing.assert_close(lse, full_lse)


def test_other_types_are_checked_again():
    q = torch.randn(1, 8, 2, 16)
    flashattn.flash_attn_func(q, q, q, window_size=(1, 2))
    with pytest.raises(TypeError, match="window_size"):
        flashattn.flash_attn_func(q, q, q, window_size=(1.0, 2.0))
    flashattn.flash_attn_func(q, q, q, softmax_scale=0.5)
    with pytest.raises(ValueError, match="softmax_scale"):
        flashattn.flash_attn_func(q, q, q, softmax_scale=-0.5)
    with pytest.raises(TypeError, match="softmax_scale"):
        flashattn.flash_attn_func(q, q, q, softmax_scale=[0.5])


def test_settings_alignment_and_gradients_change_the_path(monkeypatch):
    q = torch.randn(1, 8, 2, 16)
    flashattn.flash_attn_func(q, q, q)
    seen = []
    real = dispatch.backend
    monkeypatch.setattr(dispatch, "backend", lambda name: seen.append(name) or real(name))
    with flashattn.use_backend("portable"):  # a new settings object: a new entry
        flashattn.flash_attn_func(q, q, q)
    assert "portable" in seen
    # a view 4 bytes off the 16-byte alignment is another signature
    buf = torch.randn(1 * 8 * 2 * 16 + 1)
    odd = buf[1:].view(1, 8, 2, 16)
    n = len(fastpath.DENSE._entries)
    flashattn.flash_attn_func(odd, odd, odd)
    assert len(fastpath.DENSE._entries) == n + 1
    # inputs that require grad take the full path and get gradients
    x = torch.randn(1, 8, 2, 16, requires_grad=True)
    flashattn.flash_attn_func(x, x, x).sum().backward()
    assert x.grad is not None
    with torch.no_grad():  # (and without grad mode they may take the fast path)
        flashattn.flash_attn_func(x, x, x)


def test_kvcache_values_are_still_checked_on_every_call():
    q = torch.randn(2, 1, 4, 16)
    cache = torch.randn(2, 8, 2, 16)
    new = torch.randn(2, 1, 2, 16)
    ok = torch.tensor([3, 5], dtype=torch.int32)
    a = flashattn.flash_attn_with_kvcache(q, cache.clone(), cache.clone(), new, new,
                                          cache_seqlens=ok, causal=True)
    assert len(fastpath.KVCACHE._entries) == 1
    b = flashattn.flash_attn_with_kvcache(q, cache.clone(), cache.clone(), new, new,
                                          cache_seqlens=ok, causal=True)
    torch.testing.assert_close(a, b, rtol=0, atol=0)
    with pytest.raises(ValueError, match="cache_seqlens"):  # same signature, bad value
        flashattn.flash_attn_with_kvcache(q, cache.clone(), cache.clone(), new, new,
                                          cache_seqlens=torch.tensor([3, 8], dtype=torch.int32),
                                          causal=True)
    # an int cache_seqlens is part of the signature: past the capacity it is refused again
    flashattn.flash_attn_with_kvcache(q, cache.clone(), cache.clone(), new, new,
                                      cache_seqlens=7)
    with pytest.raises(ValueError, match="cache_seqlens"):
        flashattn.flash_attn_with_kvcache(q, cache.clone(), cache.clone(), new, new,
                                          cache_seqlens=8)


def test_kvcache_decode_loop_matches_the_full_path():
    torch.manual_seed(1)
    cache_k, cache_v = torch.zeros(2, 16, 2, 16), torch.zeros(2, 16, 2, 16)
    ref_k, ref_v = cache_k.clone(), cache_v.clone()
    for step in range(5):
        q, kn, vn = torch.randn(2, 1, 4, 16), torch.randn(2, 1, 2, 16), torch.randn(2, 1, 2, 16)
        lens = torch.tensor([step, step + 2], dtype=torch.int32)
        out = flashattn.flash_attn_with_kvcache(q, cache_k, cache_v, kn, vn, cache_seqlens=lens,
                                                causal=True)
        fastpath.KVCACHE.clear()  # the reference call takes the full path
        ref = flashattn.flash_attn_with_kvcache(q, ref_k, ref_v, kn, vn, cache_seqlens=lens,
                                                causal=True)
        torch.testing.assert_close(out, ref, rtol=0, atol=0)
    torch.testing.assert_close(cache_k, ref_k, rtol=0, atol=0)


def test_entries_are_bounded():
    q = torch.randn(1, 4, 1, 8)
    for i in range(fastpath.MAX_ENTRIES + 3):
        flashattn.flash_attn_func(q, q, q, softmax_scale=0.1 + i * 1e-3)
    assert len(fastpath.DENSE._entries) <= fastpath.MAX_ENTRIES


def test_small_query_runner_keeps_only_shape_facts(monkeypatch):
    """A repeated few-query call (the decode kernel through the dense API, portable backend)
    reuses its runner's key counts and params, never the previous call's data: every hit
    with new tensors matches float64 attention of those tensors."""
    from flashattn.reference import attention_ref
    from tests.settings import set_env

    set_env(monkeypatch, FLASHATTN_BACKEND="portable")
    torch.manual_seed(3)

    def draw():
        return torch.randn(2, 1, 4, 16), torch.randn(2, 37, 2, 16), torch.randn(2, 37, 2, 16)

    flashattn.flash_attn_func(*draw(), causal=True)  # records the signature
    (key, _), = fastpath.DENSE._entries.items()
    for _ in range(2):
        q, k, v = draw()
        out = flashattn.flash_attn_func(q, k, v, causal=True)
        assert list(fastpath.DENSE._entries) == [key]  # a hit, no new entry
        want, _ = attention_ref(q.double(), k.double(), v.double(), causal=True)
        torch.testing.assert_close(out.double(), want, atol=2e-5, rtol=1e-5)
