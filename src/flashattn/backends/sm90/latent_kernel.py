"""Multi-head latent attention decode for sm90 (FlashAttention-3's ``qv``), written in Gluon.

The problem (DeepSeek-V2/V3's MLA at decode): one KV head shared by every query head; a key
is a 64-wide rotary part K (``k_cache``) and a 512-wide latent V (``v_cache``); the score of
query row r against key j is ``q_r . k_j + qv_r . v_j`` (d = 64 + 512 = 576), the output is
``softmax(scores) . V`` (512 wide). With 128 query heads a key costs ~240 FLOP per byte of a
16-bit cache, so the kernel has to keep the tensor cores busy while it streams the cache.

One CTA = 64 packed query rows (``r = i * h + head``: query position i, head; the tile of the
split-KV decode kernel with one KV head) of one sequence and one key split, and three
warp-specialised partitions:

    producer   1 warp: TMA loads of the rows' q (64 x 64) and qv (64 x 512) once, then of
               every 64-key block (K 64 x 64 and V as two 64 x 256 halves) into NUM_STAGES
               ring slots (a *ready* mbarrier with the transaction count, an *empty* one that
               both consumers arrive on);
    consumer0  warpgroup (default partition): output columns [0, 256);
    consumer1  warpgroup (worker): output columns [256, 512).

The output is split by columns (each warpgroup's 64 x 256 fp32 accumulator is 128 registers
a thread; all 512 columns would not fit one warpgroup), so both warpgroups need every key
block's probabilities P. The score GEMM (K = 576) is not split: the warpgroups take turns,
two key blocks at a time (FlashMLA's "seesaw" schedule):

    block a = 2t:      consumer0 computes S_a = [q | qv] [K_a | V_a]^T, the softmax against
                       the running max m (-> m_a, P_a), publishes m_a and P_a (bf16, written
                       over K_a's rotary slot, which nobody reads again), then O_L += P_a V_a.
    block b = 2t + 1:  consumer1 computes S_b under consumer0's softmax, then, with m_a,
                       m_b = max(m_a, rowmax S_b) and P_b, publishes them (over K_b's slot),
                       and runs O_R += P_a V_a (P_a from shared memory) and O_R += P_b V_b.
                       consumer0 then rescales O_L to m_b and runs O_L += P_b V_b.

So each warpgroup computes one S of 64 x 64 x 576 and two P V of 64 x 256 x 64 per two blocks
(the same tensor-core work for both), and one warpgroup's softmax runs under the other's
GEMMs. Both warpgroups keep the same running max (m_a, then m_b, in the same order), each its
own running sum of the probabilities it computed; the sums are added once at the end. The
probabilities a warpgroup takes from the other are bf16 (what a 16-bit P V reads anyway).

The key range of a sequence (``seqlens[b] + seqlen_k_add`` keys, at most the cache's capacity)
is cut into ``num_programs(2)`` equal splits of whole blocks, as the portable decode kernel
does; a split writes its normalised partial output (fp32) and log-sum-exp, which the portable
combine pass merges (with one split the output itself, in q's dtype). Keys past the split's end
and, when CAUSAL, past a row's diagonal (bottom-right aligned: row i sees keys
``<= i + seqlen - s_q``) are masked; the V rows of a last block past the sequence's end (cache
slots that may hold anything, NaN included) are zeroed before a P V multiplies them by 0.

Caches: paged (num_pages, PAGE_SIZE, 1, d) with PAGE_SIZE a multiple of 64 (a key block lies in
one page: block_table[b, pos // PAGE_SIZE], rows pos % PAGE_SIZE on), or contiguous
(b_cache, s_cache, 1, d). The host (latent.py) checks what this kernel covers.

Measured (H200, 2026-11-28, benchmarks/NOTES.md): 2.2-2.3 TB/s of bf16 cache at batch 64
(533-563 TFLOP/s), 2.0-2.5x the portable decode kernel. What mattered: the S GEMM's wgmma
descriptors rebuilt in the loop (_scores: 1.20-1.24x, no spills), one wave of key splits
(the host: 1.15-1.28x at small batches). What did not: an L2 prefetch of the blocks past
the ring (0.72-0.92x), consumer1 running P_a V_a before S_b (0.91-0.99x).
"""
from __future__ import annotations

from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import (fence_async_shared, mbarrier,
                                                               warpgroup_mma, warpgroup_mma_wait)

from flashattn.runtime.gluon_api import cta_barrier, smem_reinterpret, tma_load
from flashattn.backends.sm90.ptx import widen_e4m3
from flashattn.backends.sm90.row_guard import zero_rows_from
from flashattn.backends.sm90.softmax import LN2, online_softmax

BLOCK_M = gl.constexpr(64)  # packed query rows of a CTA (one wgmma M)
BLOCK_N = gl.constexpr(64)  # keys per block
HALF_V = gl.constexpr(256)  # output columns per consumer warpgroup (one TMA box of V)


@gluon.jit
def _split(seqlens_ptr, seqlen_k_add, cache_cap):
    """This CTA's (batch row b, split index, first key block, key blocks, keys of the
    sequence, end of the split's keys): the sequence's blocks cut into equal whole-block
    splits. Every partition computes the same values."""
    b = gl.program_id(1)
    pid_s = gl.program_id(2)
    n_splits = gl.num_programs(2)
    seqlen = gl.load(seqlens_ptr + b) + seqlen_k_add
    seqlen = gl.minimum(gl.maximum(seqlen, 0), cache_cap)
    n_total = gl.cdiv(seqlen, BLOCK_N)
    per_split = gl.cdiv(n_total, n_splits)
    first = pid_s * per_split
    n_blk = gl.maximum(gl.minimum(per_split, n_total - first), 0)
    k_end = gl.minimum((first + n_blk) * BLOCK_N, seqlen)
    return b, pid_s, first, n_blk, seqlen, k_end


@gluon.jit
def _producer(q_desc, qv_desc, k_desc, v_desc, q_smem, qv_smem, k_smem, v_smem, q_ready,
              kv_ready, kv_empty, seqlens_ptr, block_table_ptr, stride_btb, seqlen_k_add,
              cache_cap, n_cache, n_pages_row, PAGE_SIZE: gl.constexpr, PAGED: gl.constexpr):
    """Every TMA load of the CTA, in the order the consumers use them."""
    NUM_STAGES: gl.constexpr = k_smem.shape[0]
    b, pid_s, first, n_blk, seqlen, k_end = _split(seqlens_ptr, seqlen_k_add, cache_cap)
    m_first = gl.program_id(0) * BLOCK_M
    mbarrier.expect(q_ready, q_desc.block_type.nbytes + 2 * qv_desc.block_type.nbytes)
    tma_load(q_desc, [b, m_first, 0], q_ready, q_smem.index(0))
    tma_load(qv_desc, [b, m_first, 0], q_ready, qv_smem.index(0))
    tma_load(qv_desc, [b, m_first, HALF_V], q_ready, qv_smem.index(1))
    # a key block is BOXES TMA boxes of BOX rows (pages of fewer than 64 keys: one per page)
    BOX: gl.constexpr = k_desc.block_type.shape[1]
    BOXES: gl.constexpr = BLOCK_N // BOX
    kv_bytes: gl.constexpr = BOXES * (k_desc.block_type.nbytes + 2 * v_desc.block_type.nbytes)
    for j in range(n_blk):
        stage = j % NUM_STAGES
        phase = (j // NUM_STAGES) & 1
        pos = (first + j) * BLOCK_N
        if BOXES == 1:  # (the block's page read before the slot is waited for)
            row0, row1 = _box_rows(block_table_ptr, b, stride_btb, pos, n_cache, n_pages_row,
                                   PAGE_SIZE, PAGED)
            mbarrier.wait(kv_empty.index(stage), phase ^ 1)
            mbarrier.expect(kv_ready.index(stage), kv_bytes)
            _load_box(k_desc, v_desc, k_smem, v_smem, kv_ready, stage, row0, row1, 0, BOX,
                      BOXES)
        else:
            mbarrier.wait(kv_empty.index(stage), phase ^ 1)
            mbarrier.expect(kv_ready.index(stage), kv_bytes)
            for i in gl.static_range(BOXES):
                row0, row1 = _box_rows(block_table_ptr, b, stride_btb, pos + i * BOX, n_cache,
                                       n_pages_row, PAGE_SIZE, PAGED)
                _load_box(k_desc, v_desc, k_smem, v_smem, kv_ready, stage, row0, row1, i, BOX,
                          BOXES)


@gluon.jit
def _box_rows(block_table_ptr, b, stride_btb, pos, n_cache, n_pages_row,
              PAGE_SIZE: gl.constexpr, PAGED: gl.constexpr):
    """(page or cache row, first row in it) of the keys from position ``pos`` of sequence b
    (the page number clamped: a bad table entry reads a wrong page, never out of bounds)."""
    if PAGED:
        idx = gl.minimum(pos // PAGE_SIZE, n_pages_row - 1)
        page = gl.load(block_table_ptr + b.to(gl.int64) * stride_btb + idx)
        row0 = gl.minimum(gl.maximum(page, 0), n_cache - 1)
        row1 = pos % PAGE_SIZE
    else:
        row0 = b
        row1 = pos
    return row0, row1


@gluon.jit
def _load_box(k_desc, v_desc, k_smem, v_smem, kv_ready, stage, row0, row1, i,
              BOX: gl.constexpr, BOXES: gl.constexpr):
    """TMA loads of box i of a key block (K, then V's two halves) into ring slot ``stage``.
    An e4m3 cache's bytes land in the slot's upper halves (_widen_block widens them in place):
    K's in the rotary slot's second half, V's two column halves in half 1's two halves."""
    if k_desc.dtype == gl.float8e4nv:
        k8 = smem_reinterpret(k_smem.index(stage), gl.float8e4nv, [2, 1, BLOCK_N, 64],
                              k_desc.layout)
        v8 = smem_reinterpret(v_smem.index(2 * stage + 1), gl.float8e4nv,
                              [2, 1, BLOCK_N, HALF_V], v_desc.layout)
        tma_load(k_desc, [row0, row1, 0], kv_ready.index(stage),
                 _rows(k8.index(1), i, BOX, BOXES))
        tma_load(v_desc, [row0, row1, 0], kv_ready.index(stage),
                 _rows(v8.index(0), i, BOX, BOXES))
        tma_load(v_desc, [row0, row1, HALF_V], kv_ready.index(stage),
                 _rows(v8.index(1), i, BOX, BOXES))
    else:
        tma_load(k_desc, [row0, row1, 0], kv_ready.index(stage),
                 _rows(k_smem.index(stage), i, BOX, BOXES))
        tma_load(v_desc, [row0, row1, 0], kv_ready.index(stage),
                 _rows(v_smem.index(2 * stage), i, BOX, BOXES))
        tma_load(v_desc, [row0, row1, HALF_V], kv_ready.index(stage),
                 _rows(v_smem.index(2 * stage + 1), i, BOX, BOXES))


@gluon.jit
def _rows(slot, i, BOX: gl.constexpr, BOXES: gl.constexpr):
    """Rows [i * BOX, (i + 1) * BOX) of a ring slot (1, BLOCK_N, cols): the slot itself when
    one box fills it."""
    if BOXES == 1:
        return slot
    else:
        return slot.slice(i * BOX, BOX, dim=1)


@gluon.jit
def _scores_issue(q_smem, qv_smem, k_smem, v_smem, stage, s_zero, z, FP8: gl.constexpr = False):
    """Issue S = q K^T + qv V^T of ring slot ``stage`` (64 x 64, fp32, wgmma layout): three
    GEMMs (K = 64 + 256 + 256), not waited for (:func:`_scores_finish`). ``z``: a zero the
    compiler cannot see through (_loop_zero), added to every shared-memory index: the 36 wgmma
    descriptors are then rebuilt in the loop from one base instead of being hoisted out of it,
    where they did not fit consumer0's registers (296 bytes spilled, reloaded before every S
    GEMM: 30 % of that warpgroup's stall samples under ncu; rebuilt: no spills, 1.20-1.24x
    faster, benchmarks/NOTES.md). FP8: q . k8 and qv . v8 into two accumulators (their
    descales differ); returns (token of q . k, token of the rest)."""
    q_view = q_smem.index(z).reshape([BLOCK_M, 64])
    k_t = k_smem.index(stage + z).reshape([BLOCK_N, 64]).permute((1, 0))
    v0_t = v_smem.index(2 * stage + z).reshape([BLOCK_N, HALF_V]).permute((1, 0))
    v1_t = v_smem.index(2 * stage + 1 + z).reshape([BLOCK_N, HALF_V]).permute((1, 0))
    qv0 = qv_smem.index(z).reshape([BLOCK_M, HALF_V])
    qv1 = qv_smem.index(1 + z).reshape([BLOCK_M, HALF_V])
    tok_k = warpgroup_mma(q_view, k_t, s_zero, use_acc=False, is_async=True)
    if FP8:
        tok_v = warpgroup_mma(qv0, v0_t, s_zero, use_acc=False, is_async=True)
    else:
        tok_v = warpgroup_mma(qv0, v0_t, tok_k, is_async=True)
    tok_v = warpgroup_mma(qv1, v1_t, tok_v, is_async=True)
    return tok_k, tok_v


@gluon.jit
def _scores_finish(toks, v_ratio, FP8: gl.constexpr = False):
    """Wait for the GEMMs of :func:`_scores_issue`: S (FP8: q . k8 + v_ratio * qv . v8, with
    v_ratio = v_descale / k_descale)."""
    tok_k, tok_v = toks
    if FP8:
        s_k, s_v = warpgroup_mma_wait(0, deps=(tok_k, tok_v))
        return s_k + s_v * v_ratio
    else:
        return warpgroup_mma_wait(0, deps=(tok_v,))


@gluon.jit
def _scores(q_smem, qv_smem, k_smem, v_smem, stage, s_zero, z, v_ratio,
            FP8: gl.constexpr = False):
    """S of ring slot ``stage``, issued and waited for."""
    return _scores_finish(_scores_issue(q_smem, qv_smem, k_smem, v_smem, stage, s_zero, z, FP8),
                          v_ratio, FP8)


@gluon.jit
def _widen_copy(src, dst, ROWS: gl.constexpr, COLS: gl.constexpr, OVERLAP: gl.constexpr):
    """dst (1, ROWS, COLS), 16-bit = src (1, ROWS, COLS), e4m3, widened (exact: every e4m3
    value is a bf16 and an fp16 value; on the integer ALU, ptx.widen_e4m3: 1.02-1.05x the
    conversion unit's version, benchmarks/NOTES.md 2026-11-29) by the calling warpgroup, 16
    contiguous values a thread. OVERLAP: dst covers src's bytes, so all of src is read into registers before any
    of dst is written (a partition barrier between); otherwise 16 rows at a time (fewer
    registers)."""
    layout: gl.constexpr = gl.BlockedLayout([1, 1, 16], [1, 512 // COLS, COLS // 16],
                                            [1, 4, 1], [2, 1, 0])
    if OVERLAP:
        x = widen_e4m3(src.load(layout), dst.dtype)
        cta_barrier()
        dst.store(x)
    else:
        for r in gl.static_range(ROWS // 16):
            x = src.slice(r * 16, 16, dim=1).load(layout)
            dst.slice(r * 16, 16, dim=1).store(widen_e4m3(x, dst.dtype))


@gluon.jit
def _widen_block(k_smem, v_smem, stage, k8_layout: gl.constexpr, v8_layout: gl.constexpr):
    """FP8 caches: the key block in ring slot ``stage``, landed as e4m3 in the upper half of
    its K slot (64 x 64) and in its V half 1 (64 x 512), widened in place into the 16-bit
    slot the GEMMs read. Ordered so that no e4m3 byte is overwritten before it is read: V's
    columns 0-255 go to half 0 (free), 256-383 to half 1's first 16 KiB (e4m3 columns 0-255,
    already read), 384-511 after being held in registers; K's rows 0-31 to the slot's first
    4 KiB (free), rows 32-63 held. Ends with the async-proxy fence and a barrier: the
    warpgroup's wgmma reads the result next, the other warpgroup after this one's arrive."""
    k16 = k_smem.index(stage)
    k8 = smem_reinterpret(k16, gl.float8e4nv, [2, 1, BLOCK_N, 64], k8_layout).index(1)
    v16_0 = v_smem.index(2 * stage)
    v16_1 = v_smem.index(2 * stage + 1)
    v8 = smem_reinterpret(v16_1, gl.float8e4nv, [2, 1, BLOCK_N, HALF_V], v8_layout)
    _widen_copy(v8.index(0), v16_0, BLOCK_N, HALF_V, False)
    cta_barrier()  # (every thread has read e4m3 columns 0-255: their bytes are written next)
    _widen_copy(v8.index(1).slice(0, HALF_V // 2, dim=2),
                v16_1.slice(0, HALF_V // 2, dim=2), BLOCK_N, HALF_V // 2, False)
    _widen_copy(v8.index(1).slice(HALF_V // 2, HALF_V // 2, dim=2),
                v16_1.slice(HALF_V // 2, HALF_V // 2, dim=2), BLOCK_N, HALF_V // 2, True)
    _widen_copy(k8.slice(0, BLOCK_N // 2, dim=1), k16.slice(0, BLOCK_N // 2, dim=1),
                BLOCK_N // 2, 64, False)
    _widen_copy(k8.slice(BLOCK_N // 2, BLOCK_N // 2, dim=1),
                k16.slice(BLOCK_N // 2, BLOCK_N // 2, dim=1), BLOCK_N // 2, 64, True)
    fence_async_shared()
    cta_barrier()


@gluon.jit
def _loop_zero(t):
    """0 for any pair index t < 2**30 (every real one), but not a constant to the compiler."""
    return t >> 30


@gluon.jit
def _mask(s, n_start, k_end, diag, m_first, G, CAUSAL: gl.constexpr, S_LAYOUT: gl.constexpr):
    """-inf where key ``n_start + col`` is past the split's end or (CAUSAL) past packed row
    ``m_first + row``'s diagonal (query position i = row // G sees keys <= i + diag)."""
    cols = n_start + gl.arange(0, BLOCK_N, layout=gl.SliceLayout(0, S_LAYOUT))
    hi = gl.full([BLOCK_M], 0, gl.int32, gl.SliceLayout(1, S_LAYOUT)) + (k_end - 1)
    if CAUSAL:
        rows = m_first + gl.arange(0, BLOCK_M, layout=gl.SliceLayout(1, S_LAYOUT))
        hi = gl.minimum(hi, rows // G + diag)
    vis = gl.expand_dims(cols, 0) <= gl.expand_dims(hi, 1)
    return gl.where(vis, s, float("-inf"))


@gluon.jit
def _block_needs_mask(n_start, k_end, diag, m_first, G, CAUSAL: gl.constexpr):
    """Whether some key of the block at ``n_start`` is hidden from some row of the tile."""
    lo = k_end
    if CAUSAL:  # (the tile's first query position sees the fewest keys)
        lo = gl.minimum(lo, m_first // G + diag + 1)
    return n_start + BLOCK_N > lo


@gluon.jit
def _guard_v(v_smem, stage, WG: gl.constexpr, n_start, seqlen):
    """Zero this warpgroup's V half's rows past the sequence's end (its P V reads them)."""
    if n_start + BLOCK_N > seqlen:
        zero_rows_from(v_smem.index(2 * stage + WG).reshape([BLOCK_N, HALF_V]), seqlen - n_start)


@gluon.jit
def _rescale(m_from, m_to):
    """exp2(m_from - m_to) with m_to = -inf read as 0 (then m_from is -inf too: 0)."""
    return gl.exp2(m_from - gl.where(m_to == float("-inf"), 0.0, m_to))


@gluon.jit
def _publish(p, m_new, m_slot, p_slot, ready, dtype: gl.constexpr):
    """Hand this warpgroup's block probabilities to the other one: the running max it reached
    and P in ``dtype`` (over the block's rotary slot), then the arrive on ``ready``. Returns P
    in ``dtype`` (this warpgroup's own P V operand)."""
    p16 = p.to(dtype)
    m_slot.store(m_new)
    p_slot.store(p16)
    fence_async_shared()  # (the other warpgroup's wgmma reads P through the async proxy)
    mbarrier.arrive(ready)
    return p16


@gluon.jit
def _finish_pv(tok, empty):
    """Wait for this warpgroup's P V and release its ring slot: the accumulator."""
    acc = warpgroup_mma_wait(0, deps=(tok,))
    mbarrier.arrive(empty)
    return acc


@gluon.jit
def _rescaled(acc, alpha, ROW_O: gl.constexpr):
    """acc with each row times alpha (a row vector in the score layout)."""
    return acc * gl.expand_dims(gl.convert_layout(alpha, ROW_O), 1)


@gluon.jit
def _consumer(WG: gl.constexpr, q_smem, qv_smem, k_smem, v_smem, m_smem, l_smem, q_ready,
              kv_ready, kv_empty, p_ready, l_ready, out_ptr, lse_ptr, seqlens_ptr,
              seqlen_k_add, cache_cap, seqlen_q, G, n_rows, qk_scale,
              stride_os, stride_ob, stride_om, stride_oh, stride_ls, stride_lb, stride_lh,
              stride_lm, fp8_args, CAUSAL: gl.constexpr, FP8: gl.constexpr):
    """Consumer warpgroup ``WG``: the seesaw schedule of the module doc; output columns
    [WG * 256, WG * 256 + 256). FP8 caches: ``fp8_args`` = (k_descale, v_descale pointers,
    their batch strides); each warpgroup widens the block it scores, both at the start of the
    pair (consumer0 widening both, the second under its own S_a GEMM, measured 0.85-0.88x:
    benchmarks/NOTES.md)."""
    # (the e4m3 tiles' layouts as they land: the host's descriptors take the same defaults)
    K8_LAYOUT: gl.constexpr = gl.NVMMASharedLayout.get_default_for([1, BLOCK_N, 64],
                                                                   gl.float8e4nv)
    V8_LAYOUT: gl.constexpr = gl.NVMMASharedLayout.get_default_for([1, BLOCK_N, HALF_V],
                                                                   gl.float8e4nv)
    NUM_STAGES: gl.constexpr = k_smem.shape[0]
    dtype: gl.constexpr = q_smem.dtype
    S_LAYOUT: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                       instr_shape=[16, BLOCK_N, 16])
    O_LAYOUT: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                       instr_shape=[16, HALF_V, 16])
    P_LAYOUT: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=O_LAYOUT, k_width=2)
    ROW_S: gl.constexpr = gl.SliceLayout(1, S_LAYOUT)
    ROW_O: gl.constexpr = gl.SliceLayout(1, O_LAYOUT)

    b, pid_s, first, n_blk, seqlen, k_end = _split(seqlens_ptr, seqlen_k_add, cache_cap)
    m_first = gl.program_id(0) * BLOCK_M
    diag = seqlen - seqlen_q
    s_zero = gl.zeros([BLOCK_M, BLOCK_N], gl.float32, S_LAYOUT)
    m_i = gl.full([BLOCK_M], float("-inf"), gl.float32, ROW_S)
    l_i = gl.zeros([BLOCK_M], gl.float32, ROW_S)
    acc = gl.zeros([BLOCK_M, HALF_V], gl.float32, O_LAYOUT)
    v_ratio = 1.0
    out_scale = 1.0
    if FP8:  # q . (k8 kd) + qv . (v8 vd) = kd (q . k8 + (vd / kd) qv . v8); O = vd P v8 / l
        kd_ptr, vd_ptr, stride_kdb, stride_vdb = fp8_args
        k_descale = gl.load(kd_ptr + b.to(gl.int64) * stride_kdb)
        v_descale = gl.load(vd_ptr + b.to(gl.int64) * stride_vdb)
        qk_scale = qk_scale * k_descale
        v_ratio = v_descale / k_descale
        out_scale = v_descale
    mbarrier.wait(q_ready, 0)

    for t in range(gl.cdiv(n_blk, 2)):
        z = _loop_zero(t)
        ja = 2 * t
        jb = ja + 1
        sa = ja % NUM_STAGES
        pa = (ja // NUM_STAGES) & 1
        sb = jb % NUM_STAGES
        pb = (jb // NUM_STAGES) & 1
        na = (first + ja) * BLOCK_N
        nb = na + BLOCK_N
        has_b = jb < n_blk
        va = v_smem.index(2 * sa + WG).reshape([BLOCK_N, HALF_V])
        vb = v_smem.index(2 * sb + WG).reshape([BLOCK_N, HALF_V])
        pa_smem = k_smem.index(sa).reshape([BLOCK_M, BLOCK_N])  # P_a over K_a's rotary slot
        pb_smem = k_smem.index(sb).reshape([BLOCK_M, BLOCK_N])
        if WG == 0:
            mbarrier.wait(kv_ready.index(sa), pa)
            if FP8:
                _widen_block(k_smem, v_smem, sa, K8_LAYOUT, V8_LAYOUT)
            toks = _scores_issue(q_smem, qv_smem, k_smem, v_smem, sa, s_zero, z, FP8)
            s = _scores_finish(toks, v_ratio, FP8)
            if _block_needs_mask(na, k_end, diag, m_first, G, CAUSAL):
                s = _mask(s, na, k_end, diag, m_first, G, CAUSAL, S_LAYOUT)
            p, m_a, l_i, alpha = online_softmax(s, m_i, l_i, qk_scale)
            p16 = _publish(p, m_a, m_smem[0], pa_smem, p_ready.index(0), dtype)
            _guard_v(v_smem, sa, WG, na, seqlen)
            acc = _rescaled(acc, alpha, ROW_O)
            tok = warpgroup_mma(gl.convert_layout(p16, P_LAYOUT), va, acc, is_async=True)
            if has_b:
                mbarrier.wait(p_ready.index(1), t & 1)
                mbarrier.wait(kv_ready.index(sb), pb)
                m_b = m_smem[1].load(ROW_S)
                acc = _finish_pv(tok, kv_empty.index(sa))
                alpha_b = _rescale(m_a, m_b)
                l_i = l_i * alpha_b
                acc = _rescaled(acc, alpha_b, ROW_O)
                _guard_v(v_smem, sb, WG, nb, seqlen)
                tok = warpgroup_mma(pb_smem, vb, acc, is_async=True)
                acc = _finish_pv(tok, kv_empty.index(sb))
                m_i = m_b
            else:
                acc = _finish_pv(tok, kv_empty.index(sa))
                m_i = m_a
        else:
            # (S_b before P_a V_a: S_b then runs under consumer0's softmax; the other order,
            # P_a V_a first, measured 0.91-0.99x, benchmarks/NOTES.md)
            s = s_zero
            if has_b:
                mbarrier.wait(kv_ready.index(sb), pb)
                if FP8:
                    _widen_block(k_smem, v_smem, sb, K8_LAYOUT, V8_LAYOUT)
                s = _scores(q_smem, qv_smem, k_smem, v_smem, sb, s_zero, z, v_ratio, FP8)
                if _block_needs_mask(nb, k_end, diag, m_first, G, CAUSAL):
                    s = _mask(s, nb, k_end, diag, m_first, G, CAUSAL, S_LAYOUT)
            mbarrier.wait(p_ready.index(0), t & 1)
            mbarrier.wait(kv_ready.index(sa), pa)
            m_a = m_smem[0].load(ROW_S)
            alpha_a = _rescale(m_i, m_a)
            l_i = l_i * alpha_a
            acc = _rescaled(acc, alpha_a, ROW_O)
            _guard_v(v_smem, sa, WG, na, seqlen)
            tok = warpgroup_mma(pa_smem, va, acc, is_async=True)
            if has_b:
                p, m_b, l_i, alpha_b = online_softmax(s, m_a, l_i, qk_scale)
                p16 = _publish(p, m_b, m_smem[1], pb_smem, p_ready.index(1), dtype)
                acc = _finish_pv(tok, kv_empty.index(sa))
                acc = _rescaled(acc, alpha_b, ROW_O)
                _guard_v(v_smem, sb, WG, nb, seqlen)
                tok = warpgroup_mma(gl.convert_layout(p16, P_LAYOUT), vb, acc, is_async=True)
                acc = _finish_pv(tok, kv_empty.index(sb))
                m_i = m_b
            else:
                acc = _finish_pv(tok, kv_empty.index(sa))
                m_i = m_a

    # ---- epilogue: the two running sums added (same order in both), O / l, LSE
    l_smem[WG].store(l_i)
    mbarrier.arrive(l_ready)
    mbarrier.wait(l_ready, 0)
    l_tot = l_smem[0].load(ROW_S) + l_smem[1].load(ROW_S)
    l_o = gl.convert_layout(l_tot, ROW_O)
    inv_l = gl.where(l_o > 0.0, out_scale / l_o, 0.0)
    out = acc * gl.expand_dims(inv_l, 1)
    r = m_first + gl.arange(0, BLOCK_M, layout=ROW_O)
    c = WG * HALF_V + gl.arange(0, HALF_V, layout=gl.SliceLayout(0, O_LAYOUT))
    i = (r // G).to(gl.int64)
    head = (r % G).to(gl.int64)
    o_row = pid_s.to(gl.int64) * stride_os + b.to(gl.int64) * stride_ob + i * stride_om \
        + head * stride_oh
    o_ptrs = out_ptr + gl.expand_dims(o_row, 1) + gl.expand_dims(c, 0)
    gl.store(o_ptrs, out.to(out_ptr.dtype.element_ty),
             mask=gl.expand_dims(r < n_rows, 1) & gl.expand_dims(c < 2 * HALF_V, 0))
    if WG == 0:
        rs = m_first + gl.arange(0, BLOCK_M, layout=ROW_S)
        lse = gl.where(l_tot > 0.0, (m_i + gl.log2(l_tot)) * LN2, float("-inf"))
        l_row = pid_s.to(gl.int64) * stride_ls + b.to(gl.int64) * stride_lb \
            + (rs % G).to(gl.int64) * stride_lh + (rs // G).to(gl.int64) * stride_lm
        gl.store(lse_ptr + l_row, lse, mask=rs < n_rows)


@gluon.jit
def latent_decode_kernel(q_desc, qv_desc, k_desc, v_desc, out_ptr, lse_ptr, seqlens_ptr,
                         block_table_ptr, stride_btb, seqlen_k_add, cache_cap, n_cache,
                         n_pages_row, seqlen_q, G, n_rows, qk_scale,
                         stride_os, stride_ob, stride_om, stride_oh,
                         stride_ls, stride_lb, stride_lh, stride_lm,
                         kd_ptr, vd_ptr, stride_kdb, stride_vdb,
                         PAGE_SIZE: gl.constexpr, PAGED: gl.constexpr, CAUSAL: gl.constexpr,
                         NUM_STAGES: gl.constexpr, CONSUMER_REGS: gl.constexpr,
                         PRODUCER_REGS: gl.constexpr):
    """Split-KV MLA decode (module doc). Grid (cdiv(s_q * h, 64), batch, splits), 4 warps.

    q_desc: rank 3 over q (b, s_q * h, 64) with a [1, 64, 64] box; qv_desc over qv (b, s_q * h,
    512), [1, 64, 256] boxes; k_desc over the rotary cache (pages or cache rows, rows, 64),
    [1, 64, 64] boxes; v_desc over the latent cache (..., rows, 512), [1, 64, 256] boxes; all
    16-bit of one dtype. seqlens_ptr int32 (b,): keys before this call's ``seqlen_k_add``
    new ones, clamped to [0, cache_cap]. block_table_ptr int32 (b, n_pages_row) when PAGED
    (pages clamped to [0, n_cache)); else unread. out_ptr / lse_ptr: (split, b, i, head, col)
    and (split, b, head, i) by the given strides (fp32 partials, or with one split the output
    in q's dtype and the float32 LSE). qk_scale: softmax_scale * log2(e).
    """
    q_smem = gl.allocate_shared_memory(q_desc.dtype, [1] + q_desc.block_type.shape,
                                       q_desc.layout)
    qv_smem = gl.allocate_shared_memory(qv_desc.dtype, [2] + qv_desc.block_type.shape,
                                        qv_desc.layout)
    # (the ring holds 16-bit blocks in q's dtype; e4m3 caches land in the slots' upper halves;
    # a page of fewer than 64 keys: the descriptors' boxes are a page tall, the ring slots a
    # whole key block; the NVMMA layout is the same: it depends on the row width only)
    FP8: gl.constexpr = k_desc.dtype == gl.float8e4nv
    k_layout: gl.constexpr = gl.NVMMASharedLayout.get_default_for([1, BLOCK_N, 64],
                                                                  q_desc.dtype)
    v_layout: gl.constexpr = gl.NVMMASharedLayout.get_default_for([1, BLOCK_N, HALF_V],
                                                                  q_desc.dtype)
    k_smem = gl.allocate_shared_memory(q_desc.dtype, [NUM_STAGES, 1, BLOCK_N, 64], k_layout)
    v_smem = gl.allocate_shared_memory(q_desc.dtype, [2 * NUM_STAGES, 1, BLOCK_N, HALF_V],
                                       v_layout)
    # the running max each warpgroup publishes (m_a, m_b) and the final running sums
    row_layout: gl.constexpr = gl.SwizzledSharedLayout(1, 1, 1, [0])
    m_smem = (gl.allocate_shared_memory(gl.float32, [BLOCK_M], row_layout),
              gl.allocate_shared_memory(gl.float32, [BLOCK_M], row_layout))
    l_smem = (gl.allocate_shared_memory(gl.float32, [BLOCK_M], row_layout),
              gl.allocate_shared_memory(gl.float32, [BLOCK_M], row_layout))
    q_ready = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())
    l_ready = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())
    p_ready = gl.allocate_shared_memory(gl.int64, [2, 1], mbarrier.MBarrierLayout())
    kv_ready = gl.allocate_shared_memory(gl.int64, [NUM_STAGES, 1], mbarrier.MBarrierLayout())
    kv_empty = gl.allocate_shared_memory(gl.int64, [NUM_STAGES, 1], mbarrier.MBarrierLayout())
    mbarrier.init(q_ready, count=1)
    mbarrier.init(l_ready, count=2)
    for i in gl.static_range(2):
        mbarrier.init(p_ready.index(i), count=1)
    for i in gl.static_range(NUM_STAGES):
        mbarrier.init(kv_ready.index(i), count=1)
        mbarrier.init(kv_empty.index(i), count=2)
    fence_async_shared()

    gl.warp_specialize([
        (_consumer, (0, q_smem, qv_smem, k_smem, v_smem, m_smem, l_smem, q_ready, kv_ready,
                     kv_empty, p_ready, l_ready, out_ptr, lse_ptr, seqlens_ptr,
                     seqlen_k_add, cache_cap, seqlen_q, G, n_rows, qk_scale, stride_os,
                     stride_ob, stride_om, stride_oh, stride_ls, stride_lb, stride_lh,
                     stride_lm, (kd_ptr, vd_ptr, stride_kdb, stride_vdb), CAUSAL, FP8)),
        (_consumer, (1, q_smem, qv_smem, k_smem, v_smem, m_smem, l_smem, q_ready, kv_ready,
                     kv_empty, p_ready, l_ready, out_ptr, lse_ptr, seqlens_ptr,
                     seqlen_k_add, cache_cap, seqlen_q, G, n_rows, qk_scale, stride_os,
                     stride_ob, stride_om, stride_oh, stride_ls, stride_lb, stride_lh,
                     stride_lm, (kd_ptr, vd_ptr, stride_kdb, stride_vdb), CAUSAL, FP8)),
        (_producer, (q_desc, qv_desc, k_desc, v_desc, q_smem, qv_smem, k_smem, v_smem,
                     q_ready, kv_ready, kv_empty, seqlens_ptr, block_table_ptr, stride_btb,
                     seqlen_k_add, cache_cap, n_cache, n_pages_row, PAGE_SIZE, PAGED)),
    ], [4, 1], [CONSUMER_REGS, PRODUCER_REGS])
