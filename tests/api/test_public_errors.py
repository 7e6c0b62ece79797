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
    # FP8 is forward only: an input that requires grad is a bad value, not a runtime failure
    ("q requires grad", ValueError,
     lambda: flashattn.flash_attn_func(_fp8_qkv()[0].requires_grad_(), *_fp8_qkv()[1:])),
    ("q requires grad", ValueError,
     lambda: fp8.flash_attn_fp8_func(*[x.bfloat16().requires_grad_() for x in _qkv()])),
]


@pytest.mark.parametrize("named,expected,call", BAD_CALLS,
                         ids=[f"{i}-{named}" for i, (named, _, _) in enumerate(BAD_CALLS)])
def test_bad_arguments_raise_the_documented_types(named, expected, call):
    with flashattn.use_backend("cpu"), pytest.raises(expected) as exc:
        call()
    assert named.split()[0] in str(exc.value)


def test_fp8_requires_grad_message_says_what_to_do():
    q, k, v = _fp8_qkv()
    with flashattn.use_backend("cpu"), pytest.raises(ValueError) as exc:
        flashattn.flash_attn_func(q.requires_grad_(), k, v)
    msg = str(exc.value)
    assert "forward only" in msg and "bfloat16" in msg and "q requires grad" in msg
