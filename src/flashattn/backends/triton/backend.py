"""The portable Triton backend's interface: one function per op, as dispatch calls them.

Every function takes validated, normalised inputs (:class:`flashattn.params.AttnParams`) and
returns fresh tensors (contracts in docs/internals.md). Runs on CUDA tensors, or on CPU tensors
under ``TRITON_INTERPRET=1``.
"""
from __future__ import annotations

from typing import Callable, Optional, Tuple

import torch

from flashattn.params import AttnParams, Fp8Scales
# through the modules (not their functions imported by name): a test spy or probe that
# replaces a kernel module's entry point is then the one that runs
from flashattn.backends.triton import bwd as _bwd
from flashattn.backends.triton import combine as _combine
from flashattn.backends.triton import lse_merge as _lse_merge
from flashattn.backends.triton import decode as _decode
from flashattn.backends.triton import fp8_quantize as _quantize
from flashattn.backends.triton import fwd as _fwd
from flashattn.backends.triton import fwd_fp8 as _fwd_fp8
from flashattn.backends.triton import rotary as _rotary
from flashattn.backends.triton import sink as _sink
from flashattn.backends.triton import sum_rows as _sum_rows

Tensor = torch.Tensor


def fwd(q: Tensor, k: Tensor, v: Tensor, p: AttnParams, return_softmax: bool,
        out_dtype: Optional[torch.dtype] = None):
    """Dense forward: (out, lse, S_dmask | None); out in ``out_dtype`` when given (float32:
    unrounded, for the learnable-sink pass), else q's."""
    return _fwd.flash_fwd(q, k, v, **p.kernel_kwargs(), return_softmax=return_softmax,
                          out_dtype=out_dtype)


def fwd_call(q: Tensor, k: Tensor, v: Tensor, p: AttnParams,
             need_lse: bool = True) -> Optional["_fwd.FwdCall"]:
    """:func:`fwd`'s decisions for tensors like these (no S_dmask), made once: a call
    ``call(q, k, v) -> (out, lse)`` for later tensors of the same shapes, strides, dtypes,
    devices and alignment (the caller keys on them; lse may be None without ``need_lse``).
    None with dropout (a new seed per call)."""
    kw = p.kernel_kwargs()
    if kw.pop("dropout_p") > 0.0:
        return None
    kw.pop("philox_seed")
    return _fwd.FwdCall(q, k, v, **kw, need_lse=need_lse)


def bwd(dout: Tensor, q: Tensor, k: Tensor, v: Tensor, out: Tensor, lse: Tensor, p: AttnParams):
    """Dense backward: (dq, dk, dv)."""
    return _bwd.flash_bwd(dout, q, k, v, out, lse, **p.kernel_kwargs(),
                          deterministic=p.deterministic)


def varlen_fwd(q: Tensor, k: Tensor, v: Tensor, cu_seqlens_q: Tensor, cu_seqlens_k: Tensor,
               seqused_k: Optional[Tensor], max_seqlen_q: int, max_seqlen_k: int,
               p: AttnParams, return_softmax: bool, out_dtype: Optional[torch.dtype] = None):
    """Packed variable-length forward: (out (total_q, h, d_v), lse (h, total_q), S_dmask);
    ``out_dtype`` as in :func:`fwd`."""
    return _fwd.flash_varlen_fwd(q, k, v, cu_seqlens_q, cu_seqlens_k, seqused_k, max_seqlen_q,
                                 max_seqlen_k, **p.kernel_kwargs(), return_softmax=return_softmax,
                                 out_dtype=out_dtype)


def varlen_bwd(dout: Tensor, q: Tensor, k: Tensor, v: Tensor, out: Tensor, lse: Tensor,
               cu_seqlens_q: Tensor, cu_seqlens_k: Tensor, seqused_k: Optional[Tensor],
               max_seqlen_q: int, max_seqlen_k: int, p: AttnParams):
    """Packed variable-length backward: (dq, dk, dv)."""
    return _bwd.flash_varlen_bwd(dout, q, k, v, out, lse, cu_seqlens_q, cu_seqlens_k, seqused_k,
                                 max_seqlen_q, max_seqlen_k, **p.kernel_kwargs(),
                                 deterministic=p.deterministic)


def fp8_fwd(q8: Tensor, k8: Tensor, v8: Tensor, scales: Fp8Scales, p: AttnParams,
            out_dtype: torch.dtype) -> Tuple[Tensor, Tensor]:
    """Dense FP8 forward (the portable kernel): (out (b, s_q, h, d_v), lse (b, h, s_q))."""
    return _fwd_fp8.flash_fwd_fp8(q8, k8, v8, scales, **_fp8_kwargs(p), out_dtype=out_dtype)


def fp8_varlen_fwd(q8: Tensor, k8: Tensor, v8: Tensor, cu_seqlens_q: Tensor,
                   cu_seqlens_k: Tensor, seqused_k: Optional[Tensor], max_seqlen_q: int,
                   max_seqlen_k: int, scales: Fp8Scales, p: AttnParams,
                   out_dtype: torch.dtype) -> Tuple[Tensor, Tensor]:
    """Packed varlen FP8 forward: (out (total_q, h, d_v), lse (h, total_q))."""
    return _fwd_fp8.flash_varlen_fwd_fp8(q8, k8, v8, cu_seqlens_q, cu_seqlens_k, seqused_k,
                                         max_seqlen_q, max_seqlen_k, scales, **_fp8_kwargs(p),
                                         out_dtype=out_dtype)


def _fp8_kwargs(p: AttnParams):
    return dict(softmax_scale=p.softmax_scale, window_left=p.window_left,
                window_right=p.window_right, softcap=p.softcap)


def fp8_quantize(q: Tensor, k: Tensor, v: Tensor, signs: Optional[Tensor], block_m: int,
                 block_n: int, v_wgmma: bool = False) -> Tuple[Tensor, ...]:
    """The fused FP8 quantization pass (triton/fp8_quantize.py), same results as cpu/fp8.py
    (V in wgmma key order with ``v_wgmma``)."""
    return _quantize.quantize_qkv(q, k, v, signs, block_m, block_n,
                                  interpret=q.device.type == "cpu", v_wgmma=v_wgmma)


def fp8_quantize_call(signs: Optional[Tensor], block_m: int, block_n: int,
                      v_wgmma: bool = True) -> "_quantize.QuantizeCall":
    """The quantize pass for one call signature, into outputs the caller places, its launch
    replayed with addresses (triton/fp8_quantize.QuantizeCall)."""
    return _quantize.QuantizeCall(signs, block_m, block_n, v_wgmma)


def append_kv(q: Tensor, k_cache: Tensor, v_cache: Tensor, k: Tensor, v: Tensor,
              cos: Optional[Tensor], sin: Optional[Tensor], interleaved: bool, seqlens: Tensor,
              batch_idx: Optional[Tensor], block_table: Optional[Tensor],
              rotary_q_step: int = 1, *, cu_seqlens_q: Optional[Tensor] = None,
              max_seqlen_q: int = 0, cu_seqlens_k_new: Optional[Tensor] = None,
              max_seqlen_k_new: int = 0, rotary_seqlens: Optional[Tensor] = None,
              k_descale: Optional[Tensor] = None, v_descale: Optional[Tensor] = None) -> Tensor:
    """Write k (rotated) / v into the caches in place at positions seqlens[b] + i; return q
    rotated at seqlens[b] + rotary_q_step * i (or q itself without rotary; a float8_e4m3fn q
    is rotated in float32 into a bfloat16 copy: no second FP8 rounding).

    FlashAttention-3's varlen forms: q packed (total_q, h, d) with ``cu_seqlens_q``; k / v
    packed (total_new, h_k, d) with ``cu_seqlens_k_new`` (sequence b's new rows [cu[b],
    cu[b + 1]), at most ``max_seqlen_k_new``); ``rotary_seqlens`` (b,): rotate at
    rotary_seqlens[b] + i instead of the cache position. k may be None (no new keys).
    ``k_descale`` / ``v_descale`` (b, h_k) float32: float8_e4m3fn caches, k / v quantized in
    (float8_e4m3fn k / v come with ones: stored as they are, re-rounded only when rotated)."""
    rot = dict(cos=cos, sin=sin, interleaved=interleaved, rot_base=rotary_seqlens)
    if k is not None:
        packed = dict(cu_seqlens=cu_seqlens_k_new, max_seqlen=max_seqlen_k_new)
        _rotary.rotary_store(k, k_cache, seqlens, batch_idx=batch_idx, block_table=block_table,
                             descale=k_descale, **rot, **packed)
        _rotary.rotary_store(v, v_cache, seqlens, batch_idx=batch_idx, block_table=block_table,
                             descale=v_descale, **packed)
    if cos is None:
        return q
    q_rot = torch.empty(q.shape, dtype=_rotated_dtype(q), device=q.device)
    _rotary.rotary_store(q, q_rot, seqlens, pos_step=rotary_q_step, to_cache=False,
                         cu_seqlens=cu_seqlens_q, max_seqlen=max_seqlen_q, **rot)
    return q_rot


def _rotated_dtype(q: Tensor) -> torch.dtype:
    """The rotated q's dtype: q's, bfloat16 for a float8_e4m3fn q (the decode kernel widens an
    FP8 q to bf16 anyway, and a rotation rounded back to e4m3 would lose 4 bits)."""
    return torch.bfloat16 if q.dtype == torch.float8_e4m3fn else q.dtype


def kvcache_attention(q: Tensor, k_cache: Tensor, v_cache: Tensor, seqlens: Tensor, s_new: int,
                      *, p: AttnParams, leftpad: Optional[Tensor], batch_idx: Optional[Tensor],
                      block_table: Optional[Tensor], num_splits: int,
                      capacity: int, buffers: Optional[dict] = None,
                      cu_seqlens_q: Optional[Tensor] = None, max_seqlen_q: int = 0,
                      k_descale: Optional[Tensor] = None, v_descale: Optional[Tensor] = None,
                      q_descale: Optional[Tensor] = None, qv: Optional[Tensor] = None,
                      out_dtype: Optional[torch.dtype] = None,
                      partials: Optional[Callable[..., None]] = None
                      ) -> Tuple[Tensor, Tensor]:
    """Split-KV attention of q against the cache (keys already appended): (out, lse).
    ``buffers``: a decode plan's outputs / workspaces, reused between calls. With
    ``cu_seqlens_q`` q is packed (total_q, h, d) and out / lse are (total_q, h, d_v) /
    (h, total_q). ``k_descale`` / ``v_descale`` (b, h_k) float32: float8_e4m3fn caches, read
    as FP8 and dequantized in the kernel; ``q_descale`` (b, h_k) float32 with a float8_e4m3fn
    (or its rotated bf16) q: out is then bfloat16. ``qv`` (q's shape with d_v):
    FlashAttention-3's latent query, its ``qv . v`` added to the scores in the kernel.
    ``partials``: another family's kernel for the split partials (dispatch's choice: the Hopper
    MLA decode kernel), run instead of the decode kernel. ``out_dtype``: out's dtype when not
    the math's (float32 for the learnable-sink pass)."""
    return _decode.decode_attention(q, k_cache, v_cache, seqlens, s_new, num_splits=num_splits,
                                    cu_seqlens_q=cu_seqlens_q, max_seqlen_q=max_seqlen_q,
                                    max_seqlen_k=capacity, softmax_scale=p.softmax_scale,
                                    window_left=p.window_left, window_right=p.window_right,
                                    softcap=p.softcap, alibi_slopes=p.alibi_slopes,
                                    leftpad=leftpad, batch_idx=batch_idx,
                                    block_table=block_table, buffers=buffers,
                                    attention_chunk=p.attention_chunk, k_descale=k_descale,
                                    v_descale=v_descale, q_descale=q_descale, qv=qv,
                                    partials=partials, out_dtype=out_dtype)


def kvcache_call(q: Tensor, k_cache: Tensor, v_cache: Tensor, seqlens: Tensor, s_new: int, *,
                 p: AttnParams, leftpad: Optional[Tensor], batch_idx: Optional[Tensor],
                 block_table: Optional[Tensor], num_splits: int, capacity: int,
                 cu_seqlens_q: Optional[Tensor] = None, max_seqlen_q: int = 0,
                 k_descale: Optional[Tensor] = None, v_descale: Optional[Tensor] = None,
                 q_descale: Optional[Tensor] = None, qv: Optional[Tensor] = None,
                 partials: Optional[Callable[..., None]] = None,
                 out_dtype: Optional[torch.dtype] = None) -> "_decode.DecodeCall":
    """:func:`kvcache_attention`'s decisions for tensors like these, made once: a
    ``DecodeCall``, called as ``call(q, k_cache, v_cache, seqlens, leftpad, batch_idx,
    block_table, p.alibi_slopes)`` (and ``cu_seqlens_q`` for packed q (total_q, h, d), whose
    longest sequence has ``max_seqlen_q`` rows) with each later call's tensors of the same
    shapes, strides, dtypes, devices and alignment (the caller keys on them). FP8: the
    descales as :func:`kvcache_attention` takes them, given to every call of the DecodeCall
    too (presence fixed by this first call); ``qv`` (the latent query) likewise."""
    return _decode.DecodeCall(q, k_cache, v_cache, seqlens, s_new, num_splits=num_splits,
                              max_seqlen_k=capacity, softmax_scale=p.softmax_scale,
                              window_left=p.window_left, window_right=p.window_right,
                              softcap=p.softcap, alibi_slopes=p.alibi_slopes, leftpad=leftpad,
                              batch_idx=batch_idx, block_table=block_table,
                              cu_seqlens_q=cu_seqlens_q, max_seqlen_q=max_seqlen_q,
                              attention_chunk=p.attention_chunk, k_descale=k_descale,
                              v_descale=v_descale, q_descale=q_descale, qv=qv,
                              partials=partials, out_dtype=out_dtype)


def decode_splits(batch: int, seqlen_q: int, max_seqlen_k: int, nheads: int, nheads_k: int,
                  headdim: int, headdim_v: int, dtype: torch.dtype, page_size: Optional[int],
                  device: torch.device, waves: Optional[float] = None) -> int:
    """The split-KV decode kernel's key splits for these shapes (its heuristic, from shapes);
    ``waves``: programs per SM to fill when another family's kernel computes the splits (the
    Hopper MLA decode kernel: 1), None for the decode kernel's own rule."""
    return _decode.planned_splits(batch, seqlen_q, max_seqlen_k, nheads, nheads_k, headdim,
                                  headdim_v, dtype, page_size is not None, device, waves)


def varlen_paged_fwd(q: Tensor, k_cache: Tensor, v_cache: Tensor, cu_seqlens_q: Tensor,
                     cu_seqlens_k: Tensor, seqused_k: Optional[Tensor], max_seqlen_q: int,
                     max_seqlen_k: int, block_table: Tensor, p: AttnParams
                     ) -> Tuple[Tensor, Tensor]:
    """Packed varlen queries against a paged cache: (out (total_q, h, d_v), lse (h, total_q));
    rows outside every sequence are written by no program (allocated as out 0 / lse -inf)."""
    seqlens = seqused_k if seqused_k is not None else cu_seqlens_k[1:] - cu_seqlens_k[:-1]
    return _decode.decode_attention(q, k_cache, v_cache, seqlens, 0, num_splits=0,
                                    max_seqlen_k=int(max_seqlen_k), block_table=block_table,
                                    cu_seqlens_q=cu_seqlens_q, max_seqlen_q=int(max_seqlen_q),
                                    softmax_scale=p.softmax_scale, window_left=p.window_left,
                                    window_right=p.window_right, softcap=p.softcap,
                                    alibi_slopes=p.alibi_slopes)


def lse_merge(out_a: Tensor, lse_a: Tensor, out_b: Tensor, lse_b: Tensor, dest: Tensor) -> None:
    """Two partial results merged through their lse, in place (one Triton pass)."""
    _lse_merge.lse_merge(out_a, lse_a, out_b, lse_b, dest)


def sum_rows(parts, starts, out: Tensor) -> None:
    """Row-range pieces summed in float32 into ``out``, rounded once (one Triton pass)."""
    _sum_rows.sum_rows(parts, starts, out)


def sink_apply(out: Tensor, lse: Tensor, sink: Tensor, packed: bool,
               out_dtype: Optional[torch.dtype] = None) -> Tuple[Tensor, Tensor]:
    """Learnable sinks on a finished (out, lse): one fused pass (triton/sink.py); the new out
    in ``out_dtype`` (default out's)."""
    return _sink.sink_apply(out, lse, sink, packed, out_dtype)


def sink_grad(dout: Tensor, out: Tensor, lse: Tensor, sink: Tensor, packed: bool) -> Tensor:
    """d sink of learnable sinks: one fused pass over dout and out (triton/sink.py)."""
    return _sink.sink_grad(dout, out, lse, sink, packed)


def combine(out_partial: Tensor, lse_partial: Tensor, out: Optional[Tensor],
            out_dtype: torch.dtype) -> Tuple[Tensor, Tensor]:
    """LSE-weighted merge of split results into ``out`` (allocated when None): (out, lse)."""
    _, b, s_q, h, d_v = out_partial.shape
    res = out if out is not None else torch.empty((b, s_q, h, d_v), dtype=out_dtype,
                                                  device=out_partial.device)
    lse = torch.empty((b, h, s_q), dtype=torch.float32, device=out_partial.device)
    _combine.combine_splits(out_partial, lse_partial, res, lse)
    return res, lse


__all__ = ["append_kv", "bwd", "combine", "decode_splits", "fp8_fwd", "fp8_quantize", "fp8_quantize_call", "fp8_varlen_fwd", "fwd",
           "fwd_call", "kvcache_attention", "kvcache_call", "lse_merge", "sink_apply", "sink_grad", "sum_rows", "varlen_bwd", "varlen_fwd", "varlen_paged_fwd"]
