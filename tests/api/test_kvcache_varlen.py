"""FlashAttention-3's varlen forms of the KV-cache call: packed queries
(``cu_seqlens_q`` / ``max_seqlen_q``: chunked prefill, speculative decoding), packed new keys
(``cu_seqlens_k_new``) and ``rotary_seqlens``.

Expected values: each sequence on its own through ``reference.kvcache_ref`` (the dense,
batch-of-one oracle of flash-attn 2's semantics, which the FA3 forms reduce to per sequence),
with the rotary positions written out explicitly for ``rotary_seqlens``.
"""
from __future__ import annotations

import itertools

import pytest
import torch

import flashattn
import flashattn.fa3 as fa3
from flashattn import reference as R


def _cu(lens):
    return torch.tensor([0, *itertools.accumulate(lens)], dtype=torch.int32)


def _setup(paged, seed=0):
    torch.manual_seed(seed)
    b, cap, h, h_k, d = 3, 32, 4, 2, 16
    k_cache, v_cache = torch.randn(b, cap, h_k, d), torch.randn(b, cap, h_k, d)
    table = None
    if paged:
        page = 8
        perm = torch.randperm(b * cap // page)
        k_cache = k_cache.view(-1, page, h_k, d)[perm.argsort()].contiguous()
        v_cache = v_cache.view(-1, page, h_k, d)[perm.argsort()].contiguous()
        table = perm.view(b, -1).to(torch.int32)
    return k_cache, v_cache, table, (b, h, h_k, d)


@pytest.mark.parametrize("backend", ["cpu", "portable"])
@pytest.mark.parametrize("paged,causal,rotary,packed_new,rot_base", [
    (False, True, False, False, False), (True, True, True, True, False),
    (False, False, True, True, True), (True, True, True, False, True),
    (False, True, False, True, False)])
def test_packed_queries_and_keys(backend, paged, causal, rotary, packed_new, rot_base):
    k_cache, v_cache, table, (b, h, h_k, d) = _setup(paged)
    lens_q, lens_new = [3, 1, 5], [2, 0, 4]
    cache_seqlens = torch.tensor([4, 20, 9], dtype=torch.int32)
    q = torch.randn(sum(lens_q), h, d)
    if packed_new:
        k_new, v_new = torch.randn(sum(lens_new), h_k, d), torch.randn(sum(lens_new), h_k, d)
        cu_new = _cu(lens_new)
    else:  # dense new keys: the same count for every sequence
        lens_new = [2, 2, 2]
        k_new, v_new = torch.randn(b, 2, h_k, d), torch.randn(b, 2, h_k, d)
        cu_new = None
    cos = sin = None
    if rotary:
        angle = torch.rand(64, d // 4) * 6.28
        cos, sin = angle.cos(), angle.sin()
    rot_seqlens = torch.tensor([7, 0, 30], dtype=torch.int32) if rot_base else None
    kc, vc = k_cache.clone(), v_cache.clone()
    with flashattn.use_backend(backend):
        out, lse = fa3.flash_attn_with_kvcache(
            q, kc, vc, k_new, v_new, rotary_cos=cos, rotary_sin=sin,
            cache_seqlens=cache_seqlens, page_table=table, cu_seqlens_q=_cu(lens_q),
            cu_seqlens_k_new=cu_new, max_seqlen_q=max(lens_q), rotary_seqlens=rot_seqlens,
            causal=causal, return_softmax_lse=True)
    cu_q = _cu(lens_q)
    kr, vr = k_cache.clone(), v_cache.clone()
    for i in range(b):
        n_new = lens_new[i]
        kn = (k_new[_cu(lens_new)[i]:_cu(lens_new)[i + 1]] if packed_new
              else k_new[i])[None]
        vn = (v_new[_cu(lens_new)[i]:_cu(lens_new)[i + 1]] if packed_new
              else v_new[i])[None]
        qi = q[cu_q[i]:cu_q[i + 1]][None]
        one = dict(cache_seqlens=cache_seqlens[i:i + 1], causal=causal)
        if table is not None:
            one["block_table"] = table[i:i + 1]
        else:
            one["cache_batch_idx"] = torch.tensor([i], dtype=torch.int32)
        if rotary and rot_seqlens is not None:
            # rotate at rotary_seqlens[i] + j ourselves, then append / attend unrotated
            step = 1 if causal else 0
            base = int(rot_seqlens[i])
            kn = R.rotary_ref(kn, cos, sin, base + torch.arange(n_new)[None], True).to(kn.dtype)
            qi = R.rotary_ref(qi, cos, sin, base + step * torch.arange(qi.shape[1])[None],
                              True).to(qi.dtype)
        elif rotary:
            one.update(rotary_cos=cos, rotary_sin=sin)
        if n_new == 0:
            kn = vn = None
        ref_out, ref_lse, kr, vr = R.kvcache_ref(qi, kr, vr, kn, vn, **one)
        torch.testing.assert_close(out[cu_q[i]:cu_q[i + 1]].double(), ref_out[0],
                                   atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(lse[:, cu_q[i]:cu_q[i + 1]].double(), ref_lse[0],
                                   atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(kc, kr)
    torch.testing.assert_close(vc, vr)


@pytest.mark.parametrize("backend", ["cpu", "portable"])
def test_packed_queries_without_new_keys_and_sink(backend):
    """SGLang-style: the cache is already written; queries are packed (speculative tokens)."""
    k_cache, v_cache, table, (b, h, h_k, d) = _setup(False, seed=1)
    lens_q = [2, 0, 3]
    q = torch.randn(5, h, d)
    seqlens = torch.tensor([10, 3, 32], dtype=torch.int32)
    sink = torch.randn(h)
    with flashattn.use_backend(backend):
        out = flashattn.flash_attn_with_kvcache(q, k_cache, v_cache, cache_seqlens=seqlens,
                                                cu_seqlens_q=_cu(lens_q), max_seqlen_q=3,
                                                causal=True)
        out_sink, lse_sink = flashattn.flash_attn_with_kvcache(
            q, k_cache, v_cache, cache_seqlens=seqlens, cu_seqlens_q=_cu(lens_q),
            max_seqlen_q=3, causal=True, learnable_sink=sink, return_softmax_lse=True)
    cu = _cu(lens_q)
    for i in range(b):
        qi = q[cu[i]:cu[i + 1]][None]
        ref, ref_lse, _, _ = R.kvcache_ref(qi, k_cache[i:i + 1], v_cache[i:i + 1],
                                           cache_seqlens=seqlens[i:i + 1], causal=True)
        torch.testing.assert_close(out[cu[i]:cu[i + 1]].double(), ref[0], atol=1e-5, rtol=1e-5)
        with_sink = torch.logaddexp(ref_lse[0], sink.double()[:, None])
        torch.testing.assert_close(lse_sink[:, cu[i]:cu[i + 1]].double(), with_sink,
                                   atol=1e-5, rtol=1e-5)


def test_errors_name_the_argument():
    k_cache, v_cache, _, (b, h, h_k, d) = _setup(False)
    q = torch.randn(4, h, d)
    cu = _cu([2, 1, 1])
    lens = torch.tensor([1, 1, 1], dtype=torch.int32)
    with pytest.raises(ValueError, match="max_seqlen_q"):
        flashattn.flash_attn_with_kvcache(q, k_cache, v_cache, cache_seqlens=lens,
                                          cu_seqlens_q=cu)
    with pytest.raises(ValueError, match="q must be a 3-d"):
        flashattn.flash_attn_with_kvcache(q[None], k_cache, v_cache, cache_seqlens=lens,
                                          cu_seqlens_q=cu, max_seqlen_q=2)
    with pytest.raises(TypeError, match="cu_seqlens_q must have dtype"):
        flashattn.flash_attn_with_kvcache(q, k_cache, v_cache, cache_seqlens=lens,
                                          cu_seqlens_q=cu.long(), max_seqlen_q=2)
    with pytest.raises(ValueError, match="cu_seqlens_q must start at 0"):
        flashattn.flash_attn_with_kvcache(q, k_cache, v_cache, cache_seqlens=lens,
                                          cu_seqlens_q=torch.tensor([0, 3, 2, 4],
                                                                    dtype=torch.int32),
                                          max_seqlen_q=3)
    k_new = torch.randn(3, h_k, d)
    with pytest.raises(ValueError, match="cu_seqlens_k_new was given without k"):
        flashattn.flash_attn_with_kvcache(q, k_cache, v_cache, cache_seqlens=lens,
                                          cu_seqlens_q=cu, max_seqlen_q=2,
                                          cu_seqlens_k_new=_cu([1, 1, 1]))
    with pytest.raises(ValueError, match="capacity"):
        flashattn.flash_attn_with_kvcache(q, k_cache, v_cache, k_new, k_new,
                                          cache_seqlens=torch.tensor([1, 31, 1],
                                                                     dtype=torch.int32),
                                          cu_seqlens_q=cu, max_seqlen_q=2,
                                          cu_seqlens_k_new=_cu([0, 3, 0]))
    with pytest.raises(ValueError, match="rotary_seqlens"):
        flashattn.flash_attn_with_kvcache(q, k_cache, v_cache, cache_seqlens=lens,
                                          cu_seqlens_q=cu, max_seqlen_q=2,
                                          rotary_seqlens=torch.tensor([1], dtype=torch.int32))


@pytest.mark.gpu
def test_packed_queries_gpu():
    torch.manual_seed(3)
    dev, dt = "cuda", torch.bfloat16
    b, cap, h, h_k, d = 4, 4096, 16, 4, 128
    k_cache = torch.randn(b, cap, h_k, d, device=dev, dtype=dt)
    v_cache = torch.randn(b, cap, h_k, d, device=dev, dtype=dt)
    lens_q, lens_new = [4, 1, 7, 2], [4, 1, 7, 2]
    q = torch.randn(sum(lens_q), h, d, device=dev, dtype=dt)
    k_new = torch.randn(sum(lens_new), h_k, d, device=dev, dtype=dt)
    v_new = torch.randn(sum(lens_new), h_k, d, device=dev, dtype=dt)
    seqlens = torch.tensor([100, 4000, 17, 2047], dtype=torch.int32, device=dev)
    kc, vc = k_cache.clone(), v_cache.clone()
    out = fa3.flash_attn_with_kvcache(q, kc, vc, k_new, v_new, cache_seqlens=seqlens,
                                      cu_seqlens_q=_cu(lens_q).to(dev),
                                      cu_seqlens_k_new=_cu(lens_new).to(dev), max_seqlen_q=7,
                                      causal=True)
    cu, cn = _cu(lens_q), _cu(lens_new)
    for i in range(b):
        ref, _, _, _ = R.kvcache_ref(q[cu[i]:cu[i + 1]][None], k_cache[i:i + 1],
                                     v_cache[i:i + 1], k_new[cn[i]:cn[i + 1]][None],
                                     v_new[cn[i]:cn[i + 1]][None],
                                     cache_seqlens=seqlens[i:i + 1], causal=True)
        torch.testing.assert_close(out[cu[i]:cu[i + 1]].double(), ref[0], atol=2e-2, rtol=2e-2)


@pytest.mark.parametrize("backend", ["cpu", "portable"])
def test_cache_batch_idx_picks_page_table_rows(backend):
    """FA3: with a paged cache, batch row b uses the page table's row cache_batch_idx[b]
    (appends included)."""
    k_cache, v_cache, table, (b, h, h_k, d) = _setup(True, seed=4)
    table = torch.cat([table, table.flip(0)])  # 6 rows, the call uses 3 of them
    idx = torch.tensor([4, 0, 2], dtype=torch.int32)
    q = torch.randn(3, 1, h, d)
    kn, vn = torch.randn(3, 1, h_k, d), torch.randn(3, 1, h_k, d)
    lens = torch.tensor([3, 9, 20], dtype=torch.int32)
    with flashattn.use_backend(backend):
        kc, vc = k_cache.clone(), v_cache.clone()
        got = fa3.flash_attn_with_kvcache(q, kc, vc, kn, vn, cache_seqlens=lens,
                                          cache_batch_idx=idx, page_table=table, causal=True)
        kr, vr = k_cache.clone(), v_cache.clone()
        want = fa3.flash_attn_with_kvcache(q, kr, vr, kn, vn, cache_seqlens=lens,
                                           page_table=table[idx.long()], causal=True)
    torch.testing.assert_close(got, want, rtol=0, atol=0)
    torch.testing.assert_close(kc, kr, rtol=0, atol=0)
    with pytest.raises(ValueError, match=r"cache_batch_idx\[0\] = 6"):
        flashattn.flash_attn_with_kvcache(q, k_cache, v_cache, cache_seqlens=lens,
                                          cache_batch_idx=torch.tensor([6, 0, 1],
                                                                       dtype=torch.int32),
                                          block_table=table)
