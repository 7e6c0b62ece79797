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

import torch

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
