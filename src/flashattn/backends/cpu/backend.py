"""The chunked torch backend's interface: one function per op, as dispatch calls them.

Same contracts as :mod:`flashattn.backends.triton.backend` (docs/internals.md); runs on any device torch
runs on (the CPU path, and GPUs without triton). ``num_splits`` is ignored here (same math).
"""
from __future__ import annotations

from typing import Optional, Tuple

import torch

from flashattn.backends.cpu import aten_flash as _aten
from flashattn.backends.cpu import dense as _dense
from flashattn.backends.cpu import fp8 as _fp8
from flashattn.backends.cpu import kvcache as _kv
from flashattn.params import AttnParams, Fp8Scales
from flashattn.fp8_format import to_wgmma_order

Tensor = torch.Tensor


def fwd(q: Tensor, k: Tensor, v: Tensor, p: AttnParams, return_softmax: bool):
    """Dense forward: (out, lse, S_dmask | None). Calls PyTorch's own CPU flash kernel covers
    run there (cpu/aten_flash.py: 1.6-2.7x faster than the chunked path, same contract)."""
    if not return_softmax and _aten.covers(q, k, v, p):
        out, lse = _aten.fwd(q, k, v, p)
        return out, lse, None
    return _dense.chunked_fwd(q, k, v, **p.kernel_kwargs(), return_softmax=return_softmax)


def bwd(dout: Tensor, q: Tensor, k: Tensor, v: Tensor, out: Tensor, lse: Tensor, p: AttnParams):
    """Dense backward: (dq, dk, dv). Either forward's lse serves either backward (same
    contract); deterministic=True stays on the chunked path (fixed reduction order), and so
    does fp32 (aten's fp32 backward misses flash-attn's accuracy rule: cpu/aten_flash.py)."""
    if not p.deterministic and _aten.covers_backward(q, k, v, p):
        return _aten.bwd(dout, q, k, v, out, lse, p)
    return _dense.chunked_bwd(dout, q, k, v, out, lse, **p.kernel_kwargs(),
                              deterministic=p.deterministic)


def varlen_fwd(q: Tensor, k: Tensor, v: Tensor, cu_seqlens_q: Tensor, cu_seqlens_k: Tensor,
               seqused_k: Optional[Tensor], max_seqlen_q: int, max_seqlen_k: int,
               p: AttnParams, return_softmax: bool):
    """Packed variable-length forward: (out (total_q, h, d_v), lse (h, total_q), S_dmask)."""
    return _dense.chunked_varlen_fwd(q, k, v, cu_seqlens_q, cu_seqlens_k, seqused_k,
                                     max_seqlen_q, max_seqlen_k, **p.kernel_kwargs(),
                                     return_softmax=return_softmax)


def varlen_bwd(dout: Tensor, q: Tensor, k: Tensor, v: Tensor, out: Tensor, lse: Tensor,
               cu_seqlens_q: Tensor, cu_seqlens_k: Tensor, seqused_k: Optional[Tensor],
               max_seqlen_q: int, max_seqlen_k: int, p: AttnParams):
    """Packed variable-length backward: (dq, dk, dv)."""
    return _dense.chunked_varlen_bwd(dout, q, k, v, out, lse, cu_seqlens_q, cu_seqlens_k, seqused_k,
                                     max_seqlen_q, max_seqlen_k, **p.kernel_kwargs(),
                                     deterministic=p.deterministic)


def fp8_fwd(q8: Tensor, k8: Tensor, v8: Tensor, scales: Fp8Scales, p: AttnParams,
            out_dtype: torch.dtype) -> Tuple[Tensor, Tensor]:
    """Dense FP8 forward: (out (b, s_q, h, d_v) in out_dtype, lse (b, h, s_q)): attention of
    the dequantized values in float32 (exact semantics, no P rounding)."""
    q, k, v = _fp8.dequantized(q8, k8, v8, scales)
    out, lse, _ = fwd(q, k, v, p, False)
    return out.to(out_dtype), lse


def fp8_varlen_fwd(q8: Tensor, k8: Tensor, v8: Tensor, cu_seqlens_q: Tensor,
                   cu_seqlens_k: Tensor, seqused_k: Optional[Tensor], max_seqlen_q: int,
                   max_seqlen_k: int, scales: Fp8Scales, p: AttnParams,
                   out_dtype: torch.dtype) -> Tuple[Tensor, Tensor]:
    """Packed varlen FP8 forward (one descale per (sequence, head)): (out, lse (h, total_q))."""
    batch = cu_seqlens_q.shape[0] - 1
    seq_q = _fp8.per_packed_row(cu_seqlens_q, q8.shape[0], batch)
    seq_k = _fp8.per_packed_row(cu_seqlens_k, k8.shape[0], batch)
    q = q8.float() * scales.q_descale[:, :, 0].float()[seq_q].unsqueeze(-1)
    k = k8.float() * scales.k_descale[:, :, 0].float()[seq_k].unsqueeze(-1)
    v = v8.float().contiguous() * scales.v_descale[:, :, 0].float()[seq_k].unsqueeze(-1)
    out, lse, _ = varlen_fwd(q, k, v, cu_seqlens_q, cu_seqlens_k, seqused_k, max_seqlen_q,
                             max_seqlen_k, p, False)
    return out.to(out_dtype), lse


def _rows(x: Optional[Tensor], cu: Optional[list], i: int) -> Optional[Tensor]:
    """Sequence i of x as a batch of one: rows cu[i]:cu[i+1] of a packed x, else x[i:i+1]."""
    if x is None:
        return None
    return x[i:i + 1] if cu is None else x[cu[i]:cu[i + 1]].unsqueeze(0)


def _one(x: Optional[Tensor], i: int) -> Optional[Tensor]:
    return None if x is None else x[i:i + 1]


def _cache_row(batch_idx: Optional[Tensor], block_table: Optional[Tensor], i: int,
               device: torch.device) -> Optional[Tensor]:
    """The cache row of sequence i once it is sliced into a batch of one (contiguous cache)."""
    if block_table is not None:
        return None
    return batch_idx[i:i + 1] if batch_idx is not None else torch.tensor(
        [i], dtype=torch.int32, device=device)


def append_kv(q: Tensor, k_cache: Tensor, v_cache: Tensor, k: Optional[Tensor],
              v: Optional[Tensor], cos: Optional[Tensor], sin: Optional[Tensor],
              interleaved: bool, seqlens: Tensor, batch_idx: Optional[Tensor],
              block_table: Optional[Tensor], rotary_q_step: int = 1, *,
              cu_seqlens_q: Optional[Tensor] = None, max_seqlen_q: int = 0,
              cu_seqlens_k_new: Optional[Tensor] = None, max_seqlen_k_new: int = 0,
              rotary_seqlens: Optional[Tensor] = None, k_descale: Optional[Tensor] = None,
              v_descale: Optional[Tensor] = None) -> Tensor:
    """As :func:`flashattn.backends.triton.backend.append_kv`, in torch (varlen forms: one sequence at
    a time, the lengths read on the host, which is free for CPU tensors). A float8_e4m3fn q
    is rotated from its bf16 widening (exact) into bf16, as the Triton path does."""
    fp8 = dict(k_descale=k_descale, v_descale=v_descale)
    if cos is not None and q.dtype == torch.float8_e4m3fn:
        q = q.to(torch.bfloat16)
    rot_base = rotary_seqlens if rotary_seqlens is not None else seqlens
    if cu_seqlens_q is None and cu_seqlens_k_new is None:
        if k is not None:
            _kv.append_kv(k_cache, v_cache, k, v, seqlens, cos, sin, interleaved, batch_idx,
                          block_table, rot_base, **fp8)
        if cos is None:
            return q
        positions = rot_base.long().view(-1, 1) + rotary_q_step * torch.arange(
            q.shape[1], device=q.device)
        return _kv.rotate(q, cos, sin, positions, interleaved)
    cu_q = None if cu_seqlens_q is None else cu_seqlens_q.tolist()
    cu_k = None if cu_seqlens_k_new is None else cu_seqlens_k_new.tolist()
    for i in range(seqlens.shape[0]):
        if k is not None:
            _kv.append_kv(k_cache, v_cache, _rows(k, cu_k, i), _rows(v, cu_k, i),
                          seqlens[i:i + 1], cos, sin, interleaved,
                          _cache_row(batch_idx, block_table, i, q.device),
                          _one(block_table, i), rot_base[i:i + 1],
                          _one(k_descale, i), _one(v_descale, i))
    if cos is None:
        return q
    q_rot = q.clone()
    for i in range(seqlens.shape[0]):
        q_i = _rows(q, cu_q, i)
        positions = rot_base[i:i + 1].long().view(-1, 1) + rotary_q_step * torch.arange(
            q_i.shape[1], device=q.device)
        rotated = _kv.rotate(q_i, cos, sin, positions, interleaved)
        if cu_q is None:
            q_rot[i:i + 1] = rotated
        else:
            q_rot[cu_q[i]:cu_q[i + 1]] = rotated[0]
    return q_rot


def kvcache_attention(q: Tensor, k_cache: Tensor, v_cache: Tensor, seqlens: Tensor, s_new: int,
                      *, p: AttnParams, leftpad: Optional[Tensor], batch_idx: Optional[Tensor],
                      block_table: Optional[Tensor], num_splits: int,
                      capacity: int, buffers: Optional[dict] = None,
                      cu_seqlens_q: Optional[Tensor] = None, max_seqlen_q: int = 0,
                      k_descale: Optional[Tensor] = None, v_descale: Optional[Tensor] = None,
                      q_descale: Optional[Tensor] = None, qv: Optional[Tensor] = None,
                      out_dtype: Optional[torch.dtype] = None) -> Tuple[Tensor, Tensor]:
    """Attention of q against the cache (keys already appended): (out, lse); FP8 caches
    with their (b, h_k) float32 descales are dequantized, then attended (an FP8 q with
    q_descale too: out bfloat16); ``qv`` (q's shape with d_v, FlashAttention-3's latent
    query) adds ``qv . v`` to the scores. (``buffers``,
    a decode plan's workspace, is not used here: the torch path allocates.) With
    ``cu_seqlens_q`` q is packed (total_q, h, d): out (total_q, h, d_v), lse (h, total_q).
    ``out_dtype``: out's dtype when not the call's (each row's result is computed in the
    call's dtype, then stored in it)."""
    kw = dict(softmax_scale=p.softmax_scale, window_left=p.window_left,
              window_right=p.window_right, softcap=p.softcap,
              attention_chunk=p.attention_chunk)
    if cu_seqlens_q is None:
        out, lse = _kv.kvcache_fwd(q, k_cache, v_cache, seqlens, s_new,
                                   alibi_slopes=p.alibi_slopes, leftpad=leftpad,
                                   batch_idx=batch_idx, block_table=block_table,
                                   k_descale=k_descale, v_descale=v_descale,
                                   q_descale=q_descale, qv=qv, **kw)
        return (out if out_dtype is None else out.to(out_dtype)), lse
    total_q, h, _ = q.shape
    out = torch.zeros(total_q, h, v_cache.shape[3], dtype=out_dtype or (
        torch.bfloat16 if q_descale is not None else q.dtype), device=q.device)
    lse = torch.full((h, total_q), float("-inf"), dtype=torch.float32, device=q.device)
    cu = cu_seqlens_q.tolist()
    for i in range(len(cu) - 1):
        if cu[i + 1] <= cu[i]:
            continue
        o_i, lse_i = _kv.kvcache_fwd(
            q[cu[i]:cu[i + 1]].unsqueeze(0), k_cache, v_cache, seqlens[i:i + 1], s_new,
            alibi_slopes=_one(p.alibi_slopes, i), leftpad=_one(leftpad, i),
            batch_idx=_cache_row(batch_idx, block_table, i, q.device),
            block_table=_one(block_table, i), k_descale=_one(k_descale, i),
            v_descale=_one(v_descale, i), q_descale=_one(q_descale, i),
            qv=None if qv is None else qv[cu[i]:cu[i + 1]].unsqueeze(0), **kw)
        out[cu[i]:cu[i + 1]] = o_i[0]
        lse[:, cu[i]:cu[i + 1]] = lse_i[0]
    return out, lse


def varlen_paged_fwd(q: Tensor, k_cache: Tensor, v_cache: Tensor, cu_seqlens_q: Tensor,
                     cu_seqlens_k: Tensor, seqused_k: Optional[Tensor], max_seqlen_q: int,
                     max_seqlen_k: int, block_table: Tensor, p: AttnParams
                     ) -> Tuple[Tensor, Tensor]:
    """Packed varlen queries against a paged cache: (out (total_q, h, d_v), lse (h, total_q))."""
    return _kv.varlen_paged_fwd(q, k_cache, v_cache, cu_seqlens_q, cu_seqlens_k, seqused_k,
                                block_table, softmax_scale=p.softmax_scale,
                                window_left=p.window_left, window_right=p.window_right,
                                softcap=p.softcap, alibi_slopes=p.alibi_slopes)


def lse_merge(out_a: Tensor, lse_a: Tensor, out_b: Tensor, lse_b: Tensor, dest: Tensor) -> None:
    """Two partial results merged through their lse, in place (torch ops, float32 math; see
    triton/lse_merge.py): a side whose lse is -inf weighs exactly 0 and is never multiplied
    in; a row with no key on either side gets out 0, lse -inf."""
    hi = torch.maximum(lse_a, lse_b)
    ref = torch.where(torch.isinf(hi), torch.zeros_like(hi), hi)  # -inf only if both are
    e_a, e_b = torch.exp(lse_a - ref), torch.exp(lse_b - ref)
    total = e_a + e_b
    any_key = total > 0
    total = torch.where(any_key, total, torch.ones_like(total))
    terms = []
    for o, e in ((out_a, e_a), (out_b, e_b)):
        w = (e / total).transpose(1, 2).unsqueeze(-1)  # (b, s, h, 1)
        terms.append(torch.where(w > 0, o.float() * w, torch.zeros((), device=o.device)))
    dest.copy_(terms[0] + terms[1])
    lse_a.copy_(torch.where(any_key, ref + torch.log(total),
                            torch.full_like(ref, float("-inf"))))


def sum_rows(parts, starts, out: Tensor) -> None:
    """``out`` (outer, n_rows, inner) becomes the float32 sum of ``parts[i]`` (outer, rows_i,
    inner) over its rows ``[starts[i], starts[i] + rows_i)``, in the pieces' order, rounded
    once; rows no piece covers become 0 (torch ops; see triton/sum_rows.py)."""
    acc = torch.zeros(out.shape, dtype=torch.float32, device=out.device)
    for part, start in zip(parts, starts):
        acc.narrow(1, start, part.shape[1]).add_(part)
    out.copy_(acc)


def sink_apply(out: Tensor, lse: Tensor, sink: Tensor, packed: bool,
               out_dtype: Optional[torch.dtype] = None) -> Tuple[Tensor, Tensor]:
    """Learnable sinks on a finished (out, lse): out * exp(lse - lse'), lse' = logaddexp(lse,
    sink) (torch ops; see triton/sink.py for the derivation); out' in ``out_dtype`` (default
    out's)."""
    s_h = sink.float()[:, None] if packed else sink.float()[None, :, None]
    lse_new = torch.logaddexp(lse, s_h)
    scale = torch.exp(lse - lse_new)  # 0 where lse = -inf
    scale_o = scale.transpose(0, 1) if packed else scale.transpose(1, 2)
    return (out.float() * scale_o.unsqueeze(-1)).to(out_dtype or out.dtype), lse_new


def sink_grad(dout: Tensor, out: Tensor, lse: Tensor, sink: Tensor, packed: bool) -> Tensor:
    """d sink (h,): -sum over rows of exp(sink - lse') * rowsum(dout * out') (torch ops)."""
    delta = (dout.float() * out.float()).sum(-1)  # (b, s, h) / (t, h)
    if packed:
        return (-(torch.exp(sink.float()[:, None] - lse) * delta.transpose(0, 1)).sum(1)
                ).to(sink.dtype)
    return (-(torch.exp(sink.float()[None, :, None] - lse) * delta.transpose(1, 2)).sum((0, 2))
            ).to(sink.dtype)


def combine(out_partial: Tensor, lse_partial: Tensor, out: Optional[Tensor],
            out_dtype: torch.dtype) -> Tuple[Tensor, Tensor]:
    """LSE-weighted merge of split results (into ``out`` when given): (out, lse)."""
    res, lse = _kv.combine(out_partial, lse_partial, out_dtype)
    if out is not None:
        out.copy_(res)
        res = out
    return res, lse


def fp8_quantize(q: Tensor, k: Tensor, v: Tensor, signs: Optional[Tensor], block_m: int,
                 block_n: int, v_wgmma: bool = False) -> Tuple[Tensor, ...]:
    """FP8 block quantization (+ incoherent processing with ``signs``): see cpu/fp8.py; V in
    wgmma key order with ``v_wgmma`` (fp8_format.to_wgmma_order)."""
    q8, k8, v8, qs, ks, vs = _fp8.fp8_quantize(q, k, v, signs, block_m, block_n)
    if v_wgmma:
        v8 = to_wgmma_order(v8)
    return q8, k8, v8, qs, ks, vs


__all__ = ["append_kv", "bwd", "combine", "fp8_fwd", "fp8_quantize", "fp8_varlen_fwd", "fwd",
           "kvcache_attention", "lse_merge", "sink_apply", "sink_grad", "sum_rows", "varlen_bwd", "varlen_fwd", "varlen_paged_fwd"]
