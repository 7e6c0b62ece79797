"""The fused FP8 quantization pass: Q, K, V -> float8_e4m3fn with one scale per tile, Q and K
rotated by M = H · diag(signs) first (FlashAttention-3's block quantization + incoherent
processing; the semantics are :mod:`flashattn.cpu.fp8`'s, which this pass matches).

One program owns BLOCK rows of one (batch, head): it loads the (BLOCK, d) tile once, rotates
it in registers (``tl.dot`` with the ±1 block-diagonal Hadamard: the products are exact for
bf16 / fp16 inputs, the fp32 sums are exact to the last bit for d <= 256, and the tensor
cores make the O(d^2) product free next to the tile's memory traffic; a butterfly would need
log2(d) register shuffles), takes the tile's amax, scales, rounds to e4m3 and writes the fp8
tile and its descale. V is written transposed (keys contiguous: the layout FP8 wgmma needs
for the P·V operand), Q and K in their own layout.

``round_e4m3`` is the rounding the FP8 kernels use under the interpreter: its fp32 -> e4m3
conversion rounds ties away from zero and flushes small values (measured), so values are first
rounded to the e4m3 grid (round-to-nearest-even, like ``torch.Tensor.to(torch.float8_e4m3fn)``
and the GPU's ``cvt.rn.satfinite``) and then converted, which is exact. On the GPU the
hardware conversion does it in one instruction per pair.
"""
from __future__ import annotations

import functools
from typing import Optional

import torch
import triton
import triton.language as tl

from flashattn.fp8_format import (WGMMA_KEY_GROUP, hadamard, hadamard_block,
                                  keys_contiguous_empty, wgmma_vt_empty)
from flashattn.runtime.device import sm_count
from flashattn.runtime.launch import LaunchPlans
from flashattn.runtime.grid import cdiv, next_pow2

E4M3_MAX = tl.constexpr(448.0)


@triton.jit
def round_e4m3(x):
    """fp32 x (|x| <= 448) rounded to the nearest float8_e4m3fn value, ties to even, as fp32.

    e4m3 has 3 mantissa bits and a minimum normal exponent of -6, so the spacing at x is
    2^(max(e, -6) - 3) with e = floor(log2 |x|). Adding and subtracting 1.5 · 2^(spacing + 23)
    rounds to a multiple of the spacing in one IEEE (round-to-nearest-even) fp32 add."""
    bits = x.to(tl.int32, bitcast=True)
    e = ((bits >> 23) & 0xFF) - 127
    spacing = tl.maximum(e, -6) - 3
    magic = ((spacing + 23 + 127) << 23) | (1 << 22)
    c = magic.to(tl.float32, bitcast=True)
    return (x + c) - c


@triton.jit
def _quantize_tile(X, Out, Descale, h, h2, signs, signs2, tile, stride_xb, stride_xs,
                   stride_xh, stride_ob, stride_os, stride_oh, stride_od, seqlen, nheads,
                   n_blocks, inv_sqrt_block, HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr,
                   BLOCK: tl.constexpr, ROTATE: tl.constexpr, HALVES: tl.constexpr,
                   MIX: tl.constexpr, DOT_PREC: tl.constexpr, UPCAST: tl.constexpr,
                   EXACT_ROUND: tl.constexpr, WGMMA_ROWS: tl.constexpr):
    """One (BLOCK rows, head dim) tile of one (batch, head): tile = bh * n_blocks + block.

    WGMMA_ROWS (V for the Hopper FP8 forward): row r is stored at position
    wgmma_key_position(r) (fp8_format), and rows past seqlen up to the padded length (a
    multiple of 32, which the tiles cover when BLOCK >= 32) are stored as zeros.

    HALVES (BLOCK_D = 256, rotated): the tile as two 128-column halves x1, x2, so the ±1
    matrices in shared memory are 128 x 128 (a 256 x 256 one does not fit beside the tile).
    The block-diagonal H is diag(h, h2); the full 256 Sylvester block (MIX) is [[h, h],
    [h, -h]], so x · H = [(x1 + x2) h, (x1 - x2) h]."""
    pid_bh = tile // n_blocks
    pid_blk = tile % n_blocks
    off_b = pid_bh // nheads
    off_h = pid_bh % nheads
    rows = pid_blk * BLOCK + tl.arange(0, BLOCK)
    W: tl.constexpr = BLOCK_D // 2 if HALVES else BLOCK_D
    cols = tl.arange(0, W)
    x_base = (X + off_b.to(tl.int64) * stride_xb + off_h.to(tl.int64) * stride_xh
              + rows[:, None].to(tl.int64) * stride_xs)
    if WGMMA_ROWS:
        # key r = 32 n + 16 a + 8 b + 2 t + w -> position 32 n + 16 a + 4 t + 2 b + w
        out_rows = ((rows >> 5) << 5) | (((rows >> 4) & 1) << 4) | (((rows >> 1) & 3) << 2) \
            | (((rows >> 3) & 1) << 1) | (rows & 1)
        stored = (rows[:, None] < ((seqlen + 31) // 32) * 32) & (cols[None, :] < HEAD_DIM)
    else:
        out_rows = rows
        stored = (rows[:, None] < seqlen) & (cols[None, :] < HEAD_DIM)
    o_base = (Out + off_b.to(tl.int64) * stride_ob + off_h.to(tl.int64) * stride_oh
              + out_rows[:, None].to(tl.int64) * stride_os)
    inside = (rows[:, None] < seqlen) & (cols[None, :] < HEAD_DIM)
    x = tl.load(x_base + cols[None, :], mask=inside, other=0.0)
    if HALVES:
        inside2 = (rows[:, None] < seqlen) & (W + cols[None, :] < HEAD_DIM)
        x1 = x
        x2 = tl.load(x_base + W + cols[None, :], mask=inside2, other=0.0)
        if UPCAST:
            x1 = x1.to(tl.float32)
            x2 = x2.to(tl.float32)
        # products of 16-bit inputs and ±1 are exact, sums in fp32 (x1 + x2 formed first would
        # not fit 16 bits: it took a hi / lo split and four products, measured 74 us per
        # tensor at d = 256 on the H100 against ~48 for d = 128)
        y1 = tl.dot(x1, h, input_precision=DOT_PREC)
        if MIX:
            y2 = tl.dot(x2, h, input_precision=DOT_PREC)
            y1, y2 = y1 + y2, y1 - y2
        else:
            y2 = tl.dot(x2, h2, input_precision=DOT_PREC)
        y1 = y1 * inv_sqrt_block * signs[None, :]
        y2 = y2 * inv_sqrt_block * signs2[None, :]
        amax = tl.maximum(tl.max(tl.max(tl.abs(y1), 1), 0), tl.max(tl.max(tl.abs(y2), 1), 0))
    else:
        if ROTATE:
            # x · H (±1 entries, block-diagonal, zero past HEAD_DIM), then 1/sqrt(block), signs
            if UPCAST:
                x = x.to(tl.float32)
            y1 = tl.dot(x, h, input_precision=DOT_PREC)
            y1 = y1 * inv_sqrt_block * signs[None, :]
        else:
            y1 = x.to(tl.float32)
        amax = tl.max(tl.max(tl.abs(y1), 1), 0)
    descale = tl.where(amax > 0.0, amax / E4M3_MAX, 1.0)
    # multiply by the fp32 reciprocal (cpu/fp8.py does the same): a division per element
    # would cost ~10 instructions
    inv = 1.0 / descale
    _store_e4m3(o_base, cols, y1, inv, stored, stride_od, EXACT_ROUND)
    if HALVES:
        _store_e4m3(o_base, W + cols, y2, inv, inside2, stride_od, EXACT_ROUND)
    tl.store(Descale + pid_bh.to(tl.int64) * n_blocks + pid_blk, descale)


@triton.jit
def _store_e4m3(o_base, cols, y, inv, stored, stride_od, EXACT_ROUND: tl.constexpr):
    ys = tl.minimum(tl.maximum(y * inv, -E4M3_MAX), E4M3_MAX)
    if EXACT_ROUND:  # the interpreter's own conversion does not round to nearest even
        ys = round_e4m3(ys)
    tl.store(o_base + cols[None, :].to(tl.int64) * stride_od,
             ys.to(o_base.dtype.element_ty), mask=stored)


@triton.jit
def _quantize_kernel(X, Out, Descale, Had, Signs,
                     stride_xb, stride_xs, stride_xh,
                     stride_ob, stride_os, stride_oh, stride_od,
                     seqlen, nheads, n_blocks, n_tiles, inv_sqrt_block,
                     HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK: tl.constexpr,
                     ROTATE: tl.constexpr, HALVES: tl.constexpr, MIX: tl.constexpr,
                     DOT_PREC: tl.constexpr, UPCAST: tl.constexpr,
                     EXACT_ROUND: tl.constexpr, NUM_STAGES: tl.constexpr,
                     WGMMA_ROWS: tl.constexpr):
    """Persistent: each program walks tiles pid, pid + nprog, ... so Triton's pipeliner loads
    the next tile while this one is rotated, reduced and stored (one tile per program left
    the load latency exposed: 0.97 TB/s measured on the H100). Had: (BLOCK_D, BLOCK_D) ±1, or
    with HALVES (2, BLOCK_D / 2, BLOCK_D / 2)."""
    W: tl.constexpr = BLOCK_D // 2 if HALVES else BLOCK_D
    cols = tl.arange(0, W)
    h = cols  # (unused without ROTATE)
    h2 = cols
    signs = cols
    signs2 = cols
    if ROTATE:
        h = tl.load(Had + cols[:, None] * W + cols[None, :])
        signs = tl.load(Signs + cols, mask=cols < HEAD_DIM, other=0.0)
        if HALVES:
            h2 = tl.load(Had + W * W + cols[:, None] * W + cols[None, :])
            signs2 = tl.load(Signs + W + cols, mask=W + cols < HEAD_DIM, other=0.0)
        if UPCAST:
            h = h.to(tl.float32)
            h2 = h2.to(tl.float32)
    for tile in tl.range(tl.program_id(0), n_tiles, tl.num_programs(0), num_stages=NUM_STAGES):
        _quantize_tile(X, Out, Descale, h, h2, signs, signs2, tile, stride_xb, stride_xs,
                       stride_xh, stride_ob, stride_os, stride_oh, stride_od, seqlen, nheads,
                       n_blocks, inv_sqrt_block, HEAD_DIM, BLOCK_D, BLOCK, ROTATE, HALVES, MIX,
                       DOT_PREC, UPCAST, EXACT_ROUND, WGMMA_ROWS)


@functools.lru_cache(maxsize=32)
def _hadamard_pm1(head_dim: int, block_d: int, dtype: torch.dtype,
                  device: torch.device) -> torch.Tensor:
    """(block_d, block_d) block-diagonal Sylvester matrix of ±1 (blocks of head_dim's largest
    power-of-two divisor), zero past head_dim: the rotation before its 1/sqrt(block). Made
    once per device (a host-to-device copy per call would wait for the stream). Read-only."""
    n = hadamard_block(head_dim)
    h = torch.zeros(block_d, block_d, dtype=torch.float64)
    h[:head_dim, :head_dim] = hadamard(head_dim, torch.device("cpu"), torch.float64) * n ** 0.5
    h = h.round()
    if block_d > _HALF_MAX:  # the two diagonal 128 x 128 blocks (the kernel's HALVES)
        w = block_d // 2
        h = torch.stack([h[:w, :w], h[w:, w:]])
    return h.contiguous().to(device=device, dtype=dtype)


# the widest ±1 matrix the kernel keeps in shared memory beside its tile
_HALF_MAX = 128


def _launch(x: torch.Tensor, out: torch.Tensor, out_strides, descale: torch.Tensor,
            block: int, signs: Optional[torch.Tensor], interpret: bool,
            tuning: Optional[dict] = None, wgmma_rows: bool = False) -> None:
    """One tensor's pass. ``tuning`` (probes only): {"warps", "per_sm", "stages"} overrides."""
    b, s, h, d = x.shape
    block_d = max(16, next_pow2(d))
    rotate = signs is not None
    upcast = interpret or x.dtype == torch.float32
    had_dtype = torch.float32 if upcast else x.dtype
    had = _hadamard_pm1(d, block_d, had_dtype, x.device) if rotate else descale
    sg = signs if rotate else descale  # (float32 (d,) on x's device: api/fp8.py)
    n_blocks = cdiv(s, block)
    n_tiles = n_blocks * b * h
    # the (block, d) tile lives in registers: 8 warps from 16K elements on (d = 256 rotated
    # keeps 1168 bytes of stack with 8 warps, 512 with 16, AOT for sm_90; 8 measured faster
    # in the sweep below)
    big = block * block_d >= 16384
    warps = 8 if big else 4
    # programs per SM and pipeline stages, from a sweep on the H100 (probes/quantize_sweep.py,
    # 16k tokens, hidden 2048; benchmarks/NOTES.md, session 14). A rotated tile of 16K
    # elements takes ~186 registers a thread at 8 warps: one program fits per SM, and three
    # stages keep the next tiles' loads in flight (d = 128: 65 -> 48 us, 2.11 TB/s). V
    # (no rotation, a transposing store) gains nothing from stages and wants more programs
    # instead (d = 128: 61 -> 43 us, 2.33 TB/s).
    if rotate and block_d > _HALF_MAX:  # two 128-column halves (d = 256: 74 -> 61 us)
        per_sm, stages = 2, 2
    elif rotate:
        per_sm, stages = (1, 3) if big else (2, 3)
    else:
        per_sm, stages = (2, 1) if big else (4, 1)
    if interpret:
        stages = 1
    if tuning:
        warps = tuning.get("warps", warps)
        per_sm = tuning.get("per_sm", per_sm)
        stages = tuning.get("stages", stages)
    programs = n_tiles if interpret else min(n_tiles, per_sm * sm_count(x.device))
    scalars = (x.stride(0), x.stride(1), x.stride(2), *out_strides, s, h, n_blocks, n_tiles,
               float(hadamard_block(d)) ** -0.5)
    constexprs = dict(
        HEAD_DIM=d, BLOCK_D=block_d, BLOCK=block, ROTATE=rotate,
        HALVES=rotate and block_d > _HALF_MAX, MIX=hadamard_block(d) > _HALF_MAX,
        DOT_PREC="ieee" if upcast else "tf32", UPCAST=upcast, EXACT_ROUND=interpret,
        NUM_STAGES=stages, WGMMA_ROWS=wgmma_rows, num_warps=warps)
    tensors = (x, out, descale, had, sg)
    # a launch plan per call shape (no binder or argument specialisation per launch, as the
    # other kernels). The call stays host-bound on the H100 host: ~200 us of Python (six
    # allocations, three launches, checks) against 135-165 us of kernels at 16k tokens
    # (benchmarks/NOTES.md, session 14)
    key = (scalars, tuple(constexprs.items()), programs, x.dtype, out.dtype)
    _PLANS.launch(key, tensors, lambda: (_quantize_kernel, (programs,), tensors + scalars,
                                         constexprs))


_PLANS = LaunchPlans(slots=tuple(range(5)))


def quantize_qkv(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, signs: Optional[torch.Tensor],
                 block_m: int, block_n: int, interpret: bool = False, v_wgmma: bool = False):
    """The fused pass: (q8, k8, v8, q_descale, k_descale, v_descale) as cpu.fp8.fp8_quantize
    returns them (v8 with keys contiguous: ``fp8_format.keys_contiguous_empty``; with
    ``v_wgmma`` in wgmma key order instead, ``fp8_format.wgmma_vt_empty``'s layout, which the
    Hopper FP8 forward reads without a copy). q (b, s_q, h, d), k (b, s_k, h_k, d), v (b, s_k,
    h_k, d_v), last dim contiguous; signs (d,) ±1 or None."""
    outs = []
    for x, block, rot in ((q, block_m, signs), (k, block_n, signs), (v, block_n, None)):
        b, s, h, d = x.shape
        wgmma_rows = v_wgmma and x is v
        if wgmma_rows:  # (tiles of fewer than 32 rows leave the padding to a zeroed buffer)
            x8 = wgmma_vt_empty(v.shape, v.device, zero=block_n < WGMMA_KEY_GROUP or s == 0)
        elif x is v:
            x8 = keys_contiguous_empty(v.shape, v.device)
        else:
            x8 = torch.empty(x.shape, dtype=torch.float8_e4m3fn, device=x.device)
        descale = torch.empty((b, h, cdiv(s, block)), dtype=torch.float32, device=x.device)
        if x.numel():
            strides = (x8.stride(0), x8.stride(1), x8.stride(2), x8.stride(3))
            _launch(x, x8, strides, descale, block, rot, interpret, wgmma_rows=wgmma_rows)
        elif descale.numel():
            descale.fill_(1.0)
        outs.append((x8, descale))
    (q8, qs), (k8, ks), (v8, vs) = outs
    return q8, k8, v8, qs, ks, vs


__all__ = ["quantize_qkv", "round_e4m3"]
