"""Row statistics for the Hopper backward (plain Triton: a bandwidth-bound pass).

For every (batch, head, query row) of a padded (b, h, s_q_pad) layout (s_q_pad = s_q rounded
up to the backward's BLOCK_M, so the kernel's loads of a query block need no mask):

    lse2  = lse * log2(e)           +inf where lse = -inf (the row sees no key) and on padding
    delta = rowsum(dO * O)  (fp32)   0 where lse = -inf and on padding rows

With lse2 = +inf the backward's P = exp2(S * scale - lse2) is exactly 0: such rows add
nothing to dK / dV / dQ and produce no NaN.

The same pass zeroes the fp32 dQ workspace the Gluon kernel then reduce-adds into (each
program its query block's rows, all padded head-dim columns): one launch and one Python
allocation path fewer than a separate ``torch.zeros`` (the bytes written are the same). (A
packed backward's dK / dV keys that no tile covers are cleared by
``varlen_rows.clear_uncovered_keys``, which writes only those keys; this pass zeroed all of
dK and dV before 2026-11-28.)
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from flashattn.backends.sm90.bwd_postprocess import workspace_strides
from flashattn.runtime.grid import cdiv, next_pow2
from flashattn.runtime.launch import LaunchPlans



@triton.jit
def _row_stats_kernel(Out, DO, Lse, Lse2, Delta, DQAcc, stride_ob, stride_om, stride_oh,
                      stride_dob, stride_dom, stride_doh, stride_acc_bh, stride_acc_s,
                      stride_acc_d, n_heads, seqlen_q, seqlen_q_pad,
                      HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_M: tl.constexpr,
                      ACC_TRANSPOSED: tl.constexpr):
    # (batch, head) on grid axis 0: b * h can pass the 65535 limit of axis 1
    bh = tl.program_id(0)
    pid_m = tl.program_id(1)
    b = bh // n_heads
    h = bh % n_heads
    rows = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    cols = tl.arange(0, BLOCK_D)
    ok = (rows[:, None] < seqlen_q) & (cols[None, :] < HEAD_DIM)
    o = tl.load(Out + b.to(tl.int64) * stride_ob + h.to(tl.int64) * stride_oh
                + rows[:, None].to(tl.int64) * stride_om + cols[None, :], mask=ok, other=0.0)
    do = tl.load(DO + b.to(tl.int64) * stride_dob + h.to(tl.int64) * stride_doh
                 + rows[:, None].to(tl.int64) * stride_dom + cols[None, :], mask=ok, other=0.0)
    delta = tl.sum(o.to(tl.float32) * do.to(tl.float32), 1)
    lse = tl.load(Lse + bh.to(tl.int64) * seqlen_q + rows, mask=rows < seqlen_q,
                  other=float("-inf"))
    lse2 = tl.where(lse == float("-inf"), float("inf"), lse * 1.4426950408889634)
    # a row that sees no key has P = 0 everywhere, so its delta is never needed; 0 keeps
    # dS = P (dP - delta) at 0 when its dO holds Inf / NaN (padding rows of a packed call)
    delta = tl.where(lse == float("-inf"), 0.0, delta)
    base = bh.to(tl.int64) * seqlen_q_pad
    tl.store(Lse2 + base + rows, lse2, mask=rows < seqlen_q_pad)
    tl.store(Delta + base + rows, delta, mask=rows < seqlen_q_pad)
    # this block's rows of the dQ workspace, every padded column; the tile runs along the
    # workspace's contiguous dim (s when transposed, d otherwise) so the stores coalesce
    acc = DQAcc + bh.to(tl.int64) * stride_acc_bh
    if ACC_TRANSPOSED:
        tile = (cols[:, None].to(tl.int64) * stride_acc_d
                + rows[None, :].to(tl.int64) * stride_acc_s)
        tl.store(acc + tile, tl.zeros([BLOCK_D, BLOCK_M], tl.float32),
                 mask=rows[None, :] < seqlen_q_pad)
    else:
        tile = (rows[:, None].to(tl.int64) * stride_acc_s
                + cols[None, :].to(tl.int64) * stride_acc_d)
        tl.store(acc + tile, tl.zeros([BLOCK_M, BLOCK_D], tl.float32),
                 mask=rows[:, None] < seqlen_q_pad)


def row_stats(out: torch.Tensor, dout: torch.Tensor, lse: torch.Tensor, seqlen_q_pad: int,
              dq_acc: torch.Tensor, transposed: bool):
    """(lse2, delta), float32 (b, h, seqlen_q_pad) each (views of one allocation); out/dout
    (b, s_q, h, d) with unit last stride, lse float32 (b, h, s_q) contiguous. Zeroes
    ``dq_acc``, the fp32 dQ workspace (b, h, seqlen_q_pad, d_pad), or (b, h, d_pad,
    seqlen_q_pad) when ``transposed``, d_pad = next_pow2(d), contiguous; seqlen_q_pad a
    multiple of 64."""
    batch, seqlen_q, n_heads, head_dim = out.shape
    stats = torch.empty((2, batch, n_heads, seqlen_q_pad), dtype=torch.float32,
                        device=out.device)
    lse2, delta = stats[0], stats[1]
    block_m = 64
    stride_bh, stride_s, stride_d = workspace_strides(dq_acc, transposed)
    key = (out.shape, out.stride(), dout.stride(), out.dtype, dout.dtype, out.device,
           seqlen_q_pad, dq_acc.shape, dq_acc.stride(), transposed)
    tensors = (out, dout, lse, lse2, delta, dq_acc)
    _PLANS.launch(key, tensors, lambda: (
        _row_stats_kernel, (batch * n_heads, cdiv(seqlen_q_pad, block_m)), (
            out, dout, lse, lse2, delta, dq_acc, out.stride(0), out.stride(1),
            out.stride(2), dout.stride(0), dout.stride(1), dout.stride(2), stride_bh, stride_s,
            stride_d, n_heads, seqlen_q, seqlen_q_pad),
        dict(HEAD_DIM=head_dim, BLOCK_D=next_pow2(head_dim), BLOCK_M=block_m,
             ACC_TRANSPOSED=transposed)))
    return lse2, delta


# launch plans by call shape (runtime/launch.py); slots: out, dout, lse, lse2, delta, the dQ
# workspace
_PLANS = LaunchPlans(slots=range(6))
