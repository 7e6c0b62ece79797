"""FlashAttention-3's ``qv`` (multi-head latent attention) in ``fa3.flash_attn_func`` and
``fa3.flash_attn_varlen_func``: the score ``softmax_scale * (q . k + qv . v)``, out over v,
default scale ``(d + d_v) ** -0.5``, forward only (FA3 has no backward for it).

FA3's own tests run these calls with ``qv`` (MHA / GQA / MQA, causal and local windows,
softcap, attention_chunk, num_splits 1 and 3, seqlen_q above and below seqlen_k); the cases
here are those at interpreter sizes, against the float64 oracle (``reference.attention_ref``
with qv, one sequence at a time for the varlen call) by flash-attn's rule, on both CPU-runnable
backends ('cpu': torch; 'portable': the Triton decode kernel under TRITON_INTERPRET=1).
"""
from __future__ import annotations

from dataclasses import dataclass, replace
from typing import List, Optional, Tuple

import pytest
import torch

from flashattn import fa3
from flashattn.reference import attention_ref
from tests.accuracy import assert_close_rule


@dataclass(frozen=True)
class QVCase:
    s_q: int = 5
    s_k: int = 9
    b: int = 2
    h: int = 4
    h_k: int = 4
    d: int = 16
    d_v: int = 32
    causal: bool = False
    window: Tuple[int, int] = (-1, -1)
    softcap: float = 0.0
    chunk: int = 0
    num_splits: int = 1
    scale: Optional[float] = None
    dtype: torch.dtype = torch.float16


DENSE = {
    "one-query-one-key": QVCase(s_q=1, s_k=1, h_k=2),
    "mha": QVCase(),
    "mqa-causal": QVCase(s_q=9, s_k=13, h_k=1, causal=True),
    "gqa-causal-more-queries": QVCase(s_q=13, s_k=5, h_k=2, causal=True),
    "queries-past-keys-not-causal": QVCase(s_q=11, s_k=3, h_k=1),
    "local": QVCase(s_q=12, s_k=17, h_k=2, window=(4, 2)),
    "local-causal": QVCase(s_q=12, s_k=12, h_k=1, window=(3, 0), causal=True),
    "softcap": QVCase(h_k=2, softcap=5.0, causal=True),
    "chunk": QVCase(s_q=14, s_k=14, h_k=1, causal=True, chunk=4),
    "splits-3": QVCase(s_q=3, s_k=40, h_k=1, num_splits=3),
    "splits-heuristic": QVCase(s_q=2, s_k=33, h_k=1, num_splits=0),
    "scale": QVCase(scale=0.3),
    "bf16-dv-64": QVCase(h_k=1, d_v=64, dtype=torch.bfloat16, causal=True),
    "fp32": QVCase(h_k=2, dtype=torch.float32),
}


def _inputs(c: QVCase, device: str = "cpu"):
    """q (b, s_q, h, d), k (b, s_k, h_k, d), v (b, s_k, h_k, d_v), qv (b, s_q, h, d_v) in
    c.dtype (softcap: q grown so that the cap matters)."""
    q = torch.randn(c.b, c.s_q, c.h, c.d, device=device)
    if c.softcap:
        q = q * c.softcap / 2
    k = torch.randn(c.b, c.s_k, c.h_k, c.d, device=device)
    v = torch.randn(c.b, c.s_k, c.h_k, c.d_v, device=device)
    qv = torch.randn(c.b, c.s_q, c.h, c.d_v, device=device)
    return tuple(x.to(c.dtype) for x in (q, k, v, qv))


def _options(c: QVCase) -> dict:
    return dict(causal=c.causal, window_size=c.window, softcap=c.softcap,
                attention_chunk=c.chunk, softmax_scale=c.scale)


def check_dense(c: QVCase, device: str = "cpu") -> None:
    """fa3.flash_attn_func with qv: out and lse by flash-attn's rule against float64."""
    q, k, v, qv = _inputs(c, device)
    out, lse = fa3.flash_attn_func(q, k, v, qv=qv, num_splits=c.num_splits,
                                   return_attn_probs=True, **_options(c))
    assert out.shape == (c.b, c.s_q, c.h, c.d_v) and out.dtype == c.dtype
    assert lse.shape == (c.b, c.h, c.s_q) and lse.dtype == torch.float32
    ref, ref_lse = attention_ref(*(x.double() for x in (q, k, v)), qv=qv.double(),
                                 **_options(c))
    low, low_lse = attention_ref(q, k, v, qv=qv, upcast=False, **_options(c))
    assert_close_rule(out, ref, low, name="out")
    assert_close_rule(lse, ref_lse, low_lse.float(), name="lse")


@pytest.mark.parametrize("case", list(DENSE.values()), ids=list(DENSE))
def test_dense_qv_matches_reference(backend: str, case: QVCase) -> None:
    check_dense(case)


# ---------------------------------------------------------------------------------------------
# The varlen call
# ---------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class VarlenQVCase:
    lens_q: Tuple[int, ...] = (3, 7, 1, 5)
    lens_k: Tuple[int, ...] = (6, 7, 9, 2)
    used_q: Optional[Tuple[int, ...]] = None
    used_k: Optional[Tuple[int, ...]] = None
    h: int = 4
    h_k: int = 2
    d: int = 16
    d_v: int = 32
    causal: bool = False
    window: Tuple[int, int] = (-1, -1)
    softcap: float = 0.0
    chunk: int = 0
    num_splits: int = 1
    dtype: torch.dtype = torch.float16


VARLEN = {
    "gqa": VarlenQVCase(),
    "mqa-causal": VarlenQVCase(h_k=1, causal=True),
    "empty-sequences": VarlenQVCase(lens_q=(3, 0, 4, 2), lens_k=(5, 3, 0, 6), causal=True),
    "seqused-q": VarlenQVCase(used_q=(2, 7, 0, 5), causal=True),
    "seqused-k": VarlenQVCase(used_k=(4, 0, 9, 1), causal=True),
    "seqused-both-local": VarlenQVCase(used_q=(3, 4, 1, 2), used_k=(6, 5, 3, 2),
                                       window=(2, 1)),
    "softcap-chunk": VarlenQVCase(lens_q=(6, 9), lens_k=(6, 12), softcap=4.0, chunk=4,
                                  causal=True),
    "splits-3": VarlenQVCase(lens_q=(2, 1), lens_k=(30, 41), h_k=1, num_splits=3),
    "bf16": VarlenQVCase(h_k=1, dtype=torch.bfloat16, causal=True),
}


def _cu(lens: Tuple[int, ...], device: str) -> torch.Tensor:
    return torch.tensor([0, *torch.tensor(lens).cumsum(0).tolist()], dtype=torch.int32,
                        device=device)


def _varlen_ref(c: VarlenQVCase, q, k, v, qv, upcast: bool):
    """The oracle sequence by sequence in the packed layout: out (total_q, h, d_v), lse (h,
    total_q); rows past seqused_q (and rows of a sequence without keys) 0 and -inf."""
    total_q = q.shape[0]
    dt = torch.float64 if upcast else q.dtype
    out = torch.zeros(total_q, c.h, c.d_v, dtype=dt, device=q.device)
    lse = torch.full((c.h, total_q), float("-inf"), dtype=torch.float64 if upcast
                     else torch.float32, device=q.device)
    q0 = k0 = 0
    for i, (n_q, n_k) in enumerate(zip(c.lens_q, c.lens_k)):
        u_q = n_q if c.used_q is None else c.used_q[i]
        u_k = n_k if c.used_k is None else c.used_k[i]
        if u_q and u_k:
            cast = (lambda x: x.double()) if upcast else (lambda x: x)
            rows, keys = slice(q0, q0 + u_q), slice(k0, k0 + u_k)
            o, l = attention_ref(*(cast(x[s][None]) for x, s in ((q, rows), (k, keys),
                                                                  (v, keys))),
                                 qv=cast(qv[rows][None]), causal=c.causal,
                                 window_size=c.window, softcap=c.softcap,
                                 attention_chunk=c.chunk, upcast=upcast)
            out[rows] = o[0].to(dt)
            lse[:, rows] = l[0].to(lse.dtype)
        q0 += n_q
        k0 += n_k
    return out, lse


def check_varlen(c: VarlenQVCase, device: str = "cpu") -> None:
    total_q, total_k = sum(c.lens_q), sum(c.lens_k)
    q = torch.randn(total_q, c.h, c.d, device=device)
    if c.softcap:
        q = q * c.softcap / 2
    k = torch.randn(total_k, c.h_k, c.d, device=device)
    v = torch.randn(total_k, c.h_k, c.d_v, device=device)
    qv = torch.randn(total_q, c.h, c.d_v, device=device)
    q, k, v, qv = (x.to(c.dtype) for x in (q, k, v, qv))
    used = {n: None if u is None else torch.tensor(u, dtype=torch.int32, device=device)
            for n, u in (("seqused_q", c.used_q), ("seqused_k", c.used_k))}
    out, lse = fa3.flash_attn_varlen_func(
        q, k, v, _cu(c.lens_q, device), _cu(c.lens_k, device), max(c.lens_q), max(c.lens_k),
        qv=qv, causal=c.causal, window_size=c.window, softcap=c.softcap,
        attention_chunk=c.chunk, num_splits=c.num_splits, return_attn_probs=True, **used)
    assert out.shape == (total_q, c.h, c.d_v) and lse.shape == (c.h, total_q)
    ref, ref_lse = _varlen_ref(c, q, k, v, qv, upcast=True)
    low, low_lse = _varlen_ref(c, q, k, v, qv, upcast=False)
    assert_close_rule(out, ref, low, name="out")
    assert_close_rule(lse, ref_lse, low_lse, name="lse")


@pytest.mark.parametrize("case", list(VARLEN.values()), ids=list(VARLEN))
def test_varlen_qv_matches_reference(backend: str, case: VarlenQVCase) -> None:
    check_varlen(case)


def test_varlen_qv_one_sequence_is_the_dense_call(cpu_backend: str) -> None:
    """A varlen call of one sequence and the dense call of the same tensors agree bitwise
    on the cpu path (same keys, same order of the sums)."""
    c = QVCase(s_q=6, s_k=11, b=1, h_k=2, causal=True)
    q, k, v, qv = _inputs(c)
    dense = fa3.flash_attn_func(q, k, v, qv=qv, causal=True)
    packed = fa3.flash_attn_varlen_func(q[0], k[0], v[0], _cu((6,), "cpu"), _cu((11,), "cpu"),
                                        6, 11, qv=qv[0], causal=True)
    torch.testing.assert_close(packed, dense[0], rtol=0, atol=0)


# ---------------------------------------------------------------------------------------------
# Forward only; calls without keys; bad input
# ---------------------------------------------------------------------------------------------
def test_qv_is_forward_only(cpu_backend: str) -> None:
    """Inputs that require grad are accepted (FA3's tests pass them); a backward raises
    NotImplementedError saying why, instead of FA3's gradients without the qv term."""
    q, k, v, qv = (x.requires_grad_() for x in _inputs(QVCase(h_k=1)))
    out = fa3.flash_attn_func(q, k, v, qv=qv, causal=True)
    assert out.requires_grad
    with pytest.raises(NotImplementedError, match=r"qv .* is forward only"):
        out.sum().backward()
    with torch.no_grad():
        again = fa3.flash_attn_func(q, k, v, qv=qv, causal=True)
    torch.testing.assert_close(again, out.detach(), rtol=0, atol=0)
    cu = _cu((5, 0), "cpu")
    packed = fa3.flash_attn_varlen_func(q.flatten(0, 1)[:5], k.flatten(0, 1)[:9],
                                        v.flatten(0, 1)[:9], cu, _cu((9, 0), "cpu"), 5, 9,
                                        qv=qv.flatten(0, 1)[:5])
    with pytest.raises(NotImplementedError, match="forward only"):
        packed.sum().backward()


def test_qv_without_keys(backend: str) -> None:
    """No key at all (seqlen_k 0, total_k 0, batch 0): out 0, lse -inf, the right shapes."""
    q, k, v, qv = _inputs(QVCase(s_q=3, s_k=0, h_k=1))
    out, lse = fa3.flash_attn_func(q, k, v, qv=qv, return_attn_probs=True)
    assert out.shape == (2, 3, 4, 32) and not out.any()
    assert lse.shape == (2, 4, 3) and bool((lse == float("-inf")).all())
    cu0 = _cu((2, 1), "cpu")
    out, lse = fa3.flash_attn_varlen_func(q[0], k[0], v[0], cu0, _cu((0, 0), "cpu"), 2, 0,
                                          qv=qv[0], return_attn_probs=True, causal=True)
    assert out.shape == (3, 4, 32) and not out.any() and bool((lse == float("-inf")).all())
    empty = _cu((), "cpu")
    out = fa3.flash_attn_varlen_func(q[0, :0], k[0], v[0], empty, empty, 0, 0, qv=qv[0, :0])
    assert out.shape == (0, 4, 32)


@pytest.mark.parametrize("bad, exc, match", [
    (lambda q, k, v, qv: dict(qv=qv[..., :16]), ValueError,
     r"qv must have shape .*v's head dim 32"),
    (lambda q, k, v, qv: dict(qv=qv.float()), TypeError, r"qv must have the dtype of q"),
    (lambda q, k, v, qv: dict(qv=qv, q_descale=torch.ones(2, 1)), ValueError,
     r"q_descale applies to float8_e4m3fn inputs only"),
    (lambda q, k, v, qv: dict(q=q.to(torch.float8_e4m3fn), k=k.to(torch.float8_e4m3fn),
                              v=v.to(torch.float8_e4m3fn), qv=qv), NotImplementedError,
     r"qv .* with FP8 q / k / v is not supported"),
    (lambda q, k, v, qv: dict(qv=qv, num_splits=1.5), TypeError, r"num_splits must be an int"),
    (lambda q, k, v, qv: dict(qv=qv, v=v[..., :8]), ValueError, r"qv must have shape"),
], ids=["qv-width", "qv-dtype", "descale-16-bit", "fp8", "num-splits", "v-width"])
def test_bad_qv_calls_name_the_argument(cpu_backend: str, bad, exc, match) -> None:
    q, k, v, qv = _inputs(QVCase(h_k=1))
    kw = dict(q=q, k=k, v=v)
    kw.update(bad(q, k, v, qv))
    with pytest.raises(exc, match=match):
        fa3.flash_attn_func(kw.pop("q"), kw.pop("k"), kw.pop("v"), **kw)


def test_bad_varlen_qv_calls_name_the_argument(cpu_backend: str) -> None:
    q, k, v, qv = (x[0] for x in _inputs(QVCase(b=1, h_k=1)))
    cu_q, cu_k = _cu((5,), "cpu"), _cu((9,), "cpu")
    with pytest.raises(ValueError, match=r"qv must have shape \(total_q, nheads, headdim_v\)"):
        fa3.flash_attn_varlen_func(q, k, v, cu_q, cu_k, 5, 9, qv=qv[:4])
    with pytest.raises(ValueError, match=r"seqused_q\[0\] = 6 must be in \[0, 5\]"):
        fa3.flash_attn_varlen_func(q, k, v, cu_q, cu_k, 5, 9, qv=qv,
                                   seqused_q=torch.tensor([6], dtype=torch.int32))
    with pytest.raises(TypeError, match="cu_seqlens_k must have dtype torch.int32"):
        fa3.flash_attn_varlen_func(q, k, v, cu_q, cu_k.long(), 5, 9, qv=qv)
    with pytest.raises(ValueError, match="max_seqlen_k"):
        fa3.flash_attn_varlen_func(q, k, v, cu_q, cu_k, 5, 4, qv=qv)


def test_qv_out_and_compile(cpu_backend: str) -> None:
    """``out=`` takes the result; torch.compile(fullgraph=True) traces the call (the KV-cache
    op and the forward-only wrapper)."""
    q, k, v, qv = _inputs(QVCase(h_k=1))
    want = fa3.flash_attn_func(q, k, v, qv=qv, causal=True)
    buf = torch.empty_like(want)
    assert fa3.flash_attn_func(q, k, v, qv=qv, causal=True, out=buf) is buf
    torch.testing.assert_close(buf, want, rtol=0, atol=0)
    compiled = torch.compile(lambda *x: fa3.flash_attn_func(*x[:3], qv=x[3], causal=True),
                             fullgraph=True, backend="eager")
    torch.testing.assert_close(compiled(q, k, v, qv), want, rtol=0, atol=0)
