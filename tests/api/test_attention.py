"""Correctness of flash_attn_func, forward and backward, against the float64 oracle.

Every case runs on both backends ('cpu': chunked torch; 'portable': the Triton kernels, under
TRITON_INTERPRET=1 without a GPU) and is judged by flash-attn's rule (tests/accuracy.py):
error vs float64 <= 2x (outputs) / 3x (gradients) the error of naive PyTorch attention in
the same low precision, plus a small atol.

The Triton interpreter is slow, so the CPU grid is *pairwise*: every pair of levels of any two
factors (dtype, head dims, mask, sequence lengths, extra feature, head layout) appears in at
least one case, in far fewer cases than the full product. ``gpu`` variants repeat the idea at
realistic sizes and add determinism, dropout reproducibility and a > 2**31-element case.
"""
from __future__ import annotations

import itertools
import random
from dataclasses import dataclass, replace
from typing import Dict, List, Optional, Sequence, Tuple

import pytest
import torch

from tests.accuracy import (assert_attention_close, assert_close_rule, delta_residual_atols,
                            fp32_sum_atol)
from flashattn import flash_attn_func
from flashattn.dispatch import select as dispatch_select
from flashattn.reference import attention_probs_ref, attention_ref, visible_mask
from tests.settings import set_env


# ---------------------------------------------------------------------------------------------
# Case description and the check
# ---------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Case:
    s_q: int
    s_k: int
    d: int = 64
    d_v: Optional[int] = None  # None: same as d
    dtype: torch.dtype = torch.float16
    b: int = 2
    h: int = 2
    h_k: int = 2
    causal: bool = False
    window: Tuple[int, int] = (-1, -1)
    softcap: float = 0.0
    alibi: Optional[str] = None  # None | "h" | "bh"
    dropout_p: float = 0.0
    deterministic: bool = False
    softmax_scale: Optional[float] = None

    @property
    def id(self) -> str:
        dt = {torch.float16: "fp16", torch.bfloat16: "bf16", torch.float32: "fp32"}[self.dtype]
        parts = [dt, f"d{self.d}" + (f"v{self.d_v}" if self.d_v not in (None, self.d) else ""),
                 f"b{self.b}s{self.s_q}x{self.s_k}", f"h{self.h}k{self.h_k}"]
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
        if self.softmax_scale is not None:
            parts.append(f"scale{self.softmax_scale:g}")
        return "-".join(parts)


def fa2_window(causal: bool, window: Sequence[int], s_k: int) -> Tuple[int, int]:
    """flash-attn 2's normalisation (a side >= seqlen_k is unbounded; causal -> right 0), so
    the oracle sees exactly the mask the API promises."""
    left, right = (-1 if w < 0 or w >= s_k else int(w) for w in window)
    return left, (0 if causal else right)


def make_inputs(c: Case, device: str, layout: str = "contiguous"):
    d_v = c.d if c.d_v is None else c.d_v
    shapes = [(c.b, c.s_q, c.h, c.d), (c.b, c.s_k, c.h_k, c.d), (c.b, c.s_k, c.h_k, d_v)]
    out = []
    for shape in shapes:
        b, s, h, d = shape
        if layout == "contiguous":
            x = torch.randn(shape, dtype=c.dtype, device=device)
        elif layout == "bhsd":  # (b, h, s, d) memory, viewed as (b, s, h, d)
            x = torch.randn(b, h, s, d, dtype=c.dtype, device=device).transpose(1, 2)
        else:  # "padded": a window of a larger tensor (storage offset, padded strides)
            big = torch.randn(b + 1, s + 2, h + 1, d + 5, dtype=c.dtype, device=device)
            x = big[1:, 2:, 1:, 3:3 + d]
        out.append(x.requires_grad_())
    slopes = None
    if c.alibi:
        shape = (c.h,) if c.alibi == "h" else (c.b, c.h)
        slopes = torch.rand(shape, dtype=torch.float32, device=device) * 0.5 + 0.05
    return (*out, slopes)


def check_attention(c: Case, device: str = "cpu", layout: str = "contiguous",
                    fwd_factor: float = 2.0, grad_factor: float = 3.0) -> None:
    q, k, v, slopes = make_inputs(c, device, layout)
    out, lse, s_dmask = flash_attn_func(
        q, k, v, dropout_p=c.dropout_p, softmax_scale=c.softmax_scale, causal=c.causal, window_size=c.window,
        softcap=c.softcap, alibi_slopes=slopes, deterministic=c.deterministic,
        return_attn_probs=True,
    )
    g = torch.randn_like(out)
    dq, dk, dv = torch.autograd.grad(out, (q, k, v), g)

    keep = None
    if c.dropout_p > 0:
        # The kernel's own dropout pattern (sign of S_dmask; -0.0 counts as dropped). Its
        # agreement with philox.dropout_keep_mask is checked in test_api.py.
        keep = ~torch.signbit(s_dmask)
    ref_kw = dict(softmax_scale=c.softmax_scale,
                  window_size=fa2_window(c.causal, c.window, c.s_k), softcap=c.softcap,
                  alibi_slopes=slopes, dropout_p=c.dropout_p, dropout_mask=keep)

    x64 = [x.detach().double().requires_grad_() for x in (q, k, v)]
    out_ref, lse_ref = attention_ref(*x64, **ref_kw)
    grads_ref = torch.autograd.grad(out_ref, x64, g.double())
    out_lp, lse_lp = attention_ref(q, k, v, upcast=False, **ref_kw)
    grads_lp = torch.autograd.grad(out_lp, (q, k, v), g)

    assert out.shape == out_ref.shape and out.dtype == c.dtype
    assert lse.dtype == torch.float32 and lse.shape == (c.b, c.h, c.s_q)
    truncates = _interpreter_truncates_bf16(q)
    # (float32: the sums over keys (out, dq) and over a GQA group's rows (dk, dv))
    terms = {"out": c.s_k, "dq": c.s_k, "dk": c.s_q * c.h // c.h_k, "dv": c.s_q * c.h // c.h_k}
    assert_close_rule(out, out_ref, out_lp, factor=fwd_factor,
                      atol=1e-5 + truncates * _ulp_atol(out_ref, c.dtype)
                      + fp32_sum_atol(out_ref, c.dtype, terms["out"]), name="out")
    assert_close_rule(lse, lse_ref, lse_lp, factor=fwd_factor, name="lse")
    atols = _single_key_grad_atols(c, ref_kw["window_size"], q, k, out, g)
    probs, _ = attention_probs_ref(x64[0], x64[1], softmax_scale=c.softmax_scale,
                                   window_size=ref_kw["window_size"], softcap=c.softcap,
                                   alibi_slopes=slopes)
    scale = c.softmax_scale if c.softmax_scale is not None else c.d ** -0.5
    residual = delta_residual_atols(q, k, out, out_ref, g, probs, scale)
    for name, x, got, ref, lp in zip(("dq", "dk", "dv"), (q, k, v), (dq, dk, dv), grads_ref,
                                     grads_lp):
        assert got.shape == x.shape and got.dtype == x.dtype, name
        atol = (atols.get(name, 1e-5) + residual.get(name, 0.0)
                + truncates * _ulp_atol(ref, c.dtype) + fp32_sum_atol(ref, c.dtype, terms[name]))
        assert_close_rule(got, ref, lp, factor=grad_factor, atol=atol, name=name)
    # Rows that see no key: out exactly 0 (lse -inf is part of assert_close_rule's pattern).
    empty = torch.isneginf(lse_ref).transpose(1, 2)  # (b, s_q, h)
    if empty.any():
        assert (out[empty] == 0).all(), "rows with no visible key must have out == 0"


def _interpreter_truncates_bf16(q: torch.Tensor) -> bool:
    """Triton 3.6's interpreter casts fp32 -> bf16 by truncation (round toward zero; also with
    fp_downcast_rounding="rtne"), so under TRITON_INTERPRET the kernels' bf16 results carry up
    to 1 ulp of error where a GPU (and PyTorch) round to nearest with 0.5 ulp. Drop this
    allowance once the kernels round explicitly when interpreting."""
    return (q.dtype == torch.bfloat16 and q.device.type == "cpu" and dispatch_select.interpreting()
            and dispatch_select.backend_for(q) == "portable")


def _ulp_atol(ref: torch.Tensor, dtype: torch.dtype) -> float:
    """One ulp of ``dtype`` at the largest finite magnitude of ``ref`` (an upper bound)."""
    r = ref.detach()
    r = r[torch.isfinite(r)]
    return torch.finfo(dtype).eps * (r.abs().max().item() if r.numel() else 0.0)


def _single_key_grad_atols(c: Case, window: Tuple[int, int], q, k, out, g) -> Dict[str, float]:
    """Absolute tolerance of dq/dk when every row sees at most one key.

    Then softmax's gradient is exactly 0 and naive PyTorch makes no error at all, so the 2x/3x
    rule has no baseline. FlashAttention computes it as ``P * (dP - D)`` with
    ``D = rowsum(dO * O)`` from the *rounded* output, which leaves a residual of up to about
    ``eps * |dO_i| |O_i|`` per row, times ``softmax_scale * max|k|`` (dq) or ``max|q|`` (dk).
    """
    if c.s_q == 0 or c.s_k == 0:
        return {}
    if visible_mask(c.s_q, c.s_k, *window).sum(-1).max().item() > 1:
        return {}
    eps = torch.finfo(c.dtype).eps
    scale = c.softmax_scale if c.softmax_scale is not None else c.d ** -0.5
    row = (g.double().norm(dim=-1) * out.detach().double().norm(dim=-1)).max().item()
    # (softcap only shrinks it: tanh' <= 1)
    base = eps * scale * row
    return {"dq": base * k.detach().abs().max().item() + 1e-5,
            "dk": base * q.detach().abs().max().item() + 1e-5}


# ---------------------------------------------------------------------------------------------
# Pairwise covering grid
# ---------------------------------------------------------------------------------------------
def pairwise(factors: Dict[str, list], seed: int = 0, tries: int = 40) -> List[Dict[str, object]]:
    """Greedy all-pairs cover (AETG-style): every pair of levels of every two factors appears
    in some row. Deterministic for a given seed, so test ids are stable."""
    names = list(factors)
    n = len(names)
    sizes = [len(factors[f]) for f in names]
    uncovered = {(a, i, b, j) for a, b in itertools.combinations(range(n), 2)
                 for i in range(sizes[a]) for j in range(sizes[b])}
    rng = random.Random(seed)
    rows: List[List[int]] = []

    def gain(row: List[Optional[int]], f: int, level: int) -> int:
        return sum(((min(f, o), level if f < o else row[o], max(f, o),
                     row[o] if f < o else level) in uncovered)
                   for o in range(n) if o != f and row[o] is not None)

    while uncovered:
        best, best_cov = None, -1
        pool = sorted(uncovered)
        for _ in range(tries):
            a, i, b, j = rng.choice(pool)
            row: List[Optional[int]] = [None] * n
            row[a], row[b] = i, j
            for f in rng.sample(range(n), n):
                if row[f] is None:
                    row[f] = max(range(sizes[f]), key=lambda lv: (gain(row, f, lv), rng.random()))
            cov = sum((x, row[x], y, row[y]) in uncovered
                      for x, y in itertools.combinations(range(n), 2))
            if cov > best_cov:
                best, best_cov = row, cov
        rows.append(best)
        uncovered -= {(x, best[x], y, best[y]) for x, y in itertools.combinations(range(n), 2)}
    return [{f: factors[f][lv] for f, lv in zip(names, row)} for row in rows]


def _build_case(p: Dict[str, object]) -> Case:
    d, d_v = p["dims"] if isinstance(p["dims"], tuple) else (p["dims"], None)
    s_q, s_k = p["seqlens"]
    h, h_k = p["heads"]
    mask, extra = p["mask"], p["extra"]
    window = {"none": (-1, -1), "causal": (-1, -1), "left": (11, -1), "right": (-1, 5),
              "both": (23, 7)}[mask]
    # keep the interpreter's work bounded: fewer batches for the longest sequences and for
    # dropout (the interpreter runs Philox op by op: 70 s for one bf16 113 x 113 case of 2
    # batches on CI's CPU, most of it in dropout_keep)
    b = 1 if s_q * s_k > 20_000 or extra == "dropout" else 2
    return Case(
        s_q=s_q, s_k=s_k, d=d, d_v=d_v, dtype=p["dtype"], b=b, h=h, h_k=h_k,
        causal=mask == "causal", window=window,
        softcap=5.0 if extra == "softcap" else 0.0,
        alibi={"alibi_h": "h", "alibi_bh": "bh"}.get(extra),
        dropout_p=0.17 if extra == "dropout" else 0.0,
    )


CPU_FACTORS = {
    "dims": [8, 59, 64, 80, 96, 111, 128, (192, 128), 256],
    "seqlens": [(1, 1), (17, 17), (113, 113), (1, 113), (17, 257), (113, 17), (257, 33)],
    "dtype": [torch.float16, torch.bfloat16, torch.float32],
    "mask": ["none", "causal", "left", "right", "both"],
    "extra": ["none", "softcap", "alibi_h", "alibi_bh", "dropout"],
    "heads": [(2, 2), (4, 2), (3, 1)],  # MHA, GQA, MQA
}
CPU_CASES = [_build_case(p) for p in pairwise(CPU_FACTORS)]


@pytest.mark.parametrize("case", CPU_CASES, ids=lambda c: c.id)
def test_attention(backend, case):
    check_attention(case)


# ---------------------------------------------------------------------------------------------
# Targeted CPU cases
# ---------------------------------------------------------------------------------------------
NO_KEY_CASES = [
    # s_q > s_k with causal: the first s_q - s_k rows see no key
    Case(s_q=40, s_k=9, d=32, causal=True),
    # a narrow band that ends before key 0 for the first rows, with every score modifier
    Case(s_q=37, s_k=20, d=16, dtype=torch.bfloat16, window=(2, 1), softcap=3.0, alibi="bh",
         h=4, h_k=2),
    Case(s_q=33, s_k=5, d=24, dtype=torch.float32, window=(0, 0), dropout_p=0.3),
]


@pytest.mark.parametrize("case", NO_KEY_CASES, ids=lambda c: c.id)
def test_rows_without_keys(backend, case):
    check_attention(case)


@pytest.mark.parametrize("case", [Case(s_q=29, s_k=45, d=40, h=4, h_k=2, causal=True),
                                  Case(s_q=45, s_k=29, d=64, d_v=32, dtype=torch.bfloat16,
                                       window=(7, 3), alibi="h")],
                         ids=lambda c: c.id)
def test_strided_inputs(backend, case):
    """(b, h, s, d) memory viewed as (b, s, h, d): only the last dim is contiguous."""
    check_attention(case, layout="bhsd")


@pytest.mark.parametrize("case", [Case(s_q=9, s_k=21, d=1, dtype=torch.float32),
                                  Case(s_q=9, s_k=21, d=3, d_v=1, causal=True),
                                  Case(s_q=5, s_k=40, d=255, d_v=17, dtype=torch.bfloat16,
                                       h=8, h_k=1)],
                         ids=lambda c: c.id)
def test_odd_head_dims(backend, case):
    """Head dims at the ends of 1..256 and far from powers of two (padded tiles)."""
    check_attention(case)


@pytest.mark.parametrize("case", [Case(s_q=29, s_k=45, d=40, h=4, h_k=2, causal=True),
                                  Case(s_q=33, s_k=17, d=32, h=3, h_k=1, dtype=torch.float32,
                                       window=(5, 2), dropout_p=0.2, deterministic=True)],
                         ids=lambda c: c.id)
def test_heads_on_grid_axis0(backend, case, monkeypatch):
    """Dense calls whose b * h passes the 65535 limit of grid axis 1 put (batch, head) on axis 0
    in every pass (forward, dK/dV, the deterministic dQ pass). The limit is lowered to 1 here,
    so these small calls take that layout; test_more_than_65535_heads_gpu runs the real size."""
    from flashattn.backends.triton import config

    monkeypatch.setattr(config, "MAX_GRID_YZ", 1)
    check_attention(case)


@pytest.mark.parametrize("p", [0.0, 0.5, 0.9])
def test_dropout_rates(backend, p):
    check_attention(Case(s_q=33, s_k=47, d=32, h=4, h_k=1, dtype=torch.float32, dropout_p=p,
                         causal=True))


def test_deterministic_backward_matches(backend):
    check_attention(Case(s_q=50, s_k=50, d=64, h=6, h_k=2, causal=True, deterministic=True))


def test_large_softmax_scale_and_softcap(backend):
    # peaky softmax (big scores) and a tight cap: exercises the running-max rescaling
    check_attention(Case(s_q=65, s_k=65, d=32, softmax_scale=1.0))
    check_attention(Case(s_q=65, s_k=65, d=32, softmax_scale=1.0, softcap=1.0, causal=True))


# ---------------------------------------------------------------------------------------------
# GPU: realistic sizes, determinism, reproducibility, 64-bit offsets
# ---------------------------------------------------------------------------------------------
GPU_FACTORS = {
    "dims": [64, 96, 128, (192, 128), 256, 59],
    "seqlens": [(128, 128), (1024, 1024), (2048, 2048), (1, 2048), (2048, 113), (1000, 1537)],
    "dtype": [torch.float16, torch.bfloat16, torch.float32],
    "mask": ["none", "causal", "left", "right", "both"],
    "extra": ["none", "softcap", "alibi_h", "alibi_bh", "dropout"],
    "heads": [(4, 4), (8, 2), (4, 1)],
}


def _gpu_case(p: Dict[str, object]) -> Case:
    c = _build_case(p)
    window = {"none": (-1, -1), "causal": (-1, -1), "left": (256, -1), "right": (-1, 77),
              "both": (300, 129)}[p["mask"]]
    return replace(c, b=2, window=window)


GPU_CASES = [_gpu_case(p) for p in pairwise(GPU_FACTORS, seed=1)]


@pytest.mark.gpu
@pytest.mark.parametrize("case", GPU_CASES, ids=lambda c: c.id)
def test_attention_gpu(case):
    check_attention(case, device="cuda")


def _gpu_inputs(b=2, s=2048, h=8, h_k=2, d=128, dtype=torch.bfloat16):
    q = torch.randn(b, s, h, d, device="cuda", dtype=dtype, requires_grad=True)
    k = torch.randn(b, s, h_k, d, device="cuda", dtype=dtype, requires_grad=True)
    v = torch.randn(b, s, h_k, d, device="cuda", dtype=dtype, requires_grad=True)
    return q, k, v


@pytest.mark.gpu
@pytest.mark.parametrize("causal", [False, True])
def test_forward_bitwise_deterministic_gpu(causal):
    q, k, v = _gpu_inputs()
    with torch.no_grad():
        first = flash_attn_func(q, k, v, causal=causal, return_attn_probs=True)[:2]
        for _ in range(20):
            again = flash_attn_func(q, k, v, causal=causal, return_attn_probs=True)[:2]
            assert all(torch.equal(a, b) for a, b in zip(first, again))


@pytest.mark.gpu
@pytest.mark.parametrize("kw", [dict(causal=True), dict(window_size=(300, 100), dropout_p=0.1),
                                dict(alibi="bh", softcap=20.0)], ids=["causal", "win_drop", "alibi_cap"])
def test_deterministic_backward_bitwise_gpu(kw):
    kw = dict(kw)
    q, k, v = _gpu_inputs(h=16, h_k=2, s=1536)  # GQA: 8 query heads accumulate into each dk/dv
    if kw.pop("alibi", None):
        kw["alibi_slopes"] = torch.rand(2, 16, device="cuda") * 0.3
    g = torch.randn(2, 1536, 16, 128, device="cuda", dtype=q.dtype)

    def grads():
        torch.manual_seed(0)  # same dropout seed every run
        out = flash_attn_func(q, k, v, deterministic=True, **kw)
        return torch.autograd.grad(out, (q, k, v), g)

    first = grads()
    for _ in range(20):
        again = grads()
        for name, a, b in zip(("dq", "dk", "dv"), first, again):
            assert torch.equal(a, b), f"{name} differs between deterministic=True runs"


@pytest.mark.gpu
def test_dropout_reproducible_gpu():
    q, k, v = _gpu_inputs(s=1024)
    g = torch.randn(2, 1024, 8, 128, device="cuda", dtype=q.dtype)

    def run(seed):
        torch.manual_seed(seed)
        out = flash_attn_func(q, k, v, dropout_p=0.2, causal=True, deterministic=True)
        return (out, *torch.autograd.grad(out, (q, k, v), g))

    a, b, c = run(3), run(3), run(4)
    assert all(torch.equal(x, y) for x, y in zip(a, b))
    assert not torch.equal(a[0], c[0])


@pytest.mark.gpu
@pytest.mark.parametrize("causal", [False, True])
def test_repeated_tiny_calls_replay_the_recorded_forward_gpu(monkeypatch, causal):
    """A repeated small call signature on the portable kernel (the tiny dense call):
    later calls, with fresh tensors, replay the forward's recorded launch with the new
    addresses and still match float64 attention of those tensors (out and lse). Calls that
    drop the LSE (no return_attn_probs) alternate with calls that return it: theirs goes to
    the stream's reused buffer, and an LSE returned earlier is not overwritten by them."""
    from flashattn.runtime import buffers
    from flashattn.runtime.launch import LaunchPlan

    set_env(monkeypatch, FLASHATTN_BACKEND="portable")
    buffers.clear()
    replays = []
    replay = LaunchPlan.replay
    monkeypatch.setattr(LaunchPlan, "replay",
                        lambda self, values: replays.append(1) or replay(self, values))
    kept = []
    for step in range(8):
        q, k, v = (torch.randn(1, 128, h, 128, device="cuda", dtype=torch.bfloat16)
                   for h in (16, 4, 4))
        want_lse = step % 2 == 0
        res = flash_attn_func(q, k, v, causal=causal, return_attn_probs=want_lse)
        out = res[0] if want_lse else res
        ref, _ = attention_ref(q.double(), k.double(), v.double(), causal=causal)
        low, _ = attention_ref(q, k, v, causal=causal, upcast=False)
        assert_close_rule(out, ref, low, name=f"call {step}")
        if want_lse:
            scores = torch.einsum("bqhd,bkhd->bhqk", q.double(),
                                  k.double().repeat_interleave(4, dim=2)) * 128 ** -0.5
            if causal:
                scores = scores.masked_fill(~visible_mask(128, 128, -1, 0, scores.device),
                                            -torch.inf)
            kept.append((res[1], torch.logsumexp(scores, -1)))
    torch.cuda.synchronize()
    for lse, ref_lse in kept:  # (calls without the LSE ran in between)
        torch.testing.assert_close(lse.double(), ref_lse, atol=1e-3, rtol=1e-4)
    assert len(replays) >= 3, "the repeated calls never replayed the recorded forward"
    assert any(key[0] == "fwd-lse" for key in buffers._BUFFERS), "the LSE buffer was not reused"


@pytest.mark.gpu
def test_dropout_matches_reference_gpu():
    check_attention(Case(s_q=777, s_k=1024, d=128, h=8, h_k=2, dtype=torch.bfloat16,
                         dropout_p=0.25, window=(200, 50)), device="cuda")


@pytest.mark.bigmem  # a few GiB: run alone (gpu_check.sh), not beside other workers
@pytest.mark.gpu
@pytest.mark.parametrize("deterministic", [False, True])
def test_more_than_65535_heads_gpu(monkeypatch, deterministic):
    """b * h = 65600 on the portable kernels (grid axis 1 stops at 65535): heads at both ends
    against the float64 oracle."""
    set_env(monkeypatch, FLASHATTN_BACKEND="portable")
    b, s, h, d = 32800, 64, 2, 64
    q, k, v = (torch.randn(b, s, h, d, device="cuda", dtype=torch.bfloat16, requires_grad=True)
               for _ in range(3))
    out = flash_attn_func(q, k, v, causal=True, deterministic=deterministic)
    g = torch.randn_like(out)
    grads = torch.autograd.grad(out, (q, k, v), g)
    for sl in (slice(0, 2), slice(b - 2, b)):
        assert_attention_close(q[sl], k[sl], v[sl], out[sl], g[sl], [x[sl] for x in grads],
                               window_size=(-1, 0))


@pytest.mark.bigmem  # tens of GiB: run alone (gpu_check.sh), not beside other workers
@pytest.mark.gpu
def test_over_2_31_elements_gpu():
    """q, k, v, out, dq, dk, dv each hold > 2**31 elements: offsets must be 64-bit.

    A local window (W, 0) keeps the work O(s * W), and the oracle only needs the ends of the
    sequence: dout is zero except on the first and last T rows, so the gradients of the first
    T keys / last T + W keys come only from queries inside the same slice (bottom-right
    alignment is unchanged by taking a tail, and a head slice with s_q == s_k stays aligned).
    """
    if torch.cuda.get_device_properties(0).total_memory < 60 * 2**30:
        pytest.skip("needs about 40 GiB of GPU memory")
    S, H, D, W, T = 2**20 + 256, 16, 128, 64, 192
    assert S * H * D > 2**31
    dtype = torch.bfloat16
    q, k, v = (torch.randn(1, S, H, D, device="cuda", dtype=dtype, requires_grad=True)
               for _ in range(3))
    out = flash_attn_func(q, k, v, window_size=(W, 0))
    g = torch.zeros_like(out)
    g[:, :T] = torch.randn(1, T, H, D, device="cuda", dtype=dtype)
    g[:, -T:] = torch.randn(1, T, H, D, device="cuda", dtype=dtype)
    dq, dk, dv = torch.autograd.grad(out, (q, k, v), g)

    for where, qsl, ksl, got_sl in (("head", slice(0, T), slice(0, T), slice(0, T)),
                                    ("tail", slice(S - T, S), slice(S - T - W, S),
                                     slice(S - T - W, S))):
        xs = [x.detach()[:, sl] for x, sl in ((q, qsl), (k, ksl), (v, ksl))]
        gs = g[:, qsl]
        x64 = [x.double().requires_grad_() for x in xs]
        out_ref, _ = attention_ref(*x64, window_size=(W, 0))
        grads_ref = torch.autograd.grad(out_ref, x64, gs.double())
        xlp = [x.clone().requires_grad_() for x in xs]
        out_lp, _ = attention_ref(*xlp, window_size=(W, 0), upcast=False)
        grads_lp = torch.autograd.grad(out_lp, xlp, gs)
        assert_close_rule(out[:, qsl], out_ref, out_lp, factor=2, name=f"out {where}")
        assert_close_rule(dq[:, qsl], grads_ref[0], grads_lp[0], factor=3, name=f"dq {where}")
        assert_close_rule(dk[:, got_sl], grads_ref[1], grads_lp[1], factor=3, name=f"dk {where}")
        assert_close_rule(dv[:, got_sl], grads_ref[2], grads_lp[2], factor=3, name=f"dv {where}")
