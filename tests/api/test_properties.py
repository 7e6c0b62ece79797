"""Property-based exploration of the public functions (hypothesis) against the float64 oracle.

The hand-written grids (test_attention, test_varlen, test_kvcache) pick their cases; here
hypothesis draws them: shapes, head layouts, masks, features and sequence lengths in any
combination the API accepts, judged by the same checks (flash-attn's 2x / 3x rule, exact
zeros where no key is visible, caches written in place). A failure prints the drawn case,
which then belongs in the grid of its file.

Reproducible by default: the examples are derandomized (the same cases on every run, so CI
cannot fail on a draw it has never seen) and the tensors are seeded from the drawn case. To
explore, set ``FLASHATTN_HYPOTHESIS_EXAMPLES=N``: N examples per test (per backend), drawn
from the suite's base seed (``--seed`` / ``FLASHATTN_TEST_SEED`` replays a run).

The 'portable' backend runs the Triton kernels in the interpreter, which is slow, so its
draws are smaller and fewer. The ``gpu`` tests run the compiled kernels on CUDA tensors, with
the Hopper kernels forced for every call they cover.
"""
from __future__ import annotations

import os

import pytest
import torch
from hypothesis import HealthCheck, Phase, given, seed, settings
from hypothesis import strategies as st

from tests.api.test_attention import Case, check_attention, fa2_window
from tests.api.test_kvcache import KVCase, run_case
from tests.api.test_varlen import VCase, check_varlen
from tests.conftest import SMOKE_ENV, use_backend

_EXPLORE = int(os.environ.get("FLASHATTN_HYPOTHESIS_EXAMPLES", "0") or 0)
_DTYPES = st.sampled_from([torch.float16, torch.bfloat16, torch.float32])


def _examples(n: int):
    """hypothesis settings: ``n`` derandomized examples, or the exploration budget."""
    common = dict(deadline=None, database=None, print_blob=True,
                  suppress_health_check=[HealthCheck.function_scoped_fixture,
                                         HealthCheck.too_slow, HealthCheck.data_too_large,
                                         HealthCheck.filter_too_much])
    if _EXPLORE:
        return settings(max_examples=_EXPLORE, derandomize=False, **common)
    if os.environ.get(SMOKE_ENV):  # pytest --smoke: every property once, not its whole budget
        n = min(n, 2)
    return settings(max_examples=n, derandomize=True, **common)


def _explore_seed(fn):
    """In exploration mode, draw from the suite's base seed (replayable with --seed)."""
    if _EXPLORE:
        return seed(int(os.environ.get("FLASHATTN_TEST_SEED", "0")))(fn)
    return fn


def _windows(max_side: int):
    side = st.integers(-1, max_side)
    return st.one_of(st.just((-1, -1)), st.tuples(side, side))


def _heads():
    return st.tuples(st.sampled_from([1, 2]), st.sampled_from([1, 2, 3])).map(
        lambda t: (t[0] * t[1], t[0]))


@st.composite
def dense_cases(draw, small: bool) -> Case:
    """A flash_attn_func call. ``small``: sizes the interpreter runs in about a second."""
    s_max, dims = (24, [8, 16, 24, 40, 64]) if small else (96, [8, 16, 24, 40, 59, 64, 80, 128])
    d = draw(st.sampled_from(dims))
    h, h_k = draw(_heads())
    extra = draw(st.sampled_from(["none", "none", "softcap", "alibi_h", "alibi_bh", "dropout"]))
    return Case(
        s_q=draw(st.integers(1, s_max)), s_k=draw(st.integers(1, s_max)), d=d,
        d_v=draw(st.one_of(st.none(), st.sampled_from(dims))), dtype=draw(_DTYPES),
        b=draw(st.integers(1, 2)), h=h, h_k=h_k, causal=draw(st.booleans()),
        window=draw(_windows(s_max + 4)), softcap=5.0 if extra == "softcap" else 0.0,
        alibi={"alibi_h": "h", "alibi_bh": "bh"}.get(extra),
        dropout_p=0.17 if extra == "dropout" else 0.0, deterministic=draw(st.booleans()),
        softmax_scale=draw(st.sampled_from([None, None, 0.3])))


def _sequences(draw, s_max: int):
    """(lens_q, lens_k, seqused_k or None) of 1-4 sequences of 0-s_max rows / keys."""
    n = draw(st.integers(1, 4))
    lens_q = tuple(draw(st.lists(st.integers(0, s_max), min_size=n, max_size=n)))
    lens_k = tuple(draw(st.lists(st.integers(0, s_max), min_size=n, max_size=n)))
    used = None
    if draw(st.booleans()):
        used = tuple(draw(st.integers(0, lk)) for lk in lens_k)
    return lens_q, lens_k, used


@st.composite
def varlen_cases(draw, small: bool) -> VCase:
    """A flash_attn_varlen_func call: 1-4 sequences, lengths from 0, s_q != s_k within one."""
    s_max = 20 if small else 70
    lens_q, lens_k, used = _sequences(draw, s_max)
    h, h_k = draw(_heads())
    dims = [8, 16, 32, 40] if small else [8, 16, 32, 40, 64, 80]
    extra = draw(st.sampled_from(["none", "none", "softcap", "alibi_h", "alibi_bh", "dropout"]))
    return VCase(
        lens_q, lens_k, d=draw(st.sampled_from(dims)),
        d_v=draw(st.one_of(st.none(), st.sampled_from(dims))), dtype=draw(_DTYPES), h=h,
        h_k=h_k, causal=draw(st.booleans()), window=draw(_windows(s_max + 4)),
        softcap=5.0 if extra == "softcap" else 0.0,
        alibi={"alibi_h": "h", "alibi_bh": "bh"}.get(extra),
        dropout_p=0.17 if extra == "dropout" else 0.0, deterministic=draw(st.booleans()),
        seqused_k=used)


@st.composite
def kvcache_cases(draw, small: bool) -> KVCase:
    """A flash_attn_with_kvcache call: contiguous or paged caches (any page size), appended
    keys, rotary, cache_batch_idx / cache_leftpad, masks, splits."""
    b = draw(st.integers(1, 3))
    s_new = draw(st.integers(0, 4))
    s_q = draw(st.integers(1, 6 if small else 12))
    s_cache = draw(st.integers(max(s_new, 1) + 1, 40 if small else 90))
    page = draw(st.one_of(st.none(), st.integers(1, 20)))
    h, h_k = draw(_heads())
    rotary = draw(st.sampled_from([None, "interleaved", "neox"])) if s_new else None
    return KVCase(
        b=b, s_q=s_q, s_new=s_new, s_cache=s_cache, h=h, h_k=h_k,
        d=draw(st.sampled_from([8, 16, 32] if small else [8, 16, 32, 64])),
        dtype=draw(_DTYPES), page=page, rotary=rotary,
        rotary_frac=draw(st.sampled_from([1.0, 0.5])),
        batch_idx=page is None and draw(st.booleans()), leftpad=draw(st.booleans()),
        causal=draw(st.booleans()), window=draw(_windows(s_cache + 8)),
        softcap=draw(st.sampled_from([0.0, 0.0, 2.0])), alibi=draw(st.booleans()),
        num_splits=draw(st.sampled_from([0, 1, 3])), seqlens_int=draw(st.booleans()),
        empty_row=b >= 2 and s_new == 0 and draw(st.booleans()))


def _seeded(strategy):
    """(case, tensor seed): the inputs' values follow from the draw."""
    return st.tuples(strategy, st.integers(0, 2**31 - 1))


def _property_test(check, backend, strategy, n):
    """A test of ``check(case, data_seed, backend, monkeypatch)`` over ``n`` draws of
    ``strategy`` with ``backend`` forced: "cpu", "portable", or "hopper" (CUDA tensors: a
    ``gpu`` test, whose failures are reported as drawn, not shrunk: shrinking compiles kernel
    variants the draw never needed, and a device call's time is short)."""
    def test(monkeypatch, drawn):
        use_backend(monkeypatch, backend)
        check(*drawn, backend, monkeypatch)
    gpu = backend == "hopper"
    # (named before hypothesis wraps it: its reports and derandomized draws key on it)
    test.__name__ = test.__qualname__ = f"test{check.__name__}_{'gpu' if gpu else backend}"
    config = _examples(n)
    if gpu:
        config = settings(config, phases=[Phase.explicit, Phase.reuse, Phase.generate])
    wrapped = config(_explore_seed(given(drawn=_seeded(strategy))(test)))
    return pytest.mark.gpu(wrapped) if gpu else wrapped


def _backend_tests(check, strategies, examples):
    """The (cpu, portable) pair of tests of ``check``: ``strategies`` and ``examples`` per
    backend, the interpreter's smaller and fewer."""
    return tuple(_property_test(check, b, st_, n)
                 for b, st_, n in zip(("cpu", "portable"), strategies, examples))


def _device(backend: str) -> str:
    return "cuda" if backend == "hopper" else "cpu"


def _dense(case, data_seed, backend, monkeypatch):
    torch.manual_seed(data_seed)
    # the inputs' memory layout from the seed: contiguous, (b, h, s, d) viewed as (b, s, h, d),
    # or a window of a larger tensor (storage offset, padded strides)
    check_attention(case, device=_device(backend),
                    layout=("contiguous", "bhsd", "padded")[data_seed % 3])


def _varlen(case, data_seed, backend, monkeypatch):
    torch.manual_seed(data_seed)
    check_varlen(case, device=_device(backend), monkeypatch=monkeypatch)


def _kvcache(case, data_seed, backend, monkeypatch):
    torch.manual_seed(data_seed)
    run_case(case, _device(backend))


test_dense_cpu, test_dense_portable = _backend_tests(
    _dense, (dense_cases(small=False), dense_cases(small=True)), (200, 40))
test_varlen_cpu, test_varlen_portable = _backend_tests(
    _varlen, (varlen_cases(small=False), varlen_cases(small=True)), (200, 40))
test_kvcache_cpu, test_kvcache_portable = _backend_tests(
    _kvcache, (kvcache_cases(small=False), kvcache_cases(small=True)), (200, 40))


# ---------------------------------------------------------------------------------------------
# GPU: the compiled kernels. FLASHATTN_BACKEND=hopper sends every call the Gluon kernels cover
# to them whatever its size (auto sends calls under ~512 keys to the portable kernels), so
# these small draws reach the Hopper forward and backward, tiles that cross a sequence's end
# and shifted key blocks included; the calls they do not cover (float32, ALiBi, dropout, other
# head dims, unaligned strides, deterministic masked backward) run the compiled portable
# kernels, and KV-cache calls the decode kernels.
# ---------------------------------------------------------------------------------------------
_GPU_DIMS = [64, 96, 128, 192, 256, 40]
_GPU_DTYPES = st.sampled_from([torch.bfloat16, torch.bfloat16, torch.float16, torch.float32])
_GPU_EXTRAS = st.sampled_from(["none", "none", "none", "softcap", "alibi_h", "dropout"])


@st.composite
def gpu_dense_cases(draw) -> Case:
    """A flash_attn_func call over 1-400 rows / keys (a few Hopper tiles)."""
    s_max = 400
    d = draw(st.sampled_from(_GPU_DIMS))
    h, h_k = draw(_heads())
    extra = draw(_GPU_EXTRAS)
    return Case(
        s_q=draw(st.integers(1, s_max)), s_k=draw(st.integers(1, s_max)), d=d,
        # (192 / 128: the Hopper forward's headdim_v != headdim case)
        d_v=draw(st.sampled_from([None, None, None, 128])) if d == 192 else None,
        dtype=draw(_GPU_DTYPES), b=draw(st.integers(1, 2)), h=h, h_k=h_k,
        causal=draw(st.booleans()), window=draw(_windows(s_max + 4)),
        softcap=5.0 if extra == "softcap" else 0.0,
        alibi="h" if extra == "alibi_h" else None,
        dropout_p=0.17 if extra == "dropout" else 0.0, deterministic=draw(st.booleans()),
        softmax_scale=draw(st.sampled_from([None, None, 0.3])))


@st.composite
def gpu_varlen_cases(draw) -> VCase:
    """A flash_attn_varlen_func call: 1-4 sequences of 0-300 rows / keys."""
    s_max = 300
    lens_q, lens_k, used = _sequences(draw, s_max)
    h, h_k = draw(_heads())
    d = draw(st.sampled_from(_GPU_DIMS))
    extra = draw(_GPU_EXTRAS)
    return VCase(
        lens_q, lens_k, d=d,
        d_v=draw(st.sampled_from([None, None, None, 128])) if d == 192 else None,
        dtype=draw(_GPU_DTYPES), h=h, h_k=h_k, causal=draw(st.booleans()),
        window=draw(_windows(s_max + 4)), softcap=5.0 if extra == "softcap" else 0.0,
        alibi="h" if extra == "alibi_h" else None,
        dropout_p=0.17 if extra == "dropout" else 0.0, deterministic=draw(st.booleans()),
        seqused_k=used)


# (20 draws each: most of a draw's time is compiling the kernel variants it needs)
test_dense_gpu = _property_test(_dense, "hopper", gpu_dense_cases(), 20)
test_varlen_gpu = _property_test(_varlen, "hopper", gpu_varlen_cases(), 20)
test_kvcache_gpu = _property_test(_kvcache, "hopper", kvcache_cases(small=False), 20)


# ---------------------------------------------------------------------------------------------
# FlashAttention-3's packed forms of the KV-cache call (cu_seqlens_q, cu_seqlens_k_new)
# ---------------------------------------------------------------------------------------------
@st.composite
def packed_kvcache_calls(draw):
    """(b, lens_q, lens_new, cache_seqlens, capacity, page or None, heads, causal, window,
    packed new keys?) of a fa3.flash_attn_with_kvcache call with packed queries."""
    b = draw(st.integers(1, 3))
    lens_q = draw(st.lists(st.integers(0, 6), min_size=b, max_size=b))
    packed_new = draw(st.booleans())
    if packed_new:
        lens_new = draw(st.lists(st.integers(0, 4), min_size=b, max_size=b))
    else:  # dense new keys: one count for every sequence
        lens_new = [draw(st.integers(0, 4))] * b
    page = draw(st.one_of(st.none(), st.sampled_from([1, 3, 8])))
    capacity = draw(st.integers(max(lens_new) + 1, 24))
    if page is not None:
        capacity = -(-capacity // page) * page
    seqlens = [draw(st.integers(0, capacity - n)) for n in lens_new]
    return dict(b=b, lens_q=lens_q, lens_new=lens_new, packed_new=packed_new, page=page,
                capacity=capacity, seqlens=seqlens, heads=draw(_heads()),
                causal=draw(st.booleans()), window=draw(_windows(capacity + 4)))


def _check_packed_kvcache(call, data_seed, backend, monkeypatch):
    """One packed-query KV-cache call against reference.kvcache_ref sequence by sequence
    (float32, as tests/api/test_kvcache_varlen.py)."""
    import itertools

    import flashattn.fa3 as fa3
    from flashattn import reference as R

    def cu(lens):
        return torch.tensor([0, *itertools.accumulate(lens)], dtype=torch.int32)

    g = torch.Generator().manual_seed(data_seed)
    b, (h, h_k), d = call["b"], call["heads"], 16
    lens_q, lens_new, page = call["lens_q"], call["lens_new"], call["page"]
    k_cache = torch.randn(b, call["capacity"], h_k, d, generator=g)
    v_cache = torch.randn(b, call["capacity"], h_k, d, generator=g)
    table = None
    if page is not None:  # the same rows as pages in a shuffled pool
        perm = torch.randperm(b * call["capacity"] // page, generator=g)
        k_cache = k_cache.view(-1, page, h_k, d)[perm.argsort()].contiguous()
        v_cache = v_cache.view(-1, page, h_k, d)[perm.argsort()].contiguous()
        table = perm.view(b, -1).to(torch.int32)
    q = torch.randn(sum(lens_q), h, d, generator=g)
    if call["packed_new"]:
        k_new = torch.randn(sum(lens_new), h_k, d, generator=g)
        v_new = torch.randn(sum(lens_new), h_k, d, generator=g)
        cu_new = cu(lens_new)
    else:
        k_new = torch.randn(b, lens_new[0], h_k, d, generator=g)
        v_new = torch.randn(b, lens_new[0], h_k, d, generator=g)
        cu_new = None
    if max(lens_new) == 0:
        k_new = v_new = cu_new = None
    seqlens = torch.tensor(call["seqlens"], dtype=torch.int32)
    kc, vc = k_cache.clone(), v_cache.clone()
    right, max_q = call["window"][1], max(max(lens_q), 1)
    if not call["causal"] and call["capacity"] <= right < max_q - 1:
        # FA3 and flash-attn 2 mask differently here (fa3._check_window_rule): refused
        with pytest.raises(NotImplementedError, match=r"window_size\[1\]"):
            fa3.flash_attn_with_kvcache(
                q, kc, vc, k_new, v_new, cache_seqlens=seqlens, page_table=table,
                cu_seqlens_q=cu(lens_q), cu_seqlens_k_new=cu_new, max_seqlen_q=max_q,
                causal=False, window_size=call["window"])
        return
    out, lse = fa3.flash_attn_with_kvcache(
        q, kc, vc, k_new, v_new, cache_seqlens=seqlens, page_table=table,
        cu_seqlens_q=cu(lens_q), cu_seqlens_k_new=cu_new, max_seqlen_q=max_q,
        causal=call["causal"], window_size=call["window"], return_softmax_lse=True)
    cu_q = cu(lens_q)
    kr, vr = k_cache.clone(), v_cache.clone()
    for i in range(b):
        rows = slice(int(cu_q[i]), int(cu_q[i + 1]))
        kn = vn = None
        if lens_new[i]:
            if call["packed_new"]:
                keys = slice(int(cu_new[i]), int(cu_new[i + 1]))
                kn, vn = k_new[keys][None], v_new[keys][None]
            else:
                kn, vn = k_new[i:i + 1], v_new[i:i + 1]
        one = dict(cache_seqlens=seqlens[i:i + 1], causal=call["causal"],
                   window_size=call["window"])
        if table is not None:
            one["block_table"] = table[i:i + 1]
        else:
            one["cache_batch_idx"] = torch.tensor([i], dtype=torch.int32)
        ref_out, ref_lse, kr, vr = R.kvcache_ref(q[rows][None], kr, vr, kn, vn, **one)
        torch.testing.assert_close(out[rows].double(), ref_out[0], atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(lse[:, rows].double(), ref_lse[0], atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(kc, kr, atol=0, rtol=0)
    torch.testing.assert_close(vc, vr, atol=0, rtol=0)


test_packed_kvcache_cpu, test_packed_kvcache_portable = _backend_tests(
    _check_packed_kvcache, (packed_kvcache_calls(),) * 2, (150, 30))


# ---------------------------------------------------------------------------------------------
# FP8: block quantization (+ incoherent processing) and attention over it
# ---------------------------------------------------------------------------------------------
@st.composite
def fp8_calls(draw):
    h, h_k = draw(_heads())
    d = draw(st.sampled_from([16, 32, 48, 64]))
    return dict(b=draw(st.integers(1, 2)), s_q=draw(st.integers(1, 48)),
                s_k=draw(st.integers(1, 48)), h=h, h_k=h_k, d=d,
                d_v=draw(st.sampled_from([d, 16, 32])),
                block_m=draw(st.sampled_from([16, 32, 64, 128])),
                block_n=draw(st.sampled_from([16, 32, 64, 128])),
                incoherent=draw(st.booleans()), causal=draw(st.booleans()),
                window=draw(_windows(52)), softcap=draw(st.sampled_from([0.0, 0.0, 2.0])))


def _check_fp8(call, data_seed, backend, monkeypatch):
    """fp8.quantize on CPU, then fp8.attention: on the cpu backend exactly the attention of
    the dequantized values (reference.attention_fp8_ref without P rounding); on the portable
    kernel within 2x of what FA3's e4m3 rounding of P costs that oracle, with the cpu lse."""
    import flashattn
    from flashattn import fp8
    from flashattn.reference import attention_fp8_ref

    g = torch.Generator().manual_seed(data_seed)
    c = call
    q = torch.randn(c["b"], c["s_q"], c["h"], c["d"], generator=g)
    k = torch.randn(c["b"], c["s_k"], c["h_k"], c["d"], generator=g)
    v = torch.randn(c["b"], c["s_k"], c["h_k"], c["d_v"], generator=g)
    kw = dict(causal=c["causal"], window_size=c["window"], softcap=c["softcap"])
    # the oracle takes the mask as flash-attn 2 normalises it (a side >= seqlen_k: unbounded)
    ref_kw = dict(kw, window_size=fa2_window(c["causal"], c["window"], c["s_k"]))
    with flashattn.use_backend("cpu"):
        r = fp8.quantize(q, k, v, incoherent=c["incoherent"], seed=data_seed,
                         block_m=c["block_m"], block_n=c["block_n"])
        out_cpu, lse_cpu = fp8.attention(r, **kw, out_dtype=torch.float32, return_lse=True)
    args = (r.q, r.k, r.v, r.q_descale, r.k_descale, r.v_descale, r.block_m, r.block_n)
    exact = attention_fp8_ref(*args, **ref_kw, p_scale=None)
    if backend == "cpu":
        torch.testing.assert_close(out_cpu.double(), exact, atol=2e-5, rtol=2e-5)
        return
    with flashattn.use_backend("portable"):
        out, lse = fp8.attention(r, **kw, out_dtype=torch.float32, return_lse=True)
    rmse = (out.double() - exact).pow(2).mean().sqrt().item()
    p_cost = (attention_fp8_ref(*args, **ref_kw) - exact).pow(2).mean().sqrt().item()
    assert rmse <= 2 * p_cost + 1e-6, (rmse, p_cost)
    finite = torch.isfinite(lse_cpu)
    assert torch.equal(finite, torch.isfinite(lse))
    assert (out[~finite.transpose(1, 2)] == 0).all()
    torch.testing.assert_close(lse[finite], lse_cpu[finite], atol=1e-4, rtol=1e-5)


test_fp8_cpu, test_fp8_portable = _backend_tests(_check_fp8, (fp8_calls(),) * 2, (100, 30))


# ---------------------------------------------------------------------------------------------
# Chunked local attention (attention_chunk, Llama-4) and learnable sinks (gpt-oss), float32
# ---------------------------------------------------------------------------------------------
@st.composite
def chunk_sink_calls(draw):
    h, h_k = draw(_heads())
    s_max = 40
    return dict(b=draw(st.integers(1, 2)), s_q=draw(st.integers(1, s_max)),
                s_k=draw(st.integers(1, s_max)), h=h, h_k=h_k,
                d=draw(st.sampled_from([8, 16, 24])), chunk=draw(st.integers(0, 20)),
                sink=draw(st.booleans()), causal=draw(st.booleans()),
                window=draw(_windows(s_max + 4)), softcap=draw(st.sampled_from([0.0, 0.0, 2.0])),
                alibi=draw(st.booleans()))


def _check_chunk_sink(call, data_seed, backend, monkeypatch):
    """flash_attn_func with attention_chunk and / or learnable_sink against the float64 oracle:
    reference.attention_ref's chunked mask (flash-attn 2's window rule first), then the sink
    as one more logit per head in each row's denominator (lse' = logaddexp(lse, sink),
    out' = out * exp(lse - lse')); forward, lse and the gradients of q, k, v and the sink."""
    import flashattn
    from flashattn import reference as R

    c = call
    g = torch.Generator().manual_seed(data_seed)
    q = torch.randn(c["b"], c["s_q"], c["h"], c["d"], generator=g).requires_grad_()
    k = torch.randn(c["b"], c["s_k"], c["h_k"], c["d"], generator=g).requires_grad_()
    v = torch.randn(c["b"], c["s_k"], c["h_k"], c["d"], generator=g).requires_grad_()
    sink = torch.randn(c["h"], generator=g).requires_grad_() if c["sink"] else None
    slopes = torch.rand(c["b"], c["h"], generator=g) * 0.5 if c["alibi"] else None
    kw = dict(causal=c["causal"], softcap=c["softcap"], alibi_slopes=slopes)
    out, lse, _ = flashattn.flash_attn_func(q, k, v, window_size=c["window"],
                                            attention_chunk=c["chunk"], learnable_sink=sink,
                                            return_attn_probs=True, **kw)
    dout = torch.randn(out.shape, generator=g)
    inputs = (q, k, v) + ((sink,) if sink is not None else ())
    grads = torch.autograd.grad(out, inputs, dout)

    x64 = [x.detach().double().requires_grad_() for x in inputs]
    ref, ref_lse = R.attention_ref(*x64[:3], window_size=fa2_window(c["causal"], c["window"],
                                                                   c["s_k"]),
                                   attention_chunk=c["chunk"], **kw)
    if sink is not None:
        with_sink = torch.logaddexp(ref_lse, x64[3].view(1, -1, 1))
        ref = ref * torch.exp(ref_lse - with_sink).transpose(1, 2).unsqueeze(-1)
        ref_lse = with_sink
    ref_grads = torch.autograd.grad(ref, x64, dout.double(), allow_unused=True)
    torch.testing.assert_close(out.double(), ref.detach(), atol=1e-5, rtol=1e-5)
    finite = torch.isfinite(ref_lse)
    assert torch.equal(finite, torch.isfinite(lse)), "lse: rows without keys differ"
    torch.testing.assert_close(lse.double()[finite], ref_lse.detach()[finite], atol=1e-5,
                               rtol=1e-5)
    for name, got, want in zip(("dq", "dk", "dv", "dsink"), grads, ref_grads):
        want = torch.zeros_like(got, dtype=torch.float64) if want is None else want
        torch.testing.assert_close(got.double(), want, atol=2e-4, rtol=2e-4,
                                   msg=lambda m, name=name: f"{name}: {m}")


test_chunk_sink_cpu, test_chunk_sink_portable = _backend_tests(
    _check_chunk_sink, (chunk_sink_calls(),) * 2, (150, 20))
