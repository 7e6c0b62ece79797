"""The FP8 ops' bodies: the quantize pass, whether it writes V in the Hopper kernel's wgmma key
order, and the dense / packed FP8 forwards."""
from __future__ import annotations

from typing import Dict, Optional, Tuple

import torch

from flashattn import fp8_format
from flashattn.dispatch import dense as _dense
from flashattn.dispatch import select as _select
from flashattn.params import AttnParams, Fp8Scales
from flashattn.runtime import env


def fp8_quantize(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                 signs: Optional[torch.Tensor], block_m: int, block_n: int,
                 v_wgmma: bool = False) -> Tuple[torch.Tensor, ...]:
    """FP8 block quantization of q, k, v (incoherent processing of q and k with ``signs``):
    (q8, k8, v8, q_descale (b, h, nq), k_descale (b, h_k, nk), v_descale (b, h_k, nk)); v8 in
    wgmma key order with ``v_wgmma`` (fp8_format.wgmma_vt_empty), else keys contiguous."""
    return _select.backend(_select.quantize_backend(q, block_m, block_n)).fp8_quantize(
        q, k, v, signs, block_m, block_n, v_wgmma=v_wgmma)


def fp8_v_wgmma(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, params: AttnParams,
                block_m: int, block_n: int) -> bool:
    """Whether a quantize pass of q, k, v (16/32-bit, validated) with these blocks should write
    V in wgmma key order (fp8_quantize's ``v_wgmma``): exactly when :func:`fp8_forward` will run
    the Hopper kernel on its outputs, so the order never has to be undone, and the forward
    skips its permuting pass (30 us per 32 MB on the H100). Decided on meta stand-ins with the
    shapes and layouts the pass writes (fresh allocations: 16-byte aligned). Kept per
    signature: it reads only shapes, dtypes, the device, the params, the blocks and the
    settings (three meta allocations and the Hopper coverage checks cost ~40 us of host per
    flash_attn_fp8_func call on the H100 host)."""
    key = (tuple(q.shape), tuple(k.shape), tuple(v.shape), q.dtype, q.device, params,
           int(block_m), int(block_n), env.settings())
    hit = _FP8_V_WGMMA.get(key)
    if hit is not None:
        return hit
    meta = torch.device("meta")
    q8 = torch.empty(q.shape, dtype=fp8_format.FP8_DTYPE, device=meta)
    k8 = torch.empty(k.shape, dtype=fp8_format.FP8_DTYPE, device=meta)
    v8 = fp8_format.keys_contiguous_empty(v.shape, meta)
    scales = Fp8Scales(q8, k8, v8, int(block_m).bit_length() - 1,  # (the tables are not read)
                       int(block_n).bit_length() - 1)
    decision = _select.fp8_on_hopper(q, q8, k8, v8, params, scales, q.dtype)
    if len(_FP8_V_WGMMA) >= 512:  # (signatures that never repeat must not grow it forever)
        _FP8_V_WGMMA.clear()
    _FP8_V_WGMMA[key] = decision
    return decision


_FP8_V_WGMMA: Dict[tuple, bool] = {}


def fp8_forward(q8: torch.Tensor, k8: torch.Tensor, v8: torch.Tensor, scales: Fp8Scales,
                params: AttnParams, out_dtype: torch.dtype, v_wgmma: bool = False
                ) -> Tuple[torch.Tensor, torch.Tensor]:
    """Dense FP8 forward: (out (b, s_q, h, d_v) in ``out_dtype``, lse (b, h, s_q)). Inputs
    validated: float8_e4m3fn q8 / k8 / v8 and block descales (params.Fp8Scales). ``v_wgmma``:
    v8 is in wgmma key order (fp8_quantize's ``v_wgmma``): the Hopper kernels read it as is,
    any other backend gets it back in key order."""
    v_keys = v8[:, :k8.shape[1]] if v_wgmma else v8  # (the shape the checks expect)
    if _dense.is_degenerate(q8, k8):
        out, lse, _ = _dense.degenerate_fwd(q8, k8, v_keys, False)
        return out.to(out_dtype), lse
    name = _select.select("fp8_fwd", q8, k8, v_keys, params, scales=scales, out_dtype=out_dtype)
    if v_wgmma:
        if name == "hopper":
            return _select.backend(name).fp8_fwd(q8, k8, v8, scales, params, out_dtype,
                                                 v_wgmma=True)
        v8 = fp8_format.from_wgmma_order(v8, k8.shape[1])
    return _select.backend(name).fp8_fwd(q8, k8, v8, scales, params, out_dtype)


def fp8_varlen_forward(q8: torch.Tensor, k8: torch.Tensor, v8: torch.Tensor,
                       cu_seqlens_q: torch.Tensor, cu_seqlens_k: torch.Tensor,
                       seqused_k: Optional[torch.Tensor], max_seqlen_q: int, max_seqlen_k: int,
                       scales: Fp8Scales, params: AttnParams, out_dtype: torch.dtype
                       ) -> Tuple[torch.Tensor, torch.Tensor]:
    """Packed varlen FP8 forward: (out (total_q, h, d_v), lse (h, total_q)); one descale per
    (sequence, head). The Hopper FP8 kernel's varlen mode takes the calls it covers (the
    dense FP8 rules over the (1, total, h, d) views; seqused_k included)."""
    name = _select.select("fp8_varlen_fwd", q8, k8, v8, params, scales=scales,
                          out_dtype=out_dtype, n_seqs=cu_seqlens_q.shape[0] - 1)
    return _select.backend(name).fp8_varlen_fwd(q8, k8, v8, cu_seqlens_q, cu_seqlens_k,
                                                seqused_k, max_seqlen_q, max_seqlen_k, scales,
                                                params, out_dtype)


__all__ = ["fp8_forward", "fp8_quantize", "fp8_v_wgmma", "fp8_varlen_forward"]
