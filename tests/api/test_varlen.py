"""Variable-length (packed) attention: flash_attn_varlen_func & friends, forward and backward.

Every case runs on both backends ('cpu': chunked torch, one sequence at a time; 'portable':
the Triton kernels in VARLEN mode, under TRITON_INTERPRET=1 without a GPU) and is judged
against :func:`flashattn.reference.attention_ref` in float64, sequence by sequence, with
flash-attn's rule (tests/accuracy.py): error <= 2x (outputs) / 3x (gradients) the error of
naive PyTorch attention in the same low precision. Sequence lengths mix 0, 1 and non-block
multiples; causal / windows are bottom-right aligned per sequence (s_q != s_k within a
sequence); dropout is checked against the keep mask rebuilt from ``flashattn.philox`` with
the per-sequence counters of docs/internals.md.
"""
from __future__ import annotations

import inspect
import itertools
from dataclasses import dataclass
from typing import Optional, Tuple

import pytest
import torch

import flashattn
from tests.accuracy import assert_close_rule, delta_residual_atols, fp32_sum_atol
from flashattn.dispatch import select as dispatch_select
from flashattn.dispatch import varlen as dispatch_varlen
from flashattn import (flash_attn_func, flash_attn_varlen_func,
                       flash_attn_varlen_kvpacked_func, flash_attn_varlen_qkvpacked_func)
from flashattn.api import normalise as api_params
from flashattn.api import varlen as varlen_mod
from flashattn.philox import dropout_keep
from flashattn.reference import attention_probs_ref, attention_ref, visible_mask
from tests.settings import set_env

SEED = 1234567  # fixed Philox seed for the dropout cases (the API draws one at random)


# ---------------------------------------------------------------------------------------------
# Case description, inputs and the per-sequence oracle
# ---------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class VCase:
    lens_q: Tuple[int, ...]
    lens_k: Tuple[int, ...]  # rows of each sequence in k/v (its slot)
    d: int = 32
    d_v: Optional[int] = None
    dtype: torch.dtype = torch.float16
    h: int = 2
    h_k: int = 2
    causal: bool = False
    window: Tuple[int, int] = (-1, -1)
    softcap: float = 0.0
    alibi: Optional[str] = None  # None | "h" | "bh"
    dropout_p: float = 0.0
    deterministic: bool = False
    seqused_k: Optional[Tuple[int, ...]] = None  # keys actually used per sequence

    @property
    def id(self) -> str:
        dt = {torch.float16: "fp16", torch.bfloat16: "bf16", torch.float32: "fp32"}[self.dtype]
        parts = [dt, f"d{self.d}" + (f"v{self.d_v}" if self.d_v not in (None, self.d) else ""),
                 "q" + "_".join(map(str, self.lens_q)), "k" + "_".join(map(str, self.lens_k)),
                 f"h{self.h}k{self.h_k}"]
        if self.causal:
            parts.append("causal")
        if self.window != (-1, -1):
            parts.append(f"win{self.window[0]}_{self.window[1]}")
        if self.softcap:
            parts.append(f"cap{self.softcap:g}")
        if self.alibi:
            parts.append(f"alibi_{self.alibi}")
        if self.dropout_p:
            parts.append(f"drop{self.dropout_p:g}")
        if self.deterministic:
            parts.append("det")
        if self.seqused_k is not None:
            parts.append("used" + "_".join(map(str, self.seqused_k)))
        return "-".join(parts)

    @property
    def used_k(self) -> Tuple[int, ...]:
        return self.lens_k if self.seqused_k is None else self.seqused_k


def cu_seqlens(lens) -> torch.Tensor:
    return torch.tensor([0, *itertools.accumulate(lens)], dtype=torch.int32)


def fa2_varlen_window(causal: bool, window, max_seqlen_k: int) -> Tuple[int, int]:
    """flash-attn 2's varlen normalisation: a side >= max_seqlen_k is unbounded (max over the
    batch, not the sequence's own s_k); causal -> right 0."""
    left, right = (-1 if w < 0 or w >= max_seqlen_k else int(w) for w in window)
    return left, (0 if causal else right)


def make_inputs(c: VCase, device: str = "cpu"):
    d_v = c.d if c.d_v is None else c.d_v
    tq, tk = sum(c.lens_q), sum(c.lens_k)
    q = torch.randn(tq, c.h, c.d, dtype=c.dtype, device=device).requires_grad_()
    k = torch.randn(tk, c.h_k, c.d, dtype=c.dtype, device=device).requires_grad_()
    v = torch.randn(tk, c.h_k, d_v, dtype=c.dtype, device=device).requires_grad_()
    b = len(c.lens_q)
    slopes = None
    if c.alibi:
        shape = (c.h,) if c.alibi == "h" else (b, c.h)
        slopes = torch.rand(shape, dtype=torch.float32, device=device) * 0.5 + 0.05
    return q, k, v, slopes


def keep_mask_of_sequence(seed: int, p: float, b: int, h: int, s_q: int, s_k: int, device):
    """Dropout keep mask (1, h, s_q, s_k) of packed sequence b: batch counter b, local i, j."""
    bh = torch.arange(b * h, (b + 1) * h, device=device).view(1, h, 1, 1)
    rows = torch.arange(s_q, device=device).view(1, 1, -1, 1)
    cols = torch.arange(s_k, device=device).view(1, 1, 1, -1)
    return dropout_keep(seed, p, bh, rows, cols, device=device)


def reference_varlen(c: VCase, q, k, v, slopes, g, upcast: bool, seed: int = SEED):
    """Per-sequence attention_ref, reassembled into the packed layout.

    Returns out (total_q, h, d_v), lse (h, total_q) and (dq, dk, dv) for output gradient g;
    float64 when ``upcast`` (the oracle), else in q's dtype (PyTorch's own low precision).
    Sequences without keys: out 0, lse -inf, zero gradients; unused keys: zero gradients.
    """
    dtype = torch.float64 if upcast else q.dtype
    xs = [x.detach().to(dtype).requires_grad_() for x in (q, k, v)]
    qx, kx, vx = xs
    b = len(c.lens_q)
    cu_q, cu_k = cu_seqlens(c.lens_q).tolist(), cu_seqlens(c.lens_k).tolist()
    window = fa2_varlen_window(c.causal, c.window, max(max(c.used_k), 1))
    d_v = v.shape[-1]
    outs, lses = [], []
    for i in range(b):
        q0, s_q = cu_q[i], c.lens_q[i]
        k0, s_k = cu_k[i], c.used_k[i]
        if s_q == 0:
            continue
        if s_k == 0:
            outs.append(qx.new_zeros(s_q, c.h, d_v))
            lses.append(torch.full((c.h, s_q), float("-inf"), dtype=torch.float64,
                                   device=q.device))
            continue
        sl = None
        if slopes is not None:
            sl = slopes if slopes.dim() == 1 else slopes[i:i + 1]
        keep = None
        if c.dropout_p > 0:
            keep = keep_mask_of_sequence(seed, c.dropout_p, i, c.h, s_q, s_k, q.device)
        o, lse = attention_ref(qx[q0:q0 + s_q][None], kx[k0:k0 + s_k][None],
                               vx[k0:k0 + s_k][None], window_size=window, softcap=c.softcap,
                               alibi_slopes=sl, dropout_p=c.dropout_p, dropout_mask=keep,
                               upcast=upcast)
        outs.append(o[0])
        lses.append(lse[0].double())
    out = torch.cat(outs) if outs else qx.new_zeros(0, c.h, d_v)
    lse = (torch.cat(lses, dim=1) if lses
           else torch.zeros(c.h, 0, dtype=torch.float64, device=q.device))
    if out.requires_grad:
        grads = torch.autograd.grad(out, xs, g.to(dtype), allow_unused=True)
        grads = [torch.zeros_like(x) if gr is None else gr for x, gr in zip(xs, grads)]
    else:
        grads = [torch.zeros_like(x) for x in xs]
    return out.detach(), lse, grads


def _interpreter_truncates_bf16(q: torch.Tensor) -> bool:
    # Triton 3.6's interpreter casts fp32 -> bf16 by truncation (see test_attention.py)
    return (q.dtype == torch.bfloat16 and q.device.type == "cpu" and dispatch_select.interpreting()
            and dispatch_select.backend_for(q) == "portable")


def _ulp_atol(ref: torch.Tensor, dtype: torch.dtype) -> float:
    r = ref.detach()
    r = r[torch.isfinite(r)]
    return torch.finfo(dtype).eps * (r.abs().max().item() if r.numel() else 0.0)


def _single_key_atols(c: VCase, q, k, out, g):
    """When every row sees at most one key, softmax's gradient is exactly 0 and the naive
    baseline has no error; FlashAttention's P * (dP - D) leaves a residual of about
    eps * |dO_i| |O_i| * scale * max|k| (dq) / max|q| (dk), as in test_attention.py."""
    window = fa2_varlen_window(c.causal, c.window, max(max(c.used_k), 1))
    most = max((visible_mask(s_q, s_k, *window).sum(-1).max().item()
                for s_q, s_k in zip(c.lens_q, c.used_k) if s_q and s_k), default=0)
    if most != 1:  # (0: no row sees a key, the gradients are exactly 0; maybe no rows)
        return {}
    eps = torch.finfo(c.dtype).eps
    row = (g.double().norm(dim=-1) * out.detach().double().norm(dim=-1)).max().item()
    base = eps * c.d ** -0.5 * row
    return {"dq": base * k.detach().abs().max().item() + 1e-5,
            "dk": base * q.detach().abs().max().item() + 1e-5}


def _delta_residual_atols(c: VCase, q, k, slopes, out, out_ref, g):
    """tests.accuracy.delta_residual_atols, sequence by sequence (the largest bound)."""
    window = fa2_varlen_window(c.causal, c.window, max(max(c.used_k), 1))
    cu_q, cu_k = cu_seqlens(c.lens_q).tolist(), cu_seqlens(c.lens_k).tolist()
    worst = {"dq": 0.0, "dk": 0.0}
    for i, (s_q, s_k) in enumerate(zip(c.lens_q, c.used_k)):
        if not (s_q and s_k):
            continue
        rows, keys = slice(cu_q[i], cu_q[i] + s_q), slice(cu_k[i], cu_k[i] + s_k)
        sl = None if slopes is None else (slopes if slopes.dim() == 1 else slopes[i:i + 1])
        qi, ki = q.detach()[rows][None].double(), k.detach()[keys][None].double()
        probs, _ = attention_probs_ref(qi, ki, window_size=window, softcap=c.softcap,
                                       alibi_slopes=sl)
        bound = delta_residual_atols(qi, ki, out[rows][None], out_ref[rows][None],
                                     g[rows][None], probs, c.d ** -0.5)
        worst = {n: max(worst[n], bound[n]) for n in worst}
    return worst


def check_varlen(c: VCase, device: str = "cpu", monkeypatch=None) -> None:
    q, k, v, slopes = make_inputs(c, device)
    cu_q, cu_k = cu_seqlens(c.lens_q).to(device), cu_seqlens(c.lens_k).to(device)
    used = None if c.seqused_k is None else torch.tensor(c.seqused_k, dtype=torch.int32,
                                                          device=device)
    if c.dropout_p > 0:
        monkeypatch.setattr(api_params, "draw_philox_seed",
                            lambda: torch.tensor([SEED], dtype=torch.int64))
    max_q, max_k = max(max(c.lens_q), 1), max(max(c.used_k), 1)
    out, lse, s_dmask = flash_attn_varlen_func(
        q, k, v, cu_q, cu_k, max_q, max_k, dropout_p=c.dropout_p, causal=c.causal,
        window_size=c.window, softcap=c.softcap, alibi_slopes=slopes,
        deterministic=c.deterministic, return_attn_probs=True, seqused_k=used)
    g = torch.randn_like(out)
    dq, dk, dv = torch.autograd.grad(out, (q, k, v), g)

    out_ref, lse_ref, grads_ref = reference_varlen(c, q, k, v, slopes, g, upcast=True)
    out_lp, lse_lp, grads_lp = reference_varlen(c, q, k, v, slopes, g, upcast=False)

    d_v = v.shape[-1]
    assert out.shape == (q.shape[0], c.h, d_v) and out.dtype == c.dtype
    assert lse.shape == (c.h, q.shape[0]) and lse.dtype == torch.float32
    truncates = _interpreter_truncates_bf16(q)
    # (float32: the sums over keys (out, dq) and over a GQA group's rows (dk, dv))
    group = c.h // c.h_k
    terms = {"out": max(c.used_k), "dq": max(c.used_k), "dk": max(c.lens_q) * group,
             "dv": max(c.lens_q) * group}
    assert_close_rule(out, out_ref, out_lp, atol=1e-5 + truncates * _ulp_atol(out_ref, c.dtype)
                      + fp32_sum_atol(out_ref, c.dtype, terms["out"]), name="out")
    assert_close_rule(lse, lse_ref, lse_lp.float(), name="lse")
    atols = _single_key_atols(c, q, k, out, g)
    residual = _delta_residual_atols(c, q, k, slopes, out, out_ref, g)
    for name, x, got, ref, lp in zip(("dq", "dk", "dv"), (q, k, v), (dq, dk, dv), grads_ref,
                                     grads_lp):
        assert got.shape == x.shape and got.dtype == x.dtype, name
        atol = (atols.get(name, 1e-5) + residual.get(name, 0.0)
                + truncates * _ulp_atol(ref, c.dtype) + fp32_sum_atol(ref, c.dtype, terms[name]))
        assert_close_rule(got, ref, lp, factor=3.0, atol=atol, name=name)
    # rows that see no key are exactly 0; so are the gradients of keys past seqused_k
    empty = torch.isneginf(lse_ref).T
    assert (out[empty] == 0).all(), "rows with no visible key must have out == 0"
    for i, (k0, n, u) in enumerate(zip(cu_k.tolist(), c.lens_k, c.used_k)):
        assert (dk[k0 + u:k0 + n] == 0).all() and (dv[k0 + u:k0 + n] == 0).all(), i
    if c.dropout_p > 0:
        check_s_dmask(c, s_dmask, max_q, max_k)
    else:
        assert s_dmask is None


def check_s_dmask(c: VCase, s_dmask, max_q: int, max_k: int) -> None:
    """S_dmask (b, h, max_q, max_k): sequence b in [b, :, :s_q, :s_k], sign = philox keep."""
    b = len(c.lens_q)
    assert s_dmask.shape == (b, c.h, max_q, max_k)
    window = fa2_varlen_window(c.causal, c.window, max_k)
    for i, (s_q, s_k) in enumerate(zip(c.lens_q, c.used_k)):
        block = s_dmask[i, :, :s_q, :s_k]
        assert (s_dmask[i, :, s_q:] == 0).all() and (s_dmask[i, :, :, s_k:] == 0).all()
        if s_q == 0 or s_k == 0:
            continue
        vis = visible_mask(s_q, s_k, *window).expand(c.h, s_q, s_k)
        vis = vis.to(s_dmask.device)
        keep = keep_mask_of_sequence(SEED, c.dropout_p, i, c.h, s_q, s_k, s_dmask.device)[0]
        nz = vis & (block != 0)  # (probabilities that underflow to 0 carry no sign)
        assert (block[~vis] == 0).all()
        assert torch.equal(block[nz] > 0, keep[nz]), f"S_dmask sign != philox keep, seq {i}"


# ---------------------------------------------------------------------------------------------
# The grid (small: the interpreter is slow)
# ---------------------------------------------------------------------------------------------
CASES = [
    # self-attention, lengths 1 / 0 / non-multiples of the tile
    VCase((1, 0, 37, 17), (1, 0, 37, 17), d=64),
    # cross lengths both ways within sequences (s_q > s_k: causal rows with no key), GQA, d_v
    VCase((5, 33, 0, 17), (20, 17, 9, 30), d=40, d_v=24, dtype=torch.bfloat16, h=4, h_k=2,
          causal=True),
    # a sequence without keys, MQA, window
    VCase((19, 1, 40), (25, 0, 40), d=32, dtype=torch.float32, h=3, h_k=1, window=(7, 3)),
    # window right 12 < max_seqlen_k = 40 but >= sequence 0's s_k = 10: still bounded
    VCase((30, 10), (10, 40), d=16, window=(-1, 12)),
    VCase((33, 16, 1), (33, 16, 1), d=80, softcap=5.0, alibi="h", causal=True),
    VCase((17, 45), (30, 12), d=16, dtype=torch.bfloat16, alibi="bh", window=(4, -1)),
    VCase((13, 29, 0, 7), (21, 29, 5, 3), d=24, dtype=torch.float32, h=4, h_k=2,
          dropout_p=0.17, causal=True),
    # seqused_k: only the first keys of each slot count (alignment uses them)
    VCase((9, 20, 4), (30, 25, 10), d=32, seqused_k=(12, 25, 0), causal=True),
    # fewer tokens than sequences
    VCase((0, 0, 1, 0, 0, 0, 1, 0), (0, 1, 1, 0, 2, 0, 0, 0), d=8, dtype=torch.float32),
    VCase((21, 34), (34, 21), d=64, h=6, h_k=2, causal=True, deterministic=True),
    VCase((9, 3), (21, 5), d=3, d_v=1, dtype=torch.float32),
    VCase((5, 18), (40, 7), d=256, d_v=17, dtype=torch.bfloat16, h=2, h_k=1),
]


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.id)
def test_varlen(backend, case, monkeypatch):
    check_varlen(case, monkeypatch=monkeypatch)


@pytest.mark.parametrize("p", [0.5, 0.9])
def test_varlen_dropout_rates(backend, p, monkeypatch):
    check_varlen(VCase((11, 0, 23), (19, 4, 23), d=16, dtype=torch.float32, h=2, h_k=1,
                       dropout_p=p, window=(9, 2), alibi="bh"), monkeypatch=monkeypatch)


# ---------------------------------------------------------------------------------------------
# Equivalences
# ---------------------------------------------------------------------------------------------
def test_equal_lengths_match_dense(backend, monkeypatch):
    """Sequences of one length packed = the dense batch, bitwise (dropout counters included)."""
    b, s_q, s_k, h, h_k, d = 3, 19, 26, 4, 2, 16
    q = torch.randn(b, s_q, h, d, dtype=torch.float16, requires_grad=True)
    k = torch.randn(b, s_k, h_k, d, dtype=torch.float16, requires_grad=True)
    v = torch.randn(b, s_k, h_k, d, dtype=torch.float16, requires_grad=True)
    slopes = torch.rand(b, h) * 0.3
    g = torch.randn(b, s_q, h, d, dtype=torch.float16)
    kw = dict(causal=True, window_size=(11, -1), softcap=4.0, alibi_slopes=slopes,
              dropout_p=0.2, return_attn_probs=True, deterministic=True)
    torch.manual_seed(5)
    out_d, lse_d, sd_d = flash_attn_func(q, k, v, **kw)
    grads_d = torch.autograd.grad(out_d, (q, k, v), g)
    qp, kp, vp = (x.detach().flatten(0, 1).requires_grad_() for x in (q, k, v))
    torch.manual_seed(5)  # same seed draw
    out_v, lse_v, sd_v = flash_attn_varlen_func(qp, kp, vp, cu_seqlens([s_q] * b),
                                                cu_seqlens([s_k] * b), s_q, s_k, **kw)
    grads_v = torch.autograd.grad(out_v, (qp, kp, vp), g.flatten(0, 1))
    assert torch.equal(out_v, out_d.flatten(0, 1))
    assert torch.equal(lse_v, lse_d.transpose(0, 1).flatten(1))  # (b, h, s) -> (h, b * s)
    assert torch.equal(sd_v, sd_d)
    for gv, gd in zip(grads_v, grads_d):
        assert torch.equal(gv, gd.flatten(0, 1))


def test_atomic_dq(backend, monkeypatch):
    """FLASHATTN_ATOMIC_DQ=1 (deterministic=False): dQ by fp32 atomics in the dK/dV pass."""
    set_env(monkeypatch, FLASHATTN_ATOMIC_DQ="1")
    check_varlen(VCase((7, 0, 26), (19, 3, 26), d=16, h=4, h_k=2, causal=True,
                       dtype=torch.float32), monkeypatch=monkeypatch)


def test_larger_max_seqlen_changes_nothing(backend):
    """A generous max_seqlen only adds programs that exit at once."""
    lens_q, lens_k = (7, 20, 3), (12, 9, 30)
    q = torch.randn(sum(lens_q), 2, 16, requires_grad=True)
    k = torch.randn(sum(lens_k), 2, 16, requires_grad=True)
    v = torch.randn(sum(lens_k), 2, 16, requires_grad=True)
    g = torch.randn(sum(lens_q), 2, 16)
    cu_q, cu_k = cu_seqlens(lens_q), cu_seqlens(lens_k)
    res = []
    for mq, mk in ((20, 30), (57, 71)):
        out = flash_attn_varlen_func(q, k, v, cu_q, cu_k, mq, mk, causal=True)
        res.append((out, *torch.autograd.grad(out, (q, k, v), g)))
    for a, b in zip(*res):
        assert torch.equal(a, b)


def test_strided_length_vectors(backend):
    """cu_seqlens / seqused_k given as strided views read the same as contiguous ones."""
    lens_q, lens_k = (6, 0, 13), (9, 4, 13)
    q = torch.randn(19, 2, 8)
    k, v = torch.randn(26, 2, 8), torch.randn(26, 2, 8)
    cu_q, cu_k = cu_seqlens(lens_q), cu_seqlens(lens_k)
    used = torch.tensor([7, 2, 13], dtype=torch.int32)
    want = flash_attn_varlen_func(q, k, v, cu_q, cu_k, 13, 13, causal=True, seqused_k=used)
    spread = [torch.stack([x, torch.full_like(x, 99)], 1)[:, 0] for x in (cu_q, cu_k, used)]
    assert spread[0].stride() == (2,)
    got = flash_attn_varlen_func(q, k, v, spread[0], spread[1], 13, 13, causal=True,
                                 seqused_k=spread[2])
    assert torch.equal(got, want)


def test_rows_outside_sequences(backend):
    """Rows before cu_seqlens[0] / after cu_seqlens[-1] belong to no sequence: out 0,
    lse -inf, zero gradients (and the sequences in between are unaffected)."""
    q = torch.randn(30, 2, 8, requires_grad=True)
    k = torch.randn(25, 2, 8, requires_grad=True)
    v = torch.randn(25, 2, 8, requires_grad=True)
    cu_q = torch.tensor([3, 10, 24], dtype=torch.int32)
    cu_k = torch.tensor([2, 9, 20], dtype=torch.int32)
    out, lse, _ = flash_attn_varlen_func(q, k, v, cu_q, cu_k, 14, 11, return_attn_probs=True)
    dq, dk, dv = torch.autograd.grad(out, (q, k, v), torch.randn_like(out))
    for rows in (slice(0, 3), slice(24, 30)):
        assert (out[rows] == 0).all() and torch.isneginf(lse[:, rows]).all()
        assert (dq[rows] == 0).all()
    for keys in (slice(0, 2), slice(20, 25)):
        assert (dk[keys] == 0).all() and (dv[keys] == 0).all()
    ref, _ = attention_ref(q[10:24][None].double(), k[9:20][None].double(),
                           v[9:20][None].double())
    torch.testing.assert_close(out[10:24].double(), ref[0], rtol=1e-5, atol=1e-5)


# ---------------------------------------------------------------------------------------------
# Few query rows per sequence (decode steps of a packed batch, speculative verification): the
# split-KV decode kernel over the packed keys (dispatch_varlen.small_query_varlen)
# ---------------------------------------------------------------------------------------------
SMALL_Q_CASES = [
    # GQA, a sequence without queries, one without keys, s_q > s_k under causal (rows with no
    # key), 16 rows (the limit)
    VCase((1, 16, 0, 5, 3), (40, 23, 5, 3, 0), d=32, h=4, h_k=2, causal=True),
    # one row per sequence (the kernel drops the right edge of 0: it hides nothing there)
    VCase((1, 1, 1), (37, 1, 64), d=64, dtype=torch.bfloat16, h=8, h_k=2, causal=True),
    VCase((2, 7), (30, 45), d=40, d_v=24, dtype=torch.float32, h=3, h_k=1, window=(6, 2),
          softcap=4.0, alibi="bh"),
    VCase((4, 9, 1), (30, 25, 10), d=16, h=2, h_k=1, seqused_k=(12, 25, 0), causal=True,
          alibi="h"),
]


def _count_decode_calls(monkeypatch) -> list:
    """Count the decode kernel's calls (triton/decode.DecodeCall) from here on."""
    from flashattn.backends.triton import decode

    calls = []
    original = decode.DecodeCall.__call__

    def counted(self, *args, **kwargs):
        calls.append(self.varlen)
        return original(self, *args, **kwargs)
    monkeypatch.setattr(decode.DecodeCall, "__call__", counted)
    return calls


@pytest.mark.parametrize("case", SMALL_Q_CASES, ids=lambda c: c.id)
def test_small_query_rows_take_the_decode_kernel(case, monkeypatch):
    """max_seqlen_q <= 16 on the Triton backend: the forward runs the decode kernel over the
    packed keys (cache positions [cu_seqlens_k[b], + s_k), the start as its left pad), judged
    against the per-sequence float64 reference; gradients come from the varlen backward on the
    decode kernel's (out, lse)."""
    set_env(monkeypatch, FLASHATTN_BACKEND="portable", FLASHATTN_SMALL_QUERY="1")
    calls = _count_decode_calls(monkeypatch)
    check_varlen(case, monkeypatch=monkeypatch)
    assert calls == [True]


def test_small_query_route_and_recorded_call(monkeypatch):
    """The route's conditions (as the dense one: <= 16 rows, no dropout, on unless
    FLASHATTN_SMALL_QUERY=0), and a repeated signature (the fast path's VarlenRunner) takes it
    too, giving the first call's outputs and gradients; the prefill kernels agree."""
    from flashattn.api import fastpath

    set_env(monkeypatch, FLASHATTN_BACKEND="portable", FLASHATTN_SMALL_QUERY="1")
    calls = _count_decode_calls(monkeypatch)
    lens_q, lens_k = (3, 1, 16), (20, 0, 33)
    q = torch.randn(sum(lens_q), 4, 16, dtype=torch.float16, requires_grad=True)
    k = torch.randn(sum(lens_k), 2, 16, dtype=torch.float16, requires_grad=True)
    v = torch.randn(sum(lens_k), 2, 16, dtype=torch.float16, requires_grad=True)
    g = torch.randn(sum(lens_q), 4, 16, dtype=torch.float16)
    cu_q, cu_k = cu_seqlens(lens_q), cu_seqlens(lens_k)

    def step(max_q=16, **kw):
        out = flash_attn_varlen_func(q, k, v, cu_q, cu_k, max_q, 33, causal=True, **kw)
        return (out, *torch.autograd.grad(out, (q, k, v), g))

    fastpath.VARLEN.clear()
    first = step()
    second = step()  # recorded
    assert calls == [True, True] and len(fastpath.VARLEN._entries) == 1
    for a, b in zip(first, second):
        assert torch.equal(a, b)
    step(max_q=17)  # more rows than the route takes
    step(dropout_p=0.1)
    set_env(monkeypatch, FLASHATTN_SMALL_QUERY="0")
    prefill = step()
    assert calls == [True, True]
    for name, a, b in zip(("out", "dq", "dk", "dv"), first, prefill):
        torch.testing.assert_close(a, b, rtol=2e-3, atol=2e-3, msg=name)


def test_small_query_rows_outside_sequences_written_by_the_kernel(monkeypatch):
    """The decode kernel writes out 0 / lse -inf on the packed rows before the first and after
    the last sequence itself (no fill pass before it): its outputs and split workspace are
    poisoned with NaN here, and those rows still read 0 / -inf, with and without key splits."""
    import types

    from flashattn.backends.triton import decode

    poisoned = types.SimpleNamespace(**{n: getattr(torch, n) for n in dir(torch)
                                        if not n.startswith("__")})
    poisoned.empty = lambda *a, **kw: torch.full(a[0] if len(a) == 1 else a, float("nan"),
                                                 **kw)
    monkeypatch.setattr(decode, "torch", poisoned)
    set_env(monkeypatch, FLASHATTN_BACKEND="portable", FLASHATTN_SMALL_QUERY="1")
    q = torch.randn(11, 4, 16)
    k, v = torch.randn(60, 2, 16), torch.randn(60, 2, 16)
    cu_q = torch.tensor([3, 4, 7], dtype=torch.int32)
    cu_k = torch.tensor([2, 40, 57], dtype=torch.int32)
    for splits in (1, 3):
        monkeypatch.setattr(decode, "num_splits_heuristic", lambda *a, **kw: splits)
        decode._launch_plan.cache_clear()
        out, lse, _ = flash_attn_varlen_func(q, k, v, cu_q, cu_k, 3, 38, causal=True,
                                             return_attn_probs=True)
        for rows in (slice(0, 3), slice(7, 11)):
            assert (out[rows] == 0).all() and torch.isneginf(lse[:, rows]).all(), splits
        for i, (q0, q1, k0, k1) in enumerate(((3, 4, 2, 40), (4, 7, 40, 57))):
            ref, _ = attention_ref(q[q0:q1][None].double(), k[k0:k1][None].double(),
                                   v[k0:k1][None].double(), causal=True)
            torch.testing.assert_close(out[q0:q1].double(), ref[0], rtol=1e-5, atol=1e-5)
    decode._launch_plan.cache_clear()


@pytest.mark.parametrize("dtype", [torch.float16, torch.float32])
def test_qkvpacked_matches_unpacked(backend, dtype):
    lens = (13, 1, 0, 22)
    total, h, d = sum(lens), 3, 16
    cu = cu_seqlens(lens)
    qkv = torch.randn(total, 3, h, d, dtype=dtype, requires_grad=True)
    g = torch.randn(total, h, d, dtype=dtype)
    out_p = flash_attn_varlen_qkvpacked_func(qkv, cu, max(lens), causal=True)
    (dqkv,) = torch.autograd.grad(out_p, qkv, g)
    q, k, v = (x.detach().clone().requires_grad_() for x in qkv.unbind(1))
    out_u = flash_attn_varlen_func(q, k, v, cu, cu, max(lens), max(lens), causal=True)
    grads = torch.autograd.grad(out_u, (q, k, v), g)
    assert dqkv.shape == qkv.shape
    assert torch.equal(out_p, out_u)
    assert torch.equal(dqkv, torch.stack(grads, dim=1))


def test_kvpacked_matches_unpacked_gqa(backend):
    lens_q, lens_k = (6, 17), (21, 4)
    h, h_k, d = 4, 2, 16
    cu_q, cu_k = cu_seqlens(lens_q), cu_seqlens(lens_k)
    q = torch.randn(sum(lens_q), h, d, requires_grad=True)
    kv = torch.randn(sum(lens_k), 2, h_k, d, requires_grad=True)
    g = torch.randn(sum(lens_q), h, d)
    kw = dict(window_size=(5, 3), softcap=5.0)
    out_p = flash_attn_varlen_kvpacked_func(q, kv, cu_q, cu_k, 17, 21, **kw)
    dq_p, dkv = torch.autograd.grad(out_p, (q, kv), g)
    q2 = q.detach().clone().requires_grad_()
    k, v = (x.detach().clone().requires_grad_() for x in kv.unbind(1))
    out_u = flash_attn_varlen_func(q2, k, v, cu_q, cu_k, 17, 21, **kw)
    dq, dk, dv = torch.autograd.grad(out_u, (q2, k, v), g)
    assert torch.equal(out_p, out_u) and torch.equal(dq_p, dq)
    assert torch.equal(dkv, torch.stack([dk, dv], dim=1))


def test_window_past_max_seqlen_k_is_unbounded(cpu_backend):
    lens_q, lens_k = (12, 5), (4, 9)
    q, k, v = torch.randn(17, 2, 8), torch.randn(13, 2, 8), torch.randn(13, 2, 8)
    cu_q, cu_k = cu_seqlens(lens_q), cu_seqlens(lens_k)
    a = flash_attn_varlen_func(q, k, v, cu_q, cu_k, 12, 9, window_size=(9, 9))
    b = flash_attn_varlen_func(q, k, v, cu_q, cu_k, 12, 9)
    assert torch.equal(a, b)
    c = flash_attn_varlen_func(q, k, v, cu_q, cu_k, 12, 9, window_size=(-1, 8))
    assert not torch.equal(a, c)  # 8 < max_seqlen_k: bounded (hides keys of sequence 0)


def test_dropout_reproducible_and_seed_reused(backend):
    lens = (9, 14)
    q = torch.randn(23, 2, 16, requires_grad=True)
    k = torch.randn(23, 2, 16, requires_grad=True)
    v = torch.randn(23, 2, 16, requires_grad=True)
    g = torch.randn(23, 2, 16)
    cu = cu_seqlens(lens)

    def run(s):
        torch.manual_seed(s)
        out = flash_attn_varlen_func(q, k, v, cu, cu, 14, 14, dropout_p=0.3)
        state = torch.get_rng_state()
        grads = torch.autograd.grad(out, (q, k, v), g)
        assert torch.equal(torch.get_rng_state(), state), "backward drew from the RNG"
        return (out, *grads)

    a, b, c = run(0), run(0), run(1)
    assert all(torch.equal(x, y) for x, y in zip(a, b))
    assert not torch.equal(a[0], c[0])


def test_empty_batch_and_no_tokens(backend):
    q = torch.randn(0, 2, 8, requires_grad=True)
    k = torch.randn(0, 2, 8, requires_grad=True)
    v = torch.randn(0, 2, 8, requires_grad=True)
    for cu in (torch.zeros(1, dtype=torch.int32), torch.zeros(4, dtype=torch.int32)):
        out, lse, s_dmask = flash_attn_varlen_func(q, k, v, cu, cu, 1, 1, dropout_p=0.1,
                                                   return_attn_probs=True)
        assert out.shape == (0, 2, 8) and lse.shape == (2, 0)
        assert s_dmask.shape == (cu.shape[0] - 1, 2, 1, 1) and (s_dmask == 0).all()
        out.sum().backward()
        assert q.grad.shape == q.shape and k.grad.shape == k.shape


def test_no_keys_at_all(backend):
    q = torch.randn(7, 2, 8, requires_grad=True)
    k = torch.randn(0, 2, 8, requires_grad=True)
    v = torch.randn(0, 2, 8, requires_grad=True)
    out, lse, _ = flash_attn_varlen_func(q, k, v, cu_seqlens((3, 4)), cu_seqlens((0, 0)), 4, 1,
                                         return_attn_probs=True)
    assert (out == 0).all() and torch.isneginf(lse).all()
    out.sum().backward()
    assert (q.grad == 0).all()


def test_dout_with_odd_strides(backend):
    lens = (5, 11)
    q = torch.randn(16, 4, 8, requires_grad=True)
    k = torch.randn(16, 4, 8, requires_grad=True)
    v = torch.randn(16, 4, 8, requires_grad=True)
    cu = cu_seqlens(lens)
    out = flash_attn_varlen_func(q, k, v, cu, cu, 11, 11, causal=True)
    ref = torch.autograd.grad(out, (q, k, v), torch.ones_like(out), retain_graph=True)
    got = torch.autograd.grad(out.sum(), (q, k, v), retain_graph=True)  # stride-0 dout
    for x, y in zip(got, ref):
        torch.testing.assert_close(x, y, rtol=1e-5, atol=1e-6)


def test_strided_inputs(backend):
    """q/k/v as views with padded head and row strides (only the last dim contiguous)."""
    lens_q, lens_k = (7, 12), (15, 6)
    base_q = torch.randn(sum(lens_q), 5, 24)
    base_k = torch.randn(sum(lens_k), 3, 2, 24)
    q = base_q[:, 1:5, :16].requires_grad_()
    k = base_k[:, :2, 0, 4:20].requires_grad_()
    v = base_k[:, :2, 1, :16].requires_grad_()
    cu_q, cu_k = cu_seqlens(lens_q), cu_seqlens(lens_k)
    out = flash_attn_varlen_func(q, k, v, cu_q, cu_k, 12, 15, causal=True)
    g = torch.randn_like(out)
    grads = torch.autograd.grad(out, (q, k, v), g)
    qc, kc, vc = (x.detach().contiguous().requires_grad_() for x in (q, k, v))
    out_c = flash_attn_varlen_func(qc, kc, vc, cu_q, cu_k, 12, 15, causal=True)
    grads_c = torch.autograd.grad(out_c, (qc, kc, vc), g)
    torch.testing.assert_close(out, out_c, rtol=1e-5, atol=1e-6)
    for a, b in zip(grads, grads_c):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)


# ---------------------------------------------------------------------------------------------
# API conventions
# ---------------------------------------------------------------------------------------------
COMMON = [("dropout_p", 0.0), ("softmax_scale", None), ("causal", False),
          ("window_size", (-1, -1)), ("softcap", 0.0), ("alibi_slopes", None),
          ("deterministic", False), ("return_attn_probs", False)]
EMPTY = inspect.Parameter.empty


@pytest.mark.parametrize("fn,positional,extra", [
    (flash_attn_varlen_func, ["q", "k", "v", "cu_seqlens_q", "cu_seqlens_k", "max_seqlen_q",
                              "max_seqlen_k"], [("block_table", None), ("seqused_k", None),
                                                ("q_descale", None), ("k_descale", None),
                                                ("v_descale", None), ("out_dtype", None),
                                                ("learnable_sink", None), ("seqused_q", None),
                                                ("attention_chunk", 0), ("out", None)]),
    (flash_attn_varlen_qkvpacked_func, ["qkv", "cu_seqlens", "max_seqlen"], [("out", None)]),
    (flash_attn_varlen_kvpacked_func, ["q", "kv", "cu_seqlens_q", "cu_seqlens_k",
                                       "max_seqlen_q", "max_seqlen_k"], [("out", None)]),
])
def test_signature_matches_flash_attn_2(fn, positional, extra):
    params = inspect.signature(fn).parameters
    expected = [(n, EMPTY) for n in positional] + COMMON + extra
    assert [(n, p.default) for n, p in params.items()] == expected
    if len(extra) > 1:
        assert params["seqused_k"].kind is inspect.Parameter.KEYWORD_ONLY
    assert params["out"].kind is inspect.Parameter.KEYWORD_ONLY
    doc = inspect.getdoc(fn)
    assert doc and "cu_seqlens" in doc and "softmax_lse" in doc and "(nheads, total_q)" in doc


def test_public_names():
    for name in ("flash_attn_varlen_func", "flash_attn_varlen_qkvpacked_func",
                 "flash_attn_varlen_kvpacked_func"):
        assert name in flashattn.__all__ and getattr(flashattn, name) is getattr(varlen_mod, name)


def test_return_conventions(cpu_backend):
    q, k, v = torch.randn(10, 4, 16), torch.randn(12, 2, 16), torch.randn(12, 2, 8)
    cu_q, cu_k = cu_seqlens((4, 6)), cu_seqlens((5, 7))
    out = flash_attn_varlen_func(q, k, v, cu_q, cu_k, 6, 7)
    assert isinstance(out, torch.Tensor) and out.shape == (10, 4, 8)
    out2, lse, s_dmask = flash_attn_varlen_func(q, k, v, cu_q, cu_k, 6, 7, return_attn_probs=True)
    assert torch.equal(out, out2) and lse.shape == (4, 10) and s_dmask is None
    _, _, s_dmask = flash_attn_varlen_func(q, k, v, cu_q, cu_k, 6, 7, dropout_p=0.1,
                                           return_attn_probs=True)
    assert s_dmask.shape == (2, 4, 6, 7) and s_dmask.dtype == q.dtype


def test_no_rng_draw_without_dropout(cpu_backend):
    q = torch.randn(9, 2, 8)
    cu = cu_seqlens((4, 5))
    torch.manual_seed(3)
    flash_attn_varlen_func(q, q, q, cu, cu, 5, 5)
    after = torch.rand(2)
    torch.manual_seed(3)
    assert torch.equal(torch.rand(2), after)


def test_kernel_launch_reads_no_tensor_values(monkeypatch):
    """The Triton path must not read cu_seqlens / seqused_k on the host (no device sync;
    CUDA-graph capture). The launches are replaced by recorders and every host read of a
    tensor value raises."""
    pytest.importorskip("triton")
    from flashattn.backends.triton import bwd, fwd

    launched = []

    class Recorder:
        def __getitem__(self, grid):
            return lambda *a, **kw: launched.append(kw.get("VARLEN"))

    monkeypatch.setattr(fwd, "_fwd_autotuned", Recorder())
    monkeypatch.setattr(bwd, "_dkdv_autotuned", Recorder())
    monkeypatch.setattr(bwd, "_dq_autotuned", Recorder())
    monkeypatch.setattr(bwd, "_bwd_preprocess", Recorder())

    def no_read(self, *a, **kw):
        raise AssertionError("a tensor value was read on the host")

    q, k, v = torch.randn(10, 4, 16), torch.randn(12, 2, 16), torch.randn(12, 2, 16)
    cu_q, cu_k = cu_seqlens((4, 6)), cu_seqlens((5, 7))
    used = torch.tensor([5, 6], dtype=torch.int32)
    params = dict(softmax_scale=0.25, causal=True, window_left=3, window_right=0, softcap=0.0,
                  alibi_slopes=torch.rand(2, 4), dropout_p=0.1, philox_seed=7)
    lse = torch.zeros(4, 10)
    for name in ("item", "tolist", "__bool__", "__int__", "__index__", "__float__", "numpy"):
        monkeypatch.setattr(torch.Tensor, name, no_read)
    fwd.flash_varlen_fwd(q, k, v, cu_q, cu_k, used, 6, 7, return_softmax=True, **params)
    bwd.flash_varlen_bwd(q, q, k, v, q, lse, cu_q, cu_k, used, 6, 7, deterministic=True,
                         **params)
    monkeypatch.undo()
    assert launched == [True, None, True, True]  # fwd, preprocess, dK/dV, dQ


# ---------------------------------------------------------------------------------------------
# Paged KV (block_table): wiring to dispatch_varlen.varlen_paged_forward, forward only
# ---------------------------------------------------------------------------------------------
def _paged_inputs(requires_grad=False):
    lens_q, lens_k, page = (3, 5), (7, 12), 4
    h, h_k, d = 4, 2, 16
    q = torch.randn(sum(lens_q), h, d, requires_grad=requires_grad)
    k_cache = torch.randn(9, page, h_k, d, requires_grad=requires_grad)
    v_cache = torch.randn(9, page, h_k, d, requires_grad=requires_grad)
    block_table = torch.tensor([[2, 0, 0, 0], [5, 1, 8, 3]], dtype=torch.int32)
    return q, k_cache, v_cache, cu_seqlens(lens_q), cu_seqlens(lens_k), block_table


@pytest.fixture
def fake_paged(monkeypatch):
    """A stand-in for dispatch_varlen.varlen_paged_forward that records its arguments."""
    calls = []

    def varlen_paged_forward(q, k_cache, v_cache, cu_seqlens_q, cu_seqlens_k, seqused_k,
                             max_seqlen_q, max_seqlen_k, block_table, params):
        calls.append(dict(k_cache=k_cache, seqused_k=seqused_k, max_seqlen_q=max_seqlen_q,
                          max_seqlen_k=max_seqlen_k, block_table=block_table,
                          softmax_scale=params.softmax_scale, window_left=params.window_left,
                          window_right=params.window_right, softcap=params.softcap,
                          alibi_slopes=params.alibi_slopes))
        out = q[..., :v_cache.shape[-1]] * 2.0
        return out, torch.zeros(q.shape[1], q.shape[0])

    monkeypatch.setattr(dispatch_varlen, "varlen_paged_forward", varlen_paged_forward)
    return calls


def test_block_table_calls_paged_forward(fake_paged):
    q, k_cache, v_cache, cu_q, cu_k, bt = _paged_inputs()
    used = torch.tensor([7, 10], dtype=torch.int32)
    slopes = torch.rand(4)
    out, lse, s_dmask = flash_attn_varlen_func(
        q, k_cache, v_cache, cu_q, cu_k, 5, 12, causal=True, window_size=(3, 5), softcap=2.0,
        alibi_slopes=slopes, return_attn_probs=True, block_table=bt, seqused_k=used)
    (call,) = fake_paged
    assert call["k_cache"] is k_cache and call["block_table"] is bt and call["seqused_k"] is used
    assert (call["max_seqlen_q"], call["max_seqlen_k"]) == (5, 12)
    assert (call["window_left"], call["window_right"]) == (3, 0)
    assert call["softmax_scale"] == 16 ** -0.5 and call["softcap"] == 2.0
    assert call["alibi_slopes"].shape == (2, 4)
    assert torch.equal(out, q * 2.0) and lse.shape == (4, 8) and s_dmask is None


def test_block_table_backward_not_implemented(fake_paged):
    q, k_cache, v_cache, cu_q, cu_k, bt = _paged_inputs(requires_grad=True)
    out = flash_attn_varlen_func(q, k_cache, v_cache, cu_q, cu_k, 5, 12, block_table=bt)
    with pytest.raises(NotImplementedError, match="block_table"):
        out.sum().backward()


def test_block_table_matches_contiguous_kv(backend):
    """The real paged path: paged K/V give the contiguous varlen answer."""
    q, k_cache, v_cache, cu_q, cu_k, bt = _paged_inputs()
    lens_k = (7, 12)
    page = k_cache.shape[1]
    k = torch.cat([k_cache[bt[i]].flatten(0, 1)[:n] for i, n in enumerate(lens_k)])
    v = torch.cat([v_cache[bt[i]].flatten(0, 1)[:n] for i, n in enumerate(lens_k)])
    assert page * bt.shape[1] >= max(lens_k)
    got = flash_attn_varlen_func(q, k_cache, v_cache, cu_q, cu_k, 5, 12, causal=True,
                                 block_table=bt)
    want = flash_attn_varlen_func(q, k, v, cu_q, cu_k, 5, 12, causal=True)
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)


# ---------------------------------------------------------------------------------------------
# Validation: ValueError / TypeError naming the argument, before any backend runs
# ---------------------------------------------------------------------------------------------
@pytest.fixture
def no_backend(monkeypatch):
    def tripwire(*a, **kw):
        raise AssertionError("a backend ran on invalid input")

    monkeypatch.setattr(dispatch_varlen, "varlen_forward", tripwire)


def _valid():
    q, k, v = torch.randn(10, 4, 16), torch.randn(12, 2, 16), torch.randn(12, 2, 16)
    return dict(q=q, k=k, v=v, cu_seqlens_q=cu_seqlens((4, 6)), cu_seqlens_k=cu_seqlens((5, 7)),
                max_seqlen_q=6, max_seqlen_k=7)


BAD = [
    (dict(cu_seqlens_q=cu_seqlens((4, 6)).long()), TypeError, ["cu_seqlens_q", "torch.int32",
                                                                "torch.int64"]),
    (dict(cu_seqlens_k=cu_seqlens((5, 7)).long()), TypeError, ["cu_seqlens_k", "torch.int64"]),
    (dict(cu_seqlens_q=[0, 4, 10]), TypeError, ["cu_seqlens_q", "list"]),
    (dict(cu_seqlens_q=cu_seqlens((4, 6)).view(1, 3)), ValueError, ["cu_seqlens_q", "(1, 3)"]),
    (dict(cu_seqlens_k=cu_seqlens((5, 3, 4))), ValueError, ["cu_seqlens_q", "cu_seqlens_k",
                                                            "same shape"]),
    (dict(cu_seqlens_q=torch.zeros(3, dtype=torch.int32, device="meta")), ValueError,
     ["cu_seqlens_q", "device", "meta"]),
    (dict(q=torch.randn(1, 10, 4, 16)), ValueError, ["q", "3-d", "(total_q, nheads, headdim)"]),
    (dict(k=torch.randn(12, 16)), ValueError, ["k", "3-d"]),
    (dict(v=torch.randn(11, 2, 16)), ValueError, ["total_k", "12", "11"]),
    (dict(k=torch.randn(12, 3, 16), v=torch.randn(12, 3, 16)), ValueError, ["multiple"]),
    (dict(q=torch.randn(10, 4, 16).half()), TypeError, ["same dtype"]),
    (dict(q=torch.randn(10, 16, 4).transpose(1, 2)), ValueError, ["q", "contiguous last"]),
    (dict(max_seqlen_q=0), ValueError, ["max_seqlen_q", "0"]),  # the sequences are longer
    (dict(max_seqlen_k=-3), ValueError, ["max_seqlen_k", "-3"]),
    (dict(max_seqlen_q=6.0), TypeError, ["max_seqlen_q", "float"]),
    (dict(max_seqlen_q=True), TypeError, ["max_seqlen_q", "bool"]),
    (dict(max_seqlen_k=torch.tensor(7)), TypeError, ["max_seqlen_k", "tensor"]),
    (dict(seqused_k=torch.tensor([5, 7])), TypeError, ["seqused_k", "torch.int32", "torch.int64"]),
    (dict(seqused_k=torch.tensor([5, 7, 1], dtype=torch.int32)), ValueError,
     ["seqused_k", "(2,)", "(3,)"]),
    (dict(seqused_k=[5, 7]), TypeError, ["seqused_k", "list"]),
    (dict(alibi_slopes=torch.rand(3)), ValueError, ["alibi_slopes", "(4,) or (2, 4)"]),
    (dict(window_size=(-2, 0)), ValueError, ["window_size"]),
    (dict(dropout_p=1.0), ValueError, ["dropout_p"]),
    # value checks (CPU tensors only: reading them is free there)
    (dict(cu_seqlens_q=torch.tensor([0, 6, 4], dtype=torch.int32)), ValueError,
     ["cu_seqlens_q", "non-decreasing"]),
    (dict(cu_seqlens_q=torch.tensor([0, 4, 11], dtype=torch.int32)), ValueError,
     ["cu_seqlens_q[-1] = 11", "10 rows of q"]),
    (dict(cu_seqlens_q=torch.tensor([-1, 4, 10], dtype=torch.int32)), ValueError,
     ["cu_seqlens_q", ">= 0"]),
    (dict(max_seqlen_q=5), ValueError, ["max_seqlen_q = 5", "longest", "6"]),
    (dict(max_seqlen_k=6), ValueError, ["max_seqlen_k = 6", "7"]),
    (dict(seqused_k=torch.tensor([6, 7], dtype=torch.int32)), ValueError,
     ["seqused_k[0] = 6", "[0, 5]"]),
    (dict(seqused_k=torch.tensor([-1, 7], dtype=torch.int32)), ValueError, ["seqused_k[0] = -1"]),
]


@pytest.mark.parametrize("change,exc,needles", BAD, ids=[f"bad{i}" for i in range(len(BAD))])
def test_bad_arguments(no_backend, change, exc, needles):
    kw = _valid()
    kw.update(change)
    with pytest.raises(exc) as info:
        flash_attn_varlen_func(**kw)
    for n in needles:
        assert n in str(info.value), f"{n!r} not in {str(info.value)!r}"


def test_bad_packed_arguments(no_backend):
    cu = cu_seqlens((3, 4))
    with pytest.raises(ValueError, match="qkv.*size 3 in dim 1"):
        flash_attn_varlen_qkvpacked_func(torch.randn(7, 2, 2, 8), cu, 4)
    with pytest.raises(ValueError, match="qkv.*4-d"):
        flash_attn_varlen_qkvpacked_func(torch.randn(1, 7, 3, 2, 8), cu, 4)
    with pytest.raises(TypeError, match="cu_seqlens.*torch.int64"):
        flash_attn_varlen_qkvpacked_func(torch.randn(7, 3, 2, 8), cu.long(), 4)
    with pytest.raises(ValueError, match="max_seqlen.*0 is smaller than the longest"):
        flash_attn_varlen_qkvpacked_func(torch.randn(7, 3, 2, 8), cu, 0)
    with pytest.raises(ValueError, match="max_seqlen.*>= 0.*-1"):
        flash_attn_varlen_qkvpacked_func(torch.randn(7, 3, 2, 8), cu, -1)
    with pytest.raises(ValueError, match="kv.*size 2 in dim 1"):
        flash_attn_varlen_kvpacked_func(torch.randn(7, 2, 8), torch.randn(7, 3, 2, 8), cu, cu,
                                        4, 4)
    with pytest.raises(ValueError, match="q.*3-d"):
        flash_attn_varlen_kvpacked_func(torch.randn(1, 7, 2, 8), torch.randn(7, 2, 2, 8), cu,
                                        cu, 4, 4)


PAGED_BAD = [
    (dict(block_table=torch.tensor([[0, 1], [2, 3]])), TypeError,
     ["block_table", "torch.int32", "torch.int64"]),
    (dict(block_table=torch.tensor([0, 1], dtype=torch.int32)), ValueError,
     ["block_table", "(batch, max_blocks_per_seq)", "(2,)"]),
    (dict(block_table=torch.zeros(3, 2, dtype=torch.int32)), ValueError, ["block_table", "(3, 2)"]),
    (dict(block_table=[[0, 1], [2, 3]]), TypeError, ["block_table", "list"]),
    (dict(k=torch.randn(12, 2, 16)), ValueError, ["k", "4-d", "block_table"]),
    (dict(v=torch.randn(5, 4, 2, 16)), ValueError, ["num_blocks", "6", "5"]),
    (dict(v=torch.randn(6, 3, 2, 16)), ValueError, ["page_size"]),
    (dict(dropout_p=0.1), ValueError, ["dropout_p", "block_table"]),
]


@pytest.mark.parametrize("change,exc,needles", PAGED_BAD,
                         ids=[f"paged_bad{i}" for i in range(len(PAGED_BAD))])
def test_bad_paged_arguments(no_backend, change, exc, needles):
    kw = _valid()
    kw.update(k=torch.randn(6, 4, 2, 16), v=torch.randn(6, 4, 2, 16),
              block_table=torch.zeros(2, 2, dtype=torch.int32))
    kw.update(change)
    with pytest.raises(exc) as info:
        flash_attn_varlen_func(**kw)
    for n in needles:
        assert n in str(info.value), f"{n!r} not in {str(info.value)!r}"


# ---------------------------------------------------------------------------------------------
# max_seqlen_k = 0 (every key sequence empty) returns zeros, as flash-attn
# ---------------------------------------------------------------------------------------------
def test_max_seqlen_k_zero_returns_zeros(backend):
    q = torch.randn(7, 4, 16, requires_grad=True)
    k = torch.randn(0, 2, 16, requires_grad=True)
    v = torch.randn(0, 2, 8, requires_grad=True)
    cu_q = torch.tensor([0, 3, 7], dtype=torch.int32)
    cu_k = torch.zeros(3, dtype=torch.int32)
    out, lse, _ = flash_attn_varlen_func(q, k, v, cu_q, cu_k, 4, 0, causal=True,
                                         window_size=(3, 2), return_attn_probs=True)
    assert out.shape == (7, 4, 8) and (out == 0).all()
    assert lse.shape == (4, 7) and (lse == float("-inf")).all()
    out.sum().backward()
    assert (q.grad == 0).all() and k.grad.shape == k.shape and v.grad.shape == v.shape
