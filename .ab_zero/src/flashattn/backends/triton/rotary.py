"""Rotary embedding and the in-place append of new keys / values into a KV cache (Triton).

One kernel does both jobs: it reads rows of a (b, s, nheads, d) tensor, optionally rotates
their first ``rotary_dim`` features, and stores them either to a dense tensor of the same
layout (the rotated q) or into a cache at cache positions ``cache_seqlens[b] + i``:

- ``DEST = 0`` dense (b, s, nheads, d);
- ``DEST = 1`` contiguous cache (b_cache, s_cache, h_k, d), row ``cache_batch_idx[b]`` (or b);
- ``DEST = 2`` paged cache (num_blocks, page_size, h_k, d), page
  ``block_table[b, pos // page_size]``, slot ``pos % page_size`` (any page size >= 1).

Rotation at position ``pos`` with ``cos/sin`` (s_ro, rotary_dim / 2), in fp32:
interleaved (GPT-J) pairs features (2k, 2k+1); GPT-NeoX pairs (k, k + rotary_dim / 2);
both use angle k: ``(x0, x1) -> (x0 cos - x1 sin, x1 cos + x0 sin)``. Features past
rotary_dim pass through. Positions are ``cache_seqlens[b] + i * pos_step`` (pos_step 0 puts
every query token at cache_seqlens, flash-attn's rule for non-causal, non-local q).
A position past the cos/sin table is not read (those rows keep their values unrotated):
the table length is the caller's contract, checked on the host where values are free.

An FP8 cache (``float8_e4m3fn``, ``descale`` (b, nheads) float32) takes each row as it would be
stored in x's dtype (rotated, rounded to that dtype) divided by its (batch row, head)'s
descale, saturated to +-448 and rounded to nearest even: ``torch``'s
``(x.float() / descale).clamp(-448, 448).to(torch.float8_e4m3fn)``, bit for bit. An FP8 x
(rows already in the cache's units; the caller passes descale 1) skips the rounding to x's
own dtype: its float32 rotation is rounded once, saturating, so an unrotated row is stored
unchanged and a rotated one cannot overflow to NaN.
"""
from __future__ import annotations

from typing import Optional

import torch
import triton
import triton.language as tl

from flashattn.backends.triton import config
from flashattn.backends.triton.fp8_quantize import E4M3_MAX, round_e4m3
from flashattn.runtime.launch import launch_jit


@triton.jit
def _rotary_store_kernel(X, Dst, Cos, Sin, Seqlens, BatchIdx, BlockTable, CuSeq, RotBase,
                         Descale, stride_xb, stride_xm, stride_xh,
                         stride_db, stride_dm, stride_dh,
                         stride_btb, stride_cos, stride_sin, stride_desc_b, stride_desc_h,
                         seqlen_x, nheads, seqlen_ro, rot_half, pos_step,
                         dst_rows, dst_cap, packed_rows,
                         HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_H: tl.constexpr,
                         HAS_ROTARY: tl.constexpr, INTERLEAVED: tl.constexpr,
                         DEST: tl.constexpr, HAS_BATCH_IDX: tl.constexpr,
                         PAGE_SIZE: tl.constexpr, VARLEN: tl.constexpr,
                         HAS_ROT_BASE: tl.constexpr, QUANT: tl.constexpr,
                         EXACT_ROUND: tl.constexpr):
    pid = tl.program_id(0)
    off_b = pid // seqlen_x
    off_i = pid % seqlen_x
    offs_h = tl.program_id(1) * BLOCK_H + tl.arange(0, BLOCK_H)
    offs_d = tl.arange(0, BLOCK_D)
    h_ok = offs_h < nheads
    d_ok = offs_d < HEAD_DIM

    # packed rows (VARLEN): sequence b owns rows [cu[b], cu[b + 1]) of x (and of a dense dst);
    # seqlen_x is then a bound of any sequence's rows (clamped to the packed length)
    row = off_i.to(tl.int64)
    if VARLEN:
        start = tl.minimum(tl.maximum(tl.load(CuSeq + off_b), 0), packed_rows)
        end = tl.minimum(tl.maximum(tl.load(CuSeq + off_b + 1), start), packed_rows)
        if off_i >= end - start:
            return
        row = start.to(tl.int64) + off_i
    base_pos = tl.load(Seqlens + off_b)
    pos = base_pos + off_i * pos_step
    # the rotation angle's position: the cache position, or rotary_seqlens[b] + i (FA3)
    rot_pos = pos
    if HAS_ROT_BASE:
        rot_pos = tl.load(RotBase + off_b) + off_i * pos_step
    # the positions as vectors too: Triton 3.9's interpreter rejects masks built from a tensor
    # and a scalar bool ("mask has unsupported dtype")
    pos_v = offs_d * 0 + pos
    rot_pos_v = offs_d * 0 + rot_pos

    x_row = X + off_b.to(tl.int64) * stride_xb + row * stride_xm \
        + offs_h.to(tl.int64)[:, None] * stride_xh
    x = tl.load(x_row + offs_d[None, :], mask=h_ok[:, None] & d_ok[None, :], other=0.0)
    if HAS_ROTARY:
        rot_dim = 2 * rot_half
        if INTERLEAVED:
            pair = offs_d // 2
            partner = offs_d ^ 1
            first = (offs_d % 2) == 0
        else:
            pair = tl.where(offs_d < rot_half, offs_d, offs_d - rot_half)
            partner = tl.where(offs_d < rot_half, offs_d + rot_half, offs_d - rot_half)
            first = offs_d < rot_half
        in_rot = (offs_d < rot_dim) & (rot_pos_v < seqlen_ro) & (rot_pos_v >= 0)
        rp = tl.maximum(rot_pos, 0).to(tl.int64)
        cos = tl.load(Cos + rp * stride_cos + pair, mask=in_rot, other=1.0)
        sin = tl.load(Sin + rp * stride_sin + pair, mask=in_rot, other=0.0)
        x_p = tl.load(x_row + partner[None, :], mask=h_ok[:, None] & in_rot[None, :], other=0.0)
        xf = x.to(tl.float32)
        xpf = x_p.to(tl.float32)
        sign = tl.where(first, -1.0, 1.0)
        c = cos.to(tl.float32)[None, :]
        sn = sin.to(tl.float32)[None, :]
        rotated = xf * c + sign[None, :] * xpf * sn
        out = tl.where(in_rot[None, :], rotated, xf)
    else:
        out = x
    if QUANT:
        # the row as the 16/32-bit append would store it, then e4m3 with its head's descale
        desc = tl.load(Descale + off_b.to(tl.int64) * stride_desc_b
                       + offs_h.to(tl.int64) * stride_desc_h, mask=h_ok, other=1.0)
        if X.dtype.element_ty != tl.float8e4nv:
            out = out.to(X.dtype.element_ty)
        out = out.to(tl.float32) / desc[:, None]
        out = tl.minimum(tl.maximum(out, -E4M3_MAX), E4M3_MAX)
        if EXACT_ROUND:  # the interpreter's fp32 -> e4m3 conversion does not round to even
            # (round_e4m3's add and subtract turns a tiny negative value into +0; torch and the
            # GPU's conversion keep the sign: -0. The interpreter negates as 0 - x, so the
            # sign comes from a multiply; the sign bit, not out < 0, so that -0 stays -0)
            r = round_e4m3(out)
            out = tl.where(out.to(tl.int32, bitcast=True) < 0, tl.abs(r) * -1.0, r)

    # destination row (64-bit: page * page stride can pass 2**31). Metadata read from the
    # device is never trusted with an address: a cache position outside [0, dst_cap) writes
    # nothing, a batch index or page number is clamped to the destination's rows (dst_rows).
    # Bad metadata then gives a wrong answer, never a write outside the cache; the checked mode
    # (flashattn.checks()) turns it into an error first.
    in_dst = d_ok
    if DEST == 0:
        d_row = off_b.to(tl.int64) * stride_db + row * stride_dm
    elif DEST == 1:
        cache_b = off_b
        if HAS_BATCH_IDX:
            cache_b = tl.minimum(tl.maximum(tl.load(BatchIdx + off_b), 0), dst_rows - 1)
        in_dst = (pos_v >= 0) & (pos_v < dst_cap)
        d_row = cache_b.to(tl.int64) * stride_db + pos.to(tl.int64) * stride_dm
    else:
        in_dst = (pos_v >= 0) & (pos_v < dst_cap)
        safe_pos = tl.minimum(tl.maximum(pos, 0), dst_cap - 1)
        page = tl.load(BlockTable + off_b.to(tl.int64) * stride_btb + safe_pos // PAGE_SIZE)
        page = tl.minimum(tl.maximum(page, 0), dst_rows - 1)
        d_row = page.to(tl.int64) * stride_db + (safe_pos % PAGE_SIZE).to(tl.int64) * stride_dm
    d_ptrs = Dst + d_row + offs_h.to(tl.int64)[:, None] * stride_dh + offs_d[None, :]
    tl.store(d_ptrs, out.to(Dst.dtype.element_ty), mask=h_ok[:, None] & d_ok[None, :]
             & in_dst[None, :])


def rotary_store(x: torch.Tensor, dst: torch.Tensor, seqlens: torch.Tensor, *,
                 cos: Optional[torch.Tensor] = None, sin: Optional[torch.Tensor] = None,
                 interleaved: bool = True, pos_step: int = 1,
                 batch_idx: Optional[torch.Tensor] = None,
                 block_table: Optional[torch.Tensor] = None, to_cache: bool = True,
                 cu_seqlens: Optional[torch.Tensor] = None, max_seqlen: int = 0,
                 rot_base: Optional[torch.Tensor] = None,
                 descale: Optional[torch.Tensor] = None) -> None:
    """Rotate (if ``cos`` is given) the rows of ``x`` (b, s, nh, d) and store them in ``dst``.

    ``to_cache=False``: dst is dense like x (the rotated q). Otherwise dst is a cache
    (b_cache, s_cache, nh, d) written at seq ``seqlens[b] + i`` of row ``batch_idx[b]`` (or
    b), or a paged cache (num_blocks, page_size, nh, d) through ``block_table``.
    seqlens: (b,) int32 on the device; cos / sin (s_ro, rotary_dim / 2).
    ``cu_seqlens`` (b + 1,) int32: x is packed (total, nh, d), sequence b's rows
    ``[cu[b], cu[b + 1])`` (at most ``max_seqlen``; a dense dst is packed the same way).
    ``rot_base`` (b,) int32: rotate at ``rot_base[b] + i * pos_step`` instead of the
    positions the rows are stored at (FlashAttention-3's ``rotary_seqlens``).
    ``descale`` (b, nh) float32: dst is a float8_e4m3fn cache, x's rows are quantized into it
    (x / descale, saturated, round to nearest even).
    """
    varlen = cu_seqlens is not None
    packed_rows = 0
    if varlen:
        packed_rows = x.shape[0]
        x = x.unsqueeze(0)
        if not to_cache:
            dst = dst.unsqueeze(0)
        b, s, nh, d = cu_seqlens.shape[0] - 1, int(max_seqlen), x.shape[2], x.shape[3]
    else:
        b, s, nh, d = x.shape
    if b * s * nh == 0:
        return
    paged = block_table is not None
    dest = 0 if not to_cache else (2 if paged else 1)
    has_rot = cos is not None
    block_d = config.next_pow2(d)
    block_h = max(1, min(config.next_pow2(nh), max(1, 4096 // block_d)))
    grid = (b * s, config.cdiv(nh, block_h))
    dummy = seqlens
    launch_jit(_rotary_store_kernel, grid, (
        x, dst, cos if has_rot else x, sin if has_rot else x, seqlens,
        batch_idx if batch_idx is not None else dummy,
        block_table if paged else dummy,
        cu_seqlens if varlen else dummy,
        rot_base if rot_base is not None else dummy,
        descale if descale is not None else dummy,
        0 if varlen else x.stride(0), x.stride(1), x.stride(2),
        0 if varlen and not to_cache else dst.stride(0), dst.stride(1), dst.stride(2),
        block_table.stride(0) if paged else 0,
        cos.stride(0) if has_rot else 0, sin.stride(0) if has_rot else 0,
        descale.stride(0) if descale is not None else 0,
        descale.stride(1) if descale is not None else 0,
        s, nh, cos.shape[0] if has_rot else 0, cos.shape[1] if has_rot else 0, int(pos_step),
        # destination rows (cache batch / pages) and positions per row (contiguous: s_cache;
        # paged: the block table's pages x page size)
        dst.shape[0], (block_table.shape[1] * dst.shape[1]) if paged else dst.shape[1],
        packed_rows), dict(
        HEAD_DIM=d, BLOCK_D=block_d, BLOCK_H=block_h,
        HAS_ROTARY=has_rot, INTERLEAVED=bool(interleaved), DEST=dest,
        HAS_BATCH_IDX=batch_idx is not None, PAGE_SIZE=dst.shape[1] if paged else 1,
        VARLEN=varlen, HAS_ROT_BASE=rot_base is not None, QUANT=descale is not None,
        EXACT_ROUND=config.INTERPRET, num_warps=4,
    ))


__all__ = ["rotary_store"]
