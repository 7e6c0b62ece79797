"""Check your own attention calls the way flashattn's tests do: the float64 oracle and
flash-attn's accuracy rule (public; the test suite uses the same functions).

    from flashattn.testing import attention_ref, assert_close_rule
    out = flashattn.flash_attn_func(q, k, v, causal=True)            # bf16 / fp16
    ref = attention_ref(q, k, v, causal=True)[0]                       # float64 oracle
    low = attention_ref(q, k, v, causal=True, upcast=False)[0]         # naive, in q's dtype
    assert_close_rule(out, ref, low)       # error <= 2x PyTorch's own low-precision error

The rule: an implementation computed in low precision is accepted when its error against the
float64 oracle is at most ``factor`` times the error PyTorch itself makes computing the same
thing naively in that precision, plus a small absolute tolerance,

    max|out - ref64| <= factor * max|out_lowprec_torch - ref64| + atol

(factor 2 for outputs, 3 for gradients, as in flash-attn's tests). Non-finite entries (e.g.
lse = -inf on rows that see no key) must match the reference exactly and are left out of the
error; a NaN the reference lacks always fails.

Oracles (:mod:`flashattn.reference`): ``attention_ref`` (dense: causal, windows, softcap,
ALiBi, GQA, dropout masks, attention_chunk, qv), ``kvcache_ref`` (a KV-cache call: appends, rotary,
paged caches), ``attention_fp8_ref`` (FP8 block quantization).
"""
from __future__ import annotations

import torch

from flashattn.reference import attention_fp8_ref, attention_ref, kvcache_ref

__all__ = ["assert_close_rule", "assert_same_nonfinite", "attention_fp8_ref", "attention_ref",
           "kvcache_ref", "max_abs_err"]


def assert_same_nonfinite(out: torch.Tensor, ref: torch.Tensor, name: str = "out") -> None:
    """Assert ``out`` has NaN / +inf / -inf exactly where ``ref`` has them."""
    out = out.detach().double().cpu()
    ref = ref.detach().double().cpu()
    assert out.shape == ref.shape, f"{name}: shape {tuple(out.shape)} != reference {tuple(ref.shape)}"
    for what, test in (("NaN", torch.isnan), ("+inf", torch.isposinf), ("-inf", torch.isneginf)):
        a, b = test(out), test(ref)
        if not torch.equal(a, b):
            idx = (a != b).nonzero()[0].tolist()
            raise AssertionError(
                f"{name}: {what} pattern differs from the reference: {int(a.sum())} vs "
                f"{int(b.sum())} entries; first mismatch at {idx}: "
                f"out={out[tuple(idx)].item()!r} ref={ref[tuple(idx)].item()!r}")


def max_abs_err(out: torch.Tensor, ref: torch.Tensor) -> float:
    """max|out - ref| in float64 over the entries where both are finite (0.0 if none)."""
    out = out.detach().double().cpu()
    ref = ref.detach().double().cpu()
    finite = torch.isfinite(out) & torch.isfinite(ref)
    if not bool(finite.any()):
        return 0.0
    return (out - ref).abs()[finite].max().item()


def assert_close_rule(out: torch.Tensor, ref: torch.Tensor, lowprec: torch.Tensor,
                      factor: float = 2.0, atol: float = 1e-5, name: str = "out") -> None:
    """Assert ``max|out - ref| <= factor * max|lowprec - ref| + atol`` (flash-attn's rule).

    out: the implementation under test (any dtype); ref: the float64 oracle; lowprec: the
    oracle computed naively in out's low precision (``attention_ref(..., upcast=False)``).
    All three must have the same shape. Non-finite entries must coincide with ref's.
    """
    assert_same_nonfinite(out, ref, name)
    assert lowprec.shape == ref.shape, (
        f"{name}: lowprec shape {tuple(lowprec.shape)} != reference {tuple(ref.shape)}")
    err = max_abs_err(out, ref)
    base = max_abs_err(lowprec, ref)
    bound = factor * base + atol
    if not err <= bound:
        o = out.detach().double().cpu()
        r = ref.detach().double().cpu()
        diff = torch.where(torch.isfinite(o) & torch.isfinite(r), (o - r).abs(),
                           torch.zeros_like(o))
        idx = tuple(torch.unravel_index(diff.argmax(), diff.shape))
        idx = tuple(int(i) for i in idx)
        raise AssertionError(
            f"{name}: max|out - ref| = {err:.3e} at {list(idx)} (out {o[idx].item():.6g}, "
            f"ref {r[idx].item():.6g}) exceeds {factor:g} * max|lowprec - ref| "
            f"({base:.3e}) + atol {atol:.1e} = {bound:.3e}; "
            f"max|ref| = {r[torch.isfinite(r)].abs().max().item() if torch.isfinite(r).any() else 0:.3e}")
