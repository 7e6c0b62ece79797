"""Self-tests behind ``python -m flashattn check`` and the CPU demo of ``python -m flashattn bench``.

``check``: one case per feature (causal, windows, softcap, ALiBi, GQA/MQA, dropout, dtypes,
odd head dims, d_v != d_qk, strided inputs), forward and backward, against the float64
oracle :func:`flashattn.reference.attention_ref` with flash-attn's accuracy rule::

    max|ours - ref_fp64| <= k * max|torch_lowprec - ref_fp64| + atol    (k = 2 out, 3 grads)

where ``torch_lowprec`` is the same naive attention computed in the inputs' dtype. Dropout is
compared through the keep mask that ``return_attn_probs`` reports, and checked for bitwise
reproducibility under ``torch.manual_seed``; ``deterministic=True`` for bitwise-equal grads.

dtype ``fp8``: the FP8 forward through its three entry points (FA3's descale API on
``flash_attn_func``, ``fp8.attention`` over ``fp8.quantize``, ``fp8.flash_attn_fp8_func``)
against :func:`flashattn.reference.attention_fp8_ref` over the same e4m3 values, with FA3's
numerics as the rule (the GPU tests' criterion)::

    rmse(ours - exact) <= 2 * rmse(p_e4m3 - exact) + 2 * rmse(round_out(exact) - exact) + 1e-6

``exact``: float64 attention of the dequantized values; ``p_e4m3``: the same with P rounded
to e4m3 as FA3 does (x 2^8); ``round_out``: the output dtype's rounding. Its LSE: -inf
exactly on rows that see no key, within 0.05 of the dequantized values' elsewhere.

CPU demo: exactness on a few shapes, then peak memory of one forward + backward of our path
beside naive attention (the s x s score matrix materialised) as the sequence grows.
"""
from __future__ import annotations

import contextlib
import gc
import math
import os
import time
from dataclasses import dataclass, replace
from typing import Any, Dict, Iterator, List, Optional, Sequence, Tuple

import torch

DTYPES = {"fp16": torch.float16, "bf16": torch.bfloat16, "fp32": torch.float32,
          "fp8": torch.float8_e4m3fn}
_ULP_AT_03 = {torch.float16: 2.0 ** -12, torch.bfloat16: 2.0 ** -9, torch.float32: 2.0 ** -25}


def atol_for(dtype: torch.dtype) -> float:
    """Absolute slack of the accuracy rule: two units in the last place at 0.3 (flash-attn's
    choice of scale), at least 1e-6."""
    return max(2 * _ULP_AT_03[dtype], 1e-6)


@dataclass(frozen=True)
class Case:
    """One attention call. ``kind``: 'ref' (vs the oracle), 'dropout-repro', 'deterministic'."""

    name: str
    b: int = 2
    s_q: int = 128
    s_k: int = 128
    h: int = 4
    h_k: int = 4
    d: int = 64
    d_v: Optional[int] = None
    causal: bool = False
    window: Tuple[int, int] = (-1, -1)
    softcap: float = 0.0
    alibi: Optional[str] = None  # None | 'h' (slopes (h,)) | 'bh' (slopes (b, h))
    dropout_p: float = 0.0
    softmax_scale: Optional[float] = None
    strided: bool = False
    kind: str = "ref"
    # fp8 cases: the entry point ('fa3' | 'quantized' | 'e2e'), the output dtype name (None:
    # the entry's default, bf16), keys per K / V scale ('quantized' and 'e2e')
    entry: str = "fa3"
    out_dtype: Optional[str] = None
    block_n: int = 128

    def shape(self) -> str:
        dv = f"/{self.d_v}" if self.d_v is not None and self.d_v != self.d else ""
        hk = f"/{self.h_k}" if self.h_k != self.h else ""
        sk = f"/{self.s_k}" if self.s_k != self.s_q else ""
        return f"b{self.b} s{self.s_q}{sk} h{self.h}{hk} d{self.d}{dv}"


def feature_cases(device: str, quick: bool = False) -> List[Case]:
    """The per-feature cases; sizes are odd on purpose (partial tiles)."""
    s = 97 if device == "cpu" else 333
    base = Case("basic", s_q=s, s_k=s)
    cases = [
        base,
        replace(base, name="causal", causal=True),
        replace(base, name="causal s_q<s_k", s_q=s // 2, causal=True),
        replace(base, name="causal s_q>s_k (empty rows)", s_k=s // 2, causal=True),
        replace(base, name="window (24, 8)", window=(24, 8)),
        replace(base, name="local causal (16, 0)", window=(16, 0), causal=True),
        replace(base, name="softcap 2.0", softcap=2.0),
        replace(base, name="alibi (h,) causal", alibi="h", causal=True),
        replace(base, name="alibi (b, h)", alibi="bh"),
        replace(base, name="GQA 8/2", h=8, h_k=2),
        replace(base, name="MQA 4/1 causal", h_k=1, causal=True),
        replace(base, name="softmax_scale 0.3", softmax_scale=0.3),
        replace(base, name="strided inputs", strided=True),
        replace(base, name="d_v != d_qk (64/32)", d_v=32),
        replace(base, name="dropout 0.17 vs ref", dropout_p=0.17),
        replace(base, name="dropout reproducible", dropout_p=0.17, kind="dropout-repro"),
        replace(base, name="deterministic bwd", kind="deterministic"),
    ]
    head_dims = (8, 33, 72, 96, 160, 256) if not quick else (33, 256)
    cases += [replace(base, name=f"head dim {d}", d=d, h=2, h_k=2) for d in head_dims]
    if not quick:
        cases += [replace(base, name="d_v != d_qk (40/72)", d=40, d_v=72, causal=True),
                  replace(base, name="all features", h=8, h_k=2, causal=True, window=(40, 0),
                          softcap=5.0, alibi="h", dropout_p=0.1)]
    return cases


def fp8_cases(device: str, quick: bool = False) -> List[Case]:
    """The FP8 forward's per-feature cases (dtype ``fp8``); odd sizes on purpose."""
    s = 97 if device == "cpu" else 333
    base = Case("fp8 basic", s_q=s, s_k=s, d=128, kind="fp8")
    cases = [
        base,
        replace(base, name="fp8 causal", causal=True),
        replace(base, name="fp8 causal s_q<s_k", s_q=s // 2, causal=True),
        replace(base, name="fp8 causal s_q>s_k (empty rows)", s_k=s // 2, causal=True),
        replace(base, name="fp8 window (24, 8)", window=(24, 8)),
        replace(base, name="fp8 softcap 2.0", softcap=2.0),
        replace(base, name="fp8 GQA 8/2", h=8, h_k=2),
        replace(base, name="fp8 MQA 4/1 causal", h_k=1, causal=True),
        replace(base, name="fp8 softmax_scale 0.3", softmax_scale=0.3),
        replace(base, name="fp8 out float32", out_dtype="fp32", causal=True),
        replace(base, name="fp8 out float16", out_dtype="fp16"),
        replace(base, name="fp8 quantized (block scales)", entry="quantized", causal=True),
        replace(base, name="fp8 quantized, 64-key scales, strided", entry="quantized",
                block_n=64, strided=True, h=8, h_k=2),
        replace(base, name="fp8 flash_attn_fp8_func", entry="e2e", causal=True, h=8, h_k=2),
        replace(base, name="fp8 flash_attn_fp8_func float32", entry="e2e", out_dtype="fp32",
                window=(40, 0), softcap=5.0),
    ]
    head_dims = (64, 96, 192, 256, 80) if not quick else (64, 256)
    cases += [replace(base, name=f"fp8 head dim {d}", d=d, h=2, h_k=2, causal=True)
              for d in head_dims]
    if not quick:
        cases.append(replace(base, name="fp8 d_v != d_qk (192/128)", d=192, d_v=128))
    return cases


@dataclass
class Result:
    case: Case
    dtype: str
    status: str  # PASS | FAIL | ERROR | SKIP
    out_err: Optional[float] = None
    out_tol: Optional[float] = None
    grad_err: Optional[float] = None
    grad_tol: Optional[float] = None
    note: str = ""
    seconds: float = 0.0

    @property
    def failed(self) -> bool:
        return self.status in ("FAIL", "ERROR")


@contextlib.contextmanager
def forced_backend(name: Optional[str]) -> Iterator[None]:
    """``flashattn.use_backend(name)`` for the duration (None: leave as it is)."""
    if name is None:
        yield
        return
    from flashattn import use_backend

    with use_backend(name):
        yield


def _inputs(case: Case, dtype: torch.dtype, device: str
            ) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, Optional[torch.Tensor]]:
    d_v = case.d_v if case.d_v is not None else case.d

    def make(b: int, s: int, h: int, d: int) -> torch.Tensor:
        if case.strided:  # (b, h, s, d) storage seen as (b, s, h, d): strides not row-major
            x = torch.randn(b, h, s, d, device=device, dtype=dtype).transpose(1, 2)
        else:
            x = torch.randn(b, s, h, d, device=device, dtype=dtype)
        return x.requires_grad_()

    q = make(case.b, case.s_q, case.h, case.d)
    k = make(case.b, case.s_k, case.h_k, case.d)
    v = make(case.b, case.s_k, case.h_k, d_v)
    dout = torch.randn(case.b, case.s_q, case.h, d_v, device=device, dtype=dtype)
    slopes = None
    if case.alibi == "h":
        slopes = torch.rand(case.h, device=device, dtype=torch.float32) * 0.3
    elif case.alibi == "bh":
        slopes = torch.rand(case.b, case.h, device=device, dtype=torch.float32) * 0.3
    return q, k, v, dout, slopes


def _ours(case: Case, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
          slopes: Optional[torch.Tensor], deterministic: bool = False,
          return_attn_probs: bool = False) -> Any:
    from flashattn import flash_attn_func

    return flash_attn_func(q, k, v, dropout_p=case.dropout_p, softmax_scale=case.softmax_scale,
                           causal=case.causal, window_size=case.window, softcap=case.softcap,
                           alibi_slopes=slopes, deterministic=deterministic,
                           return_attn_probs=return_attn_probs)


def _grads(out: torch.Tensor, inputs: Sequence[torch.Tensor], dout: torch.Tensor
           ) -> Tuple[torch.Tensor, ...]:
    return torch.autograd.grad(out, list(inputs), dout)


def _max_err(a: torch.Tensor, b: torch.Tensor) -> float:
    a, b = a.detach(), b.detach()
    diff = (a.double() - b.double()).abs()
    if diff.numel() == 0:
        return 0.0
    if not torch.isfinite(a).all():
        return math.inf
    return float(diff.max())


def _check_ref(case: Case, dtype: torch.dtype, device: str) -> Result:
    from flashattn.reference import attention_ref

    q, k, v, dout, slopes = _inputs(case, dtype, device)
    want_mask = case.dropout_p > 0.0
    res = _ours(case, q, k, v, slopes, return_attn_probs=True)
    out, lse, s_dmask = res
    grads = _grads(out, (q, k, v), dout)
    keep = None
    if want_mask:
        if s_dmask is None:
            raise RuntimeError("return_attn_probs=True with dropout returned no S_dmask")
        keep = ~torch.signbit(s_dmask)  # dropped entries are reported negated
    ref_kw: Dict[str, Any] = dict(softmax_scale=case.softmax_scale, causal=case.causal,
                                  window_size=case.window, softcap=case.softcap,
                                  alibi_slopes=slopes, dropout_p=case.dropout_p,
                                  dropout_mask=keep)

    def reference(upcast: bool) -> Tuple[torch.Tensor, torch.Tensor, Tuple[torch.Tensor, ...]]:
        leaves = [x.detach().clone().requires_grad_() for x in (q, k, v)]
        if upcast:
            leaves = [x.detach().double().requires_grad_() for x in leaves]
        o, l = attention_ref(*leaves, upcast=upcast, **ref_kw)
        g = _grads(o, leaves, dout.to(o.dtype))
        return o.detach(), l.detach(), g

    out64, lse64, grads64 = reference(True)
    out_lp, _, grads_lp = reference(False)
    atol = atol_for(dtype)
    out_err = _max_err(out, out64)
    out_tol = 2 * _max_err(out_lp, out64) + atol
    ok = out_err <= out_tol
    notes = []
    # lse: -inf exactly where the reference has it (rows that see no key), close elsewhere
    inf_ref = torch.isinf(lse64)
    if not torch.equal(torch.isinf(lse), inf_ref) or torch.isnan(lse).any():
        ok = False
        notes.append("lse -inf/NaN pattern differs")
    elif (~inf_ref).any():
        lse_err = float((lse.detach().double() - lse64)[~inf_ref].abs().max())
        if lse_err > 1e-3:
            ok = False
            notes.append(f"lse err {lse_err:.2e}")
    worst = (0.0, 0.0, 0.0)
    for name, g, g64, glp in zip(("dq", "dk", "dv"), grads, grads64, grads_lp):
        err = _max_err(g, g64)
        tol = 3 * _max_err(glp, g64) + atol
        if err > tol:
            ok = False
            notes.append(f"{name} err {err:.2e} > {tol:.2e}")
        ratio = err / tol if tol > 0 else math.inf
        if ratio >= worst[0]:
            worst = (ratio, err, tol)
    if keep is not None:
        # the keep mask itself: drop rate among visible entries near p (5 sigma)
        visible = s_dmask != 0
        n = int(visible.sum())
        if n:
            rate = 1.0 - float((keep & visible).sum()) / n
            sigma = math.sqrt(case.dropout_p * (1 - case.dropout_p) / n)
            if abs(rate - case.dropout_p) > 5 * sigma + 1e-3:
                ok = False
            notes.append(f"drop rate {rate:.3f}")
    return Result(case, "", "PASS" if ok else "FAIL", out_err, out_tol, worst[1], worst[2],
                  "; ".join(notes))


def _check_dropout_repro(case: Case, dtype: torch.dtype, device: str) -> Result:
    q, k, v, dout, slopes = _inputs(case, dtype, device)

    def run(seed: int) -> Tuple[torch.Tensor, ...]:
        torch.manual_seed(seed)
        out = _ours(case, q, k, v, slopes)
        return (out.detach(),) + _grads(out, (q, k, v), dout)

    first, again, other = run(1234), run(1234), run(4321)
    same = all(torch.equal(a, b) for a, b in zip(first, again))
    differs = not torch.equal(first[0], other[0])
    notes = ["same seed: bitwise equal" if same else "same seed: results differ",
             "other seed: differs" if differs else "other seed: identical output"]
    return Result(case, "", "PASS" if same and differs else "FAIL", note="; ".join(notes))


def _check_deterministic(case: Case, dtype: torch.dtype, device: str) -> Result:
    q, k, v, dout, slopes = _inputs(case, dtype, device)
    runs = []
    for _ in range(2):
        out = _ours(case, q, k, v, slopes, deterministic=True)
        runs.append(_grads(out, (q, k, v), dout))
    same = all(torch.equal(a, b) for a, b in zip(*runs))
    return Result(case, "", "PASS" if same else "FAIL",
                  note="grads bitwise equal" if same else "grads differ between runs")


def _rmse(a: torch.Tensor, b: torch.Tensor) -> float:
    if a.numel() == 0:
        return 0.0
    return float((a.double() - b.double()).pow(2).mean().sqrt())


def _check_fp8(case: Case, dtype: torch.dtype, device: str) -> Result:
    """One FP8 case (module doc, dtype ``fp8``): bf16 inputs (float32 for an 'e2e' case with
    out_dtype fp32) quantized by ``fp8.quantize`` (seed 0), or, for FA3's API, random e4m3
    values with random (batch, nheads_k) descales."""
    from flashattn import fp8
    from flashattn.api import fp8_attention
    from flashattn.reference import (attention_fp8_ref, attention_probs_ref,
                                     dequantize_fp8_ref)

    out_dtype = DTYPES[case.out_dtype] if case.out_dtype else None
    src = torch.float32 if case.entry == "e2e" and out_dtype == torch.float32 else torch.bfloat16
    q, k, v, _, _ = _inputs(case, src, device)
    q, k, v = (x.detach() for x in (q, k, v))
    kw = dict(softmax_scale=case.softmax_scale, causal=case.causal, window_size=case.window,
              softcap=case.softcap)
    if case.entry == "fa3":
        gen = torch.Generator(device="cpu").manual_seed(7)
        q8, k8, v8 = ((x * 4).to(torch.float8_e4m3fn) for x in (q, k, v))
        qd, kd, vd = ((torch.rand(case.b, case.h_k, generator=gen) * 0.2 + 0.05).to(device)
                      for _ in range(3))
        # (the function flash_attn_func hands e4m3 inputs to, asked for the LSE too)
        out, lse = fp8_attention.dense(q8, k8, v8, dropout_p=0.0, alibi_slopes=None,
                                       return_attn_probs=False, q_descale=qd, k_descale=kd,
                                       v_descale=vd, out_dtype=out_dtype, return_lse=True, **kw)
        group = case.h // case.h_k
        oracle = (q8, k8, v8, qd.repeat_interleave(group, 1)[..., None], kd[..., None],
                  vd[..., None], max(case.s_q, 1), max(case.s_k, 1))
    else:
        r = fp8.quantize(q, k, v, seed=0, block_n=case.block_n)
        if case.entry == "quantized":
            out, lse = fp8.attention(r, **kw, out_dtype=out_dtype, return_lse=True)
        else:
            out, lse = fp8.flash_attn_fp8_func(q, k, v, **kw, seed=0, block_n=case.block_n,
                                               return_lse=True)
        oracle = (r.q, r.k, r.v, r.q_descale, r.k_descale, r.v_descale, r.block_m, r.block_n)
    want_dtype = out_dtype or (src if case.entry == "e2e" else torch.bfloat16)
    if out.dtype != want_dtype:
        return Result(case, "", "FAIL", note=f"out dtype {out.dtype}, expected {want_dtype}")
    cpu = tuple(x.cpu() if isinstance(x, torch.Tensor) else x for x in oracle)
    exact = attention_fp8_ref(*cpu, **kw, p_scale=None)
    p_rounded = attention_fp8_ref(*cpu, **kw)
    out_err = _rmse(out.cpu(), exact)
    out_tol = 2 * _rmse(p_rounded, exact) + 2 * _rmse(exact.to(want_dtype), exact) + 1e-6
    ok = out_err <= out_tol and bool(torch.isfinite(out).all())
    notes = []
    # the LSE of the dequantized scores (P's e4m3 rounding moves it by far less than 0.05)
    deq = (dequantize_fp8_ref(cpu[0], cpu[3], cpu[6]),
           dequantize_fp8_ref(cpu[1], cpu[4], cpu[7]))
    lse64 = attention_probs_ref(*deq, **kw)[1]
    inf_ref = torch.isinf(lse64)
    lse = lse.cpu()
    if not torch.equal(torch.isinf(lse), inf_ref) or torch.isnan(lse).any():
        ok = False
        notes.append("lse -inf/NaN pattern differs")
    elif (~inf_ref).any():
        lse_err = float((lse.double() - lse64)[~inf_ref].abs().max())
        if lse_err > 0.05:
            ok = False
            notes.append(f"lse err {lse_err:.2e}")
    notes.append(f"{case.entry}, out {str(want_dtype).split('.')[-1]}, rmse")
    return Result(case, "", "PASS" if ok else "FAIL", out_err, out_tol, note="; ".join(notes))


def run_case(case: Case, dtype_name: str, device: str) -> Result:
    dtype = DTYPES[dtype_name]
    t0 = time.perf_counter()
    try:
        fn = {"ref": _check_ref, "dropout-repro": _check_dropout_repro,
              "deterministic": _check_deterministic, "fp8": _check_fp8}[case.kind]
        result = fn(case, dtype, device)
    except Exception as exc:  # reported as a row, the other cases still run
        msg = str(exc).strip().splitlines()
        result = Result(case, "", "ERROR", note=f"{type(exc).__name__}: {msg[0] if msg else ''}"[:160])
    result.dtype = dtype_name
    result.seconds = time.perf_counter() - t0
    return result


def run_check(device: str, dtypes: Sequence[str], quick: bool = False,
              time_budget_s: Optional[float] = None, only: Optional[str] = None,
              progress: Any = None) -> List[Result]:
    """Every feature case for every dtype (``fp8``: the FP8 cases); cases past the time
    budget are SKIP rows."""
    results: List[Result] = []
    t0 = time.monotonic()
    torch.manual_seed(0)
    for dtype_name in dtypes:
        cases = fp8_cases(device, quick) if dtype_name == "fp8" else feature_cases(device, quick)
        if only:
            cases = [c for c in cases if only.lower() in c.name.lower()]
        for case in cases:
            if time_budget_s is not None and time.monotonic() - t0 > time_budget_s:
                results.append(Result(case, dtype_name, "SKIP", note="time budget"))
                continue
            r = run_case(case, dtype_name, device)
            results.append(r)
            if progress is not None:
                progress(r)
    return results


def _e(x: Optional[float]) -> str:
    return "" if x is None else f"{x:.2e}"


def result_lines(results: Sequence[Result]) -> Tuple[List[str], List[List[str]]]:
    headers = ["case", "dtype", "shape", "out err", "tol", "grad err", "tol", "result", "note"]
    lines = [[r.case.name, r.dtype, r.case.shape(), _e(r.out_err), _e(r.out_tol),
              _e(r.grad_err), _e(r.grad_tol), r.status, r.note] for r in results]
    return headers, lines


# ---------------------------------------------------------------------------------------------
# CPU demo
# ---------------------------------------------------------------------------------------------
def demo_cases() -> List[Tuple[Case, str]]:
    return [
        (Case("non-causal", b=2, s_q=256, s_k=256, h=4, d=64), "fp32"),
        (Case("causal, odd length", b=1, s_q=301, s_k=301, h=4, d=80, causal=True), "fp32"),
        (Case("GQA 8/2, window, softcap", b=1, s_q=200, s_k=333, h=8, h_k=2, d=128,
              window=(64, 16), softcap=10.0), "bf16"),
        (Case("ALiBi causal", b=2, s_q=128, s_k=128, h=4, d=64, alibi="h", causal=True), "fp16"),
    ]


class _PeakRSS:
    """Peak resident memory of this process between reset() and peak() (Linux: VmHWM is
    reset through /proc/self/clear_refs). Large allocations are made to go straight to
    mmap so freed blocks leave the resident set at once."""

    def __init__(self) -> None:
        self.ok = os.path.exists("/proc/self/clear_refs") and os.path.exists("/proc/self/status")
        self._libc: Any = None
        if self.ok:
            try:
                import ctypes

                self._libc = ctypes.CDLL("libc.so.6")
                self._libc.mallopt(-3, 1 << 16)  # M_MMAP_THRESHOLD: 64 KiB, fixed (no dynamic growth)
            except Exception:  # not glibc: peaks are then only approximate
                self._libc = None
            try:
                self.reset()
            except OSError:
                self.ok = False

    @staticmethod
    def _status(key: str) -> int:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith(key + ":"):
                    return int(line.split()[1]) * 1024
        raise OSError(f"no {key} in /proc/self/status")

    def reset(self) -> None:
        gc.collect()
        if self._libc is not None:
            # free heap pages would be reused without growing the resident set: return them
            self._libc.malloc_trim(0)
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        self.base = self._status("VmRSS")

    def peak(self) -> int:
        return self._status("VmHWM") - self.base


def naive_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool) -> torch.Tensor:
    """Textbook attention: the (b, h, s, s) scores materialised (the memory baseline)."""
    qt, kt, vt = (x.transpose(1, 2) for x in (q, k, v))
    scores = (qt @ kt.transpose(-1, -2)) * q.shape[-1] ** -0.5
    if causal:
        s_q, s_k = scores.shape[-2:]
        mask = torch.ones(s_q, s_k, dtype=torch.bool).tril(s_k - s_q)
        scores = scores.masked_fill(~mask, float("-inf"))
    return (torch.softmax(scores, dim=-1) @ vt).transpose(1, 2)


@dataclass
class MemRow:
    s: int
    ours_mib: Optional[float]
    naive_mib: Optional[float]
    ours_s: float
    naive_s: float
    note: str = ""


def memory_rows(seqlens: Sequence[int], b: int = 1, h: int = 2, d: int = 64,
                causal: bool = True, naive_max_s: int = 8192, progress: Any = None) -> List[MemRow]:
    """Peak extra resident MiB of one fwd+bwd (fp32, CPU): ours vs naive, per seqlen."""
    from flashattn import flash_attn_func

    meter = _PeakRSS()
    rows = []

    def measure(fn: Any, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                dout: torch.Tensor) -> Tuple[Optional[float], float]:
        if meter.ok:
            meter.reset()
        t0 = time.perf_counter()
        out = fn(q, k, v)
        grads = torch.autograd.grad(out, (q, k, v), dout)
        seconds = time.perf_counter() - t0
        del out, grads
        return (meter.peak() / 2**20 if meter.ok else None), seconds

    def ours(q, k, v):
        return flash_attn_func(q, k, v, causal=causal)

    def naive(q, k, v):
        return naive_attention(q, k, v, causal)

    # warm-up (thread pools, lazy imports) so the first measured row is not inflated
    w = [torch.randn(1, 64, 1, 16, requires_grad=True) for _ in range(3)]
    for fn in (ours, naive):
        torch.autograd.grad(fn(*w), w, torch.ones(1, 64, 1, 16))
    for s in seqlens:
        q, k, v = (torch.randn(b, s, h, d, requires_grad=True) for _ in range(3))
        dout = torch.randn(b, s, h, d)
        ours_mib, ours_s = measure(ours, q, k, v, dout)
        if s <= naive_max_s:
            naive_mib, naive_s = measure(naive, q, k, v, dout)
            note = ""
        else:
            naive_mib, naive_s = None, 0.0
            note = f"naive skipped (s > {naive_max_s}: scores alone {4 * b * h * s * s / 2**30:.1f} GiB)"
        row = MemRow(s, ours_mib, naive_mib, ours_s, naive_s, note)
        rows.append(row)
        if progress is not None:
            progress(row)
    return rows
