"""V^T for the FP8 forward, keys contiguous and in wgmma order, in one pass (Triton).

The FP8 P·V product reads V^T (b, h_k, d_v, s_pad) K-major with its keys permuted inside each
group of 32 (fp8_format.wgmma_key_position: the order in which P's accumulator registers
serve as the operand, so P needs no shuffles). This kernel writes that layout from V in any
layout ((b, s_k, h_k, d_v) strides: the FA3 API's (b, s, h, d), or quantize's keys-contiguous
V^T), one (batch, head, 64 positions) tile per program: the tile's rows are gathered in the
permuted key order (each a contiguous d_v vector), and stored along the positions (contiguous),
so both sides are coalesced and Triton transposes the tile through shared memory. Positions of keys past s_k (up to
s_pad, a multiple of 32) are written as zeros. (The same layout built with torch ops, an
``index_copy_`` of the bytes, took 0.60 ms for 32 MB on the H100 against 0.23 ms for a plain
transposing copy; this pass takes 0.03 ms.)
"""
from __future__ import annotations

from typing import Optional

import torch
import triton
import triton.language as tl

from flashattn.fp8_format import FP8_DTYPE, wgmma_padded_keys
from flashattn.runtime.launch import LaunchPlans, launch_jit


@triton.jit
def _wgmma_vt_kernel(V, Out, s_k, s_pad, n_heads, stride_vb, stride_vs, stride_vh, stride_vd,
                     HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_S: tl.constexpr):
    pid_bh = tl.program_id(0)
    pid_s = tl.program_id(1)
    off_b = pid_bh // n_heads
    off_h = pid_bh % n_heads
    # destination positions k (contiguous: the store runs along them) and the key each holds:
    # k = 32 n + 16 a + 4 t + 2 b + w  <-  key 32 n + 16 a + 8 b + 2 t + w
    pos = pid_s * BLOCK_S + tl.arange(0, BLOCK_S)
    keys = ((pos >> 5) << 5) | (((pos >> 4) & 1) << 4) | (((pos >> 1) & 1) << 3) \
        | (((pos >> 2) & 3) << 1) | (pos & 1)
    dims = tl.arange(0, BLOCK_D)
    src = V + off_b.to(tl.int64) * stride_vb + off_h.to(tl.int64) * stride_vh \
        + keys.to(tl.int64)[:, None] * stride_vs + dims.to(tl.int64)[None, :] * stride_vd
    # keys past s_k (up to s_pad) load as zeros
    tile = tl.load(src, mask=(keys[:, None] < s_k) & (dims[None, :] < HEAD_DIM), other=0)
    dst = Out + (pid_bh.to(tl.int64) * HEAD_DIM + dims.to(tl.int64)[None, :]) * s_pad \
        + pos.to(tl.int64)[:, None]
    tl.store(dst, tile, mask=(pos[:, None] < s_pad) & (dims[None, :] < HEAD_DIM))


@triton.jit
def _wgmma_vt_varlen_kernel(V, Out, cu_k, Used, n_seqs, total_k, s_total, n_heads, stride_vs,
                            stride_vh, stride_vd, HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr,
                            BLOCK_S: tl.constexpr, HAS_USED: tl.constexpr):
    """One (sequence, head, BLOCK_S positions) tile of the packed V^T: sequence b's keys from
    position start(b) = 32 (b + cu_k[b] // 32) in wgmma order (its first Used[b] with
    HAS_USED: keys past seqused_k are not read), zeros from its end up to start(b + 1)
    (s_total for the last one)."""
    pid_bh = tl.program_id(0)
    pid_s = tl.program_id(1)
    b = pid_bh // n_heads
    off_h = pid_bh % n_heads
    # (offsets clamped to the tensor: whatever cu_k holds, nothing outside V or Out is touched)
    k0 = tl.minimum(tl.maximum(tl.load(cu_k + b), 0), total_k)
    k1 = tl.minimum(tl.maximum(tl.load(cu_k + b + 1), 0), total_k)
    seq_len = tl.maximum(k1 - k0, 0)
    if HAS_USED:
        seq_len = tl.minimum(seq_len, tl.maximum(tl.load(Used + b), 0))
    start = 32 * (b + k0 // 32)
    end = tl.where(b + 1 < n_seqs, 32 * (b + 1 + k1 // 32), s_total)
    local = pid_s * BLOCK_S + tl.arange(0, BLOCK_S)
    keys = ((local >> 5) << 5) | (((local >> 4) & 1) << 4) | (((local >> 1) & 1) << 3) \
        | (((local >> 2) & 3) << 1) | (local & 1)
    dims = tl.arange(0, BLOCK_D)
    src = V + off_h.to(tl.int64) * stride_vh + (k0 + keys).to(tl.int64)[:, None] * stride_vs \
        + dims.to(tl.int64)[None, :] * stride_vd
    tile = tl.load(src, mask=(keys[:, None] < seq_len) & (dims[None, :] < HEAD_DIM), other=0)
    pos = start + local
    dst = Out + (off_h.to(tl.int64) * HEAD_DIM + dims.to(tl.int64)[None, :]) * s_total \
        + pos.to(tl.int64)[:, None]
    keep = (pos < tl.minimum(end, s_total)) & (pos >= 0)
    tl.store(dst, tile, mask=keep[:, None] & (dims[None, :] < HEAD_DIM))


def varlen_vt_positions(n_seqs: int, total_k: int) -> int:
    """Key positions of a packed V^T (wgmma_ordered_vt_varlen): sequence b starts at
    32 (b + cu_k[b] // 32) <= 32 (n_seqs - 1) + cu_k[b], so 32 (n_seqs + total_k // 32) covers
    every sequence's keys (a multiple of 32: TMA's 16-byte row stride holds)."""
    return 32 * (n_seqs + total_k // 32)


def wgmma_ordered_vt_varlen(v8: torch.Tensor, cu_seqlens_k: torch.Tensor, max_seqlen_k: int,
                            block_n: int, seqused_k: Optional[torch.Tensor] = None
                            ) -> torch.Tensor:
    """Packed V (total_k, h_k, d_v) float8_e4m3fn, any strides, and its int32 (b + 1,)
    offsets -> a (1, s_total, h_k, d_v) view of a (1, h_k, d_v, s_total) V^T in which sequence
    b's keys start at position 32 (b + cu_seqlens_k[b] // 32) in wgmma key order (module doc),
    so every key block of a sequence starts on a whole key group, as the FP8 forward's P·V
    needs. Positions between one sequence's keys and the next one's are zeros (the forward's
    key blocks read up to ``block_n`` positions past a sequence's end; P is 0 there, and
    0 x NaN would be NaN); with ``seqused_k`` (int32 (b,), contiguous) only the first
    seqused_k[b] keys are copied and the unused ones are zeros too (unused cache slots may hold
    anything). s_total = varlen_vt_positions(b, total_k); the lengths stay on the device
    (``max_seqlen_k``, the caller's bound, sizes the grid)."""
    total_k, h, d = v8.shape
    n_seqs = cu_seqlens_k.shape[0] - 1
    s_total = varlen_vt_positions(n_seqs, total_k)
    out = torch.empty((1, h, d, s_total), dtype=torch.uint8, device=v8.device)
    if out.numel() and n_seqs > 0:
        src = v8.view(torch.uint8)
        block_s = 64
        # a sequence's region is at most its length + 63 positions; its key blocks read up to
        # block_n past its end
        span = max_seqlen_k + 64 + block_n
        # a repeated shape replays its launch plan (no binder per call)
        key = (v8.shape, src.stride(), v8.device, n_seqs, max_seqlen_k, block_n)
        tensors = (src, out, cu_seqlens_k) + (() if seqused_k is None else (seqused_k,))
        _VARLEN_PLANS[seqused_k is not None].launch(key, tensors, lambda: (
            _wgmma_vt_varlen_kernel, (n_seqs * h, triton.cdiv(span, block_s)),
            (src, out, cu_seqlens_k, seqused_k, n_seqs, total_k, s_total, h, *src.stride()),
            dict(HEAD_DIM=d, BLOCK_D=triton.next_power_of_2(d), BLOCK_S=block_s,
                 HAS_USED=seqused_k is not None, num_warps=4)))
    return out.view(FP8_DTYPE).permute(0, 3, 1, 2)


# wgmma_ordered_vt_varlen's launch plans by whether seqused_k is given; slots: V's bytes, the
# output, the offsets (and seqused_k)
_VARLEN_PLANS = {False: LaunchPlans(slots=(0, 1, 2)), True: LaunchPlans(slots=(0, 1, 2, 3))}


def wgmma_ordered_vt(v8: torch.Tensor, into: Optional[torch.Tensor] = None,
                     plan_out: Optional[list] = None) -> torch.Tensor:
    """V (b, s_k, h_k, d_v) float8_e4m3fn, any strides -> a (b, s_pad, h_k, d_v) view of a
    (b, h_k, d_v, s_pad) tensor in wgmma key order (see module doc).

    ``into``: that (b, h_k, d_v, s_pad) tensor (uint8 or float8_e4m3fn, contiguous), placed by
    the caller (a recorded call's workspace: ``dispatch.Fp8DescaleCall``); ``plan_out`` gets
    the launch plan, whose slots are (V, the output) as device addresses (None when Triton's own
    launch path ran, or nothing was launched)."""
    b, s, h, d = v8.shape
    s_pad = wgmma_padded_keys(s)
    out = (torch.empty((b, h, d, s_pad), dtype=torch.uint8, device=v8.device) if into is None
           else into.view(torch.uint8))
    plan = None
    if out.numel():
        src = v8.view(torch.uint8)
        block_s = 64
        plan = launch_jit(_wgmma_vt_kernel, (b * h, triton.cdiv(s_pad, block_s)),
                          (src, out, s, s_pad, h, *src.stride()),
                          dict(HEAD_DIM=d, BLOCK_D=triton.next_power_of_2(d), BLOCK_S=block_s,
                               num_warps=4), plan_slots=None if plan_out is None else (0, 1))
    if plan_out is not None:
        plan_out.append(plan)
    return out.view(FP8_DTYPE).permute(0, 3, 1, 2)


class VtCall:
    """:func:`wgmma_ordered_vt` for one call signature, into memory the caller places (FA3's
    FP8 API as a recorded call: ``dispatch.Fp8DescaleCall``). :meth:`record` launches and
    keeps the plan; :meth:`replay` relaunches with addresses.

    Contract (the caller's key): a replayed call has V of the recorded shape, strides and
    16-byte alignment, and a contiguous destination of the recorded shape at a 16-byte-aligned
    address."""

    def __init__(self) -> None:
        self.plan = None

    def record(self, v8: torch.Tensor, into: torch.Tensor) -> None:
        """Write V^T in wgmma key order into ``into`` (b, h_k, d_v, s_pad) and keep the plan."""
        recorded: list = []
        wgmma_ordered_vt(v8, into=into, plan_out=recorded)
        self.plan = recorded[0]

    def replay(self, v_address: int, into_address: int) -> bool:
        """The recorded launch from V at ``v_address`` into ``into_address``. False, with
        nothing launched, when there is no plan or it cannot replay now."""
        return self.plan is not None and self.plan.replay((v_address, into_address))


__all__ = ["VtCall", "varlen_vt_positions", "wgmma_ordered_vt", "wgmma_ordered_vt_varlen"]
