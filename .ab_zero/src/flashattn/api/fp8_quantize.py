"""FP8 quantization for attention (FlashAttention-3's block quantization + incoherent
processing): ``flashattn.fp8.quantize``.

The semantics (descale convention, block layout, the block-diagonal Hadamard for head dims that
are not a power of two) are those of :mod:`flashattn.backends.cpu.fp8`; on CUDA one fused Triton pass
(:mod:`flashattn.backends.triton.fp8_quantize`). Attention over the result: ``flashattn.fp8.attention``
(:mod:`flashattn.api.fp8_attention`).
"""
from __future__ import annotations

import functools
import numbers
from typing import NamedTuple, Optional, Tuple

import torch

from flashattn import ops as _ops
from flashattn.api import fastpath as _fast
from flashattn.api import validation as _v
from flashattn.philox import philox_uint32

Tensor = torch.Tensor
# Philox counter word c3 of the sign stream (dropout uses c3 = 0: the streams never meet)
_SIGNS_STREAM = 0x5EED


class QuantizedQKV(NamedTuple):
    """The result of :func:`quantize`.

    q, k, v: float8_e4m3fn, the shapes of the inputs; the real value is ``fp8 × descale``.
    q_descale: float32 (batch, nheads, cdiv(seqlen_q, block_m)).
    k_descale, v_descale: float32 (batch, nheads_k, cdiv(seqlen_k, block_n)).
    signs: float32 (headdim,) of ±1 (the random diagonal of M = H · diag(signs)), or None
        without incoherent processing. q and k hold ``(q M)`` and ``(k M)``; v is not rotated.
    block_m, block_n: the row blocks of the scales.
    """

    q: Tensor
    k: Tensor
    v: Tensor
    q_descale: Tensor
    k_descale: Tensor
    v_descale: Tensor
    signs: Optional[Tensor]
    block_m: int
    block_n: int


def random_signs(head_dim: int, seed: Optional[int], device: torch.device) -> Tensor:
    """(head_dim,) float32 of ±1: from ``seed`` (bit 0 of Philox4x32-10 keyed by the seed at
    counters 0..head_dim-1: the same signs on every device and under torch.compile), or, when
    None, from torch's default CPU generator (``torch.manual_seed`` reproduces it)."""
    if seed is None:
        bits = torch.randint(0, 2, (head_dim,), dtype=torch.int64)
        return (bits * 2 - 1).to(device=device, dtype=torch.float32)
    seed, device = int(seed) & (2**64 - 1), torch.device(device)
    if torch.compiler.is_compiling():
        # dynamo traces through an lru_cache (and warns that it does): trace the maker itself,
        # which computes the same signs, so a compiled graph holds them as its own ops
        return _seeded_signs.__wrapped__(seed, head_dim, device)
    return _seeded_signs(seed, head_dim, device)


@functools.lru_cache(maxsize=64)
def _seeded_signs(seed: int, head_dim: int, device: torch.device) -> Tensor:
    """The signs of a fixed seed, made once per device: a serving loop with a fixed rotation
    pays no host-to-device copy per call (each one waits for the stream). Read-only."""
    bits = philox_uint32(seed, torch.arange(head_dim), 0, 0, _SIGNS_STREAM) & 1
    return (bits * 2 - 1).to(device=device, dtype=torch.float32)


def _check_block(block: object, name: str) -> int:
    if isinstance(block, bool) or not isinstance(block, numbers.Integral) or int(block) < 1 \
            or int(block) & (int(block) - 1):
        raise ValueError(f"{name} must be a power of two >= 1 (rows per scale), got {block!r}")
    return int(block)


def quantize(q: Tensor, k: Tensor, v: Tensor, *, incoherent: bool = True,
             seed: Optional[int] = None, block_m: int = 128, block_n: int = 128
             ) -> QuantizedQKV:
    """Cast q, k, v to float8_e4m3fn with one scale per tile (FlashAttention-3, section 3.3).

    Arguments:
        q: (batch, seqlen_q, nheads, headdim), float16, bfloat16 or float32.
        k: (batch, seqlen_k, nheads_k, headdim), v: (batch, seqlen_k, nheads_k, headdim_v),
            same dtype and device; nheads % nheads_k == 0.
        incoherent: multiply q and k by M = H · diag(signs) first (H the orthonormal Hadamard,
            block-diagonal of power-of-two blocks when headdim is not a power of two), which
            leaves q k^T unchanged and spreads outlier channels before the cast.
        seed: int or None, the key of the random signs (None: torch's default generator).
        block_m, block_n: rows of q / keys of k and v per scale (powers of two; the FP8
            kernels will use their tile sizes).

    Returns a :class:`QuantizedQKV`.
    """
    # a repeated call signature replays the recorded pass (api/fastpath.py)
    key = _fast.quantize_key(q, k, v, incoherent, seed, block_m, block_n)
    run = None if key is None else _fast.QUANTIZE.get(key)
    if not run:
        incoherent, block_m, block_n = check_quantize_args(q, k, v, incoherent, seed, block_m,
                                                           block_n)
        if key is not None and run is None:  # the signature's first call: record it
            signs = random_signs(q.shape[-1], seed, q.device) if incoherent else None
            run = _fast.quantize_record(key, q, k, v, signs, block_m, block_n)
        if not run:
            return quantize_for_kernels(q, k, v, incoherent, seed, block_m, block_n,
                                        v_wgmma=False)
    signs = random_signs(q.shape[-1], seed, q.device) if incoherent else None
    # (a copy: the seeded sign vector is cached per device, the caller may write to theirs)
    return QuantizedQKV(*run(q, k, v), None if signs is None else signs.clone(), int(block_m),
                        int(block_n))


def check_quantize_args(q: Tensor, k: Tensor, v: Tensor, incoherent: object, seed: object,
                        block_m: object, block_n: object) -> Tuple[bool, int, int]:
    """:func:`quantize`'s argument checks; returns (incoherent, block_m, block_n) normalised."""
    _v.check_qkv(q, k, v, ("q", "k", "v"))
    incoherent = _v.check_bool(incoherent, "incoherent")
    block_m, block_n = _check_block(block_m, "block_m"), _check_block(block_n, "block_n")
    if seed is not None and (isinstance(seed, bool) or not isinstance(seed, numbers.Integral)):
        raise TypeError(f"seed must be an int or None, got {seed!r}")
    return incoherent, block_m, block_n


def quantize_for_kernels(q: Tensor, k: Tensor, v: Tensor, incoherent: bool, seed: Optional[int],
                         block_m: int, block_n: int, v_wgmma: bool,
                         copy_signs: bool = True) -> QuantizedQKV:
    """:func:`quantize`'s body, arguments checked (check_quantize_args); ``v_wgmma``: V in the
    Hopper kernels' key order (fp8_format.wgmma_vt_empty, (b, s_pad, h_k, d_v)) instead of
    key order: for flash_attn_fp8_func, which hands it straight to the forward (not a layout
    to dequantize). ``copy_signs`` False: the result's signs may be the cached sign vector
    itself (a caller that never hands them out: flash_attn_fp8_func)."""
    signs = random_signs(q.shape[-1], seed, q.device) if incoherent else None
    q8, k8, v8, qs, ks, vs = _ops.quantize_fp8(q, k, v, signs, block_m, block_n, v_wgmma)
    # (a copy: a seeded sign vector is cached per device, the caller may write to theirs)
    signs = signs.clone() if signs is not None and copy_signs else signs
    return QuantizedQKV(q8, k8, v8, qs, ks, vs, signs, block_m, block_n)


__all__ = ["QuantizedQKV", "check_quantize_args", "quantize", "quantize_for_kernels",
           "random_signs"]
