"""The dense ops' ``alibi_shift`` (AttnParams.alibi_shift): ALiBi's distance of query row i and
key j becomes ``|i + s_k - s_q + shift - j|`` while the mask keeps the bottom-right alignment.
Context parallelism's ring calls the one-GPU kernels on blocks of a longer sequence, whose
query and key positions are offset otherwise than a block's own alignment says; the shift
carries the global distance into the kernel.

Oracle: ``reference.attention_ref`` with that shift in float64 (flash-attn's rule: out / lse
within 2x of the same computation in the inputs' dtype, gradients 3x), on the cpu
backend and the portable Triton kernels (TRITON_INTERPRET=1). Shifts below, at and beyond the
block, with no mask, causal and a window; GQA; lengths not multiples of a tile.
"""
from __future__ import annotations

import pytest
import torch

from flashattn import ops
from flashattn.reference import attention_ref
from tests.accuracy import assert_close_rule


@pytest.mark.parametrize("shift", [-37, 0, 13, 300])
@pytest.mark.parametrize("window", [(-1, -1), (-1, 0), (5, 3)], ids=["full", "causal", "window"])
def test_alibi_shift_fwd_bwd(backend, shift, window) -> None:
    torch.manual_seed(17 + shift)
    b, s_q, s_k, h, h_k, d = 2, 37, 53, 4, 2, 32
    dtype = torch.bfloat16
    q = torch.randn(b, s_q, h, d, dtype=dtype)
    k = torch.randn(b, s_k, h_k, d, dtype=dtype)
    v = torch.randn(b, s_k, h_k, d, dtype=dtype)
    slopes = (torch.rand(b, h) * 0.3 + 0.01).float()
    dout = torch.randn(b, s_q, h, d, dtype=dtype)
    scale = d ** -0.5
    causal = window == (-1, 0)
    out, lse, _ = ops.fwd(q, k, v, slopes, None, scale, causal, window[0], window[1], 0.0, 0.0,
                          False, False, shift)
    dq, dk, dv = ops.bwd(dout, q, k, v, out, lse, slopes, None, scale, causal, window[0],
                         window[1], 0.0, 0.0, False, shift)

    kw = dict(softmax_scale=scale, window_size=window, alibi_slopes=slopes, alibi_shift=shift)
    x64 = [x.double().requires_grad_() for x in (q, k, v)]
    out_ref, lse_ref = attention_ref(*x64, **kw)
    grads_ref = torch.autograd.grad(out_ref, x64, dout.double())
    xlp = [x.clone().requires_grad_() for x in (q, k, v)]
    out_lp, lse_lp = attention_ref(*xlp, upcast=False, **kw)
    grads_lp = torch.autograd.grad(out_lp, xlp, dout)
    # (the interpreter rounds fp32 -> bf16 by truncation when it writes out: one bf16 step)
    atol = 2.0**-7 * out_ref.abs().max().item() if backend == "portable" else 0.0
    assert_close_rule(out, out_ref, out_lp, atol=atol, name="out")
    assert_close_rule(lse, lse_ref, lse_lp.float(), atol=1e-5, name="lse")
    for name, got, ref, lp in zip(("dq", "dk", "dv"), (dq, dk, dv), grads_ref, grads_lp):
        assert_close_rule(got, ref, lp, factor=3.0, atol=atol, name=name)


def test_alibi_shift_zero_is_the_default(backend) -> None:
    """A shift of 0 is flash-attn's ALiBi: bit for bit the call without the argument."""
    torch.manual_seed(3)
    q = torch.randn(1, 19, 2, 16, dtype=torch.float16)
    k = torch.randn(1, 23, 2, 16, dtype=torch.float16)
    v = torch.randn(1, 23, 2, 16, dtype=torch.float16)
    slopes = torch.tensor([[0.25, 0.0625]])
    plain = ops.fwd(q, k, v, slopes, None, 0.25, True, -1, 0, 0.0, 0.0, False, False)
    zero = ops.fwd(q, k, v, slopes, None, 0.25, True, -1, 0, 0.0, 0.0, False, False, 0)
    for a, b in zip(plain[:2], zero[:2]):
        assert torch.equal(a, b)
