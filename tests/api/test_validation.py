"""Bad arguments raise ValueError/TypeError naming the argument, the value and what is allowed.

Every check runs before any backend: ``dispatch_dense.forward`` is replaced by a tripwire.
"""
from __future__ import annotations

import math

import pytest
import torch

from flashattn.dispatch import dense as dispatch_dense
from flashattn.api import validation
from flashattn import flash_attn_func, flash_attn_kvpacked_func, flash_attn_qkvpacked_func

B, S, H, D = 2, 5, 4, 16


@pytest.fixture(autouse=True)
def _no_backend(monkeypatch):
    def tripwire(*a, **kw):
        raise AssertionError("a backend ran on invalid input")

    monkeypatch.setattr(dispatch_dense, "forward", tripwire)


def qkv(b=B, s_q=S, s_k=S, h=H, h_k=H, d=D, d_v=None, dtype=torch.float16, device="cpu"):
    d_v = d if d_v is None else d_v
    q = torch.randn(b, s_q, h, d, dtype=dtype, device=device)
    k = torch.randn(b, s_k, h_k, d, dtype=dtype, device=device)
    v = torch.randn(b, s_k, h_k, d_v, dtype=dtype, device=device)
    return q, k, v


def raises(exc, *needles):
    """pytest.raises that checks every needle appears in the message (case-sensitive)."""

    class _Ctx:
        def __enter__(self):
            self.cm = pytest.raises(exc)
            self.info = self.cm.__enter__()
            return self.info

        def __exit__(self, *a):
            r = self.cm.__exit__(*a)
            msg = str(self.info.value)
            for n in needles:
                assert n in msg, f"{n!r} not in error message: {msg!r}"
            return r

    return _Ctx()


# ---- tensors -------------------------------------------------------------------------------
@pytest.mark.parametrize("which", ["q", "k", "v"])
def test_non_tensor(which):
    args = dict(zip("qkv", qkv()))
    args[which] = args[which].tolist()
    with raises(TypeError, which, "torch.Tensor", "list"):
        flash_attn_func(**args)


@pytest.mark.parametrize("which", ["q", "k", "v"])
def test_wrong_rank(which):
    args = dict(zip("qkv", qkv()))
    args[which] = args[which][0]
    with raises(ValueError, which, "4-d", "3-d"):
        flash_attn_func(**args)


def test_batch_mismatch():
    q, k, v = qkv()
    with raises(ValueError, "batch", "k has 3"):
        flash_attn_func(q, k.new_zeros(3, S, H, D), v.new_zeros(3, S, H, D))
    with raises(ValueError, "batch", "v has 1"):
        flash_attn_func(q, k, v[:1])


def test_seqlen_k_mismatch():
    q, k, v = qkv()
    with raises(ValueError, "seqlen_k", "k has seqlen 5", "v has seqlen 4"):
        flash_attn_func(q, k, v[:, :4])


def test_nheads_k_mismatch_between_k_and_v():
    q, k, v = qkv(h=4, h_k=2)
    with raises(ValueError, "nheads_k", "k has 2", "v has 1"):
        flash_attn_func(q, k, v[:, :, :1])


def test_head_dim_q_vs_k():
    q, k, v = qkv()
    with raises(ValueError, "head dim", "q has headdim 16", "k has 8"):
        flash_attn_func(q, k[..., :8].contiguous(), v)


@pytest.mark.parametrize("h,h_k", [(4, 3), (3, 2), (2, 4)])
def test_gqa_divisibility(h, h_k):
    q, k, v = qkv(h=h, h_k=h_k)
    with raises(ValueError, "nheads", f"({h})", f"({h_k})", "multiple"):
        flash_attn_func(q, k, v)


def test_zero_heads():
    q, k, v = qkv(h=0, h_k=0)
    with raises(ValueError, "nheads", ">= 1"):
        flash_attn_func(q, k, v)


@pytest.mark.parametrize("which", ["k", "v"])
def test_mixed_dtypes(which):
    args = dict(zip("qkv", qkv()))
    args[which] = args[which].float()
    with raises(TypeError, "same dtype", "torch.float16", f"{which} torch.float32"):
        flash_attn_func(**args)


@pytest.mark.parametrize("which", ["k", "v"])
def test_mixed_devices(which):
    # 'meta' tensors carry shape/dtype/device only: a second device without a GPU.
    args = dict(zip("qkv", qkv()))
    args[which] = args[which].to("meta")
    with raises(ValueError, "same device", f"{which} on meta", "q on cpu"):
        flash_attn_func(**args)


# (float8_e4m3fn inputs take the FP8 path, and e5m2 raises there: tests/api/test_fp8_attention.py)
@pytest.mark.parametrize("dtype", [torch.float64, torch.int32, torch.complex64])
def test_unsupported_dtype(dtype):
    q, k, v = (torch.zeros(B, S, H, D, dtype=dtype) for _ in range(3))
    with raises(TypeError, "q", str(dtype), "torch.float16, torch.bfloat16 or torch.float32"):
        flash_attn_func(q, k, v)


@pytest.mark.parametrize("d", [0, 257, 512])
def test_head_dim_range(d):
    q, k, v = qkv(d=d)
    with raises(ValueError, "q", f"headdim {d}", "1..256"):
        flash_attn_func(q, k, v)


@pytest.mark.parametrize("d_v", [0, 513])
def test_head_dim_v_range(d_v):
    # (a forward takes V up to 512 wide: tests/api/test_wide_v.py)
    q, k, v = qkv(d_v=d_v)
    with raises(ValueError, "v", f"headdim_v {d_v}", "1..512"):
        flash_attn_func(q, k, v)


@pytest.mark.parametrize("which", ["q", "k", "v"])
def test_last_dim_stride(which):
    args = dict(zip("qkv", qkv()))
    args[which] = torch.randn(B, S, H, 2 * D, dtype=torch.float16)[..., ::2]
    with raises(ValueError, which, "contiguous last dimension", "(stride 1)", "strides"):
        flash_attn_func(**args)


def test_other_strides_accepted_by_validation():
    # Only the last dim must be unit-stride; transposed/sliced outer dims are fine.
    q = torch.randn(S, B, H, D, dtype=torch.float16).transpose(0, 1)
    k = torch.randn(B, H, S, D, dtype=torch.float16).transpose(1, 2)
    v = torch.randn(B, S, 2 * H, D, dtype=torch.float16)[:, :, ::2]
    validation.check_qkv(q, k, v)


# ---- scalar arguments ----------------------------------------------------------------------
@pytest.mark.parametrize(
    "window,exc",
    [
        ((-2, 0), ValueError),
        ((0, -5), ValueError),
        ((1,), TypeError),
        ([1, 2, 3], TypeError),
        (5, TypeError),
        (None, TypeError),
        ((1.5, 2), TypeError),
        (("a", 2), TypeError),
        ((True, 2), TypeError),
    ],
)
def test_bad_window(window, exc):
    q, k, v = qkv()
    with raises(exc, "window_size"):
        flash_attn_func(q, k, v, window_size=window)


def test_window_message_says_allowed():
    q, k, v = qkv()
    with raises(ValueError, "window_size", "-2", ">= -1"):
        flash_attn_func(q, k, v, window_size=(-2, 0))


@pytest.mark.parametrize("p", [-0.1, 1.0, 1.5, math.nan, math.inf])
def test_bad_dropout_value(p):
    q, k, v = qkv()
    with raises(ValueError, "dropout_p", "[0, 1)", repr(p)):
        flash_attn_func(q, k, v, dropout_p=p)


@pytest.mark.parametrize("p", ["0.1", None, True, torch.tensor(0.1)])
def test_bad_dropout_type(p):
    q, k, v = qkv()
    with raises(TypeError, "dropout_p"):
        flash_attn_func(q, k, v, dropout_p=p)


@pytest.mark.parametrize("scale", [0.0, -1.0, math.inf, -math.inf, math.nan])
def test_bad_softmax_scale_value(scale):
    q, k, v = qkv()
    with raises(ValueError, "softmax_scale", "finite positive", repr(scale)):
        flash_attn_func(q, k, v, softmax_scale=scale)


@pytest.mark.parametrize("scale", ["0.1", [0.1], True])
def test_bad_softmax_scale_type(scale):
    q, k, v = qkv()
    with raises(TypeError, "softmax_scale"):
        flash_attn_func(q, k, v, softmax_scale=scale)


@pytest.mark.parametrize("softcap", [-1.0, -1e-6, math.inf, math.nan])
def test_bad_softcap_value(softcap):
    q, k, v = qkv()
    with raises(ValueError, "softcap", ">= 0", repr(softcap)):
        flash_attn_func(q, k, v, softcap=softcap)


@pytest.mark.parametrize("softcap", ["30", None])
def test_bad_softcap_type(softcap):
    q, k, v = qkv()
    with raises(TypeError, "softcap"):
        flash_attn_func(q, k, v, softcap=softcap)


@pytest.mark.parametrize("name,value", [("causal", "yes"), ("causal", None), ("causal", 2),
                                        ("deterministic", "no"), ("return_attn_probs", 0.5)])
def test_bad_flags(name, value):
    q, k, v = qkv()
    with raises(TypeError, name, "bool"):
        flash_attn_func(q, k, v, **{name: value})


# ---- alibi ---------------------------------------------------------------------------------
@pytest.mark.parametrize("shape", [(H + 1,), (B, H, 1), (B + 1, H), (1, H), (H, B), ()])
def test_alibi_shape(shape):
    q, k, v = qkv()
    slopes = torch.rand(shape, dtype=torch.float32)
    with raises(ValueError, "alibi_slopes", f"({H},) or ({B}, {H})", str(tuple(shape))):
        flash_attn_func(q, k, v, alibi_slopes=slopes)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float64])
def test_alibi_dtype(dtype):
    q, k, v = qkv()
    with raises(TypeError, "alibi_slopes", "torch.float32", str(dtype)):
        flash_attn_func(q, k, v, alibi_slopes=torch.rand(H, dtype=dtype))


def test_alibi_device():
    q, k, v = qkv()
    with raises(ValueError, "alibi_slopes", "same device", "meta"):
        flash_attn_func(q, k, v, alibi_slopes=torch.rand(H, device="meta"))


def test_alibi_not_tensor():
    q, k, v = qkv()
    with raises(TypeError, "alibi_slopes", "list"):
        flash_attn_func(q, k, v, alibi_slopes=[0.5] * H)


# ---- packed --------------------------------------------------------------------------------
def test_qkvpacked_shape():
    with raises(ValueError, "qkv", "3", str((B, S, 4, H, D))):
        flash_attn_qkvpacked_func(torch.randn(B, S, 4, H, D, dtype=torch.float16))
    with raises(ValueError, "qkv", "5-d", "4-d"):
        flash_attn_qkvpacked_func(torch.randn(B, S, H, D, dtype=torch.float16))
    with raises(TypeError, "qkv", "torch.Tensor"):
        flash_attn_qkvpacked_func(None)


def test_qkvpacked_names_packed_argument():
    qkv_ = torch.randn(B, S, 3, H, D, dtype=torch.float64)
    with raises(TypeError, "qkv[:, :, 0]", "torch.float64"):
        flash_attn_qkvpacked_func(qkv_)


def test_kvpacked_shape():
    q = torch.randn(B, S, H, D, dtype=torch.float16)
    with raises(ValueError, "kv", "2", str((B, S, 3, H, D))):
        flash_attn_kvpacked_func(q, torch.randn(B, S, 3, H, D, dtype=torch.float16))
    with raises(ValueError, "q", "4-d"):
        flash_attn_kvpacked_func(q[0], torch.randn(B, S, 2, H, D, dtype=torch.float16))
    with raises(ValueError, "nheads", "(4)", "(3)"):
        flash_attn_kvpacked_func(q, torch.randn(B, S, 2, 3, D, dtype=torch.float16))


# ---- what is allowed -----------------------------------------------------------------------
def test_valid_arguments_pass_validation():
    # Everything valid: validation passes and the (tripwired) backend is reached.
    q, k, v = qkv(h=4, h_k=2, d_v=8)
    with pytest.raises(AssertionError, match="backend ran"):
        flash_attn_func(q, k, v, dropout_p=0.5, softmax_scale=0.3, causal=True,
                        window_size=[3, -1], softcap=30, alibi_slopes=torch.rand(B, 4),
                        deterministic=True, return_attn_probs=True)


@pytest.mark.parametrize("d", [1, 3, 256])
def test_head_dim_bounds_allowed(d):
    validation.check_qkv(*qkv(d=d))


def test_checks_touch_no_data():
    # meta tensors have no storage: any data access (or device sync) would raise.
    q, k, v = qkv(device="meta")
    validation.check_qkv(q, k, v)
    validation.check_alibi_slopes(torch.rand(B, H, device="meta"), B, H, q.device)


def test_empty_batch_is_valid():
    validation.check_qkv(*qkv(b=0))
    validation.check_alibi_slopes(torch.rand(0, H), 0, H, torch.device("cpu"))
