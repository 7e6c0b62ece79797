"""The portable kernels' shared prologue: which tile a program owns and where its data lives.

Every kernel of this package starts the same way: program ids -> (batch or packed sequence,
head, row block); the sequence's bounds (dense, packed varlen through cu_seqlens / seqused_k,
or a KV cache's lengths and left padding); then the 64-bit offsets of that sequence's rows in
each tensor, the base of its per-row statistics (LSE, Delta) and the TMA descriptors of its
keys. Those steps live here once; fwd.py, bwd.py, fwd_fp8.py and decode.py call them.

The kernels inline these helpers and the generated code must stay what the kernels wrote by
hand before (tools/ptx_fingerprint.py compares it): every expression keeps its operands,
dtypes and order, and the dense / varlen choice is a constexpr, so a dense kernel carries no
trace of the varlen arithmetic and the reverse.

Conventions: ``VARLEN`` kernels index packed (total, h, d) tensors, whose batch stride is
unused, with the sequence's first row; dense kernels index (b, s, h, d) tensors with the batch
index. Row offsets are int64 (rows * row stride passes 2**31 on long sequences).
"""
import triton
import triton.language as tl


@triton.jit
def program_ids(nheads, BH_AXIS0: tl.constexpr, HEAVY_FIRST: tl.constexpr):
    """This program's (pid_tile, pid_bh, off_b, off_h) on a 2-D grid of row tiles x (b * h).

    ``BH_AXIS0``: (batch, head) on grid axis 0, tiles on axis 1 (``config.bh_on_axis0``:
    b * h can pass the 65535 limit of axis 1); otherwise tiles on axis 0. ``HEAVY_FIRST``
    numbers the tiles from the last one, so that program 0 takes the last query block: the
    heaviest under a causal mask, scheduled first. ``nheads`` is the head count that pid_bh
    packs (the KV heads for a kernel that owns a KV head): off_b = pid_bh // nheads,
    off_h = pid_bh % nheads. All four are int32 scalars.
    """
    if BH_AXIS0:
        if HEAVY_FIRST:
            pid_tile = tl.num_programs(1) - 1 - tl.program_id(1)
        else:
            pid_tile = tl.program_id(1)
        pid_bh = tl.program_id(0)
    else:
        if HEAVY_FIRST:
            pid_tile = tl.num_programs(0) - 1 - tl.program_id(0)
        else:
            pid_tile = tl.program_id(0)
        pid_bh = tl.program_id(1)
    off_b = pid_bh // nheads
    off_h = pid_bh % nheads
    return pid_tile, pid_bh, off_b, off_h


@triton.jit
def packed_rows(CuSeq, SeqUsed, off_b, total, HAS_USED: tl.constexpr):
    """Rows [start, end) of packed sequence ``off_b``: int32 scalars.

    ``CuSeq`` int32 (b + 1,) cumulative lengths; the sequence's rows start at CuSeq[b] and end
    at CuSeq[b + 1], or after ``SeqUsed[b]`` rows when ``HAS_USED`` (seqused_k).
    The values are read from the device, so they are clamped before they form an address:
    rows to [0, total) (the packed tensor's length) and end >= start. Bad metadata then gives
    a wrong answer, never an access outside the tensors; ``flashattn.checks()`` reports it.
    """
    start = tl.minimum(tl.maximum(tl.load(CuSeq + off_b), 0), total)
    if HAS_USED:
        end = tl.minimum(tl.maximum(start + tl.load(SeqUsed + off_b), start), total)
    else:
        end = tl.minimum(tl.maximum(tl.load(CuSeq + off_b + 1), start), total)
    return start, end


@triton.jit
def seq_bounds(CuSeqQ, CuSeqK, SeqUsedK, off_b, total_q, total_k, HAS_SEQUSED: tl.constexpr):
    """Where packed sequence ``off_b`` lives (varlen mode): (q_start, k_start, s_q, s_k).

    q_start / k_start are int64 row offsets into the (total, h, d) tensors (total * row
    stride can exceed 2**31); s_q / s_k are the sequence's own lengths (int32), from the
    cumulative lengths ``cu_seqlens`` (b + 1,), or s_k = ``seqused_k[b]`` keys when given,
    clamped as :func:`packed_rows` says. Everything inside the sequence (masks, alignment,
    dropout counters) then uses local indices, exactly as a batch entry of the dense layout.
    """
    q_start, q_end = packed_rows(CuSeqQ, CuSeqQ, off_b, total_q, False)
    k_start, k_end = packed_rows(CuSeqK, SeqUsedK, off_b, total_k, HAS_SEQUSED)
    return (q_start.to(tl.int64), k_start.to(tl.int64), (q_end - q_start).to(tl.int32),
            (k_end - k_start).to(tl.int32))


@triton.jit
def seq_info(CuSeqQ, CuSeqK, SeqUsedK, off_b, seqlen_q, seqlen_k, total_q, total_k,
             VARLEN: tl.constexpr, HAS_SEQUSED: tl.constexpr):
    """(q_start, k_start, s_q, s_k) of batch entry / packed sequence ``off_b``.

    ``VARLEN``: :func:`seq_bounds` (int64 first rows, the sequence's own int32 lengths; the
    kernel's seqlen_q / seqlen_k arguments are then the max lengths that sized the grid).
    Dense: the lengths as given and first rows 0, which :func:`row_offset` and
    :func:`stats_base` never read in that mode (no code comes from them).
    """
    if VARLEN:
        q_start, k_start, s_q, s_k = seq_bounds(CuSeqQ, CuSeqK, SeqUsedK, off_b, total_q,
                                                total_k, HAS_SEQUSED)
    else:
        q_start = 0
        k_start = 0
        s_q = seqlen_q
        s_k = seqlen_k
    return q_start, k_start, s_q, s_k


@triton.jit
def row_offset(off_b, row_start, stride_b, stride_row, VARLEN: tl.constexpr):
    """int64 element offset of this sequence's row 0 in a (b, s, h, d) / (total, h, d) tensor:
    ``row_start * stride_row`` (varlen: row_start from :func:`seq_info`, already int64) or
    ``off_b * stride_b`` (dense; b * stride_b can exceed 2**31 on long sequences)."""
    if VARLEN:
        off = row_start * stride_row
    else:
        off = off_b.to(tl.int64) * stride_b
    return off


@triton.jit
def stats_base(Stats, bh, off_h, q_start, stride_h, seqlen_q, VARLEN: tl.constexpr):
    """Pointer to row 0 of this (sequence, head)'s per-row statistics (LSE, Delta).

    Varlen: the statistics are (h, total_q) with head stride ``stride_h``, and the sequence's
    rows start at q_start; dense: (b, h, s_q), contiguous, and ``bh`` = b * h + head.
    """
    if VARLEN:
        base = Stats + off_h.to(tl.int64) * stride_h + q_start
    else:
        base = Stats + bh.to(tl.int64) * seqlen_q
    return base


@triton.jit
def key_rows(seqlen_k, VARLEN: tl.constexpr):
    """Rows of the TMA view of this sequence's keys. Varlen: the sequence's own keys (rows
    past its end belong to the next sequence and must read as zeros), and at least one row
    for an empty sequence, which loads nothing. Dense: s_k (the tensor ends there)."""
    if VARLEN:
        rows = tl.maximum(seqlen_k, 1)
    else:
        rows = seqlen_k
    return rows


@triton.jit
def tma_pair(a_base, b_base, rows, stride_a, stride_b,
             COLS_A: tl.constexpr, COLS_B: tl.constexpr, BLOCK_R: tl.constexpr,
             BLOCK_A: tl.constexpr, BLOCK_B: tl.constexpr):
    """TMA descriptors of two row-major 2-D views sharing their rows (K and V, or Q and dO):
    (rows, COLS_A) at ``a_base`` and (rows, COLS_B) at ``b_base``, row strides ``stride_a`` /
    ``stride_b``, unit column stride, tiles (BLOCK_R, BLOCK_A) / (BLOCK_R, BLOCK_B). Rows past
    ``rows`` and columns past COLS read as zeros. The caller keeps its ``USE_TMA`` branch and
    its None descriptors on the pointer path: a jit function cannot return None."""
    a_desc = tl.make_tensor_descriptor(a_base, shape=[rows, COLS_A], strides=[stride_a, 1],
                                       block_shape=[BLOCK_R, BLOCK_A])
    b_desc = tl.make_tensor_descriptor(b_base, shape=[rows, COLS_B], strides=[stride_b, 1],
                                       block_shape=[BLOCK_R, BLOCK_B])
    return a_desc, b_desc


@triton.jit
def cache_keys(SeqlensK, LeftPad, off_b, seqlen_k_add, cache_cap, HAS_LEFTPAD: tl.constexpr):
    """(start_k, s_k) of batch row ``off_b`` of a KV cache: int32 scalars.

    The row holds ``seqlens_k[b] + seqlen_k_add`` keys (the cached ones plus those appended by
    this call), clamped to [0, cache_cap]; the first ``cache_leftpad[b]`` of them
    (``HAS_LEFTPAD``, clamped to the key count) are padding, so local key j is cache position
    ``start_k + j`` for j in [0, s_k).
    """
    total_k = tl.minimum(tl.maximum(tl.load(SeqlensK + off_b) + seqlen_k_add, 0), cache_cap)
    start_k = 0
    if HAS_LEFTPAD:
        start_k = tl.minimum(tl.maximum(tl.load(LeftPad + off_b), 0), total_k)
    return start_k, total_k - start_k


@triton.jit
def qkv_offsets(off_b, q_start, k_start, stride_qb, stride_qm, stride_kb, stride_kn,
                stride_vb, stride_vn, VARLEN: tl.constexpr):
    """(q_off, k_off, v_off): :func:`row_offset` of Q (query rows), K and V (key rows), the
    three tensors every attention kernel reads; int64 element offsets."""
    q_off = row_offset(off_b, q_start, stride_qb, stride_qm, VARLEN)
    k_off = row_offset(off_b, k_start, stride_kb, stride_kn, VARLEN)
    v_off = row_offset(off_b, k_start, stride_vb, stride_vn, VARLEN)
    return q_off, k_off, v_off


@triton.jit
def query_tile(m_start, seqlen_q, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
               BLOCK_D: tl.constexpr, BLOCK_DV: tl.constexpr):
    """Index vectors of a program that owns query rows [m_start, m_start + BLOCK_M) and
    streams key blocks: (m_end, offs_m, offs_n0, offs_d, offs_dv).

    m_end = min(m_start + BLOCK_M, s_q) (int32 scalar, the tile's last row + 1 inside the
    sequence); offs_m (BLOCK_M,) the tile's query rows; offs_n0 (BLOCK_N,) key offsets inside a
    key block; offs_d (BLOCK_D,) / offs_dv (BLOCK_DV,) the Q/K and V head-dim columns.
    """
    m_end = tl.minimum(m_start + BLOCK_M, seqlen_q)
    offs_m = m_start + tl.arange(0, BLOCK_M)
    offs_n0 = tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, BLOCK_D)
    offs_dv = tl.arange(0, BLOCK_DV)
    return m_end, offs_m, offs_n0, offs_d, offs_dv
