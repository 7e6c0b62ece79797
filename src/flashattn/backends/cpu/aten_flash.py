"""PyTorch's own CPU flash-attention kernel (``aten::_scaled_dot_product_flash_attention_for_cpu``
and its backward) for the CPU calls it computes exactly as flash-attn defines them.

It returns the output and the natural-log LSE (b, h, s_q) float32, and its backward takes the
LSE back: the same contract as our chunked path (so either forward's lse serves either
backward), O(s) memory, and torch's intra-op threads (no oversubscription with our own). It is
the kernel behind ``F.scaled_dot_product_attention`` on CPU; calling it directly skips SDPA's
backend selection and the (b, s, h, d) <-> (b, h, s, d) copies are views.

Covered (:func:`covers`): CPU tensors of fp16 / bf16 / fp32, head_dim_v == head_dim, GQA / MQA
(the kernel maps query head i to kv head i // (h / h_k), as flash-attn), no dropout (flash-attn's
Philox stream is ours to reproduce), no softcap, no ALiBi, and no mask other than causal with
seqlen_q == seqlen_k (the kernel's causal mask is top-left aligned; flash-attn's bottom-right
one coincides with it only there). Everything else runs the chunked path.

Backward in fp32 (:func:`covers_backward`): not routed. Against the float64 oracle, aten's fp32
backward errs 2-5.8x as much as plain fp32 attention does (dV worst; b 2, s 97, h 4, d 64,
scale 0.3, six draws), past flash-attn's 3x rule (``python -m flashattn check`` failed on it);
the chunked backward reads 0.9-1.9x on the same draws. Its fp32 forward passes the rule and
stays (either forward's lse serves either backward).

Backward in fp16 / bf16: computed in float32 and rounded once. The kernel accumulates its
gradients *in the output's dtype*: dV and dK gain one rounding per block of query rows, dQ one
per block of keys (and a GQA kv head one per query head), so the error grows with the sequence.
In bf16 it passed flash-attn's 3x rule up to s_q ~ 2k against one key and missed it beyond
(dV at s_q 4096: 3.5x naive bf16's error, at 16384: 7.7x; FlashAttention-3's own tests failed
on it at (239, 1)). So :func:`bwd` hands the kernel float32 copies of its inputs (the float32
kernel's own error, above, is far below one bf16 / fp16 rounding) and rounds dQ / dK / dV once,
as flash-attn's fp32-accumulating kernels do. On a CPU without bf16 instructions that is also
7-12x faster than the bf16 kernel (2026-12-02, 2-core x86 without AVX-512: (2, 1024, 8, 64)
1104 -> 164 ms; the chunked backward 242 ms).

Forward in fp16 / bf16: in float32 too, the output rounded once. The backward recomputes
P = exp(s - lse) from float32 scores; an lse from the 16-bit kernel (its scores rounded to 16
bits on some CPUs, not on others) made P of a lone key differ from 1 by up to 2^-8, so dV missed
its one rounding by up to 2 ulps on CI's CPU while passing on another. The float32 kernel was
also the faster one there ((2, 8, 1024, 64) causal: bf16 29 ms, fp16 43 ms, fp32 25 ms,
2026-12-06).
"""
from __future__ import annotations

from typing import Tuple

import torch

from flashattn.params import AttnParams

Tensor = torch.Tensor
_DTYPES = (torch.float16, torch.bfloat16, torch.float32)


def covers(q: Tensor, k: Tensor, v: Tensor, p: AttnParams) -> bool:
    """Whether the aten kernel computes this call exactly (see the module doc)."""
    if q.device.type != "cpu" or q.dtype not in _DTYPES or v.shape[-1] != q.shape[-1]:
        return False
    if p.dropout_p != 0.0 or p.softcap != 0.0 or p.alibi_slopes is not None:
        return False
    if p.window_left == -1 and p.window_right == -1:
        return True
    return p.window_left == -1 and p.window_right == 0 and q.shape[1] == k.shape[1]


def covers_backward(q: Tensor, k: Tensor, v: Tensor, p: AttnParams) -> bool:
    """Whether the aten backward serves this call: :func:`covers`, and not fp32 (module doc)."""
    return q.dtype != torch.float32 and covers(q, k, v, p)


def _causal(p: AttnParams) -> bool:
    return p.window_right == 0


def fwd(q: Tensor, k: Tensor, v: Tensor, p: AttnParams) -> Tuple[Tensor, Tensor]:
    """out (b, s_q, h, d) in q's dtype, lse (b, h, s_q) float32; fp16 / bf16 calls computed
    in float32 and rounded once (module doc)."""
    wide = [t.float() for t in (q, k, v)]  # (no copy for float32 inputs)
    out, lse = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(
        *(t.transpose(1, 2) for t in wide), 0.0, _causal(p), attn_mask=None,
        scale=p.softmax_scale)
    return out.transpose(1, 2).to(q.dtype), lse


def bwd(dout: Tensor, q: Tensor, k: Tensor, v: Tensor, out: Tensor, lse: Tensor,
        p: AttnParams) -> Tuple[Tensor, Tensor, Tensor]:
    """(dq, dk, dv) shaped and typed like q, k, v; fp16 / bf16 calls computed in float32 and
    rounded once (module doc).

    dout, out (b, s_q, h, d); q (b, s_q, h, d); k, v (b, s_k, h_k, d); lse (b, h, s_q) float32.
    """
    dtypes = (q.dtype, k.dtype, v.dtype)
    wide = [t.float() for t in (dout, q, k, v, out)]  # (no copy for float32 inputs)
    dq, dk, dv = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu_backward(
        *(t.transpose(1, 2) for t in wide), lse, 0.0, _causal(p), attn_mask=None,
        scale=p.softmax_scale)
    return tuple(t.transpose(1, 2).to(dt) for t, dt in zip((dq, dk, dv), dtypes))


__all__ = ["bwd", "covers", "covers_backward", "fwd"]
