"""The fused FP8 quantization pass: Q, K, V -> float8_e4m3fn with one scale per tile, Q and K
rotated by M = H · diag(signs) first (FlashAttention-3's block quantization + incoherent
processing; the semantics are :mod:`flashattn.backends.cpu.fp8`'s, which this pass matches).

One program owns BLOCK rows of one (batch, head): it loads the (BLOCK, d) tile once, rotates
it in registers (``tl.dot`` with the ±1 block-diagonal Hadamard: the products are exact for
bf16 / fp16 inputs, the fp32 sums are exact to the last bit for d <= 256, and the tensor
cores make the O(d^2) product free next to the tile's memory traffic; a butterfly would need
log2(d) register shuffles), takes the tile's amax, scales, rounds to e4m3 and writes the fp8
tile and its descale. V is written transposed (keys contiguous: the layout FP8 wgmma needs
for the P·V operand), Q and K in their own layout. Rotated tiles of d = 96 / 192 / 256 go as
W-column chunks with one W x W ±1 block (``_quantize_tile_chunks``: no padding to a power of
two, and d = 256 as H_4 ⊗ H_64 with a butterfly across chunks); other d > 128 as two halves.

``round_e4m3`` is the rounding the FP8 kernels use under the interpreter: its fp32 -> e4m3
conversion rounds ties away from zero and flushes small values (measured), so values are first
rounded to the e4m3 grid (round-to-nearest-even, like ``torch.Tensor.to(torch.float8_e4m3fn)``
and the GPU's ``cvt.rn.satfinite``) and then converted, which is exact. On the GPU the
hardware conversion does it in one instruction per pair.
"""
from __future__ import annotations

import functools
from typing import Optional, Tuple

import torch
import triton
import triton.language as tl

from flashattn.fp8_format import WGMMA_KEY_GROUP, hadamard, hadamard_block, quantized_empty
from flashattn.runtime.device import sm_count
from flashattn.runtime.launch import LaunchPlan, LaunchPlans
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
    if WGMMA_ROWS and BLOCK >= 32:
        # the tile's rows are storage positions: position p = 32 n + 16 a + 4 t + 2 b + w
        # holds key 32 n + 16 a + 8 b + 2 t + w (a permutation inside each group of 32, so
        # the tile holds the same keys and the same amax). Gathering whole rows (d values) keeps
        # the loads coalesced, and the transposed store runs along contiguous positions: the
        # permuted store (below, for tiles under 32 rows) compiled to 64 one-byte stores and
        # 255 registers a thread at d = 128 (AOT, 2026-11-24).
        src_rows = ((rows >> 5) << 5) | (((rows >> 4) & 1) << 4) | (((rows >> 1) & 1) << 3) \
            | (((rows >> 2) & 3) << 1) | (rows & 1)
        out_rows = rows
        stored_rows = rows < ((seqlen + 31) // 32) * 32
    elif WGMMA_ROWS:
        # key r = 32 n + 16 a + 8 b + 2 t + w -> position 32 n + 16 a + 4 t + 2 b + w
        src_rows = rows
        out_rows = ((rows >> 5) << 5) | (((rows >> 4) & 1) << 4) | (((rows >> 1) & 3) << 2) \
            | (((rows >> 3) & 1) << 1) | (rows & 1)
        stored_rows = rows < ((seqlen + 31) // 32) * 32
    else:
        src_rows = rows
        out_rows = rows
        stored_rows = rows < seqlen
    x_base = (X + off_b.to(tl.int64) * stride_xb + off_h.to(tl.int64) * stride_xh
              + src_rows[:, None].to(tl.int64) * stride_xs)
    o_base = (Out + off_b.to(tl.int64) * stride_ob + off_h.to(tl.int64) * stride_oh
              + out_rows[:, None].to(tl.int64) * stride_os)
    stored = stored_rows[:, None] & (cols[None, :] < HEAD_DIM)
    inside = (src_rows[:, None] < seqlen) & (cols[None, :] < HEAD_DIM)
    x = tl.load(x_base + cols[None, :], mask=inside, other=0.0)
    if HALVES:
        inside2 = (src_rows[:, None] < seqlen) & (W + cols[None, :] < HEAD_DIM)
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
        stored2 = stored_rows[:, None] & (W + cols[None, :] < HEAD_DIM)
        _store_e4m3(o_base, W + cols, y2, inv, stored2, stride_od, EXACT_ROUND)
    tl.store(Descale + pid_bh.to(tl.int64) * n_blocks + pid_blk, descale)


@triton.jit
def _quantize_tile_chunks(X, Out, Descale, h, signs0, signs1, signs2, signs3, tile, stride_xb,
                          stride_xs, stride_xh, stride_ob, stride_os, stride_oh, stride_od,
                          seqlen, nheads, n_blocks, inv_sqrt_block, W: tl.constexpr,
                          CHUNKS: tl.constexpr, BLOCK: tl.constexpr, DOT_PREC: tl.constexpr,
                          UPCAST: tl.constexpr, EXACT_ROUND: tl.constexpr):
    """A rotated Q / K tile as CHUNKS W-column chunks, each rotated by the one W x W ±1
    Sylvester block h (signs_c: the chunk's W signs):

    - CHUNKS = 3 (d = 3 W: 96, 192): H is block-diagonal, chunk c's output is x_c · h.
      _quantize_tile pads such a tile to the next power of two (128 / 256 columns, a quarter
      of them masked off); the chunks touch only the d real columns.
    - CHUNKS = 4 (d = 256, W = 64): H = H_4 ⊗ H_64 (Sylvester), so with z_k = x_k · h the
      output chunks are the 4-point butterfly of the z_k: y_c = sum_k H_4[k, c] z_k (two adds
      per element). One 64 x 64 matrix in shared memory instead of _quantize_tile's two
      128 x 128 halves frees room for a deeper load pipeline."""
    pid_bh = tile // n_blocks
    pid_blk = tile % n_blocks
    off_b = pid_bh // nheads
    off_h = pid_bh % nheads
    rows = pid_blk * BLOCK + tl.arange(0, BLOCK)
    cols = tl.arange(0, W)
    inside = (rows < seqlen)[:, None]
    x_base = (X + off_b.to(tl.int64) * stride_xb + off_h.to(tl.int64) * stride_xh
              + rows[:, None].to(tl.int64) * stride_xs + cols[None, :])
    x0 = tl.load(x_base, mask=inside, other=0.0)
    x1 = tl.load(x_base + W, mask=inside, other=0.0)
    x2 = tl.load(x_base + 2 * W, mask=inside, other=0.0)
    if UPCAST:
        x0 = x0.to(tl.float32)
        x1 = x1.to(tl.float32)
        x2 = x2.to(tl.float32)
    z0 = tl.dot(x0, h, input_precision=DOT_PREC)
    z1 = tl.dot(x1, h, input_precision=DOT_PREC)
    z2 = tl.dot(x2, h, input_precision=DOT_PREC)
    if CHUNKS == 4:
        x3 = tl.load(x_base + 3 * W, mask=inside, other=0.0)
        if UPCAST:
            x3 = x3.to(tl.float32)
        z3 = tl.dot(x3, h, input_precision=DOT_PREC)
        a = z0 + z1
        b = z0 - z1
        c = z2 + z3
        e = z2 - z3
        z0 = a + c
        z1 = b + e
        z2 = a - c
        z3 = b - e
        y3 = z3 * inv_sqrt_block * signs3[None, :]
    y0 = z0 * inv_sqrt_block * signs0[None, :]
    y1 = z1 * inv_sqrt_block * signs1[None, :]
    y2 = z2 * inv_sqrt_block * signs2[None, :]
    amax = tl.maximum(tl.maximum(tl.max(tl.max(tl.abs(y0), 1), 0),
                                 tl.max(tl.max(tl.abs(y1), 1), 0)),
                      tl.max(tl.max(tl.abs(y2), 1), 0))
    if CHUNKS == 4:
        amax = tl.maximum(amax, tl.max(tl.max(tl.abs(y3), 1), 0))
    descale = tl.where(amax > 0.0, amax / E4M3_MAX, 1.0)
    inv = 1.0 / descale
    o_base = (Out + off_b.to(tl.int64) * stride_ob + off_h.to(tl.int64) * stride_oh
              + rows[:, None].to(tl.int64) * stride_os)
    _store_e4m3(o_base, cols, y0, inv, inside, stride_od, EXACT_ROUND)
    _store_e4m3(o_base, W + cols, y1, inv, inside, stride_od, EXACT_ROUND)
    _store_e4m3(o_base, 2 * W + cols, y2, inv, inside, stride_od, EXACT_ROUND)
    if CHUNKS == 4:
        _store_e4m3(o_base, 3 * W + cols, y3, inv, inside, stride_od, EXACT_ROUND)
    tl.store(Descale + pid_bh.to(tl.int64) * n_blocks + pid_blk, descale)


@triton.jit
def _quantize_qk_tile(X, Out, Descale, h, h2, signs, signs1, signs2, signs3, tile, stride_xb,
                      stride_xs, stride_xh, stride_ob, stride_os, stride_oh, stride_od, seqlen,
                      nheads, n_blocks, inv_sqrt_block, HEAD_DIM: tl.constexpr,
                      BLOCK_D: tl.constexpr, BLOCK: tl.constexpr, W: tl.constexpr,
                      CHUNKS: tl.constexpr, ROTATE: tl.constexpr, HALVES: tl.constexpr,
                      MIX: tl.constexpr, DOT_PREC: tl.constexpr, UPCAST: tl.constexpr,
                      EXACT_ROUND: tl.constexpr):
    """A Q or K tile: in chunks (_quantize_tile_chunks) when CHUNKS, else _quantize_tile (rows
    in storage order). ``signs`` are chunk 0's (or the whole tile's), ``signs2`` chunk 2's or
    the second half's."""
    if CHUNKS:
        _quantize_tile_chunks(X, Out, Descale, h, signs, signs1, signs2, signs3, tile, stride_xb,
                              stride_xs, stride_xh, stride_ob, stride_os, stride_oh, stride_od,
                              seqlen, nheads, n_blocks, inv_sqrt_block, W, CHUNKS, BLOCK,
                              DOT_PREC, UPCAST, EXACT_ROUND)
    else:
        _quantize_tile(X, Out, Descale, h, h2, signs, signs2, tile, stride_xb, stride_xs,
                       stride_xh, stride_ob, stride_os, stride_oh, stride_od, seqlen, nheads,
                       n_blocks, inv_sqrt_block, HEAD_DIM, BLOCK_D, BLOCK, ROTATE, HALVES, MIX,
                       DOT_PREC, UPCAST, EXACT_ROUND, False)


@triton.jit
def _store_e4m3(o_base, cols, y, inv, stored, stride_od, EXACT_ROUND: tl.constexpr):
    ys = tl.minimum(tl.maximum(y * inv, -E4M3_MAX), E4M3_MAX)
    if EXACT_ROUND:  # the interpreter's own conversion does not round to nearest even
        ys = round_e4m3(ys)
    tl.store(o_base + cols[None, :].to(tl.int64) * stride_od,
             ys.to(o_base.dtype.element_ty), mask=stored)


@triton.jit
def _quantize_qkv_kernel(Q, K, V, Q8, K8, V8, QS, KS, VS, Had, Signs,
                         stride_qb, stride_qs, stride_qh, stride_kb, stride_ks, stride_kh,
                         stride_vb, stride_vs, stride_vh,
                         stride_q8b, stride_q8s, stride_q8h, stride_q8d,
                         stride_k8b, stride_k8s, stride_k8h, stride_k8d,
                         stride_v8b, stride_v8s, stride_v8h, stride_v8d,
                         seqlen_q, seqlen_k, nheads, nheads_k, q_blocks, k_blocks,
                         q_tiles, k_tiles, v_tiles, inv_sqrt_block,
                         HEAD_DIM: tl.constexpr, HEAD_DIM_V: tl.constexpr,
                         BLOCK_D: tl.constexpr, BLOCK_DV: tl.constexpr,
                         BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                         ROTATE: tl.constexpr, HALVES: tl.constexpr, MIX: tl.constexpr,
                         DOT_PREC: tl.constexpr, UPCAST: tl.constexpr,
                         EXACT_ROUND: tl.constexpr, STAGES_QK: tl.constexpr,
                         STAGES_V: tl.constexpr, V_WGMMA: tl.constexpr,
                         QK_LOOPS: tl.constexpr, V_LOOP: tl.constexpr,
                         CHUNKS: tl.constexpr = 0):
    """The whole pass in one launch: Q's tiles, then K's, then V's, dealt round-robin over the
    programs as one list (tile t of the concatenation goes to program t % nprog), so no
    program gets the extra tile of all three. Persistent: each program walks its tiles, and
    Triton's pipeliner loads the next tile while this one is rotated, reduced and stored (one
    tile per program left the load latency exposed: 0.97 TB/s measured on the H100). Had:
    (BLOCK_D, BLOCK_D) ±1, or with HALVES (2, BLOCK_D / 2, BLOCK_D / 2); Signs (HEAD_DIM,)."""
    W: tl.constexpr = HEAD_DIM // CHUNKS if CHUNKS else (BLOCK_D // 2 if HALVES else BLOCK_D)
    cols = tl.arange(0, W)
    h = cols  # (unused without ROTATE)
    h2 = cols
    signs = cols
    signs2 = cols
    signs1 = cols
    signs3 = cols
    if ROTATE:  # (W, W) ±1: the tile's matrix, HALVES' first half or CHUNKS' one block
        h = tl.load(Had + cols[:, None] * W + cols[None, :])
        if CHUNKS:  # each chunk's W signs (chunks cover exactly HEAD_DIM)
            signs = tl.load(Signs + cols)
            signs1 = tl.load(Signs + W + cols)
            signs2 = tl.load(Signs + 2 * W + cols)
            if CHUNKS == 4:
                signs3 = tl.load(Signs + 3 * W + cols)
        else:
            signs = tl.load(Signs + cols, mask=cols < HEAD_DIM, other=0.0)
            if HALVES:
                h2 = tl.load(Had + W * W + cols[:, None] * W + cols[None, :])
                signs2 = tl.load(Signs + W + cols, mask=W + cols < HEAD_DIM, other=0.0)
        if UPCAST:
            h = h.to(tl.float32)
            h2 = h2.to(tl.float32)
    pid = tl.program_id(0)
    nprog = tl.num_programs(0)
    if QK_LOOPS:
        for tile in tl.range(pid, q_tiles, nprog, num_stages=STAGES_QK):
            _quantize_qk_tile(Q, Q8, QS, h, h2, signs, signs1, signs2, signs3, tile, stride_qb,
                              stride_qs, stride_qh, stride_q8b, stride_q8s, stride_q8h,
                              stride_q8d, seqlen_q, nheads, q_blocks, inv_sqrt_block, HEAD_DIM,
                              BLOCK_D, BLOCK_M, W, CHUNKS, ROTATE, HALVES, MIX, DOT_PREC, UPCAST,
                              EXACT_ROUND)
        k_first = (pid + nprog - q_tiles % nprog) % nprog  # (K tile t: entry q_tiles + t)
        for tile in tl.range(k_first, k_tiles, nprog, num_stages=STAGES_QK):
            _quantize_qk_tile(K, K8, KS, h, h2, signs, signs1, signs2, signs3, tile, stride_kb,
                              stride_ks, stride_kh, stride_k8b, stride_k8s, stride_k8h,
                              stride_k8d, seqlen_k, nheads_k, k_blocks, inv_sqrt_block, HEAD_DIM,
                              BLOCK_D, BLOCK_N, W, CHUNKS, ROTATE, HALVES, MIX, DOT_PREC, UPCAST,
                              EXACT_ROUND)
    if V_LOOP:
        v_first = (pid + nprog - (q_tiles + k_tiles) % nprog) % nprog
        for tile in tl.range(v_first, v_tiles, nprog, num_stages=STAGES_V):
            _quantize_tile(V, V8, VS, h, h2, signs, signs2, tile, stride_vb, stride_vs,
                           stride_vh, stride_v8b, stride_v8s, stride_v8h, stride_v8d, seqlen_k,
                           nheads_k, k_blocks, inv_sqrt_block, HEAD_DIM_V, BLOCK_DV, BLOCK_N,
                           False, False, False, DOT_PREC, UPCAST, EXACT_ROUND, V_WGMMA)


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


def chunks(head_dim: int) -> int:
    """How many W-column chunks a rotated tile of ``head_dim`` goes in (_quantize_tile_chunks),
    0 for none: 3 when d = 3 W with W its Sylvester block (d = 96, 192; 48 too), 4 at d = 256
    (H_4 ⊗ H_64)."""
    w = hadamard_block(head_dim)
    if head_dim == 3 * w and w >= 16:
        return 3
    return 4 if head_dim == 256 else 0


def launch_params(head_dim: int, block: int, rotate: bool, elem_bytes: int = 2
                  ) -> Tuple[int, int, int, int, Optional[int]]:
    """(warps, programs per SM, stages of the Q / K loops, stages of the V loop, register cap
    or None).

    The (block, d) tile lives in registers: 8 warps from 16K elements (d = 256 rotated keeps
    1168 bytes of stack with 8 warps, 512 with 16, AOT for sm_90; 8 measured faster). Programs
    per SM and stages from sweeps on the H100 (probes/quantize_sweep.py, 16k tokens, hidden
    2048; benchmarks/NOTES.md, 2026-11-24). A rotated 128 x 128 tile takes ~180 registers
    a thread at 8 warps, so one program fitted per SM; capped at 128 (no spills, AOT) with two
    stages (112 KB of shared memory), two programs fit, and one's amax / layout conversion /
    store overlaps the other's: 132.7 -> 123.8 us at d = 128, 16k tokens (2026-11-24). The
    rotated loops decide the programs, and the V loop (no rotation, a transposing store)
    takes its stages from the sweep at that program count."""
    block_d = max(16, next_pow2(head_dim))
    big = block * block_d >= 16384
    warps = 8 if big else 4
    # (a pipelined V loop ran at half speed: 263-290 us against 143 for the whole pass with
    # one stage, d = 128, in a 2026-11-24 sweep; 2 / 3 stages 150 / 138 against 132 in a
    # later one that day)
    if rotate and (block > 128 or (elem_bytes == 4 and head_dim > 192)):
        # one stage: 3 of a 256 x 128 bf16 tile asked for 240 KB of shared memory (of 227),
        # float32 d = 256 for 276 KB; with one, every head dim at block 256 (16-bit) takes
        # <= 104 KB and float32 <= 208 KB (AOT for sm_90, 2026-11-25)
        return warps, 1, 1, 1, None
    if rotate and chunks(head_dim) == 3:  # d = 96, 192 (a 2026-11-24 sweep)
        if block * head_dim > 16384:  # d = 192: 197 registers, 3 stages in 170 KB
            return warps, 1, 3, 1, None
        # d = 96: 120 registers under a 128 cap with one stage (16-bit inputs): two programs per
        # SM (float32 inputs take 169: one)
        return (warps, 2, 1, 1, 128) if elem_bytes == 2 else (warps, 1, 1, 1, None)
    if rotate and chunks(head_dim) == 4:  # d = 256 in 64-column chunks: 3 stages in 208 KB
        return warps, 1, 3, 1, None
    if rotate and block_d > _HALF_MAX:  # two 128-column halves; 3 stages do not fit
        return warps, 1, 2, 1, None
    # (only 16-bit inputs of a power-of-two head dim: under the cap d = 96 spilled 72 bytes,
    # float32 inputs (an fp32 product) 4.5 KB)
    if rotate and block * block_d == 16384 and head_dim == block_d and elem_bytes == 2:
        return warps, 2, 2, 1, 128
    if rotate:
        return (warps, 1, 3, 1, None) if big else (warps, 2, 3, 1, None)
    return (warps, 2, 1, 1, None) if big else (warps, 4, 1, 1, None)


def _launch(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, q8: torch.Tensor,
            k8: torch.Tensor, v8: torch.Tensor, q_descale: torch.Tensor,
            k_descale: torch.Tensor, v_descale: torch.Tensor, signs: Optional[torch.Tensor],
            block_m: int, block_n: int, interpret: bool, v_wgmma: bool,
            tuning: Optional[dict] = None, plan_out: Optional[list] = None) -> None:
    """The pass, one launch. (An earlier version gave V in wgmma key order with d_v > 128 its
    own 4-warp launch: the permuted store ran at half speed at 8 warps. Since 2026-11-24 the
    V loop gathers its keys and stores along contiguous positions (``_quantize_tile``), and
    the one launch at 8 warps measured 144 us against 157 for the two at d = 256, 16k
    tokens, H100.) ``tuning`` (probes only): {"warps", "per_sm", "stages", "stages_v"}
    "maxnreg" overrides of :func:`launch_params`; {"chunks": 0} pads d = 3 W tiles to a
    power of two and runs d = 256 as two 128-column halves, as before 2026-11-24 (A/B);
    {"only": "qk" | "v"} launches only those tiles (the parts' times).
    ``plan_out``: gets (the launch plan or None, the ±1 matrix, the signs argument): what a
    :class:`QuantizeCall` replays."""
    b, s_q, h, d = q.shape
    s_k, h_k, d_v = k.shape[1], k.shape[2], v.shape[3]
    block_d, block_dv = max(16, next_pow2(d)), max(16, next_pow2(d_v))
    rotate = signs is not None
    upcast = interpret or q.dtype == torch.float32
    had_dtype = torch.float32 if upcast else q.dtype
    n_chunks = (tuning or {}).get("chunks", chunks(d)) if rotate else 0
    if n_chunks:  # the one W x W Sylvester block
        had = _hadamard_pm1(d // n_chunks, d // n_chunks, had_dtype, q.device)
    else:
        had = _hadamard_pm1(d, block_d, had_dtype, q.device) if rotate else q_descale
    sg = signs if rotate else q_descale  # (float32 (d,) on q's device: api/fp8_quantize.py)
    q_blocks, k_blocks = cdiv(s_q, block_m), cdiv(s_k, block_n)
    q_tiles, k_tiles = q_blocks * b * h, k_blocks * b * h_k
    v_tiles = k_tiles
    only = (tuning or {}).get("only")  # (probes: "qk" or "v", the other tiles not launched)
    if only == "qk":
        v_tiles = 0
    elif only == "v":
        q_tiles = k_tiles = 0
    params = launch_params(d, max(block_m, block_n), rotate, q.element_size())
    if tuning:
        params = tuple(tuning.get(name, x) for name, x in
                       zip(("warps", "per_sm", "stages", "stages_v", "maxnreg"), params))
    tensors = (q, k, v, q8, k8, v8, q_descale, k_descale, v_descale, had, sg)
    strides = (*q.stride()[:3], *k.stride()[:3], *v.stride()[:3], *q8.stride(), *k8.stride(),
               *v8.stride(), s_q, s_k, h, h_k, q_blocks, k_blocks)
    constexprs = dict(
        HEAD_DIM=d, HEAD_DIM_V=d_v, BLOCK_D=block_d, BLOCK_DV=block_dv, BLOCK_M=block_m,
        BLOCK_N=block_n, ROTATE=rotate, HALVES=rotate and block_d > _HALF_MAX,
        MIX=hadamard_block(d) > _HALF_MAX, DOT_PREC="ieee" if upcast else "tf32",
        UPCAST=upcast, EXACT_ROUND=interpret, V_WGMMA=v_wgmma, CHUNKS=n_chunks)
    inv_sqrt_block = float(hadamard_block(d)) ** -0.5
    plan = _launch_tiles(tensors, strides, (q_tiles, k_tiles, v_tiles, inv_sqrt_block),
                         constexprs, params, interpret)
    if plan_out is not None:
        plan_out.append((plan, had, sg))


def _launch_tiles(tensors: tuple, strides: tuple, tiles: tuple, constexprs: dict,
                  params: Tuple[int, int, int, int, Optional[int]], interpret: bool
                  ) -> Optional[LaunchPlan]:
    """One launch of the pass over ``tiles`` = (Q tiles, K tiles, V tiles, 1 / sqrt(block))
    (zero tiles: that loop is compiled out) with ``params`` = :func:`launch_params`'s.
    Returns the launch plan that launched or was recorded (None: Triton's own path ran)."""
    warps, per_sm, stages, stages_v, maxnreg = params
    if interpret:
        stages = stages_v = 1
    q_tiles, k_tiles, v_tiles, _ = tiles
    n_tiles = q_tiles + k_tiles + v_tiles
    if n_tiles == 0:
        return None
    programs = n_tiles if interpret else min(n_tiles, per_sm * sm_count(tensors[0].device))
    constexprs = dict(constexprs, QK_LOOPS=q_tiles + k_tiles > 0, V_LOOP=v_tiles > 0,
                      STAGES_QK=stages, STAGES_V=stages_v, num_warps=warps)
    if maxnreg is not None:
        constexprs["maxnreg"] = maxnreg
    scalars = strides + tiles
    # a launch plan per call shape (no binder or argument specialisation per launch, as the
    # other kernels)
    key = (scalars, tuple(constexprs.items()), programs, tensors[0].dtype)
    return _PLANS.launch(key, tensors, lambda: (_quantize_qkv_kernel, (programs,),
                                                tensors + scalars, constexprs))


_PLANS = LaunchPlans(slots=tuple(range(11)))


def quantize_qkv(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, signs: Optional[torch.Tensor],
                 block_m: int, block_n: int, interpret: bool = False, v_wgmma: bool = False):
    """The fused pass: (q8, k8, v8, q_descale, k_descale, v_descale) as cpu.fp8.fp8_quantize
    returns them (v8 with keys contiguous: ``fp8_format.keys_contiguous_empty``; with
    ``v_wgmma`` in wgmma key order instead, ``fp8_format.wgmma_vt_empty``'s layout, which the
    Hopper FP8 forward reads without a copy). q (b, s_q, h, d), k (b, s_k, h_k, d), v (b, s_k,
    h_k, d_v), last dim contiguous; signs (d,) ±1 or None. One launch over the three tensors'
    tiles."""
    q8, k8, v8, q_descale, k_descale, v_descale = quantized_empty(
        q.shape, k.shape, v.shape, block_m, block_n, v_wgmma, q.device)
    if q_descale.numel() + k_descale.numel():
        # (an empty tensor has no tiles, and its scales, if any (head dim 0), are written 1)
        _launch(q, k, v, q8, k8, v8, q_descale, k_descale, v_descale, signs, block_m, block_n,
                interpret, v_wgmma)
    return q8, k8, v8, q_descale, k_descale, v_descale


class QuantizeCall:
    """:func:`quantize_qkv` for one call signature, into outputs the caller places, its launch
    replayed: ``flash_attn_fp8_func``'s recorded call (``dispatch.Fp8Call``) keeps the pass's
    outputs, V in wgmma key order, in a reused per-stream workspace; a repeated
    ``fp8.quantize`` (``dispatch.Fp8QuantizeCall``) allocates them fresh, V keys contiguous.

    :meth:`record` launches the pass on the given output tensors and keeps the launch plan;
    :meth:`replay` relaunches it with addresses only (no view, no binder).
    Contract (the caller's key): a replayed call has q, k, v of the recorded shapes, strides,
    dtype, device and 16-byte alignment, and its outputs at 16-byte-aligned addresses laid out
    as the recorded ones were. V in wgmma order needs ``block_n`` >= 32 keys: the pass then
    writes the zeros of V's padding key positions itself (a reused workspace is not zeroed)."""

    def __init__(self, signs: Optional[torch.Tensor], block_m: int, block_n: int,
                 v_wgmma: bool = True) -> None:
        if v_wgmma and block_n < WGMMA_KEY_GROUP:
            raise ValueError(f"QuantizeCall needs block_n >= {WGMMA_KEY_GROUP}, got {block_n}")
        self.signs, self.block_m, self.block_n, self.v_wgmma = signs, block_m, block_n, v_wgmma
        self.plan: Optional[LaunchPlan] = None
        self._held: tuple = ()  # the ±1 matrix and the signs argument of the recorded launch
        self._const_addresses: Tuple[int, ...] = ()

    def record(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
               outs: Tuple[torch.Tensor, ...]) -> None:
        """Run the pass into ``outs`` = (q8, k8, v8 (in wgmma key order with ``v_wgmma``),
        q_descale, k_descale, v_descale) and keep its plan (None when Triton's own launch path
        ran)."""
        recorded: list = []
        _launch(q, k, v, *outs, self.signs, self.block_m, self.block_n, False, self.v_wgmma,
                plan_out=recorded)
        plan, had, sg = recorded[0]
        self.plan = plan
        if self.signs is not None:  # (else both stand-ins are q_descale: never read)
            self._held = (had, sg)
            self._const_addresses = (had.data_ptr(), sg.data_ptr())

    def replay(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
               addresses: Tuple[int, ...]) -> bool:
        """The recorded launch over q, k, v into the outputs at ``addresses`` (the six of
        :meth:`record`'s ``outs``). False, with nothing launched, when there is no plan or it
        cannot replay now (``LaunchPlan.replay``)."""
        if self.plan is None:
            return False
        consts = self._const_addresses or (addresses[3], addresses[3])
        return self.plan.replay((q.data_ptr(), k.data_ptr(), v.data_ptr(), *addresses, *consts))


__all__ = ["QuantizeCall", "launch_params", "quantize_qkv", "round_e4m3"]
