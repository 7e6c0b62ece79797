"""The Hopper (Gluon, sm90) backend's interface: the dense and packed (varlen) forward (bf16 /
fp16, and FP8) and backward (16-bit), for the calls
``support.call_unsupported`` / ``support.backward_unsupported`` accept (dispatch checks).
Every other op runs on the portable backend."""
from __future__ import annotations

from typing import Callable, Optional

import torch

from flashattn.params import AttnParams, Fp8Scales
# through the modules (not their functions imported by name): a test spy or probe that
# replaces a kernel module's entry point is then the one that runs
from flashattn.backends.sm90 import bwd as _bwd
from flashattn.backends.sm90 import fwd as _fwd
from flashattn.backends.sm90 import latent as _latent
from flashattn.backends.sm90 import v_layout as _v_layout

Tensor = torch.Tensor


def fwd(q: Tensor, k: Tensor, v: Tensor, p: AttnParams, return_softmax: bool,
        sink: Optional[Tensor] = None):
    """Dense forward: (out, lse, None); ``sink`` (h,): learnable sinks folded into the
    softmax in the kernel's epilogue."""
    return _fwd.flash_fwd_hopper(q, k, v, **p.kernel_kwargs(), return_softmax=return_softmax,
                                 sink=sink)


def varlen_fwd(q: Tensor, k: Tensor, v: Tensor, cu_seqlens_q: Tensor, cu_seqlens_k: Tensor,
               seqused_k: Optional[Tensor], max_seqlen_q: int, max_seqlen_k: int,
               p: AttnParams, return_softmax: bool, sink: Optional[Tensor] = None):
    """Packed variable-length forward (the kernel's VARLEN mode): (out (total_q, h, d_v), lse
    (h, total_q), None). The portable backend's signature; the maxima are not needed (the
    kernel reads the lengths) and return_softmax is never covered (support.varlen_unsupported).
    ``sink`` (h,): learnable sinks folded into the softmax in the kernel's epilogue."""
    return _fwd.flash_fwd_hopper_varlen(q, k, v, cu_seqlens_q, cu_seqlens_k,
                                        softmax_scale=p.softmax_scale, causal=p.causal,
                                        window_left=p.window_left, window_right=p.window_right,
                                        softcap=p.softcap, seqused_k=seqused_k, sink=sink)


def varlen_bwd(dout: Tensor, q: Tensor, k: Tensor, v: Tensor, out: Tensor, lse: Tensor,
               cu_seqlens_q: Tensor, cu_seqlens_k: Tensor, seqused_k: Optional[Tensor],
               max_seqlen_q: int, max_seqlen_k: int, p: AttnParams):
    """Packed variable-length backward (the backward kernels' VARLEN mode): (dq, dk, dv). The
    portable backend's signature (the maxima are not needed)."""
    return _bwd.flash_bwd_hopper_varlen(dout, q, k, v, out, lse, cu_seqlens_q, cu_seqlens_k,
                                        softmax_scale=p.softmax_scale, causal=p.causal,
                                        window_left=p.window_left, window_right=p.window_right,
                                        softcap=p.softcap, seqused_k=seqused_k)


def varlen_fwd_call(q: Tensor, k: Tensor, v: Tensor, n_seqs: int, seqused: bool,
                    p: AttnParams) -> "_fwd.PackedFwdCall":
    """:func:`varlen_fwd` for one call signature (``n_seqs`` sequences, ``seqused``: whether
    seqused_k is passed), made once: ``call(q, k, v, cu_seqlens_q, cu_seqlens_k, seqused_k)
    -> (out, lse)`` for later tensors of the same shapes, strides and dtypes."""
    return _fwd.PackedFwdCall(q, k, v, n_seqs, seqused, softmax_scale=p.softmax_scale,
                              window_left=p.window_left, window_right=p.window_right,
                              softcap=p.softcap)


def varlen_bwd_call(q: Tensor, k: Tensor, v: Tensor, dout: Tensor, n_seqs: int, seqused: bool,
                    p: AttnParams) -> "_bwd.PackedBwdCall":
    """:func:`varlen_bwd` for one call signature, made once: ``call(dout, q, k, v, out, lse,
    cu_seqlens_q, cu_seqlens_k, seqused_k) -> (dq, dk, dv)`` for later tensors of the same
    shapes, strides and dtypes."""
    return _bwd.PackedBwdCall(q, k, v, dout, n_seqs, seqused, softmax_scale=p.softmax_scale,
                              window_left=p.window_left, window_right=p.window_right,
                              softcap=p.softcap)


def fp8_varlen_call(q8: Tensor, k8: Tensor, v8: Tensor, n_seqs: int, seqused: bool,
                    max_seqlen_k: int, scales: Fp8Scales, p: AttnParams,
                    out_dtype: torch.dtype) -> "_fwd.PackedFwdCall":
    """:func:`fp8_varlen_fwd` for one call signature, made once: ``call(q8, k8, v8,
    cu_seqlens_q, cu_seqlens_k, seqused_k, scales) -> (out, lse)`` for later tensors of the
    same shapes, strides and dtypes, and descale tables shaped as ``scales``'."""
    return _fwd.PackedFwdCall.fp8_call(q8, k8, v8, n_seqs, seqused, max_seqlen_k, scales,
                                       out_dtype, softmax_scale=p.softmax_scale,
                                       window_left=p.window_left,
                                       window_right=p.window_right, softcap=p.softcap)


def bwd(dout: Tensor, q: Tensor, k: Tensor, v: Tensor, out: Tensor, lse: Tensor, p: AttnParams):
    """Dense backward: (dq, dk, dv)."""
    return _bwd.flash_bwd_hopper(dout, q, k, v, out, lse, **p.kernel_kwargs(),
                                 deterministic=p.deterministic)


def fp8_fwd(q8: Tensor, k8: Tensor, v8: Tensor, scales: Fp8Scales, p: AttnParams,
            out_dtype: torch.dtype, v_wgmma: bool = False):
    """Dense FP8 forward (Gluon, e4m3 wgmma): (out, lse). ``v_wgmma``: v8 already in wgmma key
    order (fp8_format.wgmma_vt_empty), else any layout (permuted by one pass first)."""
    return _fwd.flash_fwd_hopper_fp8(q8, k8, v8, scales, softmax_scale=p.softmax_scale,
                                     window_left=p.window_left, window_right=p.window_right,
                                     softcap=p.softcap, out_dtype=out_dtype,
                                     v_in_wgmma_order=v_wgmma)


def fp8_varlen_fwd(q8: Tensor, k8: Tensor, v8: Tensor, cu_seqlens_q: Tensor,
                   cu_seqlens_k: Tensor, seqused_k: Optional[Tensor], max_seqlen_q: int,
                   max_seqlen_k: int, scales: Fp8Scales, p: AttnParams,
                   out_dtype: torch.dtype):
    """Packed varlen FP8 forward (Gluon, e4m3 wgmma, VARLEN mode): (out (total_q, h, d_v),
    lse (h, total_q)); one descale per (sequence, head)."""
    return _fwd.flash_fwd_hopper_fp8_varlen(q8, k8, v8, cu_seqlens_q, cu_seqlens_k,
                                            max_seqlen_k, scales,
                                            softmax_scale=p.softmax_scale,
                                            window_left=p.window_left,
                                            window_right=p.window_right, softcap=p.softcap,
                                            out_dtype=out_dtype, seqused_k=seqused_k)


def fp8_fwd_call(head_dim: int, head_dim_v: int, p: AttnParams, out_dtype: torch.dtype
                 ) -> "_fwd.Fp8FwdCall":
    """The FP8 forward over V in wgmma key order for one call signature, its launch replayed
    with addresses (sm90/fwd.Fp8FwdCall: flash_attn_fp8_func's recorded call)."""
    return _fwd.Fp8FwdCall(head_dim, head_dim_v, softmax_scale=p.softmax_scale,
                           window_left=p.window_left, window_right=p.window_right,
                           softcap=p.softcap, out_dtype=out_dtype)


def fp8_vt_call() -> "_v_layout.VtCall":
    """V^T in the FP8 forward's wgmma key order for one call signature, written into memory
    the caller places, its launch replayed with addresses (sm90/v_layout.VtCall: FA3's FP8
    API as a recorded call)."""
    return _v_layout.VtCall()


def latent_unsupported(q: Tensor, k_cache: Tensor, v_cache: Tensor, qv: Optional[Tensor],
                       block_table: Optional[Tensor], *, p: AttnParams,
                       leftpad: Optional[Tensor], batch_idx: Optional[Tensor],
                       k_descale: Optional[Tensor] = None, q_descale: Optional[Tensor] = None,
                       varlen: bool = False, v_descale: Optional[Tensor] = None) -> Optional[str]:
    """Why the MLA decode kernel (latent_kernel.py) does not cover this KV-cache call with
    ``qv`` (None: it does)."""
    return _latent.latent_unsupported(q, k_cache, v_cache, qv, block_table,
                                      window_left=p.window_left, window_right=p.window_right,
                                      softcap=p.softcap, alibi_slopes=p.alibi_slopes,
                                      leftpad=leftpad, batch_idx=batch_idx,
                                      attention_chunk=p.attention_chunk, k_descale=k_descale,
                                      q_descale=q_descale, varlen=varlen,
                                      v_descale=v_descale)


def latent_partials(p: AttnParams, capacity: int) -> Callable[..., None]:
    """The MLA decode kernel for calls with these params over caches of ``capacity`` keys,
    as the portable DecodeCall's split partials: ``partials(q, qv, k_cache, v_cache, seqlens,
    seqlen_k_add, block_table, out_k, lse_k, num_splits)`` writes every split's output and
    LSE (:func:`flashattn.backends.sm90.latent.latent_decode`)."""
    return _latent.Partials(p.softmax_scale, p.window_right == 0, capacity)


def latent_shapes_unsupported(nheads_k: int, headdim: int, headdim_v: int, dtype: torch.dtype,
                              page_size: Optional[int], *, window_left: int = -1,
                              window_right: int = -1, softcap: float = 0.0) -> Optional[str]:
    """Why KV-cache calls with ``qv`` of these shapes are not the MLA decode kernel's (None:
    they are, tensors and device permitting)."""
    return _latent.latent_shapes_unsupported(nheads_k, headdim, headdim_v, dtype, page_size,
                                             window_left=window_left,
                                             window_right=window_right, softcap=softcap)


__all__ = ["bwd", "fp8_fwd", "fp8_fwd_call", "fp8_varlen_call", "fp8_varlen_fwd", "fp8_vt_call", "fwd",
           "latent_partials", "latent_shapes_unsupported", "latent_unsupported", "varlen_bwd", "varlen_bwd_call", "varlen_fwd",
           "varlen_fwd_call"]
