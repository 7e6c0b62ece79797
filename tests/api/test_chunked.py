"""Chunked local attention (``attention_chunk``, FlashAttention-3 / Llama-4) and ``seqused_q``,
on every path: dense, varlen, KV cache, the fa3 module; forward and backward.

Expected values: the float64 oracle (``reference.attention_ref(attention_chunk=C)``), whose
mask is checked first against a hand-written one from the definition Llama-4's model code
uses (query and key in the same chunk of absolute positions, and causal). The library
computes chunked calls by re-packing them into varlen segments (``api/segments.py``), which
shares nothing with the oracle's mask.
"""
from __future__ import annotations

import itertools

import pytest
import torch

import flashattn
import flashattn.fa3 as fa3
from flashattn import reference as R


def test_reference_mask_is_llama4_chunked_causal():
    # 6 positions, chunk 4, causal: rows 0-3 see the causal part of keys 0-3; rows 4-5 keys 4-5
    got = R.visible_mask(6, 6, -1, 0, attention_chunk=4).int()
    want = torch.tensor([[1, 0, 0, 0, 0, 0],
                         [1, 1, 0, 0, 0, 0],
                         [1, 1, 1, 0, 0, 0],
                         [1, 1, 1, 1, 0, 0],
                         [0, 0, 0, 0, 1, 0],
                         [0, 0, 0, 0, 1, 1]])
    assert torch.equal(got, want)
    # not causal: the whole chunk, both directions; s_q < s_k: positions bottom-right aligned
    got = R.visible_mask(2, 5, -1, -1, attention_chunk=2).int()
    assert torch.equal(got, torch.tensor([[0, 0, 1, 1, 0], [0, 0, 0, 0, 1]]))
    # s_q > s_k: a query at a negative position is in a chunk without keys
    got = R.visible_mask(3, 2, -1, -1, attention_chunk=2).int()
    assert torch.equal(got, torch.tensor([[0, 0], [1, 1], [1, 1]]))


def _grads(out, inputs, g):
    return torch.autograd.grad(out, inputs, g)


def _check(out, lse, grads, ref_out, ref_lse, ref_grads, tol=1e-5):
    torch.testing.assert_close(out.double(), ref_out, atol=tol, rtol=tol)
    fin = torch.isfinite(ref_lse)
    assert torch.equal(fin, torch.isfinite(lse)), "lse: rows without keys differ"
    torch.testing.assert_close(lse.double()[fin], ref_lse[fin], atol=tol, rtol=tol)
    for a, r in zip(grads, ref_grads):
        torch.testing.assert_close(a.double(), r, atol=20 * tol, rtol=20 * tol)


DENSE = [
    # s_q, s_k, chunk, causal, window, softcap, alibi
    (16, 16, 4, True, (-1, -1), 0.0, False),     # the dense fast path (equal, divisible)
    (16, 16, 8, False, (3, 2), 0.0, True),       # fast path, window + ALiBi
    (13, 13, 5, True, (-1, -1), 0.0, False),     # equal, not divisible: segments
    (7, 19, 4, True, (3, -1), 2.0, False),       # s_q < s_k, softcap
    (19, 7, 3, False, (-1, -1), 0.0, True),      # s_q > s_k: rows without keys
    (5, 30, 7, False, (-1, 2), 0.0, False),
]


@pytest.mark.parametrize("backend", ["cpu", "portable"])
@pytest.mark.parametrize("s_q,s_k,chunk,causal,window,softcap,alibi", DENSE)
def test_dense(backend, s_q, s_k, chunk, causal, window, softcap, alibi):
    torch.manual_seed(s_q * 100 + s_k)
    b, h, h_k, d = 2, 4, 2, 16
    q = torch.randn(b, s_q, h, d, requires_grad=True)
    k = torch.randn(b, s_k, h_k, d, requires_grad=True)
    v = torch.randn(b, s_k, h_k, d, requires_grad=True)
    slopes = torch.rand(b, h) * 0.5 if alibi else None
    kw = dict(causal=causal, window_size=window, softcap=softcap, alibi_slopes=slopes)
    with flashattn.use_backend(backend):
        out, lse, _ = flashattn.flash_attn_func(q, k, v, attention_chunk=chunk,
                                                return_attn_probs=True, **kw)
        g = torch.randn_like(out)
        grads = _grads(out, (q, k, v), g)
    x64 = [x.detach().double().requires_grad_() for x in (q, k, v)]
    ref_out, ref_lse = R.attention_ref(*x64, attention_chunk=chunk, **kw)
    _check(out, lse, grads, ref_out, ref_lse, _grads(ref_out, x64, g.double()))


def test_dense_fast_path_is_a_dense_call(monkeypatch):
    """Equal lengths divisible by the chunk: one dense call over b * s / C sequences (so the
    Hopper kernels serve it on an H100), not the varlen op."""
    from flashattn import ops

    calls = []
    monkeypatch.setattr(ops, "varlen_attention", lambda *a, **k: calls.append(a))
    q = torch.randn(2, 12, 2, 8)
    out = flashattn.flash_attn_func(q, q, q, causal=True, attention_chunk=4)
    assert not calls
    ref, _ = R.attention_ref(q.double(), q.double(), q.double(), causal=True, attention_chunk=4)
    torch.testing.assert_close(out.double(), ref, atol=1e-5, rtol=1e-5)


def test_chunk_at_least_seqlen_is_plain_attention():
    q = torch.randn(1, 9, 2, 8)
    plain = flashattn.flash_attn_func(q, q, q, causal=True)
    torch.testing.assert_close(flashattn.flash_attn_func(q, q, q, causal=True,
                                                         attention_chunk=9), plain)


@pytest.mark.parametrize("backend", ["cpu", "portable"])
@pytest.mark.parametrize("chunk,use_q,causal", [(4, False, True), (0, True, False),
                                                (3, True, True), (5, True, False)])
def test_varlen(backend, chunk, use_q, causal):
    torch.manual_seed(chunk + 10 * use_q)
    lens_q, lens_k = [5, 0, 9, 3], [8, 4, 9, 20]
    cu_q = torch.tensor([0, *itertools.accumulate(lens_q)], dtype=torch.int32)
    cu_k = torch.tensor([0, *itertools.accumulate(lens_k)], dtype=torch.int32)
    used_q = torch.tensor([3, 0, 9, 1], dtype=torch.int32) if use_q else None
    h, h_k, d = 4, 2, 16
    q = torch.randn(int(cu_q[-1]), h, d, requires_grad=True)
    k = torch.randn(int(cu_k[-1]), h_k, d, requires_grad=True)
    v = torch.randn(int(cu_k[-1]), h_k, d, requires_grad=True)
    with flashattn.use_backend(backend):
        out, lse, _ = flashattn.flash_attn_varlen_func(
            q, k, v, cu_q, cu_k, max(lens_q), max(lens_k), causal=causal,
            return_attn_probs=True, seqused_q=used_q, attention_chunk=chunk)
        g = torch.randn_like(out)
        dq, dk, dv = _grads(out, (q, k, v), g)
    for b in range(len(lens_q)):
        q0, q1, k0, k1 = int(cu_q[b]), int(cu_q[b + 1]), int(cu_k[b]), int(cu_k[b + 1])
        n = q1 - q0 if used_q is None else int(used_q[b])
        x64 = [x.detach()[lo:hi].double()[None].requires_grad_()
               for x, lo, hi in ((q, q0, q0 + n), (k, k0, k1), (v, k0, k1))]
        ref_out, ref_lse = R.attention_ref(*x64, causal=causal, attention_chunk=chunk)
        ref_grads = _grads(ref_out, x64, g[q0:q0 + n].double()[None])
        _check(out[q0:q0 + n], lse[:, q0:q0 + n], (dq[q0:q0 + n], dk[k0:k1], dv[k0:k1]),
               ref_out[0], ref_lse[0], [r[0] for r in ref_grads])
        # rows past seqused_q: out 0, lse -inf, dq 0
        assert (out[q0 + n:q1] == 0).all() and torch.isneginf(lse[:, q0 + n:q1]).all()
        assert (dq[q0 + n:q1] == 0).all()


@pytest.mark.parametrize("backend", ["cpu", "portable"])
@pytest.mark.parametrize("chunk,causal,s_q,paged,rotary", [
    (4, True, 1, False, False), (5, True, 6, True, False), (3, False, 4, False, True),
    (8, True, 3, True, True)])
def test_kvcache(backend, chunk, causal, s_q, paged, rotary):
    torch.manual_seed(chunk)
    b, cap, h, h_k, d, s_new = 3, 40, 4, 2, 16, 2
    k_cache = torch.randn(b, cap, h_k, d)
    v_cache = torch.randn(b, cap, h_k, d)
    block_table = None
    if paged:  # pages of 8 in a shuffled pool
        page = 8
        perm = torch.randperm(b * cap // page)
        k_cache = k_cache.view(-1, page, h_k, d)[perm.argsort()].contiguous()
        v_cache = v_cache.view(-1, page, h_k, d)[perm.argsort()].contiguous()
        block_table = perm.view(b, -1).to(torch.int32)
    q = torch.randn(b, s_q, h, d)
    k_new, v_new = torch.randn(b, s_new, h_k, d), torch.randn(b, s_new, h_k, d)
    cos = sin = None
    if rotary:
        angle = torch.rand(cap, d // 2) * 6.28
        cos, sin = angle.cos(), angle.sin()
    seqlens = torch.tensor([5, 17, 30], dtype=torch.int32)
    kw = dict(rotary_cos=cos, rotary_sin=sin, cache_seqlens=seqlens, block_table=block_table,
              causal=causal)
    ref_out, ref_lse, _, _ = R.kvcache_ref(q, k_cache, v_cache, k_new, v_new,
                                           attention_chunk=chunk, **kw)
    with flashattn.use_backend(backend):
        out, lse = flashattn.flash_attn_with_kvcache(
            q, k_cache.clone(), v_cache.clone(), k_new, v_new, return_softmax_lse=True,
            attention_chunk=chunk, **kw)
    torch.testing.assert_close(out.double(), ref_out, atol=1e-5, rtol=1e-5)
    fin = torch.isfinite(ref_lse)
    torch.testing.assert_close(lse.double()[fin], ref_lse[fin], atol=1e-5, rtol=1e-5)


def test_fa3_module():
    torch.manual_seed(3)
    q = torch.randn(1, 10, 2, 8)
    k = torch.randn(1, 10, 2, 8)
    out = fa3.flash_attn_func(q, k, k, causal=True, attention_chunk=4)
    ref, _ = R.attention_ref(q.double(), k.double(), k.double(), causal=True, attention_chunk=4)
    torch.testing.assert_close(out.double(), ref, atol=1e-5, rtol=1e-5)
    cu = torch.tensor([0, 4, 10], dtype=torch.int32)
    used = torch.tensor([2, 6], dtype=torch.int32)
    out = fa3.flash_attn_varlen_func(q[0], k[0], k[0], cu, cu, 6, 6, seqused_q=used,
                                     attention_chunk=3)
    for lo, n, hi in ((0, 2, 4), (4, 6, 10)):
        ref, _ = R.attention_ref(q[0, lo:lo + n].double()[None], k[0, lo:hi].double()[None],
                                 k[0, lo:hi].double()[None], attention_chunk=3)
        torch.testing.assert_close(out[lo:lo + n].double(), ref[0], atol=1e-5, rtol=1e-5)
        assert (out[lo + n:hi] == 0).all()
    cache = torch.randn(1, 16, 2, 8)
    out = fa3.flash_attn_with_kvcache(q[:, :1], cache, cache, cache_seqlens=13, causal=True,
                                      attention_chunk=5)
    ref, _, _, _ = R.kvcache_ref(q[:, :1], cache, cache,
                                 cache_seqlens=torch.tensor([13], dtype=torch.int32),
                                 causal=True, attention_chunk=5)
    torch.testing.assert_close(out.double(), ref, atol=1e-5, rtol=1e-5)


def test_with_learnable_sink():
    torch.manual_seed(4)
    q = torch.randn(1, 10, 2, 8, requires_grad=True)
    sink = torch.randn(2, requires_grad=True)
    out, lse, _ = flashattn.flash_attn_func(q, q, q, causal=True, attention_chunk=3,
                                            learnable_sink=sink, return_attn_probs=True)
    # the sink joins each row's denominator: out = out_plain * exp(lse_plain - lse)
    plain, plain_lse = R.attention_ref(*(q.detach().double(),) * 3, causal=True,
                                       attention_chunk=3)
    lse_ref = torch.logaddexp(plain_lse, sink.detach().double().view(1, 2, 1))
    want = plain * torch.exp(plain_lse - lse_ref).permute(0, 2, 1)[..., None]
    torch.testing.assert_close(out.double(), want, atol=1e-5, rtol=1e-5)
    out.sum().backward()
    assert torch.isfinite(q.grad).all() and torch.isfinite(sink.grad).all()


def test_errors():
    q = torch.randn(1, 8, 2, 8)
    for bad in (-1, 2.5, True, "4"):
        with pytest.raises(ValueError, match="attention_chunk"):
            flashattn.flash_attn_func(q, q, q, attention_chunk=bad)
    cu = torch.tensor([0, 8], dtype=torch.int32)
    with pytest.raises(ValueError, match=r"seqused_q\[0\] = 9"):
        flashattn.flash_attn_varlen_func(q[0], q[0], q[0], cu, cu, 8, 8,
                                         seqused_q=torch.tensor([9], dtype=torch.int32))
    with pytest.raises(TypeError, match="seqused_q"):
        flashattn.flash_attn_varlen_func(q[0], q[0], q[0], cu, cu, 8, 8,
                                         seqused_q=torch.tensor([4]))
    cache = torch.randn(2, 4, 2, 8)
    table = torch.zeros(1, 2, dtype=torch.int32)
    with pytest.raises(NotImplementedError, match="block_table"):
        flashattn.flash_attn_varlen_func(q[0], cache, cache, cu, cu, 8, 8, block_table=table,
                                         attention_chunk=4)
    q8 = q.to(torch.float8_e4m3fn)  # (FP8 takes a chunk: tests/api/test_fp8_attention.py)
    with pytest.raises(ValueError, match="attention_chunk"):
        flashattn.flash_attn_func(q8, q8, q8, attention_chunk=-1)
    with pytest.raises(NotImplementedError, match="S_dmask"):
        flashattn.flash_attn_func(q, q, q, dropout_p=0.1, attention_chunk=4,
                                  return_attn_probs=True)


@pytest.mark.gpu
@pytest.mark.parametrize("s,chunk,causal", [(2048, 512, True), (1500, 512, True),
                                            (1024, 384, False)])
def test_dense_gpu(s, chunk, causal):
    """bf16 on the GPU (the fast path runs the Hopper kernels on an H100), flash-attn's rule."""
    from tests.accuracy import assert_close_rule

    torch.manual_seed(s)
    q, k, v = (torch.randn(2, s, 8, 128, device="cuda", dtype=torch.bfloat16,
                           requires_grad=True) for _ in range(3))
    out = flashattn.flash_attn_func(q, k, v, causal=causal, attention_chunk=chunk)
    g = torch.randn_like(out)
    grads = _grads(out, (q, k, v), g)
    x64 = [x.detach().double().requires_grad_() for x in (q, k, v)]
    ref, _ = R.attention_ref(*x64, causal=causal, attention_chunk=chunk)
    ref_grads = _grads(ref, x64, g.double())
    xlp = [x.detach().clone().requires_grad_() for x in (q, k, v)]
    lp, _ = R.attention_ref(*xlp, causal=causal, attention_chunk=chunk, upcast=False)
    lp_grads = _grads(lp, xlp, g)
    assert_close_rule(out, ref, lp)
    for name, a, r, l in zip(("dq", "dk", "dv"), grads, ref_grads, lp_grads):
        assert_close_rule(a, r, l, factor=3.0, name=name)


@pytest.mark.gpu
def test_varlen_and_kvcache_gpu():
    torch.manual_seed(7)
    dev, dt = "cuda", torch.bfloat16
    lens = [300, 1000, 77]
    cu = torch.tensor([0, *itertools.accumulate(lens)], dtype=torch.int32, device=dev)
    used = torch.tensor([200, 1000, 0], dtype=torch.int32, device=dev)
    q, k, v = (torch.randn(sum(lens), 8, 64, device=dev, dtype=dt) for _ in range(3))
    out = flashattn.flash_attn_varlen_func(q, k, v, cu, cu, 1000, 1000, causal=True,
                                           seqused_q=used, attention_chunk=256)
    for b, (lo, n) in enumerate(zip(cu.tolist(), used.tolist())):
        ref, _ = R.attention_ref(q[lo:lo + n].double()[None], k[lo:lo + lens[b]].double()[None],
                                 v[lo:lo + lens[b]].double()[None], causal=True,
                                 attention_chunk=256)
        torch.testing.assert_close(out[lo:lo + n].double(), ref[0], atol=2e-2, rtol=2e-2)
        assert (out[lo + n:lo + lens[b]] == 0).all()
    cache_k = torch.randn(4, 4096, 2, 128, device=dev, dtype=dt)
    cache_v = torch.randn(4, 4096, 2, 128, device=dev, dtype=dt)
    qd = torch.randn(4, 1, 16, 128, device=dev, dtype=dt)
    seqlens = torch.tensor([1, 1000, 2049, 4096], dtype=torch.int32, device=dev)
    for splits in (1, 0):
        out = flashattn.flash_attn_with_kvcache(qd, cache_k, cache_v, cache_seqlens=seqlens,
                                                causal=True, attention_chunk=1024,
                                                num_splits=splits)
        ref, _, _, _ = R.kvcache_ref(qd, cache_k, cache_v, cache_seqlens=seqlens, causal=True,
                                     attention_chunk=1024)
        torch.testing.assert_close(out.double(), ref, atol=2e-2, rtol=2e-2)
