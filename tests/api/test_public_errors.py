"""The public API's invalid arguments raise the documented exception types (README: ValueError
for a bad value, TypeError for a bad type), each message naming the argument; CPU, fast."""
from __future__ import annotations

import pytest
import torch

import flashattn
from flashattn import fp8

E4M3 = torch.float8_e4m3fn


def _qkv(dtype=torch.float32, s=8, h=2, d=16):
    return [torch.randn(1, s, h, d, dtype=dtype) for _ in range(3)]


def _fp8_qkv():
    return [x.to(E4M3) for x in _qkv()]


BAD_CALLS = [
    ("q", TypeError, lambda: flashattn.flash_attn_func("q", *_qkv()[1:])),
    ("dropout_p", ValueError, lambda: flashattn.flash_attn_func(*_qkv(), dropout_p=1.5)),
    ("window_size", (ValueError, TypeError),
     lambda: flashattn.flash_attn_func(*_qkv(), window_size=(1, 2, 3))),
    ("head", ValueError, lambda: flashattn.flash_attn_func(
        torch.randn(1, 8, 3, 16), *_qkv()[1:])),
    ("use_backend", ValueError, lambda: flashattn.use_backend("bogus").__enter__()),
]


@pytest.mark.parametrize("named,expected,call", BAD_CALLS,
                         ids=[f"{i}-{named}" for i, (named, _, _) in enumerate(BAD_CALLS)])
def test_bad_arguments_raise_the_documented_types(named, expected, call):
    with flashattn.use_backend("cpu"), pytest.raises(expected) as exc:
        call()
    assert named.split()[0] in str(exc.value)


def test_fp8_inputs_that_require_grad_run_forward_and_refuse_backward():
    """As FlashAttention-3: FP8 calls accept inputs that require grad (serving code often has
    them) and run the forward; only a backward raises, saying what to do instead."""
    q, k, v = _fp8_qkv()
    with flashattn.use_backend("cpu"):
        out = flashattn.flash_attn_func(q.requires_grad_(), k, v)
        with torch.no_grad():
            ref = flashattn.flash_attn_func(q.detach(), k, v)
        assert torch.equal(out.detach(), ref)
        with pytest.raises(NotImplementedError) as exc:
            out.float().sum().backward()
        msg = str(exc.value)
        assert "forward only" in msg and "bfloat16" in msg and "no_grad" in msg
        x = [t.bfloat16().requires_grad_() for t in _qkv()]
        out = fp8.flash_attn_fp8_func(*x)
        with pytest.raises(NotImplementedError, match="forward only"):
            out.float().sum().backward()
