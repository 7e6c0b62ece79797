"""The eager fast path (ops._EagerAttention: the op bodies without torch.library dispatch)
must be bitwise the registered op path, forward and backward, and must step aside for
anything that traces or wraps tensors (dispatch modes, subclasses, torch.compile)."""
from __future__ import annotations

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

import flashattn
from flashattn import ops


def _inputs(seed=0, dtype=torch.float32):
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(2, 19, 4, 32, generator=g, dtype=dtype).requires_grad_() for _ in range(3)]


def _run(q, k, v, **kw):
    out = flashattn.flash_attn_func(q, k, v, **kw)
    grads = torch.autograd.grad(out, (q, k, v), torch.ones_like(out))
    return out.detach(), grads


@pytest.mark.parametrize("kw", [dict(causal=True), dict(window_size=(5, 2), softcap=3.0),
                                dict(dropout_p=0.2)])
def test_eager_path_is_bitwise_the_op_path(kw, monkeypatch):
    q, k, v = _inputs()
    torch.manual_seed(7)
    out_fast, grads_fast = _run(q, k, v, **kw)
    calls = []
    monkeypatch.setattr(ops, "eager_call", lambda *t: calls.append(1) and False)
    torch.manual_seed(7)
    out_op, grads_op = _run(q, k, v, **kw)
    assert calls, "the op path was not taken"
    assert torch.equal(out_fast, out_op)
    for a, b in zip(grads_fast, grads_op):
        assert torch.equal(a, b)


def test_eager_call_rules():
    t = torch.zeros(1)
    assert ops.eager_call(t, None, t)
    assert not ops.eager_call(torch.nn.Parameter(t), t)


class _OpNames(TorchDispatchMode):
    def __init__(self):
        super().__init__()
        self.names = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.names.append(str(func))
        return func(*args, **(kwargs or {}))


def test_dispatch_modes_see_the_registered_ops():
    q, k, v = _inputs()
    with _OpNames() as mode:
        out = flashattn.flash_attn_func(q, k, v, causal=True)
        out.sum().backward()
    assert any(n.startswith("flashattn.fwd") for n in mode.names), mode.names[:20]
    assert any(n.startswith("flashattn.bwd") for n in mode.names), mode.names[-20:]


def test_no_grad_call_matches():
    q, k, v = _inputs()
    with torch.no_grad():
        a = flashattn.flash_attn_func(q, k, v, causal=True)
    b = flashattn.flash_attn_func(q, k, v, causal=True).detach()
    assert torch.equal(a, b)


def test_varlen_eager_path_is_bitwise_the_op_path(monkeypatch):
    lengths = [5, 0, 11]
    cu = torch.tensor([0, 5, 5, 16], dtype=torch.int32)
    q, k, v = (x[0, :16].detach().requires_grad_() for x in _inputs(3))

    def run():
        out = flashattn.flash_attn_varlen_func(q, k, v, cu, cu, max(lengths), max(lengths),
                                               causal=True)
        return out.detach(), torch.autograd.grad(out, (q, k, v), torch.ones_like(out))

    out_fast, grads_fast = run()
    calls = []
    monkeypatch.setattr(ops, "eager_call", lambda *t: calls.append(1) and False)
    out_op, grads_op = run()
    assert calls
    assert torch.equal(out_fast, out_op)
    assert all(torch.equal(a, b) for a, b in zip(grads_fast, grads_op))


def test_kvcache_eager_path_is_the_op_path(monkeypatch):
    """flash_attn_with_kvcache: eager tensors skip the fwd_kvcache op's dispatch, anything else
    goes through it; both append the same way and return the same bits."""
    g = torch.Generator().manual_seed(3)
    q = torch.randn(2, 2, 4, 16, generator=g)
    k, v = (torch.randn(2, 2, 2, 16, generator=g) for _ in range(2))
    caches = [torch.randn(2, 9, 2, 16, generator=g) for _ in range(2)]
    seqlens = torch.tensor([3, 6], dtype=torch.int32)
    results = []
    real_op = ops.fwd_kvcache
    for eager in (True, False):
        calls = []

        def spy(*a, calls=calls, **kw):
            calls.append(1)
            return real_op(*a, **kw)

        monkeypatch.setattr(ops, "fwd_kvcache", spy)
        if not eager:
            # (tracing: the api's fast path and the op's eager shortcut both step aside)
            monkeypatch.setattr(ops, "tracing", lambda: True)
        cs = [c.clone() for c in caches]
        out, lse = flashattn.flash_attn_with_kvcache(q, *cs, k, v, cache_seqlens=seqlens,
                                                     causal=True, return_softmax_lse=True)
        assert bool(calls) == (not eager)
        results.append((out, lse, cs))
    (o1, l1, c1), (o2, l2, c2) = results
    assert torch.equal(o1, o2) and torch.equal(l1, l2)
    assert all(torch.equal(a, b) for a, b in zip(c1, c2))
