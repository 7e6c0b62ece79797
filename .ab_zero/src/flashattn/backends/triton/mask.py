"""Tile helpers shared by the forward and backward Triton kernels.

Everything that decides *which* scores exist and *what* they are lives here once:
key visibility (causal / sliding window, bottom-right aligned), score modification
(scale, softcap, ALiBi), the dropout decision and the key / query block ranges they imply.
The kernels inline these; where a program's sequence lives is prologue.py's.

Conventions (see docs/internals.md):
- ``offs_m`` are query row indices (i), ``offs_n`` key column indices (j); ``diag = s_k - s_q``.
- Scores are produced in log2 units (multiplied by log2(e)) so the softmax uses ``exp2``.
- Helpers take the tile orientation through their broadcasting of offs_m / offs_n, so the
  backward kernel can call them on transposed tiles (rows = keys) by passing
  ``offs_m[None, :]`` and ``offs_n[:, None]``.
"""
import triton
import triton.language as tl

LOG2E = tl.constexpr(1.4426950408889634)
LN2 = tl.constexpr(0.6931471805599453)


@triton.jit
def visible_mask(rows, cols, seqlen_k, diag, window_left, window_right,
                 HAS_LEFT: tl.constexpr, HAS_RIGHT: tl.constexpr):
    """Bool tile: key ``cols`` is visible from query ``rows`` (broadcast shapes).

    Visible iff ``0 <= j < s_k`` and ``j >= i + diag - left`` (if bounded) and
    ``j <= i + diag + right`` (if bounded). Causal is ``right == 0``.
    """
    mask = cols < seqlen_k
    if HAS_RIGHT:
        mask = mask & (cols <= rows + diag + window_right)
    if HAS_LEFT:
        mask = mask & (cols >= rows + diag - window_left)
    return mask


@triton.jit
def chunk_start(pos, chunk):
    """First key position of the chunk of ``chunk`` positions holding key position ``pos``
    (chunked local attention): ``floor(pos / chunk) * chunk``, and ``-chunk`` for a negative
    position (a query before the first key: its chunk has no keys). Integer division of
    negative numbers differs between the compiler (truncation) and the interpreter (floor),
    so negatives never reach it."""
    return tl.where(pos >= 0, tl.maximum(pos, 0) // chunk * chunk, -chunk)


@triton.jit
def tanh_f32(x):
    """tanh via exp2: exact enough in fp32 and available in the interpreter too."""
    e = tl.exp2(x * (2.0 * LOG2E))
    return 1.0 - 2.0 / (e + 1.0)


@triton.jit
def score_scales(sm_scale, softcap, HAS_SOFTCAP: tl.constexpr):
    """Constants of :func:`score_mod`: (qk_scale, softcap_inv, softcap_log2)."""
    softcap_inv = 0.0
    softcap_log2 = 0.0
    if HAS_SOFTCAP:
        softcap_inv = sm_scale / softcap
        softcap_log2 = softcap * LOG2E
    return sm_scale * LOG2E, softcap_inv, softcap_log2


@triton.jit
def score_mod(qk, rows, cols, diag, qk_scale, softcap_inv, softcap_log2, alibi_slope_log2,
              HAS_SOFTCAP: tl.constexpr, HAS_ALIBI: tl.constexpr):
    """Turn raw dot products ``q.k`` (fp32) into log2-domain scores.

    qk_scale = softmax_scale * log2(e) (used without softcap);
    softcap_inv = softmax_scale / softcap, softcap_log2 = softcap * log2(e);
    alibi_slope_log2 = slope * log2(e).
    Returns (scores, t) where t = tanh(.) for the softcap gradient (qk itself otherwise).
    """
    if HAS_SOFTCAP:
        t = tanh_f32(qk * softcap_inv)
        s = t * softcap_log2
    else:
        t = qk
        s = qk * qk_scale
    if HAS_ALIBI:
        dist = rows + diag - cols
        dist = tl.where(dist < 0, -dist, dist)
        s = s - alibi_slope_log2 * dist.to(tl.float32)
    return s, t


@triton.jit
def dropout_keep(seed, rows, cols, bh, threshold):
    """Bool tile: True where dropout keeps the entry (see docs/internals.md).

    r = Philox4x32-10(seed; c0=j, c1=i, c2=b*H+h, c3=0)[0]; dropped iff r < threshold.
    """
    zero = (rows * 0 + cols * 0)
    c0 = (cols + zero).to(tl.uint32, bitcast=True)
    c1 = (rows + zero).to(tl.uint32, bitcast=True)
    c2 = (zero + bh).to(tl.uint32, bitcast=True)
    c3 = zero.to(tl.uint32, bitcast=True)
    r, _, _, _ = tl.random.philox(seed, c0, c1, c2, c3)
    return r.to(tl.int64) >= threshold


@triton.jit
def key_range(m_start, m_end, seqlen_k, diag, window_left, window_right,
              BLOCK_N: tl.constexpr, HAS_LEFT: tl.constexpr, HAS_RIGHT: tl.constexpr):
    """Key-block bounds for query rows [m_start, m_end): (lo, mid_lo, mid_hi, hi).

    [lo, hi) holds every visible key (lo is a multiple of BLOCK_N); blocks in
    [mid_lo, mid_hi) are fully visible for all rows and need no mask.
    """
    lo = 0
    hi = seqlen_k
    full_lo = 0
    full_hi = (seqlen_k // BLOCK_N) * BLOCK_N
    if HAS_LEFT:
        lo = tl.maximum(m_start + diag - window_left, 0)
        lo = (lo // BLOCK_N) * BLOCK_N
        # first block start whose every key satisfies j >= (m_end - 1) + diag - left
        first = (m_end - 1) + diag - window_left
        full_lo = tl.maximum(tl.cdiv(tl.maximum(first, 0), BLOCK_N) * BLOCK_N, lo)
    if HAS_RIGHT:
        hi = tl.minimum(hi, tl.maximum((m_end - 1) + diag + window_right + 1, 0))
        last = m_start + diag + window_right + 1  # keys < last are visible to every row
        full_hi = tl.minimum(full_hi, tl.maximum(last, 0) // BLOCK_N * BLOCK_N)
    hi = tl.maximum(hi, lo)
    mid_lo = tl.minimum(tl.maximum(full_lo, lo), hi)
    mid_hi = tl.minimum(tl.maximum(full_hi, mid_lo), hi)
    return lo, mid_lo, mid_hi, hi


@triton.jit
def query_range(n_start, n_end, seqlen_q, diag, window_left, window_right,
                BLOCK_M: tl.constexpr, HAS_LEFT: tl.constexpr, HAS_RIGHT: tl.constexpr):
    """Query-block bounds for keys [n_start, n_end): (lo, mid_lo, mid_hi, hi).

    Query i sees key j iff i in [j - diag - right, j - diag + left]. [lo, hi) covers every
    row that sees a key of the block; rows in [mid_lo, mid_hi) see all of its keys
    (the caller still masks a key block that runs past s_k).
    """
    lo = 0
    hi = seqlen_q
    full_lo = 0
    full_hi = (seqlen_q // BLOCK_M) * BLOCK_M
    if HAS_RIGHT:
        lo = tl.maximum(n_start - diag - window_right, 0)
        lo = (lo // BLOCK_M) * BLOCK_M
        first = (n_end - 1) - diag - window_right
        full_lo = tl.maximum(tl.cdiv(tl.maximum(first, 0), BLOCK_M) * BLOCK_M, lo)
    if HAS_LEFT:
        hi = tl.minimum(hi, tl.maximum((n_end - 1) - diag + window_left + 1, 0))
        last = n_start - diag + window_left + 1
        full_hi = tl.minimum(full_hi, tl.maximum(last, 0) // BLOCK_M * BLOCK_M)
    hi = tl.maximum(hi, lo)
    mid_lo = tl.minimum(tl.maximum(full_lo, lo), hi)
    mid_hi = tl.minimum(tl.maximum(full_hi, mid_lo), hi)
    return lo, mid_lo, mid_hi, hi

