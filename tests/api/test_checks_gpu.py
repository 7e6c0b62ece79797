"""The checked mode on a GPU: bad device metadata raises a ValueError
naming the argument inside flashattn.checks(); outside it the call is not synchronised."""
from __future__ import annotations

import pytest
import torch

import flashattn

pytestmark = pytest.mark.gpu


def _varlen(cu_q, cu_k, max_q=6, max_k=7):
    q = torch.randn(10, 4, 64, device="cuda", dtype=torch.bfloat16)
    k = torch.randn(12, 2, 64, device="cuda", dtype=torch.bfloat16)
    return flashattn.flash_attn_varlen_func(
        q, k, k, torch.tensor(cu_q, dtype=torch.int32, device="cuda"),
        torch.tensor(cu_k, dtype=torch.int32, device="cuda"), max_q, max_k)


@pytest.mark.parametrize("cu_q,cu_k,max_q,match", [
    ([0, 6, 4], [0, 5, 12], 6, "cu_seqlens_q"),          # not non-decreasing
    ([0, 4, 10], [0, 5, 30], 6, "cu_seqlens_k"),         # past the keys
    ([0, 4, 10], [0, 5, 12], 3, "max_seqlen_q"),         # shorter than a sequence
])
def test_varlen_metadata_checked(cu_q, cu_k, max_q, match):
    _varlen([0, 4, 10], [0, 5, 12])  # valid
    with flashattn.checks():
        with pytest.raises(ValueError, match=match):
            _varlen(cu_q, cu_k, max_q)


@pytest.mark.parametrize("kw,match", [
    (dict(cache_seqlens=[300, 3]), "cache_seqlens"),
    (dict(cache_seqlens=[-2, 3]), "cache_seqlens"),
    (dict(cache_batch_idx=[0, 9]), "cache_batch_idx"),
])
def test_kvcache_metadata_checked(kw, match):
    q = torch.randn(2, 1, 4, 64, device="cuda", dtype=torch.bfloat16)
    kc = torch.randn(2, 256, 2, 64, device="cuda", dtype=torch.bfloat16)
    args = dict(cache_seqlens=[10, 3])
    args.update(kw)
    t = {name: torch.tensor(v, dtype=torch.int32, device="cuda") for name, v in args.items()}
    with flashattn.checks():
        with pytest.raises(ValueError, match=match):
            flashattn.flash_attn_with_kvcache(q, kc, kc, **t)
