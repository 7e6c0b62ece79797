"""Score modification, visibility mask and the online-softmax update of the Hopper forward;
the backward's probabilities and score gradients from the saved row statistics.

Scores live in the wgmma accumulator layout (fp32, one warpgroup: HALF_M x BLOCK_N). The
running max ``m_i`` is kept in log2 units (``softmax_scale * log2(e)`` folded in), so the
probabilities are one ``exp2(s * s_unit - m)`` per element (an FMA and an MUFU.EX2).
"""
from __future__ import annotations

from triton.experimental import gluon
from triton.experimental.gluon import language as gl

LOG2E = gl.constexpr(1.4426950408889634)
LN2 = gl.constexpr(0.6931471805599453)


@gluon.jit
def tanh_f32(x):
    """tanh through exp2 and a fast (2-ulp) divide: ~1e-7 relative, where tanh.approx.f32 would
    give ~5e-4 (too coarse once multiplied by the softcap); an IEEE divide costs registers."""
    e = gl.exp2(x * (2.0 * LOG2E))
    return 1.0 - gl.fdiv(2.0, e + 1.0)


@gluon.jit
def apply_softcap(s, softcap_inv, softcap_log2):
    """softcap * tanh(s * scale / softcap), returned in log2 units (times log2(e))."""
    return tanh_f32(s * softcap_inv) * softcap_log2


@gluon.jit
def mask_scores(s, row0, n_start, seqlen_q, seqlen_k, window_left, window_right,
                S_LAYOUT: gl.constexpr, HALF_M: gl.constexpr, BLOCK_N: gl.constexpr,
                HAS_LEFT: gl.constexpr, HAS_RIGHT: gl.constexpr):
    """-inf where key col is invisible from query row (bounds, causal, sliding window)."""
    # Per-row visible key interval [lo, hi], then one compare per score against it.
    rows = row0 + (seqlen_k - seqlen_q) + gl.arange(0, HALF_M, layout=gl.SliceLayout(1, S_LAYOUT))
    cols = n_start + gl.arange(0, BLOCK_N, layout=gl.SliceLayout(0, S_LAYOUT))
    hi = gl.full([HALF_M], 0, gl.int32, gl.SliceLayout(1, S_LAYOUT)) + (seqlen_k - 1)
    if HAS_RIGHT:
        hi = gl.minimum(hi, rows + window_right)
    c2 = gl.expand_dims(cols, 0)
    vis = c2 <= gl.expand_dims(hi, 1)
    if HAS_LEFT:
        vis = vis & (c2 >= gl.expand_dims(rows - window_left, 1))
    return gl.where(vis, s, float("-inf"))


# FP8: P is computed 2^8 times larger, so its e4m3 cast for P·V uses the normal range
# (fp8_format.P_SCALE_LOG2; the row sum carries the same factor and cancels it)
P_SCALE_LOG2 = gl.constexpr(8.0)


@gluon.jit
def online_softmax(s, m_i, l_i, s_unit, P_LOG2_OFFSET: gl.constexpr = 0.0,
                   ROW_SUM: gl.constexpr = True):
    """One key block of the online softmax.

    s: scores (HALF_M, BLOCK_N) fp32, multiplied by ``s_unit`` to reach log2 units;
    m_i, l_i: running max (log2 units) and sum, (HALF_M,) fp32.
    P_LOG2_OFFSET (FP8: 8): p is 2^offset larger (l too), alpha unchanged.
    ROW_SUM False: l_i is returned as given (the caller sums P on the tensor core instead).
    Returns (p, m_new, l_new, alpha): p = exp2(s * s_unit - m_new) (unnormalised
    probabilities, 0 where s = -inf) and alpha = exp2(m_i - m_new), the factor that rescales
    the accumulator. Rows whose max is still -inf use 0 instead, so they give p = 0, no NaN.
    """
    m_blk = gl.max(s, axis=1) * s_unit
    m_new = gl.maximum(m_i, m_blk)
    m_use = gl.where(m_new == float("-inf"), 0.0, m_new)
    if P_LOG2_OFFSET != 0.0:
        p = gl.exp2(s * s_unit - gl.expand_dims(m_use - P_LOG2_OFFSET, 1))
    else:
        p = gl.exp2(s * s_unit - gl.expand_dims(m_use, 1))
    alpha = gl.exp2(m_i - m_use)
    if ROW_SUM:
        l_new = l_i * alpha + gl.sum(p, axis=1)
    else:
        l_new = l_i
    return p, m_new, l_new, alpha


@gluon.jit
def probs_t(s, lse2, qk_scale, softcap_inv, softcap_log2, HAS_SOFTCAP: gl.constexpr):
    """The backward's P^T from scores S^T (keys x queries, fp32) and the queries' lse2
    (lse * log2(e), +inf for rows that see no key: P = 0 there): exp2(score in log2 units -
    lse2). Returns (p, t): t = tanh(s * scale / softcap) with softcap (ds_t needs it), else s."""
    if HAS_SOFTCAP:
        t = tanh_f32(s * softcap_inv)
        p = gl.exp2(t * softcap_log2 - gl.expand_dims(lse2, 0))
    else:
        t = s
        p = gl.exp2(s * qk_scale - gl.expand_dims(lse2, 0))
    return p, t


@gluon.jit
def ds_t(p, dp, delta, t, HAS_SOFTCAP: gl.constexpr):
    """dS^T = P^T * (dP^T - delta) (delta = rowsum(dO * O) per query), times the softcap's
    derivative 1 - tanh^2 when there is one (t from probs_t)."""
    ds = p * (dp - gl.expand_dims(delta, 0))
    if HAS_SOFTCAP:
        ds = ds * (1.0 - t * t)
    return ds
