"""Accuracy helpers for tests, on flash-attn's rule (the rule and the float64 oracle are
public: :mod:`flashattn.testing`, re-exported here): whole-call checks of out / lse / grads,
and the absolute tolerances of sums the rule's naive baseline cannot bound."""
from __future__ import annotations

import torch

from flashattn.testing import assert_close_rule, assert_same_nonfinite, max_abs_err

__all__ = ["max_abs_err", "assert_close_rule", "assert_same_nonfinite",
           "assert_attention_close", "delta_residual_atols", "fp32_sum_atol"]


def assert_attention_close(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, out: torch.Tensor,
                           dout: torch.Tensor, grads, *, lse=None,
                           window_size=(-1, -1)) -> None:
    """One attention call end to end against the float64 oracle (flashattn.reference): ``out``
    (and ``lse`` when given) by the 2x rule, ``grads`` = autograd.grad(out, (q, k, v), dout)
    by the 3x rule. q, k, v: the call's inputs (requires_grad); default softmax scale."""
    from flashattn.reference import attention_ref

    x64 = [x.detach().double().requires_grad_() for x in (q, k, v)]
    out_ref, lse_ref = attention_ref(*x64, window_size=window_size)
    grads_ref = torch.autograd.grad(out_ref, x64, dout.double())
    xlp = [x.detach().clone().requires_grad_() for x in (q, k, v)]
    out_lp, lse_lp = attention_ref(*xlp, window_size=window_size, upcast=False)
    grads_lp = torch.autograd.grad(out_lp, xlp, dout)
    assert_close_rule(out, out_ref, out_lp, name="out")
    if lse is not None:
        assert_close_rule(lse, lse_ref, lse_lp, name="lse")
    for name, got, ref, lp in zip(("dq", "dk", "dv"), grads, grads_ref, grads_lp):
        assert_close_rule(got, ref, lp, factor=3.0, name=name)


def delta_residual_atols(q: torch.Tensor, k: torch.Tensor, out: torch.Tensor,
                         out_ref: torch.Tensor, dout: torch.Tensor, probs: torch.Tensor,
                         softmax_scale: float) -> dict:
    """Bounds of the part of dq / dk that FlashAttention's backward owes to its stored output.

    The backward takes ``D_i = rowsum(dO_i * O_i)`` from O as the forward stored it (rounded
    to its dtype), so D is off by ``dD_i = dO_i . (O_i - O_ref_i)``. That enters
    ``dS_ij = P_ij (dP_ij - D_i)`` as ``-P_ij dD_i``: dq_i gains ``-scale dD_i (P k)_i`` and
    dk_j gains ``-scale sum_i P_ij dD_i q_i`` (times tanh' <= 1 under softcap; the same with
    dropout, P before it). Naive PyTorch has no such term (its softmax backward uses its own
    P and dP), so where the true gradient is tiny (a row with one or two visible keys, or a
    nearly one-hot one) the 3x rule's baseline alone asks for more than the algorithm can
    give; these bounds (grown by one eps of q's dtype, for the gradient's own rounding) are
    the allowance for it.

    q (b, s_q, h, d), k (b, s_k, h_k, d); out, out_ref, dout (b, s_q, h, d_v); probs
    (b, h, s_q, s_k) float64, 0 where invisible. Returns {"dq": float, "dk": float}.
    """
    b, s_q, h, d = q.shape
    s_k, h_k = k.shape[1], k.shape[2]
    if min(b, s_q, s_k, h) == 0:
        return {"dq": 0.0, "dk": 0.0}
    dev = probs.device  # (the oracle's device: a GPU test keeps its (b, h, s_q, s_k) there)
    o, r = (x.detach().to(dev, torch.float64) for x in (out, out_ref))
    d_delta = (dout.detach().to(dev, torch.float64) * torch.where(torch.isfinite(r), o - r, 0.0)
               ).sum(-1).abs()  # (b, s_q, h)
    p = probs.detach().double()
    k_abs = k.detach().to(dev, torch.float64).abs().repeat_interleave(h // h_k, dim=2)
    p_k = torch.einsum("bhij,bjhd->bihd", p, k_abs)  # (b, s_q, h, d)
    dq = softmax_scale * (d_delta.unsqueeze(-1) * p_k).max().item()
    dk_heads = torch.einsum("bhij,bih,bihd->bjhd", p, d_delta,
                            q.detach().to(dev, torch.float64).abs())  # (b, s_k, h, d)
    dk = softmax_scale * dk_heads.view(b, s_k, h_k, h // h_k, d).sum(3).max().item()
    # where the residual is all of the gradient (one visible key) it is also rounded to the
    # gradient's dtype: half an ulp, covered with one eps
    grow = 1.0 + torch.finfo(q.dtype).eps if q.dtype.is_floating_point else 1.0
    return {"dq": dq * grow, "dk": dk * grow}


def fp32_sum_atol(ref: torch.Tensor, dtype: torch.dtype, n_terms: int) -> float:
    """Allowance for float32 results that sum ``n_terms`` products: ``sqrt(n) * eps * max|ref|``
    (the random-walk rounding error of an fp32 running sum; 0 for other dtypes).

    Naive PyTorch's float32 baseline sums with blocked GEMMs and is often a few ulps from the
    float64 oracle, so 3x its error can be tighter than any row-by-row accumulation (a key
    block at a time, a GQA group head by head); 16-bit results are bounded by their own
    rounding instead, which the rule's baseline already carries."""
    if dtype != torch.float32 or n_terms <= 0:
        return 0.0
    r = ref.detach().double()
    r = r[torch.isfinite(r)]
    return float(n_terms) ** 0.5 * torch.finfo(torch.float32).eps * (
        r.abs().max().item() if r.numel() else 0.0)
