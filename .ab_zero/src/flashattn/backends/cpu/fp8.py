"""FP8 block quantization with incoherent processing, in torch (any device torch runs on).

FlashAttention-3's third technique (paper, section 3.3): Q, K and V are cast to
``float8_e4m3fn`` with one scale per tile (block quantization), after Q and K are multiplied by
the same random orthogonal matrix ``M = H · diag(s)`` along the head dim (incoherent
processing: ``(Q M)(K M)^T = Q K^T`` because ``M M^T = I``, while an outlier channel is spread
over all channels before the cast). This module is the semantics every FP8 backend must match;
it runs as a handful of torch ops (the GPU runs the fused pass, triton/fp8_quantize.py).
CPU FP8 attention (:func:`dequantized`) computes attention of the real values (fp8 ×
descale) exactly, in float32: CPU tests pin the semantics without the kernels' P rounding.

Conventions (FA3's): the real value is ``fp8 × descale``; a block's descale is
``amax(|x|) / 448`` over the block (448 = the largest finite e4m3 value), 1.0 for an all-zero
block. Q has one descale per (batch, head, BLOCK_M rows), K and V one per (batch, kv head,
BLOCK_N keys).

The Hadamard: ``H`` is block-diagonal with Sylvester blocks of size ``hadamard_block(d)``, the
largest power of two dividing d (64 -> 64, 96 -> 32, 128 -> 128, 192 -> 64, 256 -> 256),
normalised by ``1 / sqrt(block)`` so that it is orthonormal. A block-diagonal Hadamard still
gives ``M M^T = I`` exactly; for d = 96 / 192 it spreads an outlier over 32 / 64 channels
instead of all d (a full Hadamard of a non-power-of-two size needs a Paley construction that
costs more than the quantization pass is worth; the measured effect is in benchmarks/NOTES.md).
"""
from __future__ import annotations

from typing import Optional, Tuple

import torch

from flashattn.fp8_format import (E4M3_MAX, FP8_DTYPE, dequantize,
                                  dequantize_shift, hadamard, hadamard_block,
                                  keys_contiguous_empty)


def rotate(x: torch.Tensor, signs: torch.Tensor) -> torch.Tensor:
    """``x · H · diag(signs)`` along the last dim, in float32: x (..., d), signs (d,) of ±1."""
    d = x.shape[-1]
    return (x.float() @ hadamard(d, x.device)) * signs.to(device=x.device, dtype=torch.float32)


def _block_quantize(x: torch.Tensor, block: int) -> Tuple[torch.Tensor, torch.Tensor]:
    """x (b, s, h, d) float -> (x8 (b, s, h, d) e4m3, descale (b, h, cdiv(s, block)) fp32):
    one scale per (batch, head, block of rows)."""
    b, s, h, d = x.shape
    n_blocks = -(-s // block)
    block = min(block, max(s, 1))  # (a block past the end: one per (batch, head), no padding)
    pad = n_blocks * block - s
    xf = x.float()
    if pad:
        xf = torch.nn.functional.pad(xf, (0, 0, 0, 0, 0, pad))
    tiles = xf.view(b, n_blocks, block, h, d)
    amax = tiles.abs().amax(dim=(2, 4))  # (b, n_blocks, h)
    descale = torch.where(amax > 0, amax / E4M3_MAX, torch.ones_like(amax))
    # times the fp32 reciprocal of the descale (what the fused GPU pass computes, bit for bit)
    x8 = (tiles * (1.0 / descale)[:, :, None, :, None]).clamp(-E4M3_MAX, E4M3_MAX).to(FP8_DTYPE)
    x8 = x8.view(b, n_blocks * block, h, d)[:, :s]
    return x8.contiguous(), descale.transpose(1, 2).contiguous()


def fp8_quantize(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                 signs: Optional[torch.Tensor], block_m: int, block_n: int
                 ) -> Tuple[torch.Tensor, ...]:
    """Block quantization (with incoherent processing of Q and K when ``signs`` is given).

    q (b, s_q, h, d), k (b, s_k, h_k, d), v (b, s_k, h_k, d_v), fp16 / bf16 / fp32; signs
    None or (d,) float32 of ±1. Returns (q8, k8, v8) float8_e4m3fn with the input shapes and
    (q_descale (b, h, cdiv(s_q, block_m)), k_descale (b, h_k, cdiv(s_k, block_n)), v_descale
    (b, h_k, cdiv(s_k, block_n))) float32.
    """
    if signs is not None:
        q, k = rotate(q, signs), rotate(k, signs)
    q8, q_descale = _block_quantize(q, block_m)
    k8, k_descale = _block_quantize(k, block_n)
    v8, v_descale = _block_quantize(v, block_n)
    v8 = keys_contiguous_empty(v8.shape, v8.device).copy_(v8)  # the FP8 kernels' V layout
    return q8, k8, v8, q_descale, k_descale, v_descale


def dequantized(q8: torch.Tensor, k8: torch.Tensor, v8: torch.Tensor, scales) -> Tuple[torch.Tensor, ...]:
    """(q, k, v) float32: the real values of the FP8 inputs (``scales``: params.Fp8Scales)."""
    return (dequantize_shift(q8, scales.q_descale, scales.q_block_shift),
            dequantize_shift(k8, scales.k_descale, scales.kv_block_shift),
            dequantize_shift(v8, scales.v_descale, scales.kv_block_shift))


def per_packed_row(cu_seqlens: torch.Tensor, total: int, batch: int) -> torch.Tensor:
    """(total,) int64: the sequence each packed row belongs to (rows past the last sequence:
    the last one; they are outside every sequence and never read)."""
    rows = torch.arange(total, device=cu_seqlens.device)
    seq = torch.searchsorted(cu_seqlens[1:].long().contiguous(), rows, right=True)
    return seq.clamp_(max=max(batch - 1, 0))


__all__ = ["per_packed_row", "E4M3_MAX", "FP8_DTYPE", "dequantize", "dequantize_shift", "dequantized", "fp8_quantize", "hadamard", "hadamard_block",
           "rotate"]
