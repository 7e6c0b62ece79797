"""The backend interface: what every ``<backend>/backend.py`` module offers dispatch.

A backend is a module, not an object, so the interface is structural (``typing.Protocol``):
no backend imports this file (backends import nothing of each other or of dispatch), and
``tests/internals/test_backend_interface.py`` checks each module against it, parameter names,
kinds and defaults included. Every function takes validated, normalised inputs
(:class:`flashattn.params.AttnParams` as ``p``) and returns fresh tensors; the shapes are the
contracts of docs/internals.md.

Three tiers, because the backends differ in what they cover, not in how they are called:

- :class:`KernelFamily`: the dense and packed forward / backward and the FP8 forwards. The
  Hopper backend (sm90) implements only these: dispatch sends it the calls
  ``sm90.support`` accepts and everything else to the device backend, so the Hopper kernels
  never need a combine, a quantize pass or a KV-cache path of their own.
- :class:`DeviceBackend`: a backend that can run *every* op on its devices (``portable``:
  Triton, ``cpu``: torch), so the family plus the KV cache, paged varlen, split merge, sinks
  and the FP8 quantize pass. ``select`` falls back to one of these for any call.
- :data:`OPTIONAL`: recorded-call factories (the call's decisions made once, then replayed
  from launch plans) and host-side heuristics. Only kernels that keep launch plans have them,
  so they are optional: dispatch and the replay package look them up with ``getattr(...,
  None)`` or ask for them from the one backend that has them. The torch backend has none (it
  has no launches to record).

A backend may add trailing parameters with defaults to a required function (the Hopper
``fwd``'s ``sink``, folded into its epilogue, and ``fp8_fwd``'s ``v_wgmma``, V already in its
wgmma key order); dispatch passes them only to the backend it chose for that reason.
"""
from __future__ import annotations

from typing import Any, Callable, Dict, Optional, Protocol, Sequence, Tuple, runtime_checkable

import torch

from flashattn.params import AttnParams, Fp8Scales

Tensor = torch.Tensor
Triple = Tuple[Tensor, Tensor, Optional[Tensor]]


@runtime_checkable
class KernelFamily(Protocol):
    """The forward / backward every backend implements (sm90 implements only these)."""

    def fwd(self, q: Tensor, k: Tensor, v: Tensor, p: AttnParams,
            return_softmax: bool) -> Triple:
        """Dense forward: (out (b, s_q, h, d_v), lse (b, h, s_q), S_dmask | None)."""

    def bwd(self, dout: Tensor, q: Tensor, k: Tensor, v: Tensor, out: Tensor, lse: Tensor,
            p: AttnParams) -> Tuple[Tensor, Tensor, Tensor]:
        """Dense backward: (dq, dk, dv) like q, k, v."""

    def varlen_fwd(self, q: Tensor, k: Tensor, v: Tensor, cu_seqlens_q: Tensor,
                   cu_seqlens_k: Tensor, seqused_k: Optional[Tensor], max_seqlen_q: int,
                   max_seqlen_k: int, p: AttnParams, return_softmax: bool) -> Triple:
        """Packed forward: (out (total_q, h, d_v), lse (h, total_q), S_dmask | None)."""

    def varlen_bwd(self, dout: Tensor, q: Tensor, k: Tensor, v: Tensor, out: Tensor,
                   lse: Tensor, cu_seqlens_q: Tensor, cu_seqlens_k: Tensor,
                   seqused_k: Optional[Tensor], max_seqlen_q: int, max_seqlen_k: int,
                   p: AttnParams) -> Tuple[Tensor, Tensor, Tensor]:
        """Packed backward: (dq, dk, dv) like q, k, v."""

    def fp8_fwd(self, q8: Tensor, k8: Tensor, v8: Tensor, scales: Fp8Scales, p: AttnParams,
                out_dtype: torch.dtype) -> Tuple[Tensor, Tensor]:
        """Dense FP8 forward: (out in ``out_dtype``, lse (b, h, s_q))."""

    def fp8_varlen_fwd(self, q8: Tensor, k8: Tensor, v8: Tensor, cu_seqlens_q: Tensor,
                       cu_seqlens_k: Tensor, seqused_k: Optional[Tensor], max_seqlen_q: int,
                       max_seqlen_k: int, scales: Fp8Scales, p: AttnParams,
                       out_dtype: torch.dtype) -> Tuple[Tensor, Tensor]:
        """Packed FP8 forward: (out (total_q, h, d_v), lse (h, total_q))."""


@runtime_checkable
class DeviceBackend(KernelFamily, Protocol):
    """A backend that runs every op on its devices (portable, cpu): the fallback of select."""

    def append_kv(self, q: Tensor, k_cache: Tensor, v_cache: Tensor, k: Optional[Tensor],
                  v: Optional[Tensor], cos: Optional[Tensor], sin: Optional[Tensor],
                  interleaved: bool, seqlens: Tensor, batch_idx: Optional[Tensor],
                  block_table: Optional[Tensor], rotary_q_step: int = 1, *,
                  cu_seqlens_q: Optional[Tensor] = None, max_seqlen_q: int = 0,
                  cu_seqlens_k_new: Optional[Tensor] = None, max_seqlen_k_new: int = 0,
                  rotary_seqlens: Optional[Tensor] = None, k_descale: Optional[Tensor] = None,
                  v_descale: Optional[Tensor] = None) -> Tensor:
        """The new keys / values into the cache in place (rotated; quantized into FP8 caches
        with the (b, h_k) float32 descales); q rotated, or q itself."""

    def kvcache_attention(self, q: Tensor, k_cache: Tensor, v_cache: Tensor, seqlens: Tensor,
                          s_new: int, *, p: AttnParams, leftpad: Optional[Tensor],
                          batch_idx: Optional[Tensor], block_table: Optional[Tensor],
                          num_splits: int, capacity: int, buffers: Optional[dict] = None,
                          cu_seqlens_q: Optional[Tensor] = None,
                          max_seqlen_q: int = 0, k_descale: Optional[Tensor] = None,
                          v_descale: Optional[Tensor] = None,
                          q_descale: Optional[Tensor] = None, qv: Optional[Tensor] = None,
                          out_dtype: Optional[torch.dtype] = None) -> Tuple[Tensor, Tensor]:
        """Attention over the cache's first seqlens[b] keys (FP8 caches dequantized with the
        (b, h_k) float32 descales; a float8_e4m3fn q, or its rotated bf16 copy, with
        q_descale: out bfloat16): (out, lse). ``qv`` (q's shape with d_v; FlashAttention-3's
        latent query): the scores add ``qv . v`` against the (dequantized) values.
        ``out_dtype``: out's dtype when not that one (float32 for the learnable-sink pass)."""

    def varlen_paged_fwd(self, q: Tensor, k_cache: Tensor, v_cache: Tensor,
                         cu_seqlens_q: Tensor, cu_seqlens_k: Tensor,
                         seqused_k: Optional[Tensor], max_seqlen_q: int, max_seqlen_k: int,
                         block_table: Tensor, p: AttnParams) -> Tuple[Tensor, Tensor]:
        """Packed queries over a paged cache: (out (total_q, h, d_v), lse (h, total_q))."""

    def combine(self, out_partial: Tensor, lse_partial: Tensor, out: Optional[Tensor],
                out_dtype: torch.dtype) -> Tuple[Tensor, Tensor]:
        """Merge key splits: (out (b, s_q, h, d_v), lse (b, h, s_q))."""

    def lse_merge(self, out_a: Tensor, lse_a: Tensor, out_b: Tensor, lse_b: Tensor,
                  dest: Tensor) -> None:
        """Two partial results over disjoint keys merged through their lse: ``lse_a`` (b, h, s)
        float32 becomes the merged lse, ``dest`` (b, s, h, d_v; may be ``out_a``) the merged
        output, in place."""

    def sum_rows(self, parts: Sequence[Tensor], starts: Sequence[int], out: Tensor) -> None:
        """``out`` (outer, n_rows, inner) contiguous becomes the float32 sum of ``parts[i]``
        (outer, rows_i, inner) contiguous over its rows ``[starts[i], starts[i] + rows_i)``,
        in the pieces' order, rounded once to out's dtype; uncovered rows 0."""

    def sink_apply(self, out: Tensor, lse: Tensor, sink: Tensor, packed: bool,
                   out_dtype: Optional[torch.dtype] = None) -> Tuple[Tensor, Tensor]:
        """Learnable sinks on a finished output: (out', lse'), out' in ``out_dtype`` (default
        out's)."""

    def sink_grad(self, dout: Tensor, out: Tensor, lse: Tensor, sink: Tensor,
                  packed: bool) -> Tensor:
        """d sink (h,)."""

    def fp8_quantize(self, q: Tensor, k: Tensor, v: Tensor, signs: Optional[Tensor],
                     block_m: int, block_n: int, v_wgmma: bool = False) -> Tuple[Tensor, ...]:
        """(q8, k8, v8, q_descale, k_descale, v_descale)."""


class _Optional(Protocol):
    """The optional functions, one signature each (see :data:`OPTIONAL`)."""

    # portable: recorded calls and the split heuristic
    def fwd_call(self, q: Tensor, k: Tensor, v: Tensor, p: AttnParams,
                 need_lse: bool = True) -> Any: ...

    def kvcache_call(self, q: Tensor, k_cache: Tensor, v_cache: Tensor, seqlens: Tensor,
                     s_new: int, *, p: AttnParams, leftpad: Optional[Tensor],
                     batch_idx: Optional[Tensor], block_table: Optional[Tensor],
                     num_splits: int, capacity: int, cu_seqlens_q: Optional[Tensor] = None,
                     max_seqlen_q: int = 0, k_descale: Optional[Tensor] = None,
                     v_descale: Optional[Tensor] = None,
                     q_descale: Optional[Tensor] = None, qv: Optional[Tensor] = None,
                     partials: Optional[Callable[..., None]] = None,
                     out_dtype: Optional[torch.dtype] = None) -> Any: ...

    def fp8_quantize_call(self, signs: Optional[Tensor], block_m: int, block_n: int,
                          v_wgmma: bool = True) -> Any: ...

    def decode_splits(self, batch: int, seqlen_q: int, max_seqlen_k: int, nheads: int,
                      nheads_k: int, headdim: int, headdim_v: int, dtype: torch.dtype,
                      page_size: Optional[int], device: torch.device,
                      waves: Optional[float] = None) -> int: ...

    # hopper: recorded packed and FP8 calls
    def varlen_fwd_call(self, q: Tensor, k: Tensor, v: Tensor, n_seqs: int, seqused: bool,
                        p: AttnParams) -> Any: ...

    def varlen_bwd_call(self, q: Tensor, k: Tensor, v: Tensor, dout: Tensor, n_seqs: int,
                        seqused: bool, p: AttnParams) -> Any: ...

    def fp8_varlen_call(self, q8: Tensor, k8: Tensor, v8: Tensor, n_seqs: int, seqused: bool,
                        max_seqlen_k: int, scales: Fp8Scales, p: AttnParams,
                        out_dtype: torch.dtype) -> Any: ...

    def fp8_fwd_call(self, head_dim: int, head_dim_v: int, p: AttnParams,
                     out_dtype: torch.dtype) -> Any: ...

    def fp8_vt_call(self) -> Any: ...

    # hopper: multi-head latent attention's decode partials (the portable DecodeCall owns the
    # outputs and the combine pass)
    def latent_unsupported(self, q: Tensor, k_cache: Tensor, v_cache: Tensor,
                           qv: Optional[Tensor], block_table: Optional[Tensor], *,
                           p: AttnParams, leftpad: Optional[Tensor],
                           batch_idx: Optional[Tensor], k_descale: Optional[Tensor] = None,
                           q_descale: Optional[Tensor] = None,
                           varlen: bool = False,
                           v_descale: Optional[Tensor] = None) -> Optional[str]: ...

    def latent_partials(self, p: AttnParams, capacity: int) -> Callable[..., None]: ...

    def latent_shapes_unsupported(self, nheads_k: int, headdim: int, headdim_v: int,
                                  dtype: torch.dtype, page_size: Optional[int], *,
                                  window_left: int = -1, window_right: int = -1,
                                  softcap: float = 0.0) -> Optional[str]: ...


# optional function -> why it is optional (which backends have it)
OPTIONAL: Dict[str, str] = {
    "fwd_call": "portable: the dense forward's launch recorded per signature (eager fast path)",
    "kvcache_call": "portable: the decode kernel's launch recorded per signature",
    "fp8_quantize_call": "portable: the fused quantize pass recorded per signature",
    "decode_splits": "portable: the split-KV heuristic (FA3's get_scheduler_metadata); the "
                     "torch path has no splits",
    "varlen_fwd_call": "hopper: the packed forward's plans made once per signature",
    "varlen_bwd_call": "hopper: the packed backward's plans made once per signature",
    "fp8_varlen_call": "hopper: the packed FP8 forward's passes recorded per signature",
    "fp8_fwd_call": "hopper: the FP8 forward recorded per signature (FP8 workspaces)",
    "fp8_vt_call": "hopper: the V^T pass into wgmma key order, recorded",
    "latent_unsupported": "hopper: which KV-cache calls with qv its MLA decode kernel covers",
    "latent_partials": "hopper: the MLA decode kernel, as the split partials of a DecodeCall",
    "latent_shapes_unsupported": "hopper: which call shapes its MLA decode kernel covers (the "
                                 "split decision of FA3's get_scheduler_metadata)",
}

# each backend name (select's answers): its interface module, imported on first use, and the
# tier it promises
MODULES: Dict[str, str] = {"hopper": "flashattn.backends.sm90.backend",
                           "portable": "flashattn.backends.triton.backend",
                           "cpu": "flashattn.backends.cpu.backend"}
REQUIRED = {"hopper": KernelFamily, "portable": DeviceBackend, "cpu": DeviceBackend}

__all__ = ["DeviceBackend", "KernelFamily", "MODULES", "OPTIONAL", "REQUIRED"]
