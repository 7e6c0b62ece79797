"""The repeated-call fast path (api/fastpath.py): a call signature seen before skips
the argument checks and dispatch. It must give the full path's results, and it must never
skip a check whose outcome could differ: other types, settings, alignment, gradients or
metadata values take the full path (or keep being checked)."""
from __future__ import annotations

import pytest
import torch

import flashattn
from flashattn.dispatch import select as dispatch_select
from flashattn.replay import fp8 as replay_fp8
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
    real = dispatch_select.backend
    monkeypatch.setattr(dispatch_select, "backend", lambda name: seen.append(name) or real(name))
    with flashattn.use_backend("portable"):  # a new settings object: a new entry
        flashattn.flash_attn_func(q, q, q)
    assert "portable" in seen
    # a view 4 bytes off the 16-byte alignment is another signature
    buf = torch.randn(1 * 8 * 2 * 16 + 1)
    odd = buf[1:].view(1, 8, 2, 16)
    n = len(fastpath.DENSE._entries)
    flashattn.flash_attn_func(odd, odd, odd)
    assert len(fastpath.DENSE._entries) == n + 1
    # inputs that require grad are another signature (recorded with its autograd function)
    x = torch.randn(1, 8, 2, 16, requires_grad=True)
    n = len(fastpath.DENSE._entries)
    flashattn.flash_attn_func(x, x, x).sum().backward()
    assert x.grad is not None and len(fastpath.DENSE._entries) == n + 1
    with torch.no_grad():  # (without grad mode: the first signature of the test again)
        out = flashattn.flash_attn_func(x, x, x)
    assert len(fastpath.DENSE._entries) == n + 1 and out.grad_fn is None


DENSE_GRAD_CASES = [
    dict(),
    dict(causal=True),
    dict(window_size=(3, 1), softcap=4.0),
    dict(deterministic=True, softmax_scale=0.2),
    dict(return_attn_probs=True, causal=True),
]


@pytest.mark.parametrize("kw", DENSE_GRAD_CASES, ids=lambda kw: ",".join(kw) or "plain")
@pytest.mark.parametrize("shape", [(2, 9, 11), (2, 1, 12), (1, 6, 0)],
                         ids=["prefill", "one_query", "no_keys"])
def test_dense_grad_signature_matches_the_full_path(monkeypatch, kw, shape):
    """A repeated dense signature that records a gradient (a training step's layers) runs its
    recorded forward and backward (fastpath.DenseTrainEntry through
    replay.autograd.dense_recorded): the full path's outputs, lse and q / k / v gradients, bit
    for bit on the CPU; GQA, one query row (the decode kernel's forward), no keys."""
    b, s_q, s_k = shape
    gen = torch.Generator().manual_seed(2)
    q = torch.randn(b, s_q, 4, 16, generator=gen, requires_grad=True)
    k, v = (torch.randn(b, s_k, 2, 16, generator=gen, requires_grad=True) for _ in range(2))
    dout = torch.randn(b, s_q, 4, 16, generator=gen)
    backwards = []
    real = fastpath.DenseTrainEntry.backward
    monkeypatch.setattr(fastpath.DenseTrainEntry, "backward",
                        lambda self, *a: backwards.append(1) or real(self, *a))

    def call():
        res = flashattn.flash_attn_func(q, k, v, **kw)
        out = res[0] if isinstance(res, tuple) else res
        return res, torch.autograd.grad(out, (q, k, v), dout, allow_unused=True)

    full, full_grads = call()
    (entry,) = (e[1] for e in fastpath.DENSE._entries.values())
    assert isinstance(entry, fastpath.DenseTrainEntry) and not backwards
    fast, fast_grads = call()
    assert backwards == [1]
    if kw.get("return_attn_probs"):
        torch.testing.assert_close(fast[1], full[1], rtol=0, atol=0)
        assert fast[2] is None
        fast, full = fast[0], full[0]
    assert "RecordedDense" in type(fast.grad_fn).__name__
    torch.testing.assert_close(fast, full, rtol=0, atol=0)
    for a, b_ in zip(fast_grads, full_grads):
        torch.testing.assert_close(a, b_, rtol=0, atol=0)


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


# ---------------------------------------------------------------------------------------------
# flash_attn_fp8_func: the key, the CPU path's entry, the recorded call's workspace layout
# ---------------------------------------------------------------------------------------------
def test_fp8_signature_rules():
    """Only a fixed rotation (an int seed) has a signature: seed None draws new signs per call.
    Types are part of the key; inputs that need grad, lists and numpy scalars take the full
    path (whose checks decide about them)."""
    q = torch.randn(1, 8, 2, 16).bfloat16()
    key = fastpath.fp8_key
    args = dict(softmax_scale=None, causal=True, window_size=(-1, -1), softcap=0.0,
                incoherent=True, seed=0, block_m=128, block_n=128, return_lse=False)
    base = key(q, q, q, **args)
    assert base is not None
    assert key(q, q, q, **{**args, "seed": None}) is None
    assert key(q, q, q, **{**args, "seed": True}) is None
    assert key(q, q, q, **{**args, "window_size": [-1, -1]}) is None
    assert key(q, q, q, **{**args, "causal": 1}) not in (None, base)
    assert key(q, q, q, **{**args, "return_lse": True}) != base
    assert key(q, q, q, **{**args, "seed": 1}) != base
    assert key(q.float(), q.float(), q.float(), **args) != base
    x = q.clone().requires_grad_()
    assert key(x, x, x, **args) is None
    with torch.no_grad():
        assert key(x, x, x, **args) is not None
    import numpy as np
    assert key(q, q, q, **{**args, "softcap": np.float32(0.0)}) is None


def test_fp8_cpu_calls_keep_taking_the_full_path():
    """Off the Hopper kernels there is no recorded call: the signature's entry says so once
    (no decision per call), and repeated calls equal the first."""
    from flashattn import fp8

    fastpath.FP8.clear()
    torch.manual_seed(2)
    q, k, v = (torch.randn(1, 40, h, 32).bfloat16() for h in (4, 2, 2))
    first = fp8.flash_attn_fp8_func(q, k, v, causal=True, seed=3, block_m=32, block_n=32)
    assert list(fastpath.FP8._entries.values())[0][1] is fastpath.FP8_FULL_PATH
    again = fp8.flash_attn_fp8_func(q, k, v, causal=True, seed=3, block_m=32, block_n=32)
    assert torch.equal(first, again) and len(fastpath.FP8._entries) == 1
    fastpath.FP8.clear()


class _FakePlan:
    """Stands in for the quantize / forward recorded calls: keeps what record and replay
    received (the recorded views' addresses, the replayed addresses)."""

    def __init__(self, uses_counter=False):
        self.plan, self.uses_counter, self.recorded, self.replayed = None, uses_counter, [], []

    def record(self, *args):
        self.recorded.append(args)
        self.plan = object()

    def replay(self, *args):
        self.replayed.append(args)
        return True


@pytest.mark.parametrize("causal,need_lse", [(True, False), (False, True)])
def test_fp8_recorded_call_replays_the_recorded_layout(monkeypatch, causal, need_lse):
    """replay_fp8.Fp8Call: the addresses a replay hands the two launches are exactly those of
    the tensor views the first call recorded with (q8, k8, V^T in wgmma order, the three
    descale tables, the LSE, the tile-queue counter), the regions are 256-byte aligned and
    disjoint, V^T's view has wgmma_vt_empty's strides, the counter is zeroed before every
    launch, and a returned LSE is the caller's own tensor (CPU stand-ins for the workspace and
    the kernels)."""
    from flashattn import fp8_format
    from flashattn.params import AttnParams

    ws = torch.full((1 << 20,), 7, dtype=torch.uint8)
    from flashattn.runtime import buffers

    monkeypatch.setattr(buffers, "stream_buffer", lambda kind, nbytes, device: ws)
    quant, fwd = _FakePlan(), _FakePlan(uses_counter=causal)

    class _Backend:
        fp8_quantize_call = staticmethod(lambda signs, bm, bn: quant)
        fp8_fwd_call = staticmethod(lambda d, d_v, p, dtype: fwd)

    monkeypatch.setattr(dispatch_select, "backend", lambda name: _Backend)
    b, s_q, s_k, h, h_k, d = 2, 300, 170, 4, 2, 64
    q = torch.randn(b, s_q, h, d).bfloat16()
    k, v = (torch.randn(b, s_k, h_k, d).bfloat16() for _ in range(2))
    params = AttnParams(0.125, causal, -1, 0 if causal else -1, 0.0, None, 0.0, 0)
    call = replay_fp8.Fp8Call(q, k, v, params, None, 128, 64, need_lse)
    out, lse = call(q, k, v)
    assert out.shape == (b, s_q, h, d) and (lse is not None) == need_lse
    (_, _, _, outs), = quant.recorded
    q8, k8, v8, qs, ks, vs = outs
    (q8f, k8f, v8f, scales, out_r, lse_r, counter_r), = fwd.recorded
    assert q8f is q8 and k8f is k8 and v8f is v8 and out_r is out
    assert (scales.q_descale, scales.k_descale, scales.v_descale) == (qs, ks, vs)
    assert (scales.q_block_shift, scales.kv_block_shift) == (7, 6)
    want_v = fp8_format.wgmma_vt_empty((b, s_k, h_k, d), torch.device("cpu"))
    assert v8.shape == want_v.shape and v8.stride() == want_v.stride()
    assert qs.shape == (b, h, 3) and ks.shape == vs.shape == (b, h_k, 3)
    if need_lse:
        assert lse_r is lse
    if causal:
        assert counter_r.dtype == torch.int32 and int(counter_r[0]) == 0
    else:
        assert counter_r is lse_r
    in_ws = [q8, k8, v8, qs, ks, vs] + ([] if need_lse else [lse_r]) \
        + ([counter_r] if causal else [])
    base = ws.data_ptr()
    # (V^T's view covers all of its (b, h_k, d, s_pad) storage)
    spans = sorted((t.data_ptr() - base, t.data_ptr() - base + (
        b * h_k * d * want_v.shape[1] if t is v8 else t.numel() * t.element_size()))
        for t in in_ws)
    assert all(lo % 256 == 0 for lo, _ in spans) and spans[-1][1] <= ws.numel()
    assert all(one[1] <= two[0] for one, two in zip(spans, spans[1:]))
    # the second call replays with the same addresses
    ws[:] = 7
    out2, lse2 = call(q, k, v)
    (qa, ka, va, (a_q8, a_k8, a_v8, a_qs, a_ks, a_vs)), = quant.replayed
    assert qa is q and ka is k and va is v
    assert (a_q8, a_k8, a_v8, a_qs, a_ks, a_vs) == tuple(t.data_ptr() for t in outs)
    (addrs,), = fwd.replayed
    assert addrs[:3] == (a_q8, a_k8, a_v8) and addrs[6:] == (a_qs, a_ks, a_vs)
    assert addrs[3] == out2.data_ptr()
    assert addrs[4] == (lse2.data_ptr() if need_lse else lse_r.data_ptr())
    assert addrs[5] == (counter_r.data_ptr() if causal else addrs[4])
    if causal:
        assert int(counter_r[0]) == 0


def test_fp8_signature_first_seen_under_graph_capture_is_not_kept(monkeypatch):
    """No recorded FP8 call is built during CUDA-graph capture (docs/internals.md: whatever
    such a call made would exist only in the graph). The capture's call takes the full path
    and leaves no entry, so a later eager call of the signature still gets one."""
    from flashattn import fp8

    fastpath.FP8.clear()
    torch.manual_seed(3)
    q, k, v = (torch.randn(1, 40, h, 32).bfloat16() for h in (4, 2, 2))
    args = dict(causal=True, seed=1, block_m=32, block_n=32)
    monkeypatch.setattr(fastpath, "capturing", lambda: True)
    first = fp8.flash_attn_fp8_func(q, k, v, **args)
    assert not fastpath.FP8._entries
    monkeypatch.setattr(fastpath, "capturing", lambda: False)
    again = fp8.flash_attn_fp8_func(q, k, v, **args)
    assert torch.equal(first, again) and len(fastpath.FP8._entries) == 1
    fastpath.FP8.clear()


def test_quantize_signature_rules_and_cpu_entry():
    """fp8.quantize keys like flash_attn_fp8_func (an int seed only, no grad to record); on the
    CPU its entry says "full path" once, and repeated calls equal the first, each with its
    own copy of the signs."""
    from flashattn import fp8

    q = torch.randn(1, 40, 4, 32).bfloat16()
    k = torch.randn(1, 40, 2, 32).bfloat16()
    key = fastpath.quantize_key
    assert key(q, k, k, True, None, 32, 32) is None
    assert key(q, k, k, True, 0, 32, 32) != key(q, k, k, True, 1, 32, 32)
    assert key(q, k, k, 1, 0, 32, 32) != key(q, k, k, True, 0, 32, 32)
    fastpath.QUANTIZE.clear()
    first = fp8.quantize(q, k, k, seed=2, block_m=32, block_n=32)
    assert list(fastpath.QUANTIZE._entries.values())[0][1] is fastpath.FP8_FULL_PATH
    again = fp8.quantize(q, k, k, seed=2, block_m=32, block_n=32)
    for a, b in zip(first, again):
        if isinstance(a, torch.Tensor):
            assert torch.equal(a.view(torch.uint8) if a.element_size() == 1 else a,
                               b.view(torch.uint8) if b.element_size() == 1 else b)
    assert again.signs.data_ptr() != first.signs.data_ptr()
    fastpath.QUANTIZE.clear()


# ---------------------------------------------------------------------------------------------
# flash_attn_func on FP8 inputs (FA3's descale API): the key, the CPU entry, the recorded call
# ---------------------------------------------------------------------------------------------
def _fa3_args(**kw):
    args = dict(dropout_p=0.0, softmax_scale=None, causal=True, window_size=(-1, -1),
                softcap=0.0, alibi_slopes=None, return_attn_probs=False, q_descale=None,
                k_descale=None, v_descale=None, out_dtype=None, return_lse=False)
    args.update(kw)
    return args


def test_fa3_fp8_signature_rules():
    """Only float8_e4m3fn q, k, v have a signature; descales are keyed by presence and
    layout, never by value; dropout, ALiBi, return_attn_probs, non-tensor descales, inputs
    that need grad and other dtypes take the full path (whose checks raise or decide)."""
    key = fastpath.fa3_fp8_key
    q8 = torch.randn(2, 8, 4, 16).to(torch.float8_e4m3fn)
    k8 = torch.randn(2, 8, 2, 16).to(torch.float8_e4m3fn)
    d = torch.rand(2, 2) + 0.5
    base = key(q8, k8, k8, **_fa3_args())
    assert base is not None
    with_d = key(q8, k8, k8, **_fa3_args(q_descale=d))
    assert with_d not in (None, base)
    assert key(q8, k8, k8, **_fa3_args(q_descale=d * 3)) == with_d  # values: not keyed
    assert key(q8, k8, k8, **_fa3_args(q_descale=d.t().contiguous().t())) != with_d
    assert key(q8, k8, k8, **_fa3_args(k_descale=d)) not in (None, base, with_d)
    assert key(q8, k8, k8, **_fa3_args(out_dtype=torch.float16)) not in (None, base)
    assert key(q8, k8, k8, **_fa3_args(return_lse=True)) != base
    assert key(q8, k8, k8, **_fa3_args(causal=1)) not in (None, base)
    for bad in (dict(dropout_p=0.1), dict(alibi_slopes=torch.ones(4)),
                dict(return_attn_probs=True), dict(q_descale=[1.0, 1.0]),
                dict(window_size=[-1, -1]), dict(out_dtype="bfloat16")):
        assert key(q8, k8, k8, **_fa3_args(**bad)) is None, bad
    e5m2 = q8.to(torch.float8_e5m2)
    assert key(e5m2, k8, k8, **_fa3_args()) is None
    b16 = q8.bfloat16()
    assert key(b16, b16, b16, **_fa3_args()) is None


def test_fa3_fp8_cpu_calls_keep_taking_the_full_path():
    """Off the Hopper kernels the signature's entry is the full path (decided once), repeated
    calls equal the first, and new descale values are used (values are not part of a key)."""
    fastpath.FA3_FP8.clear()
    torch.manual_seed(4)
    q8 = torch.randn(1, 48, 4, 32).to(torch.float8_e4m3fn)
    k8, v8 = (torch.randn(1, 48, 2, 32).to(torch.float8_e4m3fn) for _ in range(2))
    d = torch.rand(1, 2) + 0.5
    first = flashattn.flash_attn_func(q8, k8, v8, causal=True, q_descale=d, v_descale=d)
    assert list(fastpath.FA3_FP8._entries.values())[0][1] is fastpath.FP8_FULL_PATH
    again = flashattn.flash_attn_func(q8, k8, v8, causal=True, q_descale=d, v_descale=d)
    assert torch.equal(first, again) and len(fastpath.FA3_FP8._entries) == 1
    doubled = flashattn.flash_attn_func(q8, k8, v8, causal=True, q_descale=d, v_descale=d * 2)
    torch.testing.assert_close(doubled.float(), 2 * first.float(), rtol=2 ** -7, atol=0)
    fastpath.FA3_FP8.clear()


class _FakeVt:
    def __init__(self):
        self.plan, self.recorded, self.replayed = None, [], []

    def record(self, v8, into):
        self.recorded.append((v8, into))
        self.plan = object()

    def replay(self, *addresses):
        self.replayed.append(addresses)
        return True


def _descale_call_stand_ins(monkeypatch, uses_counter):
    """replay_fp8.Fp8DescaleCall's workspace and kernels as CPU stand-ins: (workspace, V^T
    call, forward call), each keeping what it recorded and replayed."""
    ws = torch.full((1 << 20,), 7, dtype=torch.uint8)
    from flashattn.runtime import buffers

    monkeypatch.setattr(buffers, "stream_buffer", lambda kind, nbytes, device: ws)
    vt_call, fwd = _FakeVt(), _FakePlan(uses_counter=uses_counter)

    class _Backend:
        fp8_vt_call = staticmethod(lambda: vt_call)
        fp8_fwd_call = staticmethod(lambda d, d_v, p, dtype: fwd)

    monkeypatch.setattr(dispatch_select, "backend", lambda name: _Backend)
    return ws, vt_call, fwd


@pytest.mark.parametrize("group,given,contiguous,need_lse", [
    (2, (True, True, True), True, False),    # GQA: q's descale copied per query head
    (1, (True, True, True), True, True),     # no group: all three read in place
    (2, (False, True, False), True, False),  # None descales: tables of ones
    (1, (True, True, True), False, False)])  # non-contiguous descales: copied
def test_fa3_fp8_recorded_call_replays_the_recorded_roles(monkeypatch, group, given, contiguous,
                                                          need_lse):
    """replay_fp8.Fp8DescaleCall: V^T is written into the workspace and read back by the
    forward; the descale tables the forward reads hold the call's values (ones for None, one
    entry per query head of a group), in place where the caller's tensor is a contiguous
    (b, h_k) table; a replay hands both launches the recorded roles' addresses (the tables
    copied again on every call); regions are 256-byte aligned and disjoint (CPU stand-ins for
    the workspace and the kernels)."""
    from flashattn.params import AttnParams

    ws, vt_call, fwd = _descale_call_stand_ins(monkeypatch, uses_counter=True)
    b, s_q, s_k, h_k, d = 2, 100, 70, 2, 64
    h = h_k * group
    q8 = torch.randn(b, s_q, h, d).to(torch.float8_e4m3fn)
    k8, v8 = (torch.randn(b, s_k, h_k, d).to(torch.float8_e4m3fn) for _ in range(2))

    def descales(scale):
        ds = [(torch.arange(b * h_k, dtype=torch.float32).view(b, h_k) + 1 + i) * scale
              for i in range(3)]
        if not contiguous:
            ds = [x.t().contiguous().t() for x in ds]
        return tuple(x if g else None for x, g in zip(ds, given))

    params = AttnParams(0.125, True, -1, 0, 0.0, None, 0.0, 0)
    first = descales(1.0)
    call = replay_fp8.Fp8DescaleCall(q8, k8, v8, first, params, torch.bfloat16, need_lse)
    out, lse = call(q8, k8, v8, *first)
    assert out.shape == (b, s_q, h, d) and out.dtype == torch.bfloat16
    assert (lse is not None) == need_lse
    ((v_in, vt),) = vt_call.recorded
    assert v_in is v8 and vt.shape[:3] == (b, h_k, d) and vt.shape[3] >= s_k
    (q_r, k_r, v_r, scales, out_r, lse_r, counter_r), = fwd.recorded
    assert q_r is q8 and k_r is k8 and out_r is out
    assert v_r.data_ptr() == vt.data_ptr() and v_r.shape == (b, vt.shape[3], h_k, d)
    assert (scales.q_block_shift, scales.kv_block_shift) == (31, 31)
    tables = (scales.q_descale, scales.k_descale, scales.v_descale)
    for table, x, heads in zip(tables, first, (h, h_k, h_k)):
        assert table.shape == (b, heads, 1) and table.is_contiguous()
        want = (torch.ones(b, heads) if x is None
                else x.repeat_interleave(heads // h_k, dim=1))
        assert torch.equal(table[..., 0], want)
        in_place = x is not None and x.is_contiguous() and heads == h_k
        assert (table.data_ptr() == x.data_ptr()) if in_place else True
    assert counter_r.dtype == torch.int32 and int(counter_r[0]) == 0
    if need_lse:
        assert lse_r is lse
    base = ws.data_ptr()
    in_ws = [vt, counter_r] + ([] if need_lse else [lse_r]) + [
        t for t in tables if base <= t.data_ptr() < base + ws.numel()]
    spans = sorted((t.data_ptr() - base, t.data_ptr() - base + t.numel() * t.element_size())
                   for t in in_ws)
    assert all(lo % 256 == 0 for lo, _ in spans) and spans[-1][1] <= ws.numel()
    assert all(one[1] <= two[0] for one, two in zip(spans, spans[1:]))
    # a replay: the same roles, the new descale values in the tables the forward reads
    ws[:] = 7
    second = descales(3.0)
    out2, lse2 = call(q8, k8, v8, *second)
    ((va, vta),) = vt_call.replayed
    assert (va, vta) == (v8.data_ptr(), vt.data_ptr())
    (addrs,), = fwd.replayed
    assert addrs[:3] == (q8.data_ptr(), k8.data_ptr(), vt.data_ptr())
    assert addrs[3] == out2.data_ptr() and addrs[5] == counter_r.data_ptr()
    assert addrs[4] == (lse2.data_ptr() if need_lse else lse_r.data_ptr())
    assert int(counter_r[0]) == 0
    for address, table, x, heads in zip(addrs[6:], tables, second, (h, h_k, h_k)):
        if x is None:
            assert address == table.data_ptr()
            continue
        if x.is_contiguous() and heads == h_k:
            assert address == x.data_ptr()
        else:  # the workspace table, refilled with this call's values
            assert address == table.data_ptr()
            assert torch.equal(table[..., 0], x.repeat_interleave(heads // h_k, dim=1))


# ---------------------------------------------------------------------------------------------
# fp8.attention on fp8.quantize's output: the key, the CPU entry, the block-table mode
# ---------------------------------------------------------------------------------------------
def test_quantized_signature_rules():
    """fp8.attention's signature: the QuantizedQKV's tensors by layout (never by value), its
    blocks and the scalars; other tuple types, 16-bit tensors, non-int blocks and list windows
    take the full path."""
    from flashattn import fp8

    key = fastpath.quantized_key
    q, k, v = (torch.randn(1, 40, h, 32) for h in (4, 2, 2))
    r = fp8.quantize(q, k, v, seed=0, block_m=32, block_n=32)
    args = dict(softmax_scale=None, causal=True, window_size=(-1, -1), softcap=0.0,
                out_dtype=None, return_lse=False)
    base = key(r, **args)
    assert base is not None
    r2 = fp8.quantize(q * 2, k, v, seed=0, block_m=32, block_n=32)
    assert key(r2, **args) == base  # other values, same layout
    assert key(r._replace(block_n=64), **args) != base
    assert key(r._replace(block_n=64.0), **args) is None
    assert key(r, **{**args, "window_size": [-1, -1]}) is None
    assert key(r, **{**args, "return_lse": True}) != base
    assert key(r._replace(q=r.q.float()), **args) is None
    assert key(r._replace(k_descale=r.k_descale.double()), **args) is None


def test_quantized_cpu_calls_keep_taking_the_full_path():
    """Off the Hopper kernels fp8.attention's signature entry is the full path (decided
    once); repeated calls equal the first, and a QuantizedQKV of new values with the same
    layout computes with its own values."""
    from flashattn import fp8

    fastpath.FP8_QUANTIZED.clear()
    torch.manual_seed(5)
    q, k, v = (torch.randn(1, 48, h, 32) for h in (4, 2, 2))
    r = fp8.quantize(q, k, v, seed=1, block_m=32, block_n=32)
    first = fp8.attention(r, causal=True)
    assert list(fastpath.FP8_QUANTIZED._entries.values())[0][1] is fastpath.FP8_FULL_PATH
    assert torch.equal(fp8.attention(r, causal=True), first)
    doubled = fp8.attention(r._replace(v_descale=r.v_descale * 2), causal=True)
    torch.testing.assert_close(doubled.float(), 2 * first.float(), rtol=2 ** -7, atol=0)
    assert len(fastpath.FP8_QUANTIZED._entries) == 1
    fastpath.FP8_QUANTIZED.clear()


def test_block_table_recorded_call_reads_the_tables_in_place(monkeypatch):
    """replay_fp8.Fp8DescaleCall over fp8.quantize's block tables: the forward reads the
    caller's contiguous (b, heads, blocks) tables in place with the blocks' shifts, a
    non-contiguous table is copied into the workspace on every call (CPU stand-ins)."""
    from flashattn.params import AttnParams

    _, _, fwd = _descale_call_stand_ins(monkeypatch, uses_counter=False)
    b, s, h, h_k, d = 2, 200, 4, 2, 64
    q8 = torch.randn(b, s, h, d).to(torch.float8_e4m3fn)
    k8, v8 = (torch.randn(b, s, h_k, d).to(torch.float8_e4m3fn) for _ in range(2))
    qd = torch.rand(b, h, 4) + 0.5
    kd = torch.rand(b, h_k, 2) + 0.5
    vd = (torch.rand(b, 2, h_k) + 0.5).transpose(1, 2)  # non-contiguous: copied
    params = AttnParams(0.125, False, -1, -1, 0.0, None, 0.0, 0)
    call = replay_fp8.Fp8DescaleCall(q8, k8, v8, (qd, kd, vd), params, torch.bfloat16, False,
                                   (6, 7))
    call(q8, k8, v8, qd, kd, vd)
    (_, _, _, scales, _, _, _), = fwd.recorded
    assert (scales.q_block_shift, scales.kv_block_shift) == (6, 7)
    assert scales.q_descale.data_ptr() == qd.data_ptr()
    assert scales.k_descale.data_ptr() == kd.data_ptr()
    assert scales.v_descale.data_ptr() != vd.data_ptr() and scales.v_descale.is_contiguous()
    assert torch.equal(scales.v_descale, vd)
    vd2 = (torch.rand(b, 2, h_k) + 0.5).transpose(1, 2)
    call(q8, k8, v8, qd, kd, vd2)
    (addrs,), = fwd.replayed
    assert addrs[6:8] == (qd.data_ptr(), kd.data_ptr())
    assert addrs[8] == scales.v_descale.data_ptr() and torch.equal(scales.v_descale, vd2)


def test_dense_packed_variants_are_recorded_too():
    """flash_attn_qkvpacked_func / flash_attn_kvpacked_func: views of one tensor, recorded like
    flash_attn_func (with a gradient to record too); the packed gradient equals the full
    path's."""
    gen = torch.Generator().manual_seed(4)
    qkv = torch.randn(2, 9, 3, 4, 16, generator=gen, requires_grad=True)
    q = torch.randn(2, 7, 4, 16, generator=gen, requires_grad=True)
    kv = torch.randn(2, 9, 2, 2, 16, generator=gen, requires_grad=True)
    results = []
    for _ in range(2):
        out1 = flashattn.flash_attn_qkvpacked_func(qkv, causal=True)
        out2 = flashattn.flash_attn_kvpacked_func(q, kv, window_size=(2, 1))
        grads = torch.autograd.grad(out1.sum() + (out2 * out2).sum(), (qkv, q, kv))
        results.append((out1, out2) + grads)
    assert len(fastpath.DENSE._entries) == 2
    assert "RecordedDense" in type(results[1][0].grad_fn).__name__
    for a, b in zip(*results):
        torch.testing.assert_close(a, b, rtol=0, atol=0)


@pytest.mark.parametrize("fp8", [False, True], ids=["bf16-cache", "fp8-cache"])
def test_kvcache_with_qv_hits_and_matches_the_full_path(fp8, backend):
    """MLA decode steps (a latent query qv over one KV head): a repeated signature is keyed
    with qv as a tensor and replays (the portable backend's recorded decode call under the
    interpreter, the op's body on 'cpu') to the full path's bits, and a qv of another width is
    another signature."""
    torch.manual_seed(7)
    b, h, d, d_v, s_k = 2, 4, 16, 32, 20
    kc = torch.randn(b, s_k, 1, d).bfloat16()
    vc = torch.randn(b, s_k, 1, d_v).bfloat16()
    kw = dict(cache_seqlens=torch.tensor([20, 7], dtype=torch.int32), causal=True,
              return_softmax_lse=True)
    if fp8:
        kc, vc = kc.to(torch.float8_e4m3fn), vc.to(torch.float8_e4m3fn)
        kw.update(k_descale=torch.full((b, 1), 0.5), v_descale=torch.full((b, 1), 2.0))

    def draw():
        return torch.randn(b, 1, h, d).bfloat16(), torch.randn(b, 1, h, d_v).bfloat16()

    flashattn.flash_attn_with_kvcache(*draw()[:1], kc, vc, qv=draw()[1], **kw)
    (_, (_, runner)), = fastpath.KVCACHE._entries.values()  # (settings, (template, runner))
    assert (runner is not None) == (backend == "portable")  # the recorded decode call
    for _ in range(2):
        q, qv = draw()
        out, lse = flashattn.flash_attn_with_kvcache(q, kc, vc, qv=qv, **kw)
        assert len(fastpath.KVCACHE._entries) == 1  # a hit
        fastpath.KVCACHE.clear()
        ref, ref_lse = flashattn.flash_attn_with_kvcache(q, kc, vc, qv=qv, **kw)  # full path
        assert torch.equal(out, ref) and torch.equal(lse, ref_lse)
    narrow = vc[..., :16].contiguous()  # d_v 16: qv of another width
    flashattn.flash_attn_with_kvcache(q, kc, narrow, qv=qv[..., :16].contiguous(), **kw)
    assert len(fastpath.KVCACHE._entries) == 2
