"""Learnable attention sinks (gpt-oss's ``sinks``, transformers' ``s_aux``): one
extra logit per head in every row's softmax denominator, attending to nothing.

Expected values come from that definition, computed in float64 by appending the sink as an
extra key column whose value is zero and dropping it after the softmax (the way gpt-oss's
reference code writes it), not from the library's composition."""
from __future__ import annotations

import pytest
import torch

import flashattn
from flashattn.params import AttnParams
from flashattn.reference import visible_mask


def _ref(q, k, v, sink, causal=False, window=(-1, -1), scale=None, dtype=torch.float64):
    """Attention with a sink column computed in ``dtype`` (float64: the oracle; bf16: PyTorch's
    own low-precision error, the baseline of flash-attn's rule): (out (b, s_q, h, d_v), lse
    (b, h, s_q))."""
    b, s_q, h, d = q.shape
    s_k, h_k = k.shape[1], k.shape[2]
    kk = k.to(dtype).repeat_interleave(h // h_k, 2)
    vv = v.to(dtype).repeat_interleave(h // h_k, 2)
    scale = d ** -0.5 if scale is None else scale
    scores = torch.einsum("bihd,bjhd->bhij", q.to(dtype) * scale, kk)
    left, right = window
    if causal:
        right = 0
    vis = visible_mask(s_q, s_k, left, right, q.device)
    scores = scores.masked_fill(~vis, float("-inf"))
    col = sink.to(dtype).view(1, h, 1, 1).expand(b, h, s_q, 1)
    full = torch.cat([scores, col], dim=-1)
    lse = torch.logsumexp(full, dim=-1)
    probs = torch.softmax(full, dim=-1)[..., :-1]
    return torch.einsum("bhij,bjhd->bihd", probs, vv), lse


CASES = [(False, (-1, -1)), (True, (-1, -1)), (False, (6, 2))]


@pytest.mark.parametrize("backend", ["cpu", "portable"])
@pytest.mark.parametrize("causal,window", CASES)
def test_dense_forward_and_backward(backend, causal, window):
    torch.manual_seed(0)
    b, s_q, s_k, h, h_k, d = 2, 9, 13, 4, 2, 16
    q = torch.randn(b, s_q, h, d, requires_grad=True)
    k = torch.randn(b, s_k, h_k, d, requires_grad=True)
    v = torch.randn(b, s_k, h_k, d, requires_grad=True)
    sink = torch.randn(h, requires_grad=True)
    with flashattn.use_backend(backend):
        out, lse, _ = flashattn.flash_attn_func(q, k, v, causal=causal, window_size=window,
                                                learnable_sink=sink, return_attn_probs=True)
    qd, kd, vd, sd = (x.detach().double().requires_grad_() for x in (q, k, v, sink))
    ref, ref_lse = _ref(qd, kd, vd, sd, causal, window)
    torch.testing.assert_close(out.double(), ref, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(lse.double(), ref_lse, atol=1e-5, rtol=1e-5)
    g = torch.randn_like(out)
    grads = torch.autograd.grad(out, (q, k, v, sink), g)
    ref_grads = torch.autograd.grad(ref, (qd, kd, vd, sd), g.double())
    for a, r in zip(grads, ref_grads):
        torch.testing.assert_close(a.double(), r, atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("backend", ["cpu", "portable"])
def test_varlen_forward_and_backward(backend):
    torch.manual_seed(1)
    h, d = 2, 16
    cu = torch.tensor([0, 4, 4, 11], dtype=torch.int32)
    q = torch.randn(11, h, d, requires_grad=True)
    k = torch.randn(11, h, d, requires_grad=True)
    v = torch.randn(11, h, d, requires_grad=True)
    sink = torch.randn(h, requires_grad=True)
    with flashattn.use_backend(backend):
        out = flashattn.flash_attn_varlen_func(q, k, v, cu, cu, 7, 7, causal=True,
                                               learnable_sink=sink)
    out.sum().backward()
    for lo, hi in ((0, 4), (4, 11)):
        qd, kd, vd = (x.detach()[lo:hi][None].double() for x in (q, k, v))
        ref, _ = _ref(qd, kd, vd, sink.detach(), causal=True)
        torch.testing.assert_close(out[lo:hi].double(), ref[0], atol=1e-5, rtol=1e-5)
    # d sink = -sum over rows of p_sink * rowsum(dout * out) with dout = 1
    assert sink.grad is not None and torch.isfinite(sink.grad).all()
    sd = sink.detach().double().requires_grad_()
    total = sum(_ref(*(x.detach()[lo:hi][None].double() for x in (q, k, v)), sd, True)[0].sum()
                for lo, hi in ((0, 4), (4, 11)))
    (g_ref,) = torch.autograd.grad(total, sd)
    torch.testing.assert_close(sink.grad.double(), g_ref, atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("backend", ["cpu", "portable"])
def test_kvcache_forward(backend):
    torch.manual_seed(2)
    q = torch.randn(2, 1, 4, 16)
    cache = torch.randn(2, 20, 2, 16)
    seqlens = torch.tensor([20, 7], dtype=torch.int32)
    sink = torch.randn(4)
    with flashattn.use_backend(backend):
        out, lse = flashattn.flash_attn_with_kvcache(q, cache, cache, cache_seqlens=seqlens,
                                                     causal=True, learnable_sink=sink,
                                                     return_softmax_lse=True)
    for i, n in enumerate((20, 7)):
        ref, ref_lse = _ref(q[i:i + 1], cache[i:i + 1, :n], cache[i:i + 1, :n], sink, True)
        torch.testing.assert_close(out[i:i + 1].double(), ref, atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(lse[i:i + 1].double(), ref_lse, atol=1e-5, rtol=1e-5)


def _bf16_inputs(seed, b, s_q, s_k, h, h_k, d, d_v):
    """q (b, s_q, h, d), k (b, s_k, h_k, d), v (b, s_k, h_k, d_v) bf16 and the sink (h,)
    float32, from ``seed``."""
    gen = torch.Generator().manual_seed(seed)
    bf = dict(dtype=torch.bfloat16)
    q = torch.randn(b, s_q, h, d, generator=gen).to(**bf)
    k = torch.randn(b, s_k, h_k, d, generator=gen).to(**bf)
    v = torch.randn(b, s_k, h_k, d_v, generator=gen).to(**bf)
    return q, k, v, torch.randn(h, generator=gen)


def _bf16_sink_calls_meet_the_rule(backend, seed, b, s_q, s_k, h, h_k, d, d_v):
    """Causal bf16 calls with sinks, dense and packed (the same sequences), against the float64
    sink oracle on flash-attn's rule (baseline: the oracle in bf16): out and lse of both."""
    q, k, v, sink = _bf16_inputs(seed, b, s_q, s_k, h, h_k, d, d_v)
    cu_q = torch.arange(b + 1, dtype=torch.int32) * s_q
    cu_k = torch.arange(b + 1, dtype=torch.int32) * s_k
    with flashattn.use_backend(backend):
        out, lse, _ = flashattn.flash_attn_func(q, k, v, causal=True, learnable_sink=sink,
                                                return_attn_probs=True)
        packed, packed_lse, _ = flashattn.flash_attn_varlen_func(
            q.flatten(0, 1), k.flatten(0, 1), v.flatten(0, 1), cu_q, cu_k, s_q, s_k,
            causal=True, learnable_sink=sink, return_attn_probs=True)
    _assert_sink_rule((out, lse), (packed, packed_lse), q, k, v, sink)


def _assert_sink_rule(dense, packed, q, k, v, sink):
    """Causal bf16 results with sinks, dense (out (b, s_q, h, d_v), lse (b, h, s_q)) and
    packed (out (b * s_q, h, d_v), lse (h, b * s_q)), against the float64 sink oracle on
    flash-attn's rule (baseline: the oracle in bf16)."""
    from tests.accuracy import assert_close_rule

    (out, lse), (packed_out, packed_lse) = dense, packed
    ref, ref_lse = _ref(q, k, v, sink, causal=True)
    lp, lp_lse = _ref(q, k, v, sink, causal=True, dtype=torch.bfloat16)
    assert out.dtype == packed_out.dtype == torch.bfloat16
    assert_close_rule(out, ref, lp)
    assert_close_rule(lse, ref_lse, lp_lse, name="lse")
    assert_close_rule(packed_out, ref.flatten(0, 1), lp.flatten(0, 1), name="packed out")
    assert_close_rule(packed_lse, ref_lse.transpose(0, 1).flatten(1),
                      lp_lse.transpose(0, 1).flatten(1), name="packed lse")


@pytest.mark.parametrize("backend", ["cpu", "portable"])
@pytest.mark.parametrize("d_v", [16, 256])
@pytest.mark.parametrize("seed", range(5))
def test_bf16_forward_meets_the_rule(backend, d_v, seed):
    """The portable kernel writes its output in float32 for the sink pass, which rounds once:
    rounding to bf16 before the pass and again after it missed the rule in 3 of these 10
    portable calls, and came within 10 % of it in 4 more (benchmarks/NOTES.md, 2026-11-28)."""
    _bf16_sink_calls_meet_the_rule(backend, seed, 2, 19, 23, 4, 2, 16, d_v)


@pytest.mark.parametrize("backend", ["cpu", "portable"])
@pytest.mark.parametrize("d_v, seed", [(64, 9), (256, 5), (64, 0), (256, 1)])
def test_bf16_few_query_forward_meets_the_rule(backend, d_v, seed):
    """Few query rows (the decode kernel's route on the portable backend): the decode kernel
    writes float32 for the sink pass too. (d_v 64 seed 9 and d_v 256 seed 5 missed the rule
    when its output was rounded before the pass: 2 of 20 such calls, benchmarks/NOTES.md
    2026-11-28.)"""
    _bf16_sink_calls_meet_the_rule(backend, seed, 2, 3, 301, 8, 2, 64, d_v)


def _bf16_kvcache_sinks_meet_the_rule(backend, seed, b, s_q, s_k, h, h_k, d, d_v, paged):
    """Causal bf16 ``flash_attn_with_kvcache`` calls with sinks, q dense (b, s_q) and packed
    (FlashAttention-3's cu_seqlens_q), the cache contiguous or in pages of 16, against the
    float64 sink oracle on flash-attn's rule (baseline: the oracle in bf16): out and lse."""
    q, k, v, sink = _bf16_inputs(seed, b, s_q, s_k, h, h_k, d, d_v)
    lens = torch.full((b,), s_k, dtype=torch.int32)
    kw = {}
    k_cache, v_cache = k, v
    if paged:
        page = 16
        n_pages = b * s_k // page
        kw["block_table"] = torch.arange(n_pages, dtype=torch.int32).view(b, s_k // page)
        k_cache = k.reshape(n_pages, page, h_k, d)
        v_cache = v.reshape(n_pages, page, h_k, d_v)
    cu_q = torch.arange(b + 1, dtype=torch.int32) * s_q
    with flashattn.use_backend(backend):
        out, lse = flashattn.flash_attn_with_kvcache(
            q, k_cache, v_cache, cache_seqlens=lens, causal=True, learnable_sink=sink,
            return_softmax_lse=True, **kw)
        packed, packed_lse = flashattn.flash_attn_with_kvcache(
            q.flatten(0, 1), k_cache, v_cache, cache_seqlens=lens, cu_seqlens_q=cu_q,
            max_seqlen_q=s_q, causal=True, learnable_sink=sink, return_softmax_lse=True, **kw)
    # (the queries are the cache's last s_q positions: causal, bottom-right aligned)
    _assert_sink_rule((out, lse), (packed, packed_lse), q, k, v, sink)


@pytest.mark.parametrize("backend", ["cpu", "portable"])
@pytest.mark.parametrize("d_v, seed, paged", [(64, 3, False), (256, 6, True), (64, 9, True)])
def test_bf16_kvcache_sinks_meet_the_rule(backend, d_v, seed, paged):
    """The KV-cache call's attention writes float32 for its sink pass, which rounds once.
    These three seeds missed the rule on the portable backend when its output was rounded
    before the pass (12 of 48 such calls; 0 of 48 after; benchmarks/NOTES.md 2026-11-28)."""
    _bf16_kvcache_sinks_meet_the_rule(backend, seed, 2, 3, 304, 8, 2, 64, d_v, paged)


def test_row_without_keys_gets_zero_and_the_sink_as_lse():
    q, k = torch.randn(1, 3, 2, 8), torch.randn(1, 3, 2, 8)
    sink = torch.tensor([0.5, -1.0])
    out, lse, _ = flashattn.flash_attn_func(q, k, k, window_size=(0, -1), causal=True,
                                            learnable_sink=sink, return_attn_probs=True)
    assert torch.isfinite(out).all() and torch.isfinite(lse).all()


@pytest.mark.parametrize("kw,match", [
    (dict(learnable_sink=torch.zeros(3)), "shape"),
    (dict(learnable_sink=torch.zeros(4, dtype=torch.int32)), "float"),
    (dict(learnable_sink=[0.0] * 4), "tensor"),
    (dict(learnable_sink=torch.zeros(4), dropout_p=0.1), "dropout_p"),
])
def test_bad_sinks_name_the_argument(kw, match):
    q = torch.randn(1, 3, 4, 8)
    with pytest.raises((TypeError, ValueError), match=match):
        flashattn.flash_attn_func(q, q, q, **kw)


def test_sinks_under_compile():
    """fullgraph compile with the sink's gradient (distinct q, k, v: Dynamo does not trace an
    autograd.Function given the same tensor twice)."""
    torch.manual_seed(3)
    q = torch.randn(1, 8, 2, 16, requires_grad=True)
    k, v = torch.randn(1, 8, 2, 16), torch.randn(1, 8, 2, 16)
    sink = torch.randn(2, requires_grad=True)

    @torch.compile(fullgraph=True, backend="aot_eager")
    def f(q, k, v, sink):
        return flashattn.flash_attn_func(q, k, v, causal=True, learnable_sink=sink)

    with flashattn.use_backend("cpu"):
        out = f(q, k, v, sink)
        out.sum().backward()
        ref = flashattn.flash_attn_func(q.detach(), k, v, causal=True,
                                        learnable_sink=sink.detach())
    torch.testing.assert_close(out, ref)
    assert sink.grad is not None and torch.isfinite(sink.grad).all()


@pytest.mark.parametrize("backend", ["cpu", "portable"])
def test_kvcache_sinks_under_compile(backend):
    """A decode step with sinks and an append traces as one op (the sink is its argument):
    fullgraph compile equals the eager call, and both write the new keys into the cache."""
    torch.manual_seed(4)
    q = torch.randn(2, 1, 4, 16)
    k_new, v_new = torch.randn(2, 1, 2, 16), torch.randn(2, 1, 2, 16)
    sink = torch.randn(4)
    lens = torch.tensor([9, 3], dtype=torch.int32)
    caches = [(torch.randn(2, 12, 2, 16), torch.randn(2, 12, 2, 16)) for _ in range(2)]
    caches[1] = (caches[0][0].clone(), caches[0][1].clone())

    def step(q, k_cache, v_cache, k, v, lens, sink):
        return flashattn.flash_attn_with_kvcache(q, k_cache, v_cache, k, v, cache_seqlens=lens,
                                                 causal=True, learnable_sink=sink,
                                                 return_softmax_lse=True)

    compiled = torch.compile(step, fullgraph=True, backend="aot_eager")
    with flashattn.use_backend(backend):
        out, lse = compiled(q, *caches[0], k_new, v_new, lens, sink)
        ref, ref_lse = step(q, *caches[1], k_new, v_new, lens, sink)
    torch.testing.assert_close(out, ref)
    torch.testing.assert_close(lse, ref_lse)
    torch.testing.assert_close(caches[0][0], caches[1][0])
    for i, n in enumerate((10, 4)):  # the sink oracle over the appended cache
        exp, exp_lse = _ref(q[i:i + 1], caches[1][0][i:i + 1, :n], caches[1][1][i:i + 1, :n],
                            sink, True)
        torch.testing.assert_close(out[i:i + 1].double(), exp, atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(lse[i:i + 1].double(), exp_lse, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("backend", ["cpu", "portable"])
def test_varlen_sinks_under_compile(backend):
    """The packed forward with sinks is one op (flashattn::varlen_fwd_sink) under a fullgraph
    compile, with the sink's gradient (distinct cu_seqlens tensors: Dynamo does not trace an
    autograd.Function given the same tensor twice)."""
    torch.manual_seed(4)
    h, d = 2, 16
    cu_q = torch.tensor([0, 4, 11], dtype=torch.int32)
    cu_k = cu_q.clone()
    q = torch.randn(11, h, d, requires_grad=True)
    k, v = torch.randn(11, h, d), torch.randn(11, h, d)
    sink = torch.randn(h, requires_grad=True)

    @torch.compile(fullgraph=True, backend="aot_eager")
    def f(q, k, v, sink):
        return flashattn.flash_attn_varlen_func(q, k, v, cu_q, cu_k, 7, 7, causal=True,
                                                learnable_sink=sink)

    with flashattn.use_backend(backend):
        out = f(q, k, v, sink)
        out.sum().backward()
        ref = flashattn.flash_attn_varlen_func(q.detach(), k, v, cu_q, cu_k, 7, 7, causal=True,
                                               learnable_sink=sink.detach())
    torch.testing.assert_close(out, ref)
    assert sink.grad is not None and torch.isfinite(sink.grad).all()


@pytest.mark.gpu
@pytest.mark.parametrize("causal", [False, True])
def test_dense_gpu(causal, monkeypatch):
    """bf16 on the GPU, flash-attn's rule against the float64 sink oracle; the low-precision
    baseline is the same oracle in bf16. On sm90 the Hopper kernel folds the sink into its
    epilogue: the separate sink pass must not run."""
    from flashattn.dispatch import merge as dispatch_merge
    from flashattn.dispatch import select as dispatch_select
    from tests.accuracy import assert_close_rule

    torch.manual_seed(5)
    b, s, h, h_k, d = 2, 1024, 8, 2, 128
    q = torch.randn(b, s, h, d, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    k = torch.randn(b, s, h_k, d, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    v = torch.randn(b, s, h_k, d, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    params = AttnParams(d ** -0.5, causal, -1, 0 if causal else -1, 0.0, None, 0.0, 0)
    if dispatch_select.select("fwd", q, k, v, params) == "hopper":
        def no_pass(*args, **kwargs):
            raise AssertionError("the dense Hopper forward ran the separate sink pass")
        monkeypatch.setattr(dispatch_merge, "sink_apply", no_pass)
    sink = torch.randn(h, device="cuda", requires_grad=True)
    out, lse, _ = flashattn.flash_attn_func(q, k, v, causal=causal, learnable_sink=sink,
                                            return_attn_probs=True)
    g = torch.randn_like(out)
    grads = torch.autograd.grad(out, (q, k, v, sink), g)
    x64 = [x.detach().double().requires_grad_() for x in (q, k, v, sink)]
    ref, ref_lse = _ref(*x64, causal=causal)
    ref_grads = torch.autograd.grad(ref, x64, g.double())
    xlp = [x.detach().clone().requires_grad_() for x in (q, k, v)] + \
        [sink.detach().clone().requires_grad_()]
    lp, lp_lse = _ref(*xlp, causal=causal, dtype=torch.bfloat16)
    lp_grads = torch.autograd.grad(lp, xlp, g)
    assert_close_rule(out, ref, lp)
    assert_close_rule(lse, ref_lse, lp_lse, name="lse")
    for name, a, r, l in zip(("dq", "dk", "dv", "dsink"), grads, ref_grads, lp_grads):
        assert_close_rule(a, r, l, factor=3.0, name=name, atol=1e-3)


@pytest.mark.gpu
def test_varlen_and_kvcache_gpu():
    torch.manual_seed(6)
    dev, dt, h, d = "cuda", torch.bfloat16, 4, 64
    cu = torch.tensor([0, 300, 301, 1000], dtype=torch.int32, device=dev)
    q, k, v = (torch.randn(1000, h, d, device=dev, dtype=dt) for _ in range(3))
    sink = torch.randn(h, device=dev)
    out = flashattn.flash_attn_varlen_func(q, k, v, cu, cu, 699, 699, causal=True,
                                           learnable_sink=sink)
    for lo, hi in ((0, 300), (300, 301), (301, 1000)):
        ref, _ = _ref(*(x[lo:hi][None] for x in (q, k, v)), sink, causal=True)
        torch.testing.assert_close(out[lo:hi].double(), ref[0], atol=2e-2, rtol=2e-2)
    cache = torch.randn(2, 2048, h, d, device=dev, dtype=dt)
    qd = torch.randn(2, 1, h, d, device=dev, dtype=dt)
    lens = torch.tensor([5, 2048], dtype=torch.int32, device=dev)
    out = flashattn.flash_attn_with_kvcache(qd, cache, cache, cache_seqlens=lens,
                                            learnable_sink=sink)
    for i, n in enumerate(lens.tolist()):
        ref, _ = _ref(qd[i:i + 1], cache[i:i + 1, :n], cache[i:i + 1, :n], sink)
        torch.testing.assert_close(out[i:i + 1].double(), ref, atol=2e-2, rtol=2e-2)


@pytest.mark.gpu
@pytest.mark.parametrize("backend", ["auto", "portable"])
def test_varlen_bf16_gpu_meets_the_rule(backend, monkeypatch):
    """Packed bf16 with sinks on flash-attn's rule, sequence by sequence; on sm90 (auto) the
    Hopper kernel folds the sink into its epilogue in its varlen mode too (the separate sink
    pass must not run), the portable kernel's float32 output is rounded once by the pass."""
    from flashattn.dispatch import merge as dispatch_merge
    from flashattn.dispatch import select as dispatch_select
    from tests.accuracy import assert_close_rule

    torch.manual_seed(7)
    dev, dt, h, h_k, d = "cuda", torch.bfloat16, 8, 2, 128
    bounds = [0, 300, 301, 1000, 2024]
    cu = torch.tensor(bounds, dtype=torch.int32, device=dev)
    q = torch.randn(bounds[-1], h, d, device=dev, dtype=dt)
    k, v = (torch.randn(bounds[-1], h_k, d, device=dev, dtype=dt) for _ in range(2))
    sink = torch.randn(h, device=dev)
    params = AttnParams(d ** -0.5, True, -1, 0, 0.0, None, 0.0, 0)
    with flashattn.use_backend(backend):
        family = dispatch_select.varlen_forward_family(q, k, v, len(bounds) - 1, None, params)
        if family == "hopper":
            def no_pass(*args, **kwargs):
                raise AssertionError("the packed Hopper forward ran the separate sink pass")
            monkeypatch.setattr(dispatch_merge, "sink_apply", no_pass)
        out, lse, _ = flashattn.flash_attn_varlen_func(q, k, v, cu, cu, 1024, 1024, causal=True,
                                                       learnable_sink=sink,
                                                       return_attn_probs=True)
    for lo, hi in zip(bounds[:-1], bounds[1:]):
        part = [x[lo:hi][None] for x in (q, k, v)]
        ref, ref_lse = _ref(*part, sink, causal=True)
        lp, lp_lse = _ref(*part, sink, causal=True, dtype=torch.bfloat16)
        assert_close_rule(out[lo:hi][None], ref, lp, name=f"out [{lo}, {hi})")
        assert_close_rule(lse[:, lo:hi][None], ref_lse, lp_lse, name=f"lse [{lo}, {hi})")
