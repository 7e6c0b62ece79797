"""Multi-head latent attention (MLA) decoding: FlashAttention-3's ``qv`` in the KV-cache call.

With ``qv`` (b, s_q, h, d_v) the score is ``softmax_scale * (q.k + qv.v)``: the latent part of
the query scores against the cached values themselves, the output is over v (d_v, e.g. 512),
and the default scale is ``(d + d_v) ** -0.5``. DeepSeek's decode: q the 64-wide rotary part,
qv the 512-wide latent part, one KV head (MQA), k_cache (pages, 64, 1, 64), v_cache (pages, 64,
1, 512).

The oracle is ``reference.kvcache_ref(..., qv=...)`` in float64, by flash-attn's rule (2x the
error of the same reference in q's dtype, + atol); both backends ('cpu': torch; 'portable':
the Triton decode kernel, under TRITON_INTERPRET=1 here).
"""
from __future__ import annotations

import math

import pytest
import torch

from flashattn import fa3, flash_attn_with_kvcache
from flashattn.reference import attention_probs_ref, attention_ref, default_scale


def test_reference_qv_is_the_concatenated_score() -> None:
    """q.k + qv.v is the score of the concatenated query [q, qv] against [k, v], the output
    is over v, and the default scale counts both widths."""
    b, s_q, s_k, h, h_k, d, d_v = 2, 3, 7, 4, 2, 5, 6
    q = torch.randn(b, s_q, h, d, dtype=torch.float64)
    qv = torch.randn(b, s_q, h, d_v, dtype=torch.float64)
    k = torch.randn(b, s_k, h_k, d, dtype=torch.float64)
    v = torch.randn(b, s_k, h_k, d_v, dtype=torch.float64)
    out, lse = attention_ref(q, k, v, qv=qv, causal=True, softcap=3.0)
    cat_out, cat_lse = attention_ref(torch.cat((q, qv), -1), torch.cat((k, v), -1), v,
                                     causal=True, softcap=3.0)
    torch.testing.assert_close(out, cat_out, rtol=0, atol=1e-12)
    torch.testing.assert_close(lse, cat_lse, rtol=0, atol=1e-12)
    assert default_scale(d, qv) == (d + d_v) ** -0.5 and default_scale(d) == d ** -0.5


def test_reference_qv_hand_computed() -> None:
    """One head, d = d_v = 1, scale 1: score_j = q k_j + qv v_j."""
    q = torch.tensor([2.0], dtype=torch.float64).view(1, 1, 1, 1)
    qv = torch.tensor([-1.0], dtype=torch.float64).view(1, 1, 1, 1)
    k = torch.tensor([1.0, 0.0], dtype=torch.float64).view(1, 2, 1, 1)
    v = torch.tensor([3.0, 5.0], dtype=torch.float64).view(1, 2, 1, 1)
    out, lse = attention_ref(q, k, v, qv=qv, softmax_scale=1.0)
    s = [2.0 * 1.0 - 3.0, 0.0 - 5.0]  # -1, -5
    z = math.exp(s[0]) + math.exp(s[1])
    assert abs(lse.item() - math.log(z)) < 1e-12
    assert abs(out.item() - (3.0 * math.exp(s[0]) + 5.0 * math.exp(s[1])) / z) < 1e-12
    probs, _ = attention_probs_ref(q, k, qv=qv, v=v, softmax_scale=1.0)
    assert abs(probs[0, 0, 0, 0].item() - math.exp(s[0]) / z) < 1e-12


# ---------------------------------------------------------------------------------------------
# Bad input: errors that name the argument
# ---------------------------------------------------------------------------------------------
def _small(d: int = 16, d_v: int = 32, dtype=torch.float16):
    """q (2, 1, 4, d), caches (2, 24, 1, d / d_v), qv (2, 1, 4, d_v), lengths (2,) int32."""
    q = torch.randn(2, 1, 4, d).to(dtype)
    kc, vc = torch.randn(2, 24, 1, d).to(dtype), torch.randn(2, 24, 1, d_v).to(dtype)
    qv = torch.randn(2, 1, 4, d_v).to(dtype)
    return q, kc, vc, qv, torch.tensor([24, 5], dtype=torch.int32)


@pytest.mark.parametrize("bad, exc, match", [
    (lambda qv: qv[..., :16], ValueError, r"qv must have shape .* \(2, 1, 4, 32\)"),
    (lambda qv: qv[:1], ValueError, r"qv must have shape"),
    (lambda qv: qv[:, :, :2], ValueError, r"qv must have shape"),
    (lambda qv: qv[0], ValueError, r"qv must be a 4-d tensor"),
    (lambda qv: qv.float(), TypeError, r"qv must have the dtype of q \(torch.float16\)"),
    (lambda qv: torch.empty(qv.shape, dtype=qv.dtype, device="meta"), ValueError,
     "qv must be on the device of q"),
    (lambda qv: torch.randn(2, 1, 4, 64).half()[..., ::2], ValueError,
     "qv must have a contiguous last dimension"),
    (lambda qv: qv.tolist(), TypeError, "qv must be a torch.Tensor"),
], ids=["width", "batch", "heads", "rank", "dtype", "device", "strided", "not-a-tensor"])
def test_bad_qv_names_it(cpu_backend: str, bad, exc, match) -> None:
    q, kc, vc, qv, lens = _small()
    for fn in (flash_attn_with_kvcache, fa3.flash_attn_with_kvcache):
        with pytest.raises(exc, match=match):
            fn(q, kc, vc, cache_seqlens=lens, qv=bad(qv))


def test_packed_qv_shape(cpu_backend: str) -> None:
    """With cu_seqlens_q, qv is packed like q: (total_q, nheads, headdim_v)."""
    q, kc, vc, qv, lens = _small()
    cu = torch.tensor([0, 1, 2], dtype=torch.int32)
    with pytest.raises(ValueError, match=r"qv must be a 3-d tensor .*\(total_q, nheads"):
        fa3.flash_attn_with_kvcache(q[:, 0], kc, vc, cache_seqlens=lens, qv=qv,
                                    cu_seqlens_q=cu, max_seqlen_q=1)


def test_head_dim_v_above_the_kernels(cpu_backend: str) -> None:
    """headdim_v up to 512 in the KV-cache call, a ValueError naming v_cache above; the q / k
    head dim keeps its 256."""
    q, kc, _, _, lens = _small()
    vc = torch.randn(2, 24, 1, 520).half()
    for fn in (flash_attn_with_kvcache, fa3.flash_attn_with_kvcache):
        with pytest.raises(ValueError, match=r"v_cache has headdim_v 520; supported range is "
                                             r"1\.\.512"):
            fn(q, kc, vc, cache_seqlens=lens)
    q_wide, k_wide = torch.randn(2, 1, 4, 264).half(), torch.randn(2, 24, 1, 264).half()
    with pytest.raises(ValueError, match="q has headdim 264; supported range is 1..256"):
        flash_attn_with_kvcache(q_wide, k_wide, k_wide[..., :8], cache_seqlens=lens)
    with pytest.raises(NotImplementedError, match="head dim 264 of q"):
        fa3.flash_attn_with_kvcache(q_wide, k_wide, k_wide[..., :8], cache_seqlens=lens)


def test_dense_calls_still_refuse_qv(cpu_backend: str) -> None:
    """The dense / varlen FA3 calls do not take qv (the KV-cache call does)."""
    q = torch.randn(1, 4, 2, 16)
    with pytest.raises(NotImplementedError, match="qv"):
        fa3.flash_attn_func(q, q, q, qv=q)
