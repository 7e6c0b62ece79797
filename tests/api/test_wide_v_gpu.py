"""V head dims past 256 in the dense and varlen forwards on the GPU (the portable forward
kernel with V up to 512 wide; on sm90 dense calls go by V's column slices on the Hopper
kernels, which take V up to 256): realistic sizes against the float64 oracle by flash-attn's
rule, a CUDA-graph capture, and gradients by V's column slices. CPU twin:
tests/api/test_wide_v.py.

Run on the device machine: ``python3 -m pytest -q -m gpu tests/api/test_wide_v_gpu.py``.
"""
from __future__ import annotations

import pytest
import torch

import flashattn
from flashattn.reference import attention_ref
from tests.accuracy import assert_attention_close, assert_close_rule
from tests.api.test_wide_v import _check

pytestmark = pytest.mark.gpu


def _inputs(b, s_q, s_k, h, h_k, d, d_v, dtype):
    g = torch.Generator(device="cuda").manual_seed(0)
    mk = lambda *shape: torch.randn(*shape, device="cuda", dtype=dtype, generator=g)
    return mk(b, s_q, h, d), mk(b, s_k, h_k, d), mk(b, s_k, h_k, d_v)


@pytest.mark.parametrize("b, s_q, s_k, h, h_k, d, d_v, dtype, causal", [
    (2, 1000, 1000, 16, 1, 64, 512, torch.bfloat16, True),    # MLA prefill, absorbed
    (1, 777, 2049, 8, 2, 128, 512, torch.bfloat16, False),
    (2, 513, 513, 4, 4, 256, 384, torch.float16, True),
    (1, 300, 300, 4, 1, 64, 512, torch.float32, True),
    (3, 5, 4000, 16, 1, 64, 512, torch.bfloat16, True),       # few query rows: the decode kernel
])
@pytest.mark.parametrize("backend", ["auto", "portable"])  # (auto on sm90: by slices)
def test_dense_forward_wide_v_gpu(b, s_q, s_k, h, h_k, d, d_v, dtype, causal, backend):
    q, k, v = _inputs(b, s_q, s_k, h, h_k, d, d_v, dtype)
    with flashattn.use_backend(backend):
        out, lse, _ = flashattn.flash_attn_func(q, k, v, causal=causal,
                                                return_attn_probs=True)
    _check(out, lse, q, k, v, backend, causal=causal)


def test_varlen_forward_wide_v_gpu():
    lengths = [1000, 1, 0, 513, 2048]
    cu = torch.tensor([0] + lengths, device="cuda").cumsum(0).to(torch.int32)
    q, k, v = (x[0] for x in _inputs(1, int(cu[-1]), int(cu[-1]), 16, 1, 64, 512,
                                     torch.bfloat16))
    out = flashattn.flash_attn_varlen_func(q, k, v, cu, cu, max(lengths), max(lengths),
                                           causal=True)
    for i, n in enumerate(lengths):
        if n == 0:
            continue
        rows = slice(int(cu[i]), int(cu[i + 1]))
        ref, _ = attention_ref(q[rows][None].double(), k[rows][None].double(),
                               v[rows][None].double(), causal=True)
        lp, _ = attention_ref(q[rows][None], k[rows][None], v[rows][None], causal=True,
                              upcast=False)
        assert_close_rule(out[rows][None], ref, lp, name=f"out of sequence {i}")


def test_wide_v_under_cuda_graphs_and_gradients_by_slices():
    q, k, v = _inputs(2, 256, 256, 8, 1, 64, 512, torch.bfloat16)
    eager = flashattn.flash_attn_func(q, k, v, causal=True)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        captured = flashattn.flash_attn_func(q, k, v, causal=True)
    graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(captured, eager)
    # with a gradient: by V's column slices on the Hopper kernels (api/wide_v.py)
    qg, kg, vg = (x.clone().requires_grad_() for x in (q, k, v))
    out = flashattn.flash_attn_func(qg, kg, vg, causal=True)
    dout = torch.randn_like(out)
    assert_attention_close(qg, kg, vg, out, dout, torch.autograd.grad(out, (qg, kg, vg), dout),
                           window_size=(-1, 0))
