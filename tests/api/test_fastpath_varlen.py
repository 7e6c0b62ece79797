"""The repeated-call fast path of ``flash_attn_varlen_func`` (api/fastpath.VARLEN, the
lean eager path): a packed signature seen before skips the argument checks and dispatch, and
runs ``replay_varlen.VarlenRunner``'s decisions, through its own autograd function when a gradient
is recorded (every layer of a packed training step repeats one signature). It must give the
full path's outputs and gradients, keep checking the metadata values wherever the full path
checks them, and leave every other kind of call on the full path."""
from __future__ import annotations

import numpy as np
import pytest
import torch

import flashattn
from flashattn.replay import varlen as replay_varlen
from flashattn.api import fastpath


@pytest.fixture(autouse=True)
def _empty_cache():
    fastpath.VARLEN.clear()
    fastpath.FA3_FP8_VARLEN.clear()
    yield
    fastpath.VARLEN.clear()
    fastpath.FA3_FP8_VARLEN.clear()


LENS = [5, 17, 0, 30, 9]


def _packed(h=4, h_k=2, d=32, d_v=None, lens=LENS, grad=False, seed=0):
    gen = torch.Generator().manual_seed(seed)
    total = sum(lens)
    q = torch.randn(total, h, d, generator=gen)
    k = torch.randn(total, h_k, d, generator=gen)
    v = torch.randn(total, h_k, d_v or d, generator=gen)
    cu = torch.tensor([0] + np.cumsum(lens).tolist(), dtype=torch.int32)
    for t in (q, k, v):
        t.requires_grad_(grad)
    return q, k, v, cu, max(lens)


class _Spy:
    """Counts VarlenRunner.forward / backward calls (the recorded path's)."""

    def __init__(self, monkeypatch):
        self.forward = self.backward = 0
        real_f, real_b = replay_varlen.VarlenRunner.forward, replay_varlen.VarlenRunner.backward

        def forward(runner, *a):
            self.forward += 1
            return real_f(runner, *a)

        def backward(runner, *a):
            self.backward += 1
            return real_b(runner, *a)

        monkeypatch.setattr(replay_varlen.VarlenRunner, "forward", forward)
        monkeypatch.setattr(replay_varlen.VarlenRunner, "backward", backward)


CASES = [
    dict(),
    dict(causal=True),
    dict(window_size=(6, 2)),
    dict(softcap=5.0, causal=True),
    dict(softmax_scale=0.3, deterministic=True),
    dict(return_attn_probs=True, causal=True),
]


@pytest.mark.parametrize("kw", CASES, ids=lambda kw: ",".join(kw) or "plain")
@pytest.mark.parametrize("used", [False, True], ids=["all_keys", "seqused_k"])
def test_recorded_call_matches_the_full_path(monkeypatch, kw, used):
    """Outputs (and lse) and q / k / v gradients of the recorded call equal the full path's
    (the same bodies on the same tensors: bitwise on the CPU), with and without grad mode."""
    spy = _Spy(monkeypatch)
    q, k, v, cu, m = _packed(grad=True)
    seqused = torch.tensor([3, 17, 0, 12, 9], dtype=torch.int32) if used else None
    dout = torch.randn(q.shape[0], q.shape[1], v.shape[2])

    def call():
        res = flashattn.flash_attn_varlen_func(q, k, v, cu, cu, m, m, seqused_k=seqused, **kw)
        out = res[0] if isinstance(res, tuple) else res
        grads = torch.autograd.grad(out, (q, k, v), dout)
        return res, grads

    full, full_grads = call()  # the signature's first call: the full path, recorded
    assert len(fastpath.VARLEN._entries) == 1 and spy.forward == 0
    fast, fast_grads = call()
    assert spy.forward == 1 and spy.backward == 1
    if kw.get("return_attn_probs"):
        assert fast[2] is None and full[2] is None
        torch.testing.assert_close(fast[1], full[1], rtol=0, atol=0)
        fast, full = fast[0], full[0]
    assert fast.grad_fn is not None and "RecordedVarlen" in type(fast.grad_fn).__name__
    torch.testing.assert_close(fast, full, rtol=0, atol=0)
    for a, b in zip(fast_grads, full_grads):
        torch.testing.assert_close(a, b, rtol=0, atol=0)
    with torch.no_grad():  # (another signature: recorded by its first call, then replayed)
        for _ in range(2):
            res = flashattn.flash_attn_varlen_func(q, k, v, cu, cu, m, m, seqused_k=seqused,
                                                   **kw)
    out = res[0] if isinstance(res, tuple) else res
    assert out.grad_fn is None and spy.forward == 2 and len(fastpath.VARLEN._entries) == 2
    torch.testing.assert_close(out, fast.detach(), rtol=0, atol=0)


def test_values_are_checked_on_every_call():
    """The CPU offsets (and seqused_k) are value-checked on a recorded call as on the full
    path: a bad offset or a too-small max_seqlen never reaches the kernels."""
    q, k, v, cu, m = _packed()
    for _ in range(2):
        flashattn.flash_attn_varlen_func(q, k, v, cu, cu, m, m)
    assert len(fastpath.VARLEN._entries) == 1
    bad = cu.clone()
    bad[2] = 100
    with pytest.raises(ValueError, match="cu_seqlens_q"):
        flashattn.flash_attn_varlen_func(q, k, v, bad, cu, m, m)
    swapped = cu.clone()
    swapped[1], swapped[2] = cu[2], cu[1]
    with pytest.raises(ValueError, match="cu_seqlens_k"):
        flashattn.flash_attn_varlen_func(q, k, v, cu, swapped, m, m)
    used = torch.tensor([3, 99, 0, 1, 1], dtype=torch.int32)
    for _ in range(2):
        flashattn.flash_attn_varlen_func(q, k, v, cu, cu, m, m,
                                         seqused_k=torch.zeros(5, dtype=torch.int32))
    with pytest.raises(ValueError, match="seqused_k"):
        flashattn.flash_attn_varlen_func(q, k, v, cu, cu, m, m, seqused_k=used)


def test_signature_rules():
    """What makes a signature, and what takes the full path."""
    q, k, v, cu, m = _packed()
    args = (q, k, v, cu, cu, m, m)
    base = dict(dropout_p=0.0, softmax_scale=None, causal=False, window_size=(-1, -1),
                softcap=0.0, deterministic=False, return_attn_probs=False, seqused_k=None)

    def key(*a, **kw):
        p = {**base, **kw}
        return fastpath.varlen_key(*a, p["dropout_p"], p["softmax_scale"], p["causal"],
                                   p["window_size"], p["softcap"], p["deterministic"],
                                   p["return_attn_probs"], p["seqused_k"])

    k0 = key(*args)
    assert k0 is not None and key(*args) == k0
    assert key(q, k, v, cu, cu, m, m + 1) != k0  # the maxima (the window rule reads them)
    assert key(*args, causal=1) != key(*args, causal=True)
    assert key(*args, seqused_k=torch.zeros(5, dtype=torch.int32)) != k0
    # full path: dropout, odd scalar types, a list window, non-int maxima, subclasses
    assert key(*args, dropout_p=0.1) is None
    assert key(*args, softcap=np.float64(1.0)) is None
    assert key(*args, window_size=[-1, -1]) is None
    assert key(q, k, v, cu, cu, np.int64(m), m) is None
    assert key(q, k, v, cu, cu, torch.tensor(m), m) is None
    assert key(q.to(torch.float64), k, v, cu, cu, m, m) is None

    class Sub(torch.Tensor):
        pass

    assert key(q.as_subclass(Sub), k, v, cu, cu, m, m) is None
    assert key(q, k, v, cu.as_subclass(Sub), cu, m, m) is None
    assert key(*args, seqused_k=[1, 2]) is None


def test_other_calls_take_the_full_path(monkeypatch):
    """ALiBi, dropout, sinks, seqused_q, out=, tracing: never recorded."""
    q, k, v, cu, m = _packed()
    for _ in range(2):
        flashattn.flash_attn_varlen_func(q, k, v, cu, cu, m, m, dropout_p=0.2)
        flashattn.flash_attn_varlen_func(q, k, v, cu, cu, m, m,
                                         alibi_slopes=torch.rand(4))
        flashattn.flash_attn_varlen_func(q, k, v, cu, cu, m, m,
                                         learnable_sink=torch.zeros(4))
        flashattn.flash_attn_varlen_func(q, k, v, cu, cu, m, m,
                                         seqused_q=torch.zeros(5, dtype=torch.int32))
    assert not fastpath.VARLEN._entries
    out = torch.empty(q.shape)
    for _ in range(2):
        flashattn.flash_attn_varlen_func(q, k, v, cu, cu, m, m, out=out)
    assert len(fastpath.VARLEN._entries) == 1  # (out= wraps the recorded call, copies into out)
    torch.testing.assert_close(out, flashattn.flash_attn_varlen_func(q, k, v, cu, cu, m, m))
    fastpath.VARLEN.clear()
    monkeypatch.setattr(flashattn.ops, "tracing", lambda: True)
    assert fastpath.varlen_key(q, k, v, cu, cu, m, m, 0.0, None, False, (-1, -1), 0.0, False,
                               False, None) is None


def test_settings_change_the_path():
    """A recorded signature is used only under the settings it was recorded with."""
    q, k, v, cu, m = _packed()
    flashattn.flash_attn_varlen_func(q, k, v, cu, cu, m, m)
    (key,) = fastpath.VARLEN._entries
    assert fastpath.VARLEN.get(key) is not None
    with flashattn.use_backend("portable"):
        assert fastpath.VARLEN.get(key) is None


def test_signature_first_seen_under_graph_capture_is_not_kept(monkeypatch):
    monkeypatch.setattr(fastpath, "capturing", lambda: True)
    q, k, v, cu, m = _packed()
    for _ in range(2):
        flashattn.flash_attn_varlen_func(q, k, v, cu, cu, m, m)
    assert not fastpath.VARLEN._entries


def test_empty_sequences_signature():
    """max_seqlen_k = 0 (every key sequence empty): out 0, lse -inf, zero gradients, recorded
    as the full path answers it."""
    q, k, v, cu, _ = _packed(grad=True)
    cu_k = torch.zeros_like(cu)
    results = []
    for _ in range(2):
        out, lse, _ = flashattn.flash_attn_varlen_func(q, k, v, cu, cu_k, 30, 0,
                                                       return_attn_probs=True)
        grads = torch.autograd.grad(out.sum(), (q, k, v))
        results.append((out, lse) + grads)
    assert len(fastpath.VARLEN._entries) == 1
    out, lse, dq, dk, dv = results[1]
    assert not out.any() and torch.isneginf(lse).all()
    assert not dq.any() and not dk.any() and not dv.any()


def test_fp8_signature_rules():
    """FP8 packed calls (FA3's descale API) have their own signatures: descales keyed by
    presence and layout, no dropout / ALiBi / return_attn_probs / grad."""
    q, k, v, cu, m = _packed()
    q8, k8, v8 = (t.to(torch.float8_e4m3fn) for t in (q, k, v))
    d = torch.ones(5, 2)

    def key(q8=q8, k8=k8, v8=v8, dropout_p=0.0, alibi=None, probs=False, qd=None, kd=None,
            vd=None, out_dtype=None, used=None, max_k=m):
        return fastpath.fa3_fp8_varlen_key(q8, k8, v8, cu, cu, m, max_k, dropout_p, None, True,
                                           (-1, -1), 0.0, alibi, probs, qd, kd, vd, out_dtype,
                                           used)

    k0 = key()
    assert k0 is not None and key() == k0
    assert key(qd=d) != k0 and key(qd=d) != key(kd=d)
    assert key(out_dtype=torch.float16) != k0 and key(max_k=m + 1) != k0
    assert key(used=torch.zeros(5, dtype=torch.int32)) != k0
    assert key(dropout_p=0.1) is None and key(probs=True) is None
    assert key(alibi=torch.ones(4)) is None and key(qd=[1.0]) is None
    assert key(q8=q) is None  # (16-bit inputs: varlen_key's)
    assert key(q8=q8.clone().requires_grad_(False), max_k=np.int64(m)) is None


def test_fp8_cpu_calls_keep_taking_the_full_path():
    """No recorded FP8 call covers CPU tensors (the exact dequantized path): the signature's
    entry says so, and every call is checked and computed by the full path."""
    q, k, v, cu, m = _packed()
    q8, k8, v8 = (t.to(torch.float8_e4m3fn) for t in (q, k, v))
    kd = torch.full((5, 2), 0.5)
    outs = [flashattn.flash_attn_varlen_func(q8, k8, v8, cu, cu, m, m, causal=True,
                                             k_descale=kd) for _ in range(3)]
    (entry,) = fastpath.FA3_FP8_VARLEN._entries.values()
    assert entry[1] is fastpath.FP8_FULL_PATH
    assert torch.equal(outs[0], outs[2])
    with pytest.raises(ValueError, match="k_descale"):
        flashattn.flash_attn_varlen_func(q8, k8, v8, cu, cu, m, m, causal=True,
                                         k_descale=-kd)


def test_packed_qkv_variants_are_recorded_too():
    """flash_attn_varlen_qkvpacked_func / _kvpacked_func: views of one tensor, recorded like
    the plain call; the packed gradient equals the full path's."""
    q, k, v, cu, m = _packed(h=4, h_k=4)
    qkv = torch.stack([q, k, v], dim=1).requires_grad_(True)
    kv = torch.stack([k, v], dim=1).requires_grad_(True)
    qg = q.clone().requires_grad_(True)
    results = []
    for _ in range(2):
        out1 = flashattn.flash_attn_varlen_qkvpacked_func(qkv, cu, m, causal=True)
        out2 = flashattn.flash_attn_varlen_kvpacked_func(qg, kv, cu, cu, m, m, softcap=3.0)
        grads = torch.autograd.grad(out1.sum() + (out2 * out2).sum(), (qkv, qg, kv))
        results.append((out1, out2) + grads)
    assert len(fastpath.VARLEN._entries) == 2
    assert "RecordedVarlen" in type(results[1][0].grad_fn).__name__
    for a, b in zip(*results):
        torch.testing.assert_close(a, b, rtol=0, atol=0)
