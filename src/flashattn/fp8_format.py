"""The FP8 format conventions every backend shares (a leaf: torch only).

- ``float8_e4m3fn`` values; the largest finite one is 448 (``E4M3_MAX``).
- FlashAttention-3's descale convention: the real value is ``fp8 × descale``; a block's
  descale is ``amax(|x|) / 448`` over the block, 1.0 for an all-zero block.
- The incoherent-processing rotation ``M = H · diag(signs)``: ``H`` is block-diagonal with
  Sylvester blocks of ``hadamard_block(d)`` = the largest power of two dividing d (64 -> 64,
  96 -> 32, 128 -> 128, 192 -> 64, 256 -> 256), normalised by ``1 / sqrt(block)`` so that it
  is orthonormal (``M M^T = I`` exactly, so ``(Q M)(K M)^T = Q K^T``).
- ``P_SCALE``: the FP8 kernels multiply the softmax probabilities by 2^8 before casting them
  to e4m3 for the P·V product (FlashAttention-3's choice: P in [0, 1] would otherwise sit in
  e4m3's subnormal range below 2^-6), and divide the row sums by the same factor.
"""
from __future__ import annotations

import functools
from typing import Tuple

import torch

E4M3_MAX = 448.0
FP8_DTYPE = torch.float8_e4m3fn
P_SCALE_LOG2 = 8
P_SCALE = float(2 ** P_SCALE_LOG2)


def hadamard_block(head_dim: int) -> int:
    """The Sylvester block size used for ``head_dim``: its largest power-of-two divisor."""
    return head_dim & -head_dim


@functools.lru_cache(maxsize=32)
def _hadamard_cpu(head_dim: int) -> torch.Tensor:
    n = hadamard_block(head_dim)
    h = torch.ones(1, 1, dtype=torch.float64)
    while h.shape[0] < n:  # Sylvester: H_2n = [[H, H], [H, -H]]
        h = torch.cat([torch.cat([h, h], 1), torch.cat([h, -h], 1)], 0)
    h = h / n ** 0.5
    return torch.block_diag(*([h] * (head_dim // n)))


def hadamard(head_dim: int, device: torch.device, dtype: torch.dtype = torch.float32
             ) -> torch.Tensor:
    """Orthonormal block-diagonal Hadamard matrix (head_dim, head_dim) (see the module doc)."""
    return _hadamard_cpu(head_dim).to(device=device, dtype=dtype)


def keys_contiguous_empty(shape, device: torch.device) -> torch.Tensor:
    """An uninitialised float8_e4m3fn tensor of ``shape`` (b, s_k, h_k, d_v) whose storage is
    (b, h_k, d_v, s_pad), keys contiguous: the V layout of the FP8 kernels (FP8 wgmma reads
    both operands K-major, and P·V's K is the key axis). s_pad = s_k rounded up to 16 (TMA
    needs 16-byte row strides)."""
    b, s, h, d = shape
    s_pad = max(16, -(-s // 16) * 16)
    storage = torch.empty((b, h, d, s_pad), dtype=FP8_DTYPE, device=device)
    return storage[..., :s].permute(0, 3, 1, 2)


# P·V on FP8 wgmma: the S accumulator gives each thread key columns in pairs (2t, 2t + 1,
# 8 + 2t, 9 + 2t, ... of every 32), while an 8-bit A operand wants 4 consecutive keys per
# register (4t .. 4t + 3, 16 + 4t .. 16 + 4t + 3). Reading P's registers in place as the operand
# puts key column c at operand position wgmma_key_position(c) (a permutation inside each group
# of 32); V^T stored with its keys in that order (sm90/v_layout.py writes it) makes the product
# exact, and the conversion from S's layout to the operand's needs no shuffles
# (sm90/fwd_kernel._p_operand).
WGMMA_KEY_GROUP = 32
# The fused quantize pass (triton/fp8_quantize.py) holds a (block, head dim) tile in registers;
# larger scale blocks (up to "one per head") take the torch ops of cpu/fp8.py on any device.
PASS_MAX_BLOCK = 256


# Widening e4m3 to a 16-bit dtype on the GPU without the conversion unit. sm_90 converts
# e4m3 pairs to fp16 with one conversion-unit instruction (``cvt.rn.f16x2.e4m3x2``) and fp16 to
# bf16 with two more (one per value), and that unit issues a quarter as fast as the integer
# ALU. The bits of an e4m3 value, moved into place, already spell a 16-bit float of the same
# sign, significand and exponent, only with the wrong exponent bias: shifted so that its 4
# exponent bits start the 16-bit exponent field, a value x reads as x * 2^-120 in bf16 (bias 127
# against 7) or x * 2^-8 in fp16 (bias 15), subnormals included (both formats have them where
# e4m3's land). One exact multiply by 2^120 (2^8) restores it. The one code with no such
# reading is NaN (magnitude 0x7F, which would read as 480): found by the carry of magnitude + 1
# into the byte's top bit and written as an all-ones NaN. Eight integer / multiply
# instructions per pair of values against three conversions (bf16).
# (shift of the magnitude from a byte's high half, the exact scale as a packed pair, its type)
_WIDEN_FORMATS = {"bf16": (4, "0x7B807B80", "bf16x2"),   # 2^120: exponent 247 << 7
                  "fp16": (1, "0x5C005C00", "f16x2")}    # 2^8: exponent 23 << 10


def e4m3x4_widen_ptx(dst: str) -> str:
    """Inline PTX widening four float8_e4m3fn values to ``dst`` ("bf16" or "fp16"), exactly
    (NaN stays NaN): ``$2`` holds the four bytes (value i in byte i), ``$0`` / ``$1`` receive
    values 0, 1 / 2, 3 as packed 16-bit pairs (value 2i in the low half). The constraint string
    is "=r,=r,r" with pack=4 (Triton's and Gluon's ``inline_asm_elementwise``)."""
    shift, scale, kind = _WIDEN_FORMATS[dst]
    return f"""{{
    .reg .b32 m, t0, t1, v0, v1, n0, n1, s;
    and.b32 m, $2, 0x7F7F7F7F;
    add.u32 m, m, 0x01010101;
    prmt.b32 t0, $2, 0, 0x1404;
    prmt.b32 t1, $2, 0, 0x3424;
    prmt.b32 n0, m, 0, 0x9988;
    prmt.b32 n1, m, 0, 0xBBAA;
    and.b32 v0, t0, 0x7F007F00;
    and.b32 v1, t1, 0x7F007F00;
    shr.b32 v0, v0, {shift};
    shr.b32 v1, v1, {shift};
    and.b32 t0, t0, 0x80008000;
    and.b32 t1, t1, 0x80008000;
    or.b32 v0, v0, t0;
    or.b32 v1, v1, t1;
    or.b32 v0, v0, n0;
    or.b32 v1, v1, n1;
    mov.b32 s, {scale};
    mul.rn.{kind} $0, v0, s;
    mul.rn.{kind} $1, v1, s;
    }}"""


def wgmma_key_position(c: torch.Tensor) -> torch.Tensor:
    """Storage position of key c (int tensor) in a V^T whose key axis is in wgmma order: with
    c = 32 n + 16 a + 8 b + 2 t + w inside its group, 32 n + 16 a + 4 t + 2 b + w."""
    return ((c >> 5) << 5) | (((c >> 4) & 1) << 4) | (((c >> 1) & 3) << 2) \
        | (((c >> 3) & 1) << 1) | (c & 1)


def wgmma_padded_keys(seqlen_k: int) -> int:
    """Key positions of a V^T in wgmma order: seqlen_k rounded up to a whole group of 32 (at
    least one group)."""
    return max(WGMMA_KEY_GROUP, -(-seqlen_k // WGMMA_KEY_GROUP) * WGMMA_KEY_GROUP)


def wgmma_vt_empty(shape, device: torch.device, zero: bool = False) -> torch.Tensor:
    """An uninitialised (or zeroed) V^T in wgmma key order for V of ``shape`` (b, s_k, h_k, d_v):
    a (b, s_pad, h_k, d_v) view of float8_e4m3fn storage (b, h_k, d_v, s_pad), s_pad =
    wgmma_padded_keys(s_k); key c lives at position wgmma_key_position(c), positions of no key
    must hold zeros (the kernel's P is 0 there, and 0 x NaN is NaN)."""
    b, s, h, d = shape
    make = torch.zeros if zero else torch.empty
    storage = make((b, h, d, wgmma_padded_keys(s)), dtype=FP8_DTYPE, device=device)
    return storage.permute(0, 3, 1, 2)


def quantized_empty(q_shape, k_shape, v_shape, block_m: int, block_n: int, v_wgmma: bool,
                    device: torch.device) -> Tuple[torch.Tensor, ...]:
    """The six outputs of the quantize pass, uninitialised: q8 (b, s_q, h, d) and k8
    (b, s_k, h_k, d) float8_e4m3fn contiguous; v8 for V of ``v_shape`` in wgmma key order
    (:func:`wgmma_vt_empty`, zeroed where the pass leaves padding positions: tiles of fewer
    than 32 keys, or no key) or keys contiguous (:func:`keys_contiguous_empty`); q_descale
    (b, h, cdiv(s_q, block_m)), k_descale and v_descale (b, h_k, cdiv(s_k, block_n)) float32.
    ``device`` may be "meta" (the layouts alone)."""
    b, s_q, h, _ = q_shape
    s_k, h_k = k_shape[1], k_shape[2]
    if v_wgmma:
        v8 = wgmma_vt_empty(v_shape, device, zero=block_n < WGMMA_KEY_GROUP or s_k == 0)
    else:
        v8 = keys_contiguous_empty(v_shape, device)
    f32 = torch.float32
    return (torch.empty(q_shape, dtype=FP8_DTYPE, device=device),
            torch.empty(k_shape, dtype=FP8_DTYPE, device=device), v8,
            torch.empty((b, h, -(-s_q // block_m)), dtype=f32, device=device),
            torch.empty((b, h_k, -(-s_k // block_n)), dtype=f32, device=device),
            torch.empty((b, h_k, -(-s_k // block_n)), dtype=f32, device=device))


def to_wgmma_order(v8: torch.Tensor) -> torch.Tensor:
    """V (b, s_k, h_k, d_v) float8_e4m3fn, any layout -> the same values in wgmma key order
    (wgmma_vt_empty's layout), with torch ops (the CPU path; CUDA has sm90/v_layout.py and the
    quantize pass writes the order directly)."""
    out = wgmma_vt_empty(v8.shape, v8.device, zero=True)
    pos = wgmma_key_position(torch.arange(v8.shape[1], device=v8.device))
    out.view(torch.uint8).index_copy_(1, pos, v8.view(torch.uint8))
    return out


def from_wgmma_order(v8w: torch.Tensor, seqlen_k: int) -> torch.Tensor:
    """The inverse of to_wgmma_order: (b, s_pad, h_k, d_v) in wgmma key order -> (b, seqlen_k,
    h_k, d_v) in key order, keys contiguous (keys_contiguous_empty's layout: the V a quantize
    pass writes without the wgmma order, so a backend reading it runs exactly as on that)."""
    b, _, h, d = v8w.shape
    pos = wgmma_key_position(torch.arange(seqlen_k, device=v8w.device))
    out = keys_contiguous_empty((b, seqlen_k, h, d), v8w.device)
    out.view(torch.uint8).copy_(v8w.view(torch.uint8).index_select(1, pos))
    return out


def block_index(positions: torch.Tensor, block_shift: int, n_blocks: int) -> torch.Tensor:
    """The scale block of each row / key position: ``min(pos >> block_shift, n_blocks - 1)``
    (block_shift 31 or more: one scale for every position)."""
    return torch.clamp(positions >> min(block_shift, 62), max=max(n_blocks - 1, 0))


# The format's meaning in torch (the public fp8.dequantize and the cpu backend's FP8 path).
def dequantize(x8: torch.Tensor, descale: torch.Tensor, block: int) -> torch.Tensor:
    """The real values of a block-quantized (b, s, h, d) tensor, float32 (``block`` rows per
    scale, a power of two)."""
    return dequantize_shift(x8, descale, block.bit_length() - 1)


def dequantize_shift(x8: torch.Tensor, descale: torch.Tensor, block_shift: int) -> torch.Tensor:
    """:func:`dequantize` with the kernels' convention: row i uses descale[:, :, min(i >>
    block_shift, n - 1)] (block_shift 31: one descale per (batch, head))."""
    s = x8.shape[1]
    idx = block_index(torch.arange(s, device=descale.device), block_shift, descale.shape[2])
    per_row = descale.float()[:, :, idx]  # (b, h, s)
    # contiguous: V may come keys-contiguous, the float32 attention wants unit last stride
    return x8.float().contiguous() * per_row.transpose(1, 2).unsqueeze(-1)


__all__ = ["E4M3_MAX", "FP8_DTYPE", "PASS_MAX_BLOCK", "P_SCALE", "P_SCALE_LOG2", "WGMMA_KEY_GROUP",
           "block_index", "dequantize", "dequantize_shift", "e4m3x4_widen_ptx",
           "from_wgmma_order", "hadamard", "hadamard_block", "keys_contiguous_empty",
           "quantized_empty", "to_wgmma_order", "wgmma_key_position", "wgmma_padded_keys", "wgmma_vt_empty"]
