"""Public API conventions: flash-attn 2 signatures, returns, packing, seeds, empty inputs.

Numerical accuracy against the oracle lives in test_attention.py; these tests check the
plumbing, mostly on the fast chunked-torch backend, and on the Triton kernels where the
convention is theirs to honour (dropout seeds, S_dmask).
"""
from __future__ import annotations

import inspect
import typing

import pytest
import torch

import flashattn
from flashattn import flash_attn_func, flash_attn_kvpacked_func, flash_attn_qkvpacked_func
from flashattn.dispatch import dense as dispatch_dense
from flashattn.philox import dropout_keep_mask
from flashattn.reference import visible_mask

COMMON = [
    ("dropout_p", 0.0),
    ("softmax_scale", None),
    ("causal", False),
    ("window_size", (-1, -1)),
    ("softcap", 0.0),
    ("alibi_slopes", None),
    ("deterministic", False),
    ("return_attn_probs", False),
]
EMPTY = inspect.Parameter.empty


@pytest.mark.parametrize(
    "fn,positional",
    [
        (flash_attn_func, ["q", "k", "v"]),
        (flash_attn_qkvpacked_func, ["qkv"]),
        (flash_attn_kvpacked_func, ["q", "kv"]),
    ],
)
def test_signature_matches_flash_attn_2(fn, positional):
    """flash-attn 2's parameters, in its order and with its defaults; flash_attn_func adds
    FA3's FP8 descales (and the FP8 output dtype) after them, keyword only."""
    params = inspect.signature(fn).parameters
    expected = [(n, EMPTY) for n in positional] + COMMON
    fa2 = [(n, p.default) for n, p in params.items()
           if p.kind is inspect.Parameter.POSITIONAL_OR_KEYWORD]
    assert fa2 == expected
    extra = [(n, p.default) for n, p in params.items() if p.kind is inspect.Parameter.KEYWORD_ONLY]
    assert extra == ([("q_descale", None), ("k_descale", None), ("v_descale", None),
                      ("out_dtype", None), ("learnable_sink", None), ("attention_chunk", 0)]
                     if fn is flash_attn_func else []) + [("out", None)]
    assert len(fa2) + len(extra) == len(params)
    hints = typing.get_type_hints(fn)
    assert set(hints) >= {n for n, _ in expected} | {"return"}
    doc = inspect.getdoc(fn)
    assert doc and "batch" in doc and "float32" in doc and "softmax_lse" in doc


def test_public_names():
    assert set(flashattn.__all__) == {"flash_attn_func", "flash_attn_qkvpacked_func",
                                      "flash_attn_kvpacked_func",
                                      "flash_attn_varlen_func", "flash_attn_varlen_qkvpacked_func",
                                      "flash_attn_varlen_kvpacked_func",
                                      "flash_attn_with_kvcache", "flash_attn_combine",
                                      "flash_attn_fp8_func", "use_backend", "checks",
                                      "plan_decode", "DecodePlan"}


def _inputs(b=2, s_q=7, s_k=9, h=4, h_k=2, d=16, d_v=None, dtype=torch.float32, grad=True):
    d_v = d if d_v is None else d_v
    q = torch.randn(b, s_q, h, d, dtype=dtype)
    k = torch.randn(b, s_k, h_k, d, dtype=dtype)
    v = torch.randn(b, s_k, h_k, d_v, dtype=dtype)
    return [x.requires_grad_(grad) for x in (q, k, v)]


class _Spy:
    """Records the parameters every backend call received (wraps dispatch), as the kernels'
    keyword arguments."""

    def __init__(self, monkeypatch):
        self.fwd, self.bwd = [], []
        real_fwd, real_bwd = dispatch_dense.forward, dispatch_dense.backward

        def fwd(q, k, v, params, return_softmax=False):
            self.fwd.append({**params.kernel_kwargs(), "return_softmax": return_softmax})
            return real_fwd(q, k, v, params, return_softmax)

        def bwd(dout, q, k, v, out, lse, params):
            self.bwd.append({**params.kernel_kwargs(), "deterministic": params.deterministic})
            return real_bwd(dout, q, k, v, out, lse, params)

        monkeypatch.setattr(dispatch_dense, "forward", fwd)
        monkeypatch.setattr(dispatch_dense, "backward", bwd)


@pytest.fixture
def spy(monkeypatch):
    return _Spy(monkeypatch)


# ---- returns -------------------------------------------------------------------------------
def test_return_conventions(cpu_backend):
    q, k, v = _inputs(d_v=8)
    out = flash_attn_func(q, k, v)
    assert isinstance(out, torch.Tensor) and out.shape == (2, 7, 4, 8) and out.dtype == q.dtype
    res = flash_attn_func(q, k, v, return_attn_probs=True)
    assert isinstance(res, tuple) and len(res) == 3
    out2, lse, s_dmask = res
    torch.testing.assert_close(out2, out, rtol=0, atol=0)
    assert lse.shape == (2, 4, 7) and lse.dtype == torch.float32 and not lse.requires_grad
    assert s_dmask is None  # as flash-attn 2: S_dmask only with dropout
    _, _, s_dmask = flash_attn_func(q, k, v, dropout_p=0.1, return_attn_probs=True)
    assert s_dmask.shape == (2, 4, 7, 9) and s_dmask.dtype == q.dtype
    assert not s_dmask.requires_grad


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32])
def test_output_dtype(cpu_backend, dtype):
    q, k, v = _inputs(dtype=dtype)
    out, lse, _ = flash_attn_func(q, k, v, return_attn_probs=True)
    assert out.dtype == dtype and lse.dtype == torch.float32
    out.sum().backward()
    assert q.grad.dtype == k.grad.dtype == v.grad.dtype == dtype


def test_softmax_scale_default_is_d_qk(cpu_backend, spy):
    q, k, v = _inputs(d=24, d_v=8, grad=False)
    out = flash_attn_func(q, k, v)
    assert spy.fwd[-1]["softmax_scale"] == 24**-0.5
    torch.testing.assert_close(flash_attn_func(q, k, v, softmax_scale=24**-0.5), out,
                               rtol=0, atol=0)
    assert not torch.allclose(flash_attn_func(q, k, v, softmax_scale=8**-0.5), out)


@pytest.mark.parametrize(
    "causal,window,s_q,s_k,expected",
    [
        (False, (-1, -1), 5, 9, (-1, -1)),
        (True, (-1, -1), 5, 9, (-1, 0)),
        (True, (3, -1), 5, 9, (3, 0)),
        (True, (3, 7), 5, 9, (3, 0)),
        (False, (3, 2), 5, 9, (3, 2)),
        (False, (9, 9), 5, 9, (-1, -1)),  # flash-attn 2: a side >= seqlen_k is unbounded
        (False, (8, 8), 5, 9, (8, 8)),
        (True, (12, 4), 5, 9, (-1, 0)),
        (False, [2, 1], 5, 9, (2, 1)),
    ],
)
def test_window_normalisation(cpu_backend, spy, causal, window, s_q, s_k, expected):
    q, k, v = _inputs(s_q=s_q, s_k=s_k, grad=False)
    flash_attn_func(q, k, v, causal=causal, window_size=window)
    kw = spy.fwd[-1]
    assert (kw["window_left"], kw["window_right"]) == expected
    assert kw["causal"] is causal


def test_causal_equals_window_left_unbounded_right_zero(backend):
    q, k, v = _inputs(s_q=5, s_k=9, grad=False)
    a = flash_attn_func(q, k, v, causal=True)
    b = flash_attn_func(q, k, v, window_size=(-1, 0))
    torch.testing.assert_close(a, b, rtol=0, atol=0)


def test_window_past_seqlen_k_is_unbounded(cpu_backend):
    # flash-attn 2 semantics: with s_q > s_k the formula would hide keys from the first rows
    # for window_right >= s_k, but flash-attn treats such a window as unbounded.
    q, k, v = _inputs(s_q=12, s_k=4, grad=False)
    torch.testing.assert_close(flash_attn_func(q, k, v, window_size=(-1, 4)),
                               flash_attn_func(q, k, v), rtol=0, atol=0)


def test_alibi_h_equals_expanded_bh(backend, spy):
    q, k, v = _inputs(grad=False)
    slopes = torch.rand(4) * 0.5
    a = flash_attn_func(q, k, v, alibi_slopes=slopes)
    passed = spy.fwd[-1]["alibi_slopes"]
    assert passed.shape == (2, 4) and passed.stride() == (0, 1) and passed.dtype == torch.float32
    b = flash_attn_func(q, k, v, alibi_slopes=slopes.expand(2, 4).clone())
    torch.testing.assert_close(a, b, rtol=0, atol=0)


def test_deterministic_flag_reaches_backward(cpu_backend, spy):
    q, k, v = _inputs()
    flash_attn_func(q, k, v, deterministic=True).sum().backward()
    assert spy.bwd[-1]["deterministic"] is True
    assert "deterministic" not in spy.fwd[-1]


# ---- packed variants -----------------------------------------------------------------------
@pytest.mark.parametrize("dtype", [torch.float16, torch.float32])
def test_qkvpacked_matches_unpacked(backend, dtype):
    b, s, h, d = 2, 19, 3, 16
    qkv = torch.randn(b, s, 3, h, d, dtype=dtype, requires_grad=True)
    g = torch.randn(b, s, h, d, dtype=dtype)
    out_p = flash_attn_qkvpacked_func(qkv, causal=True)
    (dqkv,) = torch.autograd.grad(out_p, qkv, g)
    q, k, v = (x.detach().clone().requires_grad_() for x in qkv.unbind(2))
    out_u = flash_attn_func(q, k, v, causal=True)
    dq, dk, dv = torch.autograd.grad(out_u, (q, k, v), g)
    tol = dict(rtol=1e-5, atol=1e-6) if dtype == torch.float32 else dict(rtol=1e-3, atol=1e-3)
    torch.testing.assert_close(out_p, out_u, **tol)
    assert dqkv.shape == qkv.shape
    torch.testing.assert_close(dqkv, torch.stack([dq, dk, dv], dim=2), **tol)


def test_kvpacked_matches_unpacked_gqa(backend):
    b, s_q, s_k, h, h_k, d = 2, 13, 21, 6, 2, 16
    q = torch.randn(b, s_q, h, d, requires_grad=True)
    kv = torch.randn(b, s_k, 2, h_k, d, requires_grad=True)
    g = torch.randn(b, s_q, h, d)
    out_p = flash_attn_kvpacked_func(q, kv, window_size=(5, 3), softcap=5.0)
    dq_p, dkv = torch.autograd.grad(out_p, (q, kv), g)
    q2 = q.detach().clone().requires_grad_()
    k, v = (x.detach().clone().requires_grad_() for x in kv.unbind(2))
    out_u = flash_attn_func(q2, k, v, window_size=(5, 3), softcap=5.0)
    dq, dk, dv = torch.autograd.grad(out_u, (q2, k, v), g)
    torch.testing.assert_close(out_p, out_u, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(dq_p, dq, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(dkv, torch.stack([dk, dv], dim=2), rtol=1e-5, atol=1e-6)


def test_packed_return_attn_probs(cpu_backend):
    qkv = torch.randn(1, 6, 3, 2, 8)
    out, lse, s_dmask = flash_attn_qkvpacked_func(qkv, dropout_p=0.2, return_attn_probs=True)
    assert out.shape == (1, 6, 2, 8) and lse.shape == (1, 2, 6) and s_dmask.shape == (1, 2, 6, 6)


# ---- empty inputs --------------------------------------------------------------------------
@pytest.mark.parametrize("fn", ["func", "qkvpacked", "kvpacked"])
def test_empty_batch(backend, fn):
    b, s, h, d = 0, 5, 2, 8
    if fn == "func":
        ins = _inputs(b=0, s_q=s, s_k=s, h=h, h_k=h, d=d)
        out, lse, _ = flash_attn_func(*ins, causal=True, return_attn_probs=True)
    elif fn == "qkvpacked":
        ins = [torch.randn(b, s, 3, h, d, requires_grad=True)]
        out, lse, _ = flash_attn_qkvpacked_func(*ins, return_attn_probs=True)
    else:
        ins = [torch.randn(b, s, h, d, requires_grad=True),
               torch.randn(b, s, 2, h, d, requires_grad=True)]
        out, lse, _ = flash_attn_kvpacked_func(*ins, return_attn_probs=True)
    assert out.shape == (0, s, h, d) and lse.shape == (0, h, s)
    out.sum().backward()
    for x in ins:
        assert x.grad is not None and x.grad.shape == x.shape


def test_empty_batch_with_dropout(backend):
    q, k, v = _inputs(b=0)
    out, lse, s_dmask = flash_attn_func(q, k, v, dropout_p=0.3, return_attn_probs=True)
    assert out.shape == (0, 7, 4, 16) and s_dmask.shape == (0, 4, 7, 9)
    out.sum().backward()
    assert q.grad.shape == q.shape


def test_empty_seqlen_k(backend):
    # No keys at all: every row sees nothing -> out 0, lse -inf, zero grads.
    q, k, v = _inputs(s_k=0)
    out, lse, _ = flash_attn_func(q, k, v, return_attn_probs=True)
    assert (out == 0).all() and (lse == float("-inf")).all()
    out.sum().backward()
    assert (q.grad == 0).all() and k.grad.shape == k.shape


# ---- dropout seeds -------------------------------------------------------------------------
def test_no_rng_draw_without_dropout(cpu_backend):
    q, k, v = _inputs()
    torch.manual_seed(123)
    flash_attn_func(q, k, v).sum().backward()
    after = torch.rand(4)
    torch.manual_seed(123)
    torch.testing.assert_close(torch.rand(4), after, rtol=0, atol=0)


def test_one_seed_per_forward_reused_by_backward(cpu_backend, spy):
    q, k, v = _inputs()
    torch.manual_seed(7)
    out = flash_attn_func(q, k, v, dropout_p=0.25)
    state = torch.get_rng_state()
    seed = spy.fwd[-1]["philox_seed"]
    assert isinstance(seed, int) and 0 <= seed < 2**63
    out.sum().backward()
    assert spy.bwd[-1]["philox_seed"] == seed and spy.bwd[-1]["dropout_p"] == 0.25
    assert torch.equal(torch.get_rng_state(), state), "backward drew from the RNG"
    flash_attn_func(q, k, v, dropout_p=0.25)
    assert spy.fwd[-1]["philox_seed"] != seed, "a second forward must draw a new seed"


def test_dropout_reproducible_under_manual_seed(backend):
    q, k, v = _inputs(s_q=20, s_k=24)
    g = torch.randn(2, 20, 4, 16)

    def run(s):
        torch.manual_seed(s)
        out = flash_attn_func(q, k, v, dropout_p=0.3)
        return (out, *torch.autograd.grad(out, (q, k, v), g))

    a, b, c = run(0), run(0), run(1)
    for x, y in zip(a, b):
        assert torch.equal(x, y)
    assert not torch.equal(a[0], c[0])


@pytest.mark.parametrize("p", [0.17, 0.5, 0.9])
def test_s_dmask_sign_is_philox_keep_mask(backend, spy, p):
    b, s_q, s_k, h, h_k = 2, 19, 37, 4, 2
    q, k, v = _inputs(b=b, s_q=s_q, s_k=s_k, h=h, h_k=h_k, grad=False)
    q = q * 0.3  # soft probabilities: no entry underflows to 0
    window = (9, 4)
    out, lse, s_dmask = flash_attn_func(q, k, v, dropout_p=p, window_size=window,
                                        return_attn_probs=True)
    seed = spy.fwd[-1]["philox_seed"]
    keep = dropout_keep_mask(seed, p, b, h, s_q, s_k)
    visible = visible_mask(s_q, s_k, *window).expand(b, h, s_q, s_k)
    assert (s_dmask[~visible] == 0).all(), "S_dmask must be 0 where the key is invisible"
    sv = s_dmask[visible]
    assert (sv != 0).all()
    assert torch.equal(sv > 0, keep[visible]), "S_dmask sign must equal the philox keep mask"
    # magnitude: the softmax probabilities before dropout scaling (rows sum to 1)
    torch.testing.assert_close(s_dmask.abs().sum(-1), torch.ones(b, h, s_q), rtol=1e-4, atol=1e-4)
    # the dropped fraction is about p
    frac = (~keep[visible]).float().mean().item()
    assert abs(frac - p) < 0.1


def test_dout_with_odd_strides(backend):
    # out.sum() hands the backward an expanded (stride 0) gradient; a transposed gradient
    # has a non-unit last stride. Both must give the same grads as a contiguous dout.
    q, k, v = _inputs(s_q=9, s_k=9)
    out = flash_attn_func(q, k, v, causal=True)
    ref = torch.autograd.grad(out, (q, k, v), torch.ones_like(out), retain_graph=True)
    got = torch.autograd.grad(out.sum(), (q, k, v), retain_graph=True)
    for x, y in zip(got, ref):
        torch.testing.assert_close(x, y, rtol=1e-5, atol=1e-6)
    g = torch.randn(2, 9, 16, 4).transpose(2, 3)  # (b, s, h, d) with stride(-1) == 4
    ref = torch.autograd.grad(out, (q, k, v), g.contiguous(), retain_graph=True)
    got = torch.autograd.grad(out, (q, k, v), g)
    for x, y in zip(got, ref):
        torch.testing.assert_close(x, y, rtol=1e-5, atol=1e-6)


# ---------------------------------------------------------------------------------------------
# window_size as tensors / numpy ints (flash-attn's own tests pass
# torch.randint(...) results) means the same window as the Python ints
# ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize("as_", ["tensor", "numpy_array", "numpy_ints", "zero_d_tensors"])
def test_window_size_tensors_and_numpy(cpu_backend, as_):
    import numpy as np

    q, k, v = _inputs(grad=False)
    window = {"tensor": torch.tensor([3, 1]), "numpy_array": np.array([3, 1]),
              "numpy_ints": (np.int64(3), np.int32(1)),
              "zero_d_tensors": (torch.tensor(3), torch.tensor(1))}[as_]
    got = flash_attn_func(q, k, v, window_size=window)
    torch.testing.assert_close(got, flash_attn_func(q, k, v, window_size=(3, 1)), rtol=0, atol=0)


@pytest.mark.parametrize("bad", [torch.tensor([1.0, 2.0]), torch.tensor([1, 2, 3]),
                                 torch.tensor([[1, 2]]), torch.tensor([True, False])])
def test_window_size_bad_tensors_name_the_argument(cpu_backend, bad):
    q, k, v = _inputs(grad=False)
    with pytest.raises(TypeError, match="window_size"):
        flash_attn_func(q, k, v, window_size=bad)
