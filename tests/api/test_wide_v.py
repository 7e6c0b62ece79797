"""V head dims past 256 in the dense and varlen forwards (FlashAttention-3 takes hdimv 512:
multi-head latent attention's latent width, e.g. q / k 64 wide and v 512): the forward of
``flash_attn_func`` / ``flash_attn_varlen_func`` (and ``flashattn.fa3``'s) up to 512, against
the float64 oracle by flash-attn's rule, on both CPU-runnable backends; inputs that require
grad run the forward and a backward raises NotImplementedError naming the head dim; past 512
a ValueError names v (``fa3``: NotImplementedError, as FA3)."""
from __future__ import annotations

import pytest
import torch

import flashattn
from flashattn import fa3
from flashattn.reference import attention_ref
from tests.accuracy import assert_close_rule


def _dense(b, s_q, s_k, h, h_k, d, d_v, dtype=torch.bfloat16):
    q = torch.randn(b, s_q, h, d, dtype=dtype)
    k = torch.randn(b, s_k, h_k, d, dtype=dtype)
    v = torch.randn(b, s_k, h_k, d_v, dtype=dtype)
    return q, k, v


def _check(out, lse, q, k, v, **kw):
    ref, lse_ref = attention_ref(q.double(), k.double(), v.double(), **kw)
    lp, lse_lp = attention_ref(q, k, v, upcast=False, **kw)
    assert_close_rule(out, ref, lp, name="out")
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
    _check(out, lse, q, k, v, causal=causal, window_size=window, softcap=softcap)


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
               v[keys][None], causal=True)


def test_fa3_forward_wide_v(backend):
    q, k, v = _dense(1, 16, 16, 2, 1, 64, 512)
    out, lse = fa3.flash_attn_func(q, k, v, causal=True, return_attn_probs=True)
    _check(out, lse, q, k, v, causal=True)


@pytest.mark.parametrize("varlen", [False, True])
def test_backward_of_wide_v_raises(cpu_backend, varlen):
    q, k, v = (x.requires_grad_() for x in _dense(1, 8, 8, 2, 1, 32, 320))
    if varlen:
        cu = torch.tensor([0, 8], dtype=torch.int32)
        out = flashattn.flash_attn_varlen_func(q[0], k[0], v[0], cu, cu, 8, 8)
    else:
        out = flashattn.flash_attn_func(q, k, v)
    ref, _ = attention_ref(q.detach().double(), k.detach().double(), v.detach().double())
    assert (out.detach().double() - ref[0 if varlen else slice(None)]).abs().max() < 0.05
    assert out.requires_grad
    with pytest.raises(NotImplementedError, match="head dim above 256"):
        out.sum().backward()
    # the same call without grad is a plain forward (the fast path may record it)
    with torch.no_grad():
        again = flashattn.flash_attn_func(q, k, v) if not varlen else None
    if again is not None:
        assert torch.equal(again, out.detach())


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
    """torch.compile(fullgraph=True) compiles the forward of inputs that require grad (it
    traces a backward at compile time: the refusal is an op that raises when it runs)."""
    q = torch.randn(1, 8, 2, 32, requires_grad=True)
    k, v = torch.randn(1, 8, 1, 32), torch.randn(1, 8, 1, 320)
    compiled = torch.compile(lambda q, k, v: flashattn.flash_attn_func(q, k, v, causal=True),
                             fullgraph=True)
    out = compiled(q, k, v)
    assert torch.equal(out.detach(), flashattn.flash_attn_func(q.detach(), k, v, causal=True))
    with pytest.raises(NotImplementedError, match="head dim above 256"):
        out.sum().backward()
