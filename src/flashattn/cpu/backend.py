"""The chunked torch backend's interface: one function per op, as dispatch calls them.

Same contracts as :mod:`flashattn.triton.backend` (docs/internals.md); runs on any device torch
runs on (the CPU path, and GPUs without triton). ``num_splits`` is ignored here (same math).
"""
from __future__ import annotations

from typing import Optional, Tuple

import torch

from flashattn.cpu import aten_flash as _aten
from flashattn.cpu import dense as _dense
from flashattn.cpu import fp8 as _fp8
from flashattn.cpu import kvcache as _kv
from flashattn.params import AttnParams, Fp8Scales

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
    contract); deterministic=True stays on the chunked path (fixed reduction order)."""
    if not p.deterministic and _aten.covers(q, k, v, p):
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


def append_kv(q: Tensor, k_cache: Tensor, v_cache: Tensor, k: Tensor, v: Tensor,
              cos: Optional[Tensor], sin: Optional[Tensor], interleaved: bool, seqlens: Tensor,
              batch_idx: Optional[Tensor], block_table: Optional[Tensor],
              rotary_q_step: int = 1) -> Tensor:
    """As :func:`flashattn.triton.backend.append_kv`, in torch."""
    _kv.append_kv(k_cache, v_cache, k, v, seqlens, cos, sin, interleaved, batch_idx, block_table)
    if cos is None:
        return q
    s_q = q.shape[1]
    positions = seqlens.long().view(-1, 1) + rotary_q_step * torch.arange(s_q, device=q.device)
    return _kv.rotate(q, cos, sin, positions, interleaved)


def kvcache_attention(q: Tensor, k_cache: Tensor, v_cache: Tensor, seqlens: Tensor, s_new: int,
                      *, p: AttnParams, leftpad: Optional[Tensor], batch_idx: Optional[Tensor],
                      block_table: Optional[Tensor], num_splits: int,
                      capacity: int, buffers: Optional[dict] = None) -> Tuple[Tensor, Tensor]:
    """Attention of q against the cache (keys already appended): (out, lse). (``buffers``,
    a decode plan's workspace, is not used here: the torch path allocates.)"""
    return _kv.kvcache_fwd(q, k_cache, v_cache, seqlens, s_new, softmax_scale=p.softmax_scale,
                           window_left=p.window_left, window_right=p.window_right,
                           softcap=p.softcap, alibi_slopes=p.alibi_slopes, leftpad=leftpad,
                           batch_idx=batch_idx, block_table=block_table,
                           attention_chunk=p.attention_chunk)


def varlen_paged_fwd(q: Tensor, k_cache: Tensor, v_cache: Tensor, cu_seqlens_q: Tensor,
                     cu_seqlens_k: Tensor, seqused_k: Optional[Tensor], max_seqlen_q: int,
                     max_seqlen_k: int, block_table: Tensor, p: AttnParams
                     ) -> Tuple[Tensor, Tensor]:
    """Packed varlen queries against a paged cache: (out (total_q, h, d_v), lse (h, total_q))."""
    return _kv.varlen_paged_fwd(q, k_cache, v_cache, cu_seqlens_q, cu_seqlens_k, seqused_k,
                                block_table, softmax_scale=p.softmax_scale,
                                window_left=p.window_left, window_right=p.window_right,
                                softcap=p.softcap, alibi_slopes=p.alibi_slopes)


def sink_apply(out: Tensor, lse: Tensor, sink: Tensor, packed: bool) -> Tuple[Tensor, Tensor]:
    """Learnable sinks on a finished (out, lse): out * exp(lse - lse'), lse' = logaddexp(lse,
    sink) (torch ops; see triton/sink.py for the derivation)."""
    s_h = sink.float()[:, None] if packed else sink.float()[None, :, None]
    lse_new = torch.logaddexp(lse, s_h)
    scale = torch.exp(lse - lse_new)  # 0 where lse = -inf
    scale_o = scale.transpose(0, 1) if packed else scale.transpose(1, 2)
    return (out.float() * scale_o.unsqueeze(-1)).to(out.dtype), lse_new


def combine(out_partial: Tensor, lse_partial: Tensor, out: Optional[Tensor],
            out_dtype: torch.dtype) -> Tuple[Tensor, Tensor]:
    """LSE-weighted merge of split results (into ``out`` when given): (out, lse)."""
    res, lse = _kv.combine(out_partial, lse_partial, out_dtype)
    if out is not None:
        out.copy_(res)
        res = out
    return res, lse


def fp8_quantize(q: Tensor, k: Tensor, v: Tensor, signs: Optional[Tensor], block_m: int,
                 block_n: int) -> Tuple[Tensor, ...]:
    """FP8 block quantization (+ incoherent processing with ``signs``): see cpu/fp8.py."""
    return _fp8.fp8_quantize(q, k, v, signs, block_m, block_n)


__all__ = ["append_kv", "bwd", "combine", "fp8_fwd", "fp8_quantize", "fp8_varlen_fwd", "fwd",
           "kvcache_attention", "sink_apply", "varlen_bwd", "varlen_fwd", "varlen_paged_fwd"]
