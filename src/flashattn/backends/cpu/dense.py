"""Memory-efficient chunked attention in plain torch: the backend for CPU tensors.

The FlashAttention-2 algorithm with torch ops on tiles instead of a Triton kernel: query
chunks stream over key chunks with an online softmax (running max ``m_i``, running sum
``l_i``, fp32 accumulator ``acc``); the backward recomputes the probabilities from the saved
``lse`` and never stores them. Extra memory is O(nb * h * BLOCK_Q * BLOCK_K) for a group of
``nb`` batch entries chosen so that this stays below ``TILE_BUDGET`` elements; nothing of
size s_q x s_k is allocated (except the S_dmask that ``return_softmax`` asks for).

GQA: a chunk of q (nb, s, h, d) is viewed as (nb, h_k, g * s, d) with g = h // h_k query
heads per kv head, so one batched matmul against the (nb, h_k, s_k, d) kv chunk serves the
whole group and the dK / dV matmuls sum over the group for free. Score-level tensors are
viewed as (nb, h_k, g, s_q_chunk, s_k_chunk) whenever a per-head term (alibi, dropout) is
applied; head ``h_k_idx * g + g_idx`` is query head ``hq``.

Dropout decisions come from :mod:`flashattn.philox` with the counters of docs/internals.md,
so they are bit-identical to the Triton kernels'.
"""
from __future__ import annotations

from typing import Iterator, Optional

import torch

from flashattn.philox import dropout_keep

# Tile sizes (read at call time, so tests can shrink them to exercise many tiles).
BLOCK_Q = 128
BLOCK_K = 256
# Upper bound on the elements of one score tile (nb * h * BLOCK_Q * BLOCK_K); decides how
# many batch entries are processed together.
TILE_BUDGET = 1 << 22


# ---------------------------------------------------------------------------------------
# tile geometry
# ---------------------------------------------------------------------------------------

def _key_span(i0: int, i1: int, s_q: int, s_k: int, window_left: int, window_right: int
              ) -> tuple[int, int]:
    """Keys [lo, hi) that some query row in [i0, i1) may see (empty when lo >= hi)."""
    diag = s_k - s_q
    lo = 0 if window_left < 0 else max(0, i0 + diag - window_left)
    hi = s_k if window_right < 0 else min(s_k, (i1 - 1) + diag + window_right + 1)
    return lo, hi


def _query_span(j0: int, j1: int, s_q: int, s_k: int, window_left: int, window_right: int
                ) -> tuple[int, int]:
    """Query rows [lo, hi) that may see some key in [j0, j1) (empty when lo >= hi).

    Row i sees key j iff ``j - diag - right <= i <= j - diag + left``.
    """
    diag = s_k - s_q
    lo = 0 if window_right < 0 else max(0, j0 - diag - window_right)
    hi = s_q if window_left < 0 else min(s_q, (j1 - 1) - diag + window_left + 1)
    return lo, hi


def _chunks(lo: int, hi: int, size: int) -> Iterator[tuple[int, int]]:
    for start in range(lo, hi, size):
        yield start, min(start + size, hi)


def _batch_groups(b: int, h: int, block_q: int, block_k: int) -> Iterator[tuple[int, int]]:
    nb = max(1, min(b, TILE_BUDGET // max(1, h * block_q * block_k)))
    return _chunks(0, b, nb)


# ---------------------------------------------------------------------------------------
# per-tile score computation
# ---------------------------------------------------------------------------------------

class _Problem:
    """The normalised attention parameters plus shapes, shared by every tile."""

    def __init__(self, q, k, v, softmax_scale, window_left, window_right, softcap,
                 alibi_slopes, dropout_p, philox_seed, batch_offset=0, alibi_shift=0):
        self.b, self.s_q, self.h, self.d = q.shape
        self.s_k, self.h_k = k.shape[1], k.shape[2]
        self.d_v = v.shape[3]
        self.g = self.h // self.h_k
        # fp32 accumulation for fp16/bf16/fp32 inputs; float64 inputs keep their precision
        self.acc_dtype = torch.promote_types(q.dtype, torch.float32)
        self.scale = float(softmax_scale)
        self.window_left = int(window_left)
        self.window_right = int(window_right)
        self.softcap = float(softcap)
        self.alibi = None
        self.alibi_shift = int(alibi_shift)  # (AttnParams.alibi_shift: moves ALiBi, not the mask)
        if alibi_slopes is not None:
            slopes = alibi_slopes.to(self.acc_dtype)
            if slopes.dim() == 1:
                slopes = slopes.view(1, self.h).expand(self.b, self.h)
            self.alibi = slopes
        self.dropout_p = float(dropout_p)
        self.seed = int(philox_seed) if dropout_p > 0.0 else 0
        # dropout's batch counter of entry 0 (varlen: the index of the packed sequence)
        self.batch_offset = int(batch_offset)
        self.device = q.device

    def q_tile(self, x: torch.Tensor, b0: int, b1: int, i0: int, i1: int) -> torch.Tensor:
        """Rows [i0, i1) of a (b, s_q, h, e) tensor as (nb, h_k, g * m, e) in acc dtype."""
        t = x[b0:b1, i0:i1].to(self.acc_dtype)  # (nb, m, h, e)
        nb, m, _, e = t.shape
        return t.view(nb, m, self.h_k, self.g, e).permute(0, 2, 3, 1, 4).reshape(
            nb, self.h_k, self.g * m, e)

    def kv_tile(self, x: torch.Tensor, b0: int, b1: int, j0: int, j1: int) -> torch.Tensor:
        """Keys [j0, j1) of a (b, s_k, h_k, e) tensor as (nb, h_k, n, e) in acc dtype."""
        return x[b0:b1, j0:j1].to(self.acc_dtype).transpose(1, 2)

    def scores(self, q_t: torch.Tensor, k_t: torch.Tensor, b0: int, b1: int,
               i0: int, i1: int, j0: int, j1: int
               ) -> tuple[torch.Tensor, Optional[torch.Tensor]]:
        """Modified scores (nb, h_k, g, m, n), -inf where invisible, and tanh for softcap's grad.

        q_t (nb, h_k, g * m, d), k_t (nb, h_k, n, d).
        """
        nb, m, n = b1 - b0, i1 - i0, j1 - j0
        qk = torch.matmul(q_t, k_t.transpose(-1, -2)).view(nb, self.h_k, self.g, m, n)
        t = None
        if self.softcap > 0.0:
            t = torch.tanh(qk * (self.scale / self.softcap))
            s = t * self.softcap
        else:
            s = qk * self.scale
        rows = torch.arange(i0, i1, device=self.device).view(m, 1)
        cols = torch.arange(j0, j1, device=self.device).view(1, n)
        key_of_row = rows + (self.s_k - self.s_q)  # bottom-right alignment
        if self.alibi is not None:
            dist = (key_of_row + self.alibi_shift - cols).abs().to(self.acc_dtype)
            slopes = self.alibi[b0:b1].reshape(nb, self.h_k, self.g, 1, 1)
            s = s - slopes * dist
        visible = None
        if self.window_left >= 0:
            visible = cols >= key_of_row - self.window_left
        if self.window_right >= 0:
            right_ok = cols <= key_of_row + self.window_right
            visible = right_ok if visible is None else visible & right_ok
        if visible is not None and not bool(visible.all()):
            s = s.masked_fill(~visible, float("-inf"))
        return s, t

    def keep(self, b0: int, b1: int, i0: int, i1: int, j0: int, j1: int) -> torch.Tensor:
        """Dropout keep mask (nb, h_k, g, m, n) with the counters of the full problem."""
        nb = b1 - b0
        b0, b1 = b0 + self.batch_offset, b1 + self.batch_offset
        bh = torch.arange(b0 * self.h, b1 * self.h, device=self.device).view(
            nb, self.h_k, self.g, 1, 1)
        rows = torch.arange(i0, i1, device=self.device).view(-1, 1)
        cols = torch.arange(j0, j1, device=self.device).view(1, -1)
        return dropout_keep(self.seed, self.dropout_p, bh, rows, cols, device=self.device)


def _lse_tile(lse: torch.Tensor, p: _Problem, b0: int, b1: int, i0: int, i1: int) -> torch.Tensor:
    """lse rows (nb, h_k, g, m, 1); -inf (no visible key) becomes +inf so exp(s - lse) = 0."""
    t = lse[b0:b1, :, i0:i1].to(p.acc_dtype)
    t = torch.where(t == float("-inf"), torch.full_like(t, float("inf")), t)
    return t.view(b1 - b0, p.h_k, p.g, i1 - i0, 1)


# ---------------------------------------------------------------------------------------
# forward
# ---------------------------------------------------------------------------------------

def chunked_fwd(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, softmax_scale: float,
                causal: bool, window_left: int, window_right: int, softcap: float,
                alibi_slopes: Optional[torch.Tensor], dropout_p: float, philox_seed: int,
                return_softmax: bool, batch_offset: int = 0, alibi_shift: int = 0
                ) -> tuple[torch.Tensor, torch.Tensor, Optional[torch.Tensor]]:
    """Attention forward, tiled with an online softmax.

    q (b, s_q, h, d), k (b, s_k, h_k, d), v (b, s_k, h_k, d_v); fp16/bf16/fp32, one dtype.
    ``causal`` is informational (already folded into ``window_right == 0``).
    ``batch_offset`` is the dropout counter of batch entry 0 (varlen calls one sequence at a
    time with its own index). ``alibi_shift``: ALiBi's distance is |i + s_k - s_q + shift - j|
    (AttnParams.alibi_shift).

    Returns:
        out (b, s_q, h, d_v) in q's dtype, contiguous; 0 on rows that see no key.
        lse (b, h, s_q) float32, natural log; -inf on rows that see no key.
        S_dmask (b, h, s_q, s_k) in q's dtype if ``return_softmax`` else None: probabilities
            before dropout scaling, negated where dropout dropped the entry, 0 where invisible.
    """
    p = _Problem(q, k, v, softmax_scale, window_left, window_right, softcap, alibi_slopes,
                 dropout_p, philox_seed, batch_offset, alibi_shift)
    out = torch.empty(p.b, p.s_q, p.h, p.d_v, dtype=q.dtype, device=q.device)
    lse = torch.empty(p.b, p.h, p.s_q, dtype=torch.float32, device=q.device)
    has_dropout = p.dropout_p > 0.0
    neg_inf = float("-inf")
    for b0, b1 in _batch_groups(p.b, p.h, BLOCK_Q, BLOCK_K):
        nb = b1 - b0
        for i0, i1 in _chunks(0, p.s_q, BLOCK_Q):
            m = i1 - i0
            q_t = p.q_tile(q, b0, b1, i0, i1)
            m_i = torch.full((nb, p.h_k, p.g, m, 1), neg_inf, dtype=p.acc_dtype, device=p.device)
            l_i = torch.zeros_like(m_i)
            acc = torch.zeros(nb, p.h_k, p.g, m, p.d_v, dtype=p.acc_dtype, device=p.device)
            k_lo, k_hi = _key_span(i0, i1, p.s_q, p.s_k, p.window_left, p.window_right)
            for j0, j1 in _chunks(k_lo, k_hi, BLOCK_K):
                s, _ = p.scores(q_t, p.kv_tile(k, b0, b1, j0, j1), b0, b1, i0, i1, j0, j1)
                m_new = torch.maximum(m_i, s.amax(dim=-1, keepdim=True))
                # rows with no visible key so far keep m = -inf: subtract 0 instead (no NaN)
                m_sub = torch.where(m_new == neg_inf, torch.zeros_like(m_new), m_new)
                p_ij = torch.exp(s - m_sub)
                alpha = torch.exp(m_i - m_sub)
                l_i = l_i * alpha + p_ij.sum(dim=-1, keepdim=True)
                if has_dropout:
                    # l_i sums the undropped probabilities: dropout acts after the softmax
                    p_ij = p_ij.masked_fill(~p.keep(b0, b1, i0, i1, j0, j1), 0.0)
                v_t = p.kv_tile(v, b0, b1, j0, j1).unsqueeze(2)  # (nb, h_k, 1, n, d_v)
                acc = acc * alpha + torch.matmul(p_ij, v_t)
                m_i = m_new
            has_key = l_i > 0
            l_safe = torch.where(has_key, l_i, torch.ones_like(l_i))
            o_scale = 1.0 / (1.0 - p.dropout_p)
            o_t = acc * (o_scale / l_safe)  # 0 on rows without keys: acc is 0 there
            lse_t = torch.where(has_key, m_i + torch.log(l_safe), torch.full_like(l_i, neg_inf))
            # (nb, h_k, g, m, d_v) -> (nb, m, h, d_v)
            out[b0:b1, i0:i1] = o_t.permute(0, 3, 1, 2, 4).reshape(nb, m, p.h, p.d_v).to(q.dtype)
            lse[b0:b1, :, i0:i1] = lse_t.reshape(nb, p.h, m).to(torch.float32)
    s_dmask = _softmax_dmask(q, k, lse, p) if return_softmax else None
    return out, lse, s_dmask


def _softmax_dmask(q: torch.Tensor, k: torch.Tensor, lse: torch.Tensor, p: _Problem
                   ) -> torch.Tensor:
    """S_dmask (b, h, s_q, s_k) in q's dtype, recomputed tile by tile from the final lse."""
    s_dmask = torch.zeros(p.b, p.h, p.s_q, p.s_k, dtype=q.dtype, device=q.device)
    for b0, b1 in _batch_groups(p.b, p.h, BLOCK_Q, BLOCK_K):
        nb = b1 - b0
        for i0, i1 in _chunks(0, p.s_q, BLOCK_Q):
            q_t = p.q_tile(q, b0, b1, i0, i1)
            lse_t = _lse_tile(lse, p, b0, b1, i0, i1)
            k_lo, k_hi = _key_span(i0, i1, p.s_q, p.s_k, p.window_left, p.window_right)
            for j0, j1 in _chunks(k_lo, k_hi, BLOCK_K):
                s, _ = p.scores(q_t, p.kv_tile(k, b0, b1, j0, j1), b0, b1, i0, i1, j0, j1)
                probs = torch.exp(s - lse_t)
                if p.dropout_p > 0.0:
                    probs = torch.where(p.keep(b0, b1, i0, i1, j0, j1), probs, -probs)
                s_dmask[b0:b1, :, i0:i1, j0:j1] = probs.reshape(
                    nb, p.h, i1 - i0, j1 - j0).to(q.dtype)
    return s_dmask


# ---------------------------------------------------------------------------------------
# backward
# ---------------------------------------------------------------------------------------

def chunked_bwd(dout: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                out: torch.Tensor, lse: torch.Tensor, *, softmax_scale: float, causal: bool,
                window_left: int, window_right: int, softcap: float,
                alibi_slopes: Optional[torch.Tensor], dropout_p: float, philox_seed: int,
                deterministic: bool, batch_offset: int = 0, alibi_shift: int = 0
                ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Attention backward: recompute P = exp(s - lse) per tile, never store it.

    dout, out (b, s_q, h, d_v); q (b, s_q, h, d); k (b, s_k, h_k, d); v (b, s_k, h_k, d_v);
    lse (b, h, s_q) float32 from :func:`chunked_fwd`. Returns dq, dk, dv with the shapes and
    dtypes of q, k, v; dk / dv are summed over the query heads of each GQA group. The loop
    order is fixed, so the result is always bitwise repeatable (``deterministic`` is moot).
    ``batch_offset`` and ``alibi_shift`` as for :func:`chunked_fwd`.

    With D_i = rowsum(dO_i * O_i) and Z = keep / (1 - p):
    dV = (P * Z)^T dO;  dP = (dO V^T) * Z;  dS = P * (dP - D);  through softcap
    dS *= 1 - tanh^2;  dQ = dS K * scale;  dK = dS^T Q * scale.
    """
    p = _Problem(q, k, v, softmax_scale, window_left, window_right, softcap, alibi_slopes,
                 dropout_p, philox_seed, batch_offset, alibi_shift)
    has_dropout = p.dropout_p > 0.0
    z_scale = 1.0 / (1.0 - p.dropout_p)
    dq = torch.zeros(p.b, p.s_q, p.h, p.d, dtype=p.acc_dtype, device=p.device)
    dk = torch.empty(p.b, p.s_k, p.h_k, p.d, dtype=k.dtype, device=p.device)
    dv = torch.empty(p.b, p.s_k, p.h_k, p.d_v, dtype=v.dtype, device=p.device)
    # delta (b, h, s_q) in acc dtype; computed once, O(b * s_q * h) memory
    delta = (dout.to(p.acc_dtype) * out.to(p.acc_dtype)).sum(dim=-1).transpose(1, 2)
    for b0, b1 in _batch_groups(p.b, p.h, BLOCK_Q, BLOCK_K):
        nb = b1 - b0
        # key chunks outside, query chunks inside (as FA2's backward): dK / dV of a key
        # chunk are complete after its inner loop and written once; dQ accumulates into
        # one fp32 buffer of q's size
        for j0, j1 in _chunks(0, p.s_k, BLOCK_K):
            n = j1 - j0
            k_t = p.kv_tile(k, b0, b1, j0, j1)  # (nb, h_k, n, d)
            v_t = p.kv_tile(v, b0, b1, j0, j1)  # (nb, h_k, n, d_v)
            dk_t = torch.zeros(nb, p.h_k, n, p.d, dtype=p.acc_dtype, device=p.device)
            dv_t = torch.zeros(nb, p.h_k, n, p.d_v, dtype=p.acc_dtype, device=p.device)
            q_lo, q_hi = _query_span(j0, j1, p.s_q, p.s_k, p.window_left, p.window_right)
            for i0, i1 in _chunks(q_lo, q_hi, BLOCK_Q):
                m = i1 - i0
                q_t = p.q_tile(q, b0, b1, i0, i1)  # (nb, h_k, g*m, d)
                do_t = p.q_tile(dout, b0, b1, i0, i1)  # (nb, h_k, g*m, d_v)
                s, t = p.scores(q_t, k_t, b0, b1, i0, i1, j0, j1)  # (nb, h_k, g, m, n)
                probs = torch.exp(s - _lse_tile(lse, p, b0, b1, i0, i1))
                dp = torch.matmul(do_t, v_t.transpose(-1, -2)).view(nb, p.h_k, p.g, m, n)
                if has_dropout:
                    keep = p.keep(b0, b1, i0, i1, j0, j1)
                    probs_z = probs.masked_fill(~keep, 0.0) * z_scale
                    dp = dp.masked_fill(~keep, 0.0) * z_scale
                else:
                    probs_z = probs
                # summing over (g, m) in one matmul reduces over the GQA group too
                dv_t += torch.matmul(probs_z.reshape(nb, p.h_k, p.g * m, n).transpose(-1, -2),
                                     do_t)
                delta_t = delta[b0:b1, :, i0:i1].reshape(nb, p.h_k, p.g, m, 1)
                ds = probs * (dp - delta_t)
                if t is not None:
                    ds = ds * (1.0 - t * t)
                ds = ds.reshape(nb, p.h_k, p.g * m, n)
                dk_t += torch.matmul(ds.transpose(-1, -2), q_t)
                dq_t = torch.matmul(ds, k_t)  # (nb, h_k, g*m, d)
                dq[b0:b1, i0:i1] += dq_t.view(nb, p.h_k, p.g, m, p.d).permute(
                    0, 3, 1, 2, 4).reshape(nb, m, p.h, p.d)
            dk[b0:b1, j0:j1] = (dk_t * p.scale).transpose(1, 2).to(k.dtype)
            dv[b0:b1, j0:j1] = dv_t.transpose(1, 2).to(v.dtype)
    return (dq * p.scale).to(q.dtype), dk, dv


# ---------------------------------------------------------------------------------------
# packed variable-length sequences
# ---------------------------------------------------------------------------------------

def _sequences(cu_seqlens_q: torch.Tensor, cu_seqlens_k: torch.Tensor,
               seqused_k: Optional[torch.Tensor]) -> Iterator[tuple[int, int, int, int, int]]:
    """(b, q_start, s_q, k_start, s_k) of every packed sequence with queries and keys.

    Reads the (small) length tensors on the host: fine for this path, whose tensors live
    on the CPU (or on a device without Triton, where speed is not the point).
    """
    cu_q = cu_seqlens_q.tolist()
    cu_k = cu_seqlens_k.tolist()
    used = seqused_k.tolist() if seqused_k is not None else None
    for b in range(len(cu_q) - 1):
        s_q = cu_q[b + 1] - cu_q[b]
        s_k = used[b] if used is not None else cu_k[b + 1] - cu_k[b]
        if s_q > 0 and s_k > 0:  # otherwise: out 0, lse -inf, zero gradients
            yield b, cu_q[b], s_q, cu_k[b], s_k


def chunked_varlen_fwd(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                       cu_seqlens_q: torch.Tensor, cu_seqlens_k: torch.Tensor,
                       seqused_k: Optional[torch.Tensor], max_seqlen_q: int, max_seqlen_k: int,
                       *, softmax_scale: float, causal: bool, window_left: int,
                       window_right: int, softcap: float, alibi_slopes: Optional[torch.Tensor],
                       dropout_p: float, philox_seed: int, return_softmax: bool
                       ) -> tuple[torch.Tensor, torch.Tensor, Optional[torch.Tensor]]:
    """Varlen forward: :func:`chunked_fwd` on each packed sequence in turn.

    q (total_q, h, d), k (total_k, h_k, d), v (total_k, h_k, d_v); cu_seqlens_* int32 (b + 1,);
    seqused_k int32 (b,) or None (then s_k = cu_seqlens_k[b+1] - cu_seqlens_k[b]);
    alibi_slopes (b, h) or None. Sequence b is batch entry b of the dense semantics (its own
    s_q, s_k, bottom-right alignment and dropout batch counter b).

    Returns out (total_q, h, d_v) in q's dtype (0 on rows outside every sequence), lse
    float32 (h, total_q) (-inf there), S_dmask (b, h, max_seqlen_q, max_seqlen_k) or None.
    """
    total_q, h, _ = q.shape
    batch = cu_seqlens_q.shape[0] - 1
    out = torch.zeros(total_q, h, v.shape[-1], dtype=q.dtype, device=q.device)
    lse = torch.full((h, total_q), float("-inf"), dtype=torch.float32, device=q.device)
    s_dmask = (torch.zeros(batch, h, max_seqlen_q, max_seqlen_k, dtype=q.dtype, device=q.device)
               if return_softmax else None)
    for b, q0, s_q, k0, s_k in _sequences(cu_seqlens_q, cu_seqlens_k, seqused_k):
        o_b, lse_b, p_b = chunked_fwd(
            q[q0:q0 + s_q].unsqueeze(0), k[k0:k0 + s_k].unsqueeze(0),
            v[k0:k0 + s_k].unsqueeze(0), softmax_scale=softmax_scale, causal=causal,
            window_left=window_left, window_right=window_right, softcap=softcap,
            alibi_slopes=None if alibi_slopes is None else alibi_slopes[b:b + 1],
            dropout_p=dropout_p, philox_seed=philox_seed, return_softmax=return_softmax,
            batch_offset=b)
        out[q0:q0 + s_q] = o_b[0]
        lse[:, q0:q0 + s_q] = lse_b[0]
        if s_dmask is not None:
            s_dmask[b, :, :s_q, :s_k] = p_b[0]
    return out, lse, s_dmask


def chunked_varlen_bwd(dout: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                       out: torch.Tensor, lse: torch.Tensor, cu_seqlens_q: torch.Tensor,
                       cu_seqlens_k: torch.Tensor, seqused_k: Optional[torch.Tensor],
                       max_seqlen_q: int, max_seqlen_k: int, *, softmax_scale: float,
                       causal: bool, window_left: int, window_right: int, softcap: float,
                       alibi_slopes: Optional[torch.Tensor], dropout_p: float,
                       philox_seed: int, deterministic: bool
                       ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Varlen backward: :func:`chunked_bwd` on each packed sequence in turn.

    Shapes as in :func:`chunked_varlen_fwd`; lse float32 (h, total_q). Returns dq, dk, dv
    with the shapes and dtypes of q, k, v; 0 for rows outside every sequence and keys past
    seqused_k. Sequences own disjoint rows, so the result is bitwise repeatable.
    """
    dq = torch.zeros(q.shape, dtype=q.dtype, device=q.device)
    dk = torch.zeros(k.shape, dtype=k.dtype, device=k.device)
    dv = torch.zeros(v.shape, dtype=v.dtype, device=v.device)
    for b, q0, s_q, k0, s_k in _sequences(cu_seqlens_q, cu_seqlens_k, seqused_k):
        rows, keys = slice(q0, q0 + s_q), slice(k0, k0 + s_k)
        dq_b, dk_b, dv_b = chunked_bwd(
            dout[rows].unsqueeze(0), q[rows].unsqueeze(0), k[keys].unsqueeze(0),
            v[keys].unsqueeze(0), out[rows].unsqueeze(0), lse[:, rows].unsqueeze(0),
            softmax_scale=softmax_scale, causal=causal, window_left=window_left,
            window_right=window_right, softcap=softcap,
            alibi_slopes=None if alibi_slopes is None else alibi_slopes[b:b + 1],
            dropout_p=dropout_p, philox_seed=philox_seed, deterministic=deterministic,
            batch_offset=b)
        dq[rows] = dq_b[0]
        dk[keys] = dk_b[0]
        dv[keys] = dv_b[0]
    return dq, dk, dv
