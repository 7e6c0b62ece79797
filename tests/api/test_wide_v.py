"""V head dims past 256 in the dense and varlen forwards (FlashAttention-3 takes hdimv 512:
multi-head latent attention's latent width, e.g. q / k 64 wide and v 512): the forward of
``flash_attn_func`` / ``flash_attn_varlen_func`` (and ``flashattn.fa3``'s) up to 512, against
the float64 oracle by flash-attn's rule, on both CPU-runnable backends; inputs that require
grad go by V's column slices (api/wide_v.py) and every gradient is checked; past 512 a
ValueError names v (``fa3``: NotImplementedError, as FA3)."""
from __future__ import annotations

import pytest
import torch

import flashattn
from flashattn import fa3
from flashattn.reference import attention_ref
from tests.accuracy import assert_attention_close, assert_close_rule
from tests.api.test_sinks import _ref as sink_ref


def _dense(b, s_q, s_k, h, h_k, d, d_v, dtype=torch.bfloat16):
    q = torch.randn(b, s_q, h, d, dtype=dtype)
    k = torch.randn(b, s_k, h_k, d, dtype=dtype)
    v = torch.randn(b, s_k, h_k, d_v, dtype=dtype)
    return q, k, v


def _check(out, lse, q, k, v, backend, **kw):
    ref, lse_ref = attention_ref(q.double(), k.double(), v.double(), **kw)
    lp, lse_lp = attention_ref(q, k, v, upcast=False, **kw)
    atol = 1e-5
    if out.dtype == torch.bfloat16 and backend == "portable" and out.device.type == "cpu":
        # the interpreter truncates fp32 -> bf16 (one ulp, not half) when a kernel writes out
        # (a CI seed, 134515869, put the few-query route's 16-row call 5e-4 past the bare rule)
        atol += 2.0**-7 * ref.abs().max().item()
    assert_close_rule(out, ref, lp, atol=atol, name="out")
    assert_close_rule(lse, lse_ref, lse_lp, name="lse")


@pytest.mark.parametrize("d, d_v, h, h_k, causal, window, softcap", [
    (64, 512, 4, 1, False, (-1, -1), 0.0),      # MLA's shape: one KV head
    (64, 512, 4, 2, True, (-1, -1), 0.0),
    (128, 384, 2, 2, True, (24, 0), 0.0),       # a width between 256 and 512, a window
    (32, 300, 2, 1, False, (-1, -1), 20.0),     # not a power of two; softcap
])
def test_dense_forward_wide_v(backend, d, d_v, h, h_k, causal, window, softcap):
    q, k, v = _dense(2, 37, 45, h, h_k, d, d_v)
    out, lse, _ = flashattn.flash_attn_func(q, k, v, causal=causal, window_size=window,
                                            softcap=softcap, return_attn_probs=True)
    assert out.shape == (2, 37, h, d_v) and out.dtype == q.dtype
    _check(out, lse, q, k, v, backend, causal=causal, window_size=window, softcap=softcap)


def test_varlen_forward_wide_v(backend):
    lengths_q, lengths_k = [5, 0, 33, 17], [9, 4, 33, 40]
    cu_q = torch.tensor([0] + lengths_q).cumsum(0).to(torch.int32)
    cu_k = torch.tensor([0] + lengths_k).cumsum(0).to(torch.int32)
    h, h_k, d, d_v = 4, 1, 64, 512
    q = torch.randn(int(cu_q[-1]), h, d, dtype=torch.bfloat16)
    k = torch.randn(int(cu_k[-1]), h_k, d, dtype=torch.bfloat16)
    v = torch.randn(int(cu_k[-1]), h_k, d_v, dtype=torch.bfloat16)
    out, lse, _ = flashattn.flash_attn_varlen_func(
        q, k, v, cu_q, cu_k, max(lengths_q), max(lengths_k), causal=True,
        return_attn_probs=True)
    assert out.shape == (q.shape[0], h, d_v)
    for i in range(len(lengths_q)):
        if lengths_q[i] == 0:
            continue
        rows = slice(int(cu_q[i]), int(cu_q[i + 1]))
        keys = slice(int(cu_k[i]), int(cu_k[i + 1]))
        _check(out[rows][None], lse[:, rows][None], q[rows][None], k[keys][None],
               v[keys][None], backend, causal=True)


def test_fa3_forward_wide_v(backend):
    q, k, v = _dense(1, 16, 16, 2, 1, 64, 512)
    out, lse = fa3.flash_attn_func(q, k, v, causal=True, return_attn_probs=True)
    _check(out, lse, q, k, v, backend, causal=True)


@pytest.mark.parametrize("d, d_v, causal, sink", [
    (32, 320, True, False),     # two slices of 160
    (64, 512, False, False),    # two slices of 256
    (16, 600 - 88, True, True),  # a learnable sink: its gradient sums over the slices too
])
def test_gradients_of_wide_v_by_column_slices(backend, d, d_v, causal, sink):
    """Inputs that require grad run by V's column slices: out, lse and every gradient
    against the float64 oracle (2x / 3x rule)."""
    # (the sink case in float32: in bf16 its dsink missed the 3x rule on one CI seed of
    # 2026-11-28, 5.7e-2 against 4.5e-2, after the forward's sink rounding was fixed; NOTES)
    dtype = torch.float32 if sink else torch.bfloat16
    q, k, v = (x.requires_grad_() for x in _dense(2, 19, 23, 4, 2, d, d_v, dtype))
    if sink:
        s = torch.randn(4, requires_grad=True)
        out = flashattn.flash_attn_func(q, k, v, causal=causal, learnable_sink=s)
        dout = torch.randn_like(out)
        grads = torch.autograd.grad(out, (q, k, v, s), dout)
        # the sink's oracle (tests/api/test_sinks.py) in float64, and in q's dtype for the
        # baseline
        x64 = [t.detach().double().requires_grad_() for t in (q, k, v, s)]
        ref, _ = sink_ref(*x64, causal=causal)
        ref_grads = torch.autograd.grad(ref, x64, dout.double())
        xlp = [t.detach().clone().requires_grad_() for t in (q, k, v, s)]
        lp, _ = sink_ref(*xlp, causal=causal, dtype=dtype)
        lp_grads = torch.autograd.grad(lp, xlp, dout)
        assert_close_rule(out, ref, lp, name="out")
        for name, got, r, l in zip(("dq", "dk", "dv", "dsink"), grads, ref_grads, lp_grads):
            assert_close_rule(got, r, l, factor=3.0, name=name, atol=1e-3)
        return
    out, lse, _ = flashattn.flash_attn_func(q, k, v, causal=causal, return_attn_probs=True)
    dout = torch.randn_like(out)
    assert_attention_close(q, k, v, out, dout, torch.autograd.grad(out, (q, k, v), dout),
                           lse=lse, window_size=(-1, 0) if causal else (-1, -1))


def test_varlen_gradients_of_wide_v(backend):
    lengths = [7, 0, 16, 9]
    cu = torch.tensor([0] + lengths).cumsum(0).to(torch.int32)
    h, h_k, d, d_v = 2, 1, 32, 384
    total = int(cu[-1])
    q = torch.randn(total, h, d, dtype=torch.bfloat16, requires_grad=True)
    k = torch.randn(total, h_k, d, dtype=torch.bfloat16, requires_grad=True)
    v = torch.randn(total, h_k, d_v, dtype=torch.bfloat16, requires_grad=True)
    out = flashattn.flash_attn_varlen_func(q, k, v, cu, cu, max(lengths), max(lengths),
                                           causal=True)
    dout = torch.randn_like(out)
    dq, dk, dv = torch.autograd.grad(out, (q, k, v), dout)
    for i, n in enumerate(lengths):
        if n == 0:
            continue
        rows = slice(int(cu[i]), int(cu[i + 1]))
        qs, ks, vs = (x.detach()[rows][None].requires_grad_() for x in (q, k, v))
        assert_attention_close(qs, ks, vs, out[rows][None], dout[rows][None],
                               (dq[rows][None], dk[rows][None], dv[rows][None]),
                               window_size=(-1, 0))


def test_column_slices():
    from flashattn.api.wide_v import column_slices

    assert column_slices(512) == [(0, 256), (256, 512)]
    assert column_slices(384) == [(0, 192), (192, 384)]
    assert column_slices(257) == [(0, 129), (129, 257)]
    assert column_slices(300) == [(0, 150), (150, 300)]


def test_dropout_with_wide_v_and_grad_is_refused(cpu_backend):
    q, k, v = (x.requires_grad_() for x in _dense(1, 8, 8, 2, 1, 32, 320))
    with pytest.raises(NotImplementedError, match="dropout_p"):
        flashattn.flash_attn_func(q, k, v, dropout_p=0.1)
    with torch.no_grad():  # one kernel, one mask: fine without a gradient
        assert flashattn.flash_attn_func(q, k, v, dropout_p=0.1).shape == (1, 8, 2, 320)


def test_v_wider_than_512_is_refused(cpu_backend):
    q, k, v = _dense(1, 4, 4, 2, 1, 64, 513)
    with pytest.raises(ValueError, match=r"v.*headdim_v 513.*1\.\.512"):
        flashattn.flash_attn_func(q, k, v)
    with pytest.raises(NotImplementedError, match="head dim 513 of v"):
        fa3.flash_attn_func(q, k, v)
    q2, k2, _ = _dense(1, 4, 4, 2, 1, 257, 64)
    with pytest.raises(ValueError, match=r"q.*headdim 257"):
        flashattn.flash_attn_func(q2, k2, torch.randn(1, 4, 1, 512, dtype=torch.bfloat16))


def test_wide_v_under_torch_compile(cpu_backend):
    """torch.compile(fullgraph=True) traces the slices, forward and backward."""
    q = torch.randn(1, 8, 2, 32, requires_grad=True)
    k, v = torch.randn(1, 8, 1, 32), torch.randn(1, 8, 1, 320, requires_grad=True)
    compiled = torch.compile(lambda q, k, v: flashattn.flash_attn_func(q, k, v, causal=True),
                             fullgraph=True)
    out = compiled(q, k, v)
    eager = flashattn.flash_attn_func(q, k, v, causal=True)
    assert torch.equal(out, eager)
    assert all(torch.equal(a, b) for a, b in zip(torch.autograd.grad(out.sum(), (q, v)),
                                                 torch.autograd.grad(eager.sum(), (q, v))))


@pytest.mark.parametrize("d, d_v, dtype, alibi, dropout, family, expected", [
    (64, 512, torch.bfloat16, False, 0.0, "hopper", True),     # two slices of 256
    (128, 384, torch.float16, False, 0.0, "hopper", True),     # two of 192
    (64, 320, torch.bfloat16, False, 0.0, "hopper", False),    # 160: no Hopper head dim
    (16, 512, torch.bfloat16, False, 0.0, "hopper", False),    # d 16: no Hopper head dim
    (64, 512, torch.float32, False, 0.0, "hopper", False),     # fp32: portable only
    (64, 512, torch.bfloat16, True, 0.0, "hopper", False),     # ALiBi: portable only
    (64, 512, torch.bfloat16, False, 0.1, "hopper", False),    # dropout: portable only
    (64, 512, torch.bfloat16, False, 0.0, "portable", False),  # not a Hopper device
])
def test_calls_without_grad_go_by_slices_only_onto_the_hopper_kernel(
        monkeypatch, d, d_v, dtype, alibi, dropout, family, expected):
    """Without a gradient, slices are taken only where each runs on the Hopper kernel
    (measured faster than the portable kernel's one pass there; elsewhere they would only
    recompute Q K^T)."""
    from flashattn.api import wide_v
    from flashattn.dispatch import select

    monkeypatch.setattr(select, "family_for", lambda t: family)
    q = torch.zeros(1, 4, 2, d, dtype=dtype)
    v = torch.zeros(1, 4, 2, d_v, dtype=dtype)
    slopes = torch.ones(2) if alibi else None
    assert wide_v.faster_by_slices(q, v, slopes, dropout) is expected


def test_calls_without_grad_by_slices_match_one_pass(backend, monkeypatch):
    """A call without a gradient taken by slices (as on a Hopper device) gives the one pass's
    output and lse (here both on this backend: the slices' path with the family forced)."""
    from flashattn.api import wide_v

    q, k, v = _dense(2, 19, 23, 4, 2, 64, 512, torch.bfloat16)
    calls = []
    real = wide_v.by_slices

    def spy(run, vv):
        calls.append(vv.shape[-1])
        return real(run, vv)
    # (the slices first: a one-pass call of the same signature would be replayed by the
    # recorded-call fast path afterwards; a call by slices records nothing)
    with monkeypatch.context() as m:
        m.setattr(wide_v, "faster_by_slices", lambda *a: True)
        m.setattr(wide_v, "by_slices", spy)
        two, lse2, _ = flashattn.flash_attn_func(q, k, v, causal=True, return_attn_probs=True)
    assert calls == [512]
    one, lse1, _ = flashattn.flash_attn_func(q, k, v, causal=True, return_attn_probs=True)
    _check(two, lse2, q, k, v, backend, causal=True)
    torch.testing.assert_close(lse2, lse1)
    torch.testing.assert_close(two.float(), one.float(), atol=2e-2, rtol=0)
