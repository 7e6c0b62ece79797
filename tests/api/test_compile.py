"""torch.compile through flashattn: fullgraph, dynamic sequence lengths, dropout seeds.

The public functions run the ``flashattn::fwd`` / ``flashattn::bwd`` ops (flashattn.ops), so
``torch.compile(fullgraph=True)`` must trace them without a graph break (fullgraph raises on
any break). CPU compiles are slow, so the cases are few and tiny: one Inductor compile of a
transformer block, the others with ``aot_eager`` (the same Dynamo + AOTAutograd trace, with
eager kernels), counted by ``CompileCounterWithBackend`` to prove no recompilation.
"""
from __future__ import annotations

import pytest
import torch
import torch._dynamo
import torch.nn as nn
from torch._dynamo.testing import CompileCounterWithBackend

import flashattn
from flashattn.api.normalise import draw_philox_seed
from flashattn import flash_attn_varlen_func, flash_attn_func, flash_attn_kvpacked_func, flash_attn_qkvpacked_func
from tests.settings import set_env


@pytest.fixture(autouse=True)
def _fresh_dynamo():
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


class TinyBlock(nn.Module):
    """Pre-norm transformer block with GQA attention through flash_attn_kvpacked_func."""

    def __init__(self, dim=32, heads=4, kv_heads=2, dropout_p=0.0, window=(-1, -1)):
        super().__init__()
        self.heads, self.kv_heads, self.d = heads, kv_heads, dim // heads
        self.dropout_p, self.window = dropout_p, window
        self.norm1, self.norm2 = nn.LayerNorm(dim), nn.LayerNorm(dim)
        self.wq = nn.Linear(dim, dim)
        self.wkv = nn.Linear(dim, 2 * kv_heads * self.d)
        self.wo = nn.Linear(dim, dim)
        self.mlp = nn.Sequential(nn.Linear(dim, 2 * dim), nn.GELU(), nn.Linear(2 * dim, dim))

    def forward(self, x):
        b, s, _ = x.shape
        h = self.norm1(x)
        q = self.wq(h).view(b, s, self.heads, self.d)
        kv = self.wkv(h).view(b, s, 2, self.kv_heads, self.d)
        a = flash_attn_kvpacked_func(q, kv, dropout_p=self.dropout_p, causal=True,
                                     window_size=self.window, softcap=8.0)
        x = x + self.wo(a.reshape(b, s, -1))
        return x + self.mlp(self.norm2(x))


def _fwd_bwd(model, x):
    x = x.detach().requires_grad_()
    model.zero_grad(set_to_none=True)
    out = model(x)
    out.square().mean().backward()
    grads = [p.grad.clone() for p in model.parameters()] + [x.grad.clone()]
    return out.detach(), grads


def _assert_same(a, b, atol):
    torch.testing.assert_close(a, b, rtol=1e-4, atol=atol)


def test_block_inductor_fullgraph_matches_eager(device):
    """Inductor compiles the whole block (fullgraph); forward and every gradient match eager."""
    model = TinyBlock(window=(5, -1)).to(device)
    x = torch.randn(2, 11, 32, device=device)
    ref_out, ref_grads = _fwd_bwd(model, x)
    compiled = torch.compile(model, fullgraph=True, backend="inductor")
    out, grads = _fwd_bwd(compiled, x)
    _assert_same(out, ref_out, 1e-5)
    for g, r in zip(grads, ref_grads):
        _assert_same(g, r, 1e-5)


def test_dynamic_seqlens_trace_once(device):
    """dynamic=True: one graph serves several batch sizes and sequence lengths (no recompile)."""
    cnt = CompileCounterWithBackend("aot_eager")
    model = TinyBlock().to(device)
    compiled = torch.compile(model, fullgraph=True, backend=cnt, dynamic=True)
    frames = []
    for b, s in ((2, 7), (3, 13), (2, 5)):  # b = 1 would specialise (0/1 rule)
        x = torch.randn(b, s, 32, device=device)
        out, grads = _fwd_bwd(compiled, x)
        frames.append(cnt.frame_count)
        ref_out, ref_grads = _fwd_bwd(model, x)
        _assert_same(out, ref_out, 1e-6)
        for g, r in zip(grads, ref_grads):
            _assert_same(g, r, 1e-6)
    # The first call may count twice (Dynamo restarts its first analysis once to specialise
    # a Python float); later shapes must not compile again.
    assert frames[0] >= 1 and frames[1:] == frames[:1] * 2, f"recompiled: frames {frames}"


def test_mark_dynamic_packed_variants(device):
    """qkvpacked / plain functions under fullgraph with a seqlen marked dynamic, with lse."""
    cnt = CompileCounterWithBackend("aot_eager")

    def f(qkv, q, kv):
        o1, lse, s_dmask = flash_attn_qkvpacked_func(qkv, causal=True, return_attn_probs=True)
        o2 = flash_attn_func(q, kv[:, :, 0], kv[:, :, 1], window_size=(2, 1))
        return o1, lse, s_dmask, o2

    compiled = torch.compile(f, fullgraph=True, backend=cnt)
    for s in (6, 9):
        qkv = torch.randn(2, s, 3, 2, 8, device=device)
        q = torch.randn(2, s + 1, 4, 8, device=device)
        kv = torch.randn(2, s, 2, 2, 8, device=device)
        for t in (qkv, q, kv):
            torch._dynamo.mark_dynamic(t, 1)
        got, ref = compiled(qkv, q, kv), f(qkv, q, kv)
        assert got[2] is None and ref[2] is None  # no dropout: no S_dmask (flash-attn 2)
        for a, r in zip(got[:2] + got[3:], ref[:2] + ref[3:]):
            torch.testing.assert_close(a, r, rtol=0, atol=0)
        frames = cnt.frame_count if s == 6 else frames
    assert cnt.frame_count == frames, "recompiled for a new sequence length"


def test_dropout_seed_follows_manual_seed_under_compile(device):
    """The seed is drawn inside the graph: fresh per call, reproduced by torch.manual_seed, and
    (with eager kernels, aot_eager) the very draw eager makes."""

    def f(q, k, v):
        out, lse, s_dmask = flash_attn_func(q, k, v, dropout_p=0.3, return_attn_probs=True)
        return out, s_dmask

    q, k, v = (torch.randn(1, 8, 2, 8, device=device) for _ in range(3))
    for backend in ("aot_eager", "inductor"):
        torch._dynamo.reset()
        compiled = torch.compile(f, fullgraph=True, backend=backend)
        torch.manual_seed(123)
        a, a_mask = compiled(q, k, v)
        b, b_mask = compiled(q, k, v)
        torch.manual_seed(123)
        c, c_mask = compiled(q, k, v)
        assert not torch.equal(a_mask < 0, b_mask < 0), f"{backend}: same dropout twice"
        assert torch.equal(a, c) and torch.equal(a_mask, c_mask), f"{backend}: not reproducible"
        if backend == "aot_eager":
            torch.manual_seed(123)
            e, e_mask = f(q, k, v)
            assert torch.equal(a, e) and torch.equal(a_mask, e_mask)


def test_varlen_dropout_seed_follows_manual_seed_under_compile(device):
    """flash_attn_varlen_func draws its seed like the dense function: two calls of a compiled
    function give different dropout masks (the draw is a random op of the graph, not a
    trace-time constant), and torch.manual_seed reproduces them."""

    def f(q, k, v, cu_q, cu_k):
        out, lse, s_dmask = flash_attn_varlen_func(q, k, v, cu_q, cu_k, 5, 6, dropout_p=0.3,
                                                   return_attn_probs=True)
        return out, s_dmask

    cu_q = torch.tensor([0, 3, 8], dtype=torch.int32, device=device)
    cu_k = torch.tensor([0, 6, 10], dtype=torch.int32, device=device)
    q = torch.randn(8, 2, 8, device=device)
    k, v = torch.randn(10, 2, 8, device=device), torch.randn(10, 2, 8, device=device)
    for backend in ("aot_eager", "inductor"):
        torch._dynamo.reset()
        compiled = torch.compile(f, fullgraph=True, backend=backend)
        torch.manual_seed(321)
        a, a_mask = compiled(q, k, v, cu_q, cu_k)
        b, b_mask = compiled(q, k, v, cu_q, cu_k)
        torch.manual_seed(321)
        c, c_mask = compiled(q, k, v, cu_q, cu_k)
        assert not torch.equal(a_mask < 0, b_mask < 0), f"{backend}: same dropout twice"
        assert torch.equal(a, c) and torch.equal(a_mask, c_mask), f"{backend}: not reproducible"
        if backend == "aot_eager":
            torch.manual_seed(321)
            e, e_mask = f(q, k, v, cu_q, cu_k)
            assert torch.equal(a, e) and torch.equal(a_mask, e_mask)


def test_training_block_with_dropout_compiles(device):
    """Dropout inside a compiled training step: same seed -> same loss and grads as eager."""
    model = TinyBlock(dropout_p=0.2).to(device)
    x = torch.randn(2, 9, 32, device=device)
    compiled = torch.compile(model, fullgraph=True, backend="aot_eager")
    torch.manual_seed(5)
    out, grads = _fwd_bwd(compiled, x)
    torch.manual_seed(5)
    ref_out, ref_grads = _fwd_bwd(model, x)
    _assert_same(out, ref_out, 1e-6)
    for g, r in zip(grads, ref_grads):
        _assert_same(g, r, 1e-6)


def test_decode_step_through_kvcache_op_compiles(device):
    """A decode step (append to the cache in place + attention), fullgraph, through the public
    function (which traces into the fwd_kvcache op): same output and same cache contents as
    eager flash_attn_with_kvcache."""
    fn = flashattn.flash_attn_with_kvcache

    def step(q, k_cache, v_cache, k, v, seqlens):
        return fn(q, k_cache, v_cache, k, v, cache_seqlens=seqlens, causal=True)

    q, k, v = torch.randn(2, 1, 4, 16), torch.randn(2, 1, 2, 16), torch.randn(2, 1, 2, 16)
    k_cache, v_cache = torch.randn(2, 12, 2, 16), torch.randn(2, 12, 2, 16)
    seqlens = torch.tensor([5, 11], dtype=torch.int32)
    caches = [c.clone() for c in (k_cache, v_cache)]
    out = torch.compile(step, fullgraph=True, backend="aot_eager")(q, *caches, k, v, seqlens)
    ref_caches = [c.clone() for c in (k_cache, v_cache)]
    ref = flashattn.flash_attn_with_kvcache(q, *ref_caches, k, v, cache_seqlens=seqlens,
                                            causal=True)
    torch.testing.assert_close(out, ref, rtol=0, atol=0)
    assert all(torch.equal(c, r) for c, r in zip(caches, ref_caches))
    assert not torch.equal(caches[0], k_cache)


@pytest.mark.gpu
@pytest.mark.parametrize("dynamic", [False, True])
def test_block_inductor_gpu(dynamic, monkeypatch):
    """Realistic block on the GPU, bf16: compiled (Inductor, fullgraph) vs eager, fwd + grads."""
    set_env(monkeypatch, FLASHATTN_AUTOTUNE="0")
    torch.manual_seed(0)
    model = TinyBlock(dim=1024, heads=8, kv_heads=2, window=(255, -1)).cuda().bfloat16()
    compiled = torch.compile(model, fullgraph=True, backend="inductor", dynamic=dynamic)
    for s in ((1000, 777) if dynamic else (1000,)):
        x = torch.randn(2, s, 1024, device="cuda", dtype=torch.bfloat16)
        out, grads = _fwd_bwd(compiled, x)
        ref_out, ref_grads = _fwd_bwd(model, x)
        # Inductor fuses the layer norms / GELU differently: compare at bf16 resolution,
        # relative to each tensor's scale.
        for a, r in zip([out] + grads, [ref_out] + ref_grads):
            scale = r.float().abs().max().clamp_min(1e-3)
            assert ((a.float() - r.float()).abs().max() / scale) < 3e-2


@pytest.mark.gpu
def test_dropout_seed_under_compile_gpu():
    def f(q, k, v):
        return flash_attn_func(q, k, v, dropout_p=0.1, causal=True)

    q, k, v = (torch.randn(2, 300, 4, 64, device="cuda", dtype=torch.bfloat16) for _ in range(3))
    compiled = torch.compile(f, fullgraph=True)
    torch.manual_seed(1)
    a, b = compiled(q, k, v), compiled(q, k, v)
    torch.manual_seed(1)
    c = compiled(q, k, v)
    assert not torch.equal(a, b) and torch.equal(a, c)
    assert draw_philox_seed().device.type == "cpu"
