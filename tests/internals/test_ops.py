"""The torch.library ops of flashattn.ops: schema, fake kernels, autograd registration.

``torch.library.opcheck`` runs each op eagerly, under FakeTensorMode (the fake kernel must
give the real shapes, dtypes and strides), through AOT dispatch with dynamic shapes, and
checks the autograd registration. Each case runs on both backends ('cpu': chunked torch;
'portable': the Triton kernels, under TRITON_INTERPRET=1 without a GPU). Shapes are tiny:
opcheck runs every op several times.
"""
from __future__ import annotations

import pytest
import torch

import flashattn
from flashattn.api.normalise import draw_philox_seed
from flashattn import ops
from tests.settings import set_env

_OPCHECK_TESTS = ("test_schema", "test_autograd_registration", "test_faketensor",
                  "test_aot_dispatch_dynamic")


def _qkv(b, s_q, s_k, h, h_k, d, d_v=None, dtype=torch.float32, device="cpu", grad=False):
    d_v = d_v or d
    q = torch.randn(b, s_q, h, d, dtype=dtype, device=device, requires_grad=grad)
    k = torch.randn(b, s_k, h_k, d, dtype=dtype, device=device, requires_grad=grad)
    v = torch.randn(b, s_k, h_k, d_v, dtype=dtype, device=device, requires_grad=grad)
    return q, k, v


# (alibi, dropout_p, return_softmax, window (left, right), softcap, GQA)
_FWD_CASES = {
    "causal": dict(causal=True, window=(-1, 0)),
    "gqa_window_softcap_alibi_dropout_probs": dict(
        gqa=True, window=(3, 2), softcap=5.0, alibi=True, dropout_p=0.25, return_softmax=True),
}


def _fwd_args(case, b=2, s_q=9, s_k=12, d=16, grad=True):
    h, h_k = (4, 2) if case.get("gqa") else (2, 2)
    q, k, v = _qkv(b, s_q, s_k, h, h_k, d, d_v=8, grad=grad)
    alibi = torch.rand(b, h, dtype=torch.float32) if case.get("alibi") else None
    p = case.get("dropout_p", 0.0)
    seed = draw_philox_seed() if p > 0 else None
    left, right = case.get("window", (-1, -1))
    return (q, k, v, alibi, seed, d ** -0.5, case.get("causal", False), left, right,
            case.get("softcap", 0.0), p, False, case.get("return_softmax", False))


@pytest.mark.parametrize("name", sorted(_FWD_CASES))
def test_opcheck_fwd(name, backend):
    torch.library.opcheck(torch.ops.flashattn.fwd.default, _fwd_args(_FWD_CASES[name]),
                          test_utils=_OPCHECK_TESTS)


@pytest.mark.parametrize("name", sorted(_FWD_CASES))
def test_opcheck_bwd(name, backend):
    args = _fwd_args(_FWD_CASES[name], grad=False)
    q, k, v, alibi, seed, scale, causal, left, right, softcap, p, det, _ = args
    out, lse, _ = ops.fwd(*args)
    dout = torch.randn_like(out)
    torch.library.opcheck(
        torch.ops.flashattn.bwd.default,
        (dout, q, k, v, out, lse, alibi, seed, scale, causal, left, right, softcap, p, det),
        test_utils=_OPCHECK_TESTS)


def _varlen_args(grad=True, dropout_p=0.0, return_softmax=False):
    lens_q, lens_k = [3, 0, 6], [5, 2, 4]
    cu_q = torch.tensor([0, 3, 3, 9], dtype=torch.int32)
    cu_k = torch.tensor([0, 5, 7, 11], dtype=torch.int32)
    q = torch.randn(sum(lens_q), 4, 16, requires_grad=grad)
    k = torch.randn(sum(lens_k), 2, 16, requires_grad=grad)
    v = torch.randn(sum(lens_k), 2, 8, requires_grad=grad)
    seed = draw_philox_seed() if dropout_p > 0 else None
    return (q, k, v, cu_q, cu_k, None, None, None, seed, max(lens_q), max(lens_k), 0.25, True,
            -1, 0, 0.0, dropout_p, False, return_softmax)


@pytest.mark.parametrize("dropout_p, return_softmax", [(0.0, False), (0.3, True)])
def test_opcheck_varlen(dropout_p, return_softmax, backend):
    args = _varlen_args(dropout_p=dropout_p, return_softmax=return_softmax)
    torch.library.opcheck(torch.ops.flashattn.varlen_fwd.default, args,
                          test_utils=_OPCHECK_TESTS)
    fwd_args = tuple(a.detach() if isinstance(a, torch.Tensor) else a for a in args)
    out, lse, _ = ops.varlen_fwd(*fwd_args)
    q, k, v, cu_q, cu_k, seqused, _block_table, alibi, seed = fwd_args[:9]
    torch.library.opcheck(
        torch.ops.flashattn.varlen_bwd.default,
        (torch.randn_like(out), q, k, v, out, lse, cu_q, cu_k, seqused, alibi, seed,
         *fwd_args[9:18]),  # max_seqlen_q ... deterministic (return_softmax dropped)
        test_utils=_OPCHECK_TESTS)


def test_public_api_runs_through_the_op(cpu_backend):
    """flash_attn_func records flashattn::fwd in a traced graph, and its gradients the bwd op."""
    q, k, v = _qkv(1, 5, 7, 2, 1, 8, grad=True)
    seen = []

    class Recorder(torch.utils._python_dispatch.TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            seen.append(str(func))
            return func(*args, **(kwargs or {}))

    with Recorder():
        out = flashattn.flash_attn_func(q, k, v, causal=True)
        out.sum().backward()
    assert "flashattn.fwd.default" in seen and "flashattn.bwd.default" in seen


def test_varlen_attention_matches_the_public_function(backend):
    """ops.varlen_attention is the drop-in for varlen's autograd.Function: same out and grads."""
    args = _varlen_args()
    q, k, v, cu_q, cu_k, _, _, _, _, mq, mk = args[:11]
    dout = torch.randn(q.shape[0], 4, 8)
    out, lse, s = ops.varlen_attention(q, k, v, cu_q, cu_k, None, None, None, mq, mk, 0.25,
                                       True, -1, 0, 0.0, 0.0, 0, False, False)
    grads = torch.autograd.grad(out, (q, k, v), dout)
    ref_out, ref_lse, _ = flashattn.flash_attn_varlen_func(
        q, k, v, cu_q, cu_k, mq, mk, softmax_scale=0.25, causal=True, return_attn_probs=True)
    ref_grads = torch.autograd.grad(ref_out, (q, k, v), dout)
    assert s is None and not lse.requires_grad
    torch.testing.assert_close(out, ref_out, rtol=0, atol=0)
    torch.testing.assert_close(lse, ref_lse, rtol=0, atol=0)
    for g, r in zip(grads, ref_grads):
        torch.testing.assert_close(g, r, rtol=0, atol=0)


def test_dropout_seed_is_a_cpu_int64_tensor_from_torch_generator():
    torch.manual_seed(7)
    a = draw_philox_seed()
    torch.manual_seed(7)
    b = draw_philox_seed()
    c = draw_philox_seed()
    assert a.dtype == torch.int64 and a.device.type == "cpu" and a.shape == (1,)
    assert torch.equal(a, b) and not torch.equal(b, c) and int(a) >= 0


@pytest.mark.gpu
@pytest.mark.parametrize("name", sorted(_FWD_CASES))
def test_opcheck_fwd_bwd_gpu(name, monkeypatch):
    set_env(monkeypatch, FLASHATTN_AUTOTUNE="0")
    case = _FWD_CASES[name]
    h, h_k = (8, 2) if case.get("gqa") else (4, 4)
    q, k, v = _qkv(2, 200, 257, h, h_k, 64, dtype=torch.bfloat16, device="cuda", grad=True)
    alibi = torch.rand(2, h, device="cuda") if case.get("alibi") else None
    p = case.get("dropout_p", 0.0)
    seed = draw_philox_seed() if p > 0 else None
    left, right = case.get("window", (-1, -1))
    args = (q, k, v, alibi, seed, 0.125, case.get("causal", False), left, right,
            case.get("softcap", 0.0), p, False, case.get("return_softmax", False))
    torch.library.opcheck(torch.ops.flashattn.fwd.default, args, test_utils=_OPCHECK_TESTS)
    det = tuple(a.detach() if isinstance(a, torch.Tensor) and a.requires_grad else a for a in args)
    out, lse, _ = ops.fwd(*det)
    torch.library.opcheck(
        torch.ops.flashattn.bwd.default,
        (torch.randn_like(out), *det[:3], out, lse, alibi, seed, *det[5:12]),
        test_utils=_OPCHECK_TESTS)


def _kvcache_args(paged: bool):
    b, s_q, h, h_k, d, s_new = 2, 2, 4, 2, 16, 2
    q = torch.randn(b, s_q, h, d)
    k, v = torch.randn(b, s_new, h_k, d), torch.randn(b, s_new, h_k, d)
    if paged:
        page, n_blocks = 3, 8
        k_cache, v_cache = torch.randn(n_blocks, page, h_k, d), torch.randn(n_blocks, page, h_k, d)
        block_table = torch.randperm(n_blocks, dtype=torch.int32).view(b, 4)
    else:
        k_cache, v_cache = torch.randn(b, 10, h_k, d), torch.randn(b, 10, h_k, d)
        block_table = None
    cos, sin = torch.rand(12, 4), torch.rand(12, 4)
    seqlens = torch.tensor([3, 7], dtype=torch.int32)
    # the op takes what kvcache._prepare returns: softmax_scale resolved (d ** -0.5)
    return (q, k_cache, v_cache, k, v, cos, sin, seqlens, None, None, block_table, None, 0.25,
            True, -1, 0, 0.0, False, 0)


@pytest.mark.parametrize("paged", [False, True])
def test_opcheck_kvcache_and_drop_in(paged, backend):
    """fwd_kvcache: declared in-place writes into the caches, fake shapes; the op equals
    flash_attn_with_kvcache (whose eager calls run the op's body), outputs and caches."""
    args = _kvcache_args(paged)
    torch.library.opcheck(torch.ops.flashattn.fwd_kvcache.default, args,
                          test_utils=_OPCHECK_TESTS)
    q, k_cache, v_cache, k, v, cos, sin, seqlens, _, _, block_table = args[:11]
    caches = [c.clone() for c in (k_cache, v_cache)]
    from flashattn.api.kvcache import _prepare

    prepared = _prepare(q, *caches, k, v, cos, sin, seqlens, None, None, block_table, None, True,
                        (-1, -1), 0.0, False, None, 0)
    out, lse = torch.ops.flashattn.fwd_kvcache(*prepared)  # through the registered op
    ref_caches = [c.clone() for c in (k_cache, v_cache)]
    ref_out, ref_lse = flashattn.flash_attn_with_kvcache(
        q, *ref_caches, k, v, cos, sin, seqlens, block_table=block_table, causal=True,
        rotary_interleaved=False, return_softmax_lse=True)
    torch.testing.assert_close(out, ref_out, rtol=0, atol=0)
    torch.testing.assert_close(lse, ref_lse, rtol=0, atol=0)
    for c, r, orig in zip(caches, ref_caches, (k_cache, v_cache)):
        assert torch.equal(c, r) and not torch.equal(c, orig)  # appended in place


def test_opcheck_combine(backend):
    out_partial = torch.randn(3, 2, 4, 2, 8)
    lse_partial = torch.randn(3, 2, 2, 4)
    lse_partial[1, 0, 1] = float("-inf")  # an empty split
    for out_dtype in (None, torch.bfloat16):
        torch.library.opcheck(torch.ops.flashattn.combine.default,
                              (out_partial, lse_partial, out_dtype), test_utils=_OPCHECK_TESTS)
    out = torch.empty(2, 4, 2, 8, dtype=torch.float16)
    res, lse = ops.combine_splits(out_partial, lse_partial, out=out)
    ref, ref_lse = flashattn.flash_attn_combine(out_partial, lse_partial, out_dtype=torch.float16)
    assert res is out and torch.equal(res, ref) and torch.equal(lse, ref_lse)


def test_forward_only_refuses_the_backward_also_when_compiled():
    """ops.forward_only's backward raises in eager mode, and under torch.compile (which traces
    the backward when it compiles the forward) it compiles and raises when the backward runs:
    the refusal is the flashattn::no_backward op there."""

    def f(x):
        return ops.forward_only(x * 2, (x,), "no backward here")

    for fn in (f, torch.compile(f, fullgraph=True)):
        x = torch.randn(4, requires_grad=True)
        out = fn(x)
        assert torch.equal(out.detach(), x.detach() * 2) and out.requires_grad
        with pytest.raises(NotImplementedError, match="no backward here"):
            out.sum().backward()
