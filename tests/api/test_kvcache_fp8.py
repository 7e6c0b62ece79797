"""flash_attn_with_kvcache with an FP8 (float8_e4m3fn) KV cache and FA3's k_descale / v_descale.

The oracle is ``reference.kvcache_ref`` in float64 on the *dequantized* cache (``fp8 * descale``
of each batch row), by flash-attn's rule (2x the error of the same reference computed in q's
dtype, + atol). Appended keys / values must equal the quantize rule bit for bit:
``(x.float() / descale).clamp(-448, 448).to(torch.float8_e4m3fn)``, x rotated first (in q's
dtype) where rotary is asked. Both backends ('cpu': torch; 'portable': the Triton decode
kernel, under TRITON_INTERPRET=1 here). Inputs come from test_kvcache's ``make_inputs``.
"""
from __future__ import annotations

from dataclasses import replace
from typing import Optional

import pytest
import torch

import flashattn
from flashattn import fa3
from flashattn import flash_attn_with_kvcache
from flashattn.reference import kvcache_ref, rotary_ref
from tests.accuracy import assert_close_rule
from tests.api.test_kvcache import KVCase, make_inputs

FP8 = torch.float8_e4m3fn


def _fp8_inputs(c: KVCase):
    """make_inputs with the caches in FP8 (random values within e4m3's range) and descales
    (b, h_k) float32 in [0.25, 1.25)."""
    x = make_inputs(c, "cpu")
    for n in ("k_cache", "v_cache"):
        x[n] = (x[n].float() * 4).clamp(-448, 448).to(FP8)
    x["k_descale"] = torch.rand(c.b, c.h_k) + 0.25
    x["v_descale"] = torch.rand(c.b, c.h_k) + 0.25
    return x


def _quantize(x: torch.Tensor, descale: torch.Tensor) -> torch.Tensor:
    return (x.float() / descale[:, None, :, None]).clamp(-448, 448).to(FP8)


def _slots(x: dict, row: int, positions: torch.Tensor):
    """(dim-0, dim-1) cache indices of batch row ``row``'s cache positions."""
    bt = x["block_table"]
    if bt is not None:
        page = x["k_cache"].shape[1]
        return bt[row].long()[positions // page], positions % page
    idx = x["cache_batch_idx"]
    r = row if idx is None else int(idx[row])
    return torch.full_like(positions, r), positions


def _expected_caches(x: dict, c: KVCase):
    """The caches as the call must leave them: new rows (rotated at their cache positions)
    quantized with their batch row's descales."""
    k_after, v_after = x["k_cache"].clone(), x["v_cache"].clone()
    if x["k"] is None:
        return k_after, v_after
    lens = x["cache_seqlens"].long()
    k_new = x["k"]
    if x["rotary_cos"] is not None:
        pos = lens.view(-1, 1) + torch.arange(c.s_new)
        k_new = rotary_ref(k_new, x["rotary_cos"], x["rotary_sin"], pos,
                           c.rotary != "neox").to(k_new.dtype)
    k8, v8 = _quantize(k_new, x["k_descale"]), _quantize(x["v"], x["v_descale"])
    for row in range(c.b):
        d0, d1 = _slots(x, row, int(lens[row]) + torch.arange(c.s_new))
        k_after[d0, d1], v_after[d0, d1] = k8[row], v8[row]
    return k_after, v_after


def _reference(x: dict, c: KVCase, k_after: torch.Tensor, v_after: torch.Tensor,
               upcast: bool):
    """out / lse of every batch row against its dequantized cache (float64 when upcast, else
    in q's dtype): q rotated as the call rotates it, the new keys already in the cache."""
    q = x["q"]
    lens = x["cache_seqlens"].long()
    local = c.causal or c.window != (-1, -1)
    if x["rotary_cos"] is not None:
        pos = lens.view(-1, 1) + (1 if local else 0) * torch.arange(c.s_q)
        q = rotary_ref(q, x["rotary_cos"], x["rotary_sin"], pos, c.rotary != "neox").to(q.dtype)
    dtype = torch.float64 if upcast else q.dtype
    outs, lses = [], []
    for row in range(c.b):
        def deq(cache, descale):
            return (cache.double() * descale[row].double()[None, None, :, None]).to(dtype)

        one = lambda t: None if t is None else t[row:row + 1]  # noqa: E731
        # (a batch of one: a contiguous cache's row must be named, paged rows are the table's)
        cache_row = one(x["cache_batch_idx"])
        if cache_row is None and x["block_table"] is None:
            cache_row = torch.tensor([row], dtype=torch.int32)
        o, l, _, _ = kvcache_ref(
            q[row:row + 1], deq(k_after, x["k_descale"]), deq(v_after, x["v_descale"]),
            cache_seqlens=(lens + c.s_new)[row:row + 1].to(torch.int32),
            cache_batch_idx=cache_row, cache_leftpad=one(x["cache_leftpad"]),
            block_table=one(x["block_table"]), causal=c.causal, window_size=c.window,
            softcap=c.softcap, alibi_slopes=one(x["alibi_slopes"]), upcast=upcast)
        outs.append(o)
        lses.append(l)
    return torch.cat(outs), torch.cat(lses)


def _run(c: KVCase, x: Optional[dict] = None, fa3_api: bool = False):
    x = _fp8_inputs(c) if x is None else x
    kc, vc = x["k_cache"].clone(), x["v_cache"].clone()
    kw = dict(k=x["k"], v=x["v"], rotary_cos=x["rotary_cos"], rotary_sin=x["rotary_sin"],
              cache_seqlens=x["cache_seqlens"], cache_batch_idx=x["cache_batch_idx"],
              cache_leftpad=x["cache_leftpad"], causal=c.causal, window_size=c.window,
              softcap=c.softcap, rotary_interleaved=c.rotary != "neox",
              num_splits=c.num_splits, return_softmax_lse=True, k_descale=x["k_descale"],
              v_descale=x["v_descale"])
    if fa3_api:
        out, lse = fa3.flash_attn_with_kvcache(x["q"], kc, vc, page_table=x["block_table"],
                                               **kw)
    else:
        out, lse = flash_attn_with_kvcache(x["q"], kc, vc, block_table=x["block_table"],
                                           alibi_slopes=x["alibi_slopes"], **kw)
    return x, out, lse, kc, vc


def check_case(c: KVCase, fa3_api: bool = False) -> None:
    x, out, lse, kc, vc = _run(c, fa3_api=fa3_api)
    k_after, v_after = _expected_caches(x, c)
    # the append is the quantize rule bit for bit, and nothing else in the caches moved
    assert torch.equal(kc.view(torch.uint8), k_after.view(torch.uint8)), "k_cache after append"
    assert torch.equal(vc.view(torch.uint8), v_after.view(torch.uint8)), "v_cache after append"
    ref, ref_lse = _reference(x, c, k_after, v_after, upcast=True)
    low, low_lse = _reference(x, c, k_after, v_after, upcast=False)
    assert out.dtype == c.dtype and out.shape == (c.b, c.s_q, c.h, c.d)
    atol = 1e-5
    if c.dtype == torch.bfloat16:
        # the interpreter truncates fp32 -> bf16 (1 ulp, not 0.5) when it writes out
        atol += 2.0**-7 * ref.abs().max().item()
    assert_close_rule(out, ref, low, atol=atol, name="out")
    assert_close_rule(lse, ref_lse, low_lse.float(), atol=1e-4, name="lse")


BASE = KVCase()
# what each case adds to BASE (GQA 4/2, d 32, fp16 q, contiguous cache of 48)
_FEATURES = {
    "plain": {},
    "append-splits": dict(s_new=1, num_splits=3),
    "rotary-causal": dict(s_new=3, rotary="interleaved", causal=True, s_q=3),
    "rotary-neox-half": dict(s_new=2, rotary="neox", rotary_frac=0.5, num_splits=0),
    "page1": dict(page=1, s_cache=12, s_new=1),
    "page3-leftpad": dict(page=3, s_new=2, num_splits=3, causal=True, s_q=2, leftpad=True),
    "page64-mqa-rotary": dict(page=64, s_cache=64, s_new=1, h=8, h_k=1, rotary="interleaved"),
    "batch-idx": dict(batch_idx=True, s_new=2, num_splits=3),
    "window-leftpad": dict(s_q=3, causal=True, window=(5, 0), num_splits=3, leftpad=True),
    "alibi-softcap": dict(s_q=2, window=(6, 2), alibi=True, softcap=2.0),
    "bf16": dict(dtype=torch.bfloat16, s_new=1, num_splits=2),
    "fp32-d24": dict(dtype=torch.float32, s_new=1, d=24),
}
CASES = [replace(BASE, **kw) for kw in _FEATURES.values()]


@pytest.mark.parametrize("case", CASES, ids=list(_FEATURES))
def test_kvcache_fp8(case: KVCase, backend: str) -> None:
    check_case(case)


def test_fa3_kvcache_fp8_paged(backend: str) -> None:
    """flashattn.fa3's signature (page_table, FA3's descales) takes the same path."""
    check_case(replace(BASE, page=3, s_new=2, causal=True, s_q=2), fa3_api=True)


def test_descale_none_is_one(cpu_backend: str) -> None:
    """FlashAttention-3: a missing descale means 1.0."""
    c = replace(BASE, s_new=1)
    x = _fp8_inputs(c)
    x["k_descale"] = torch.ones(c.b, c.h_k)
    _, out_ones, _, k_ones, _ = _run(c, dict(x))
    x["k_descale"] = None
    _, out_none, _, k_none, _ = _run(c, dict(x))
    assert torch.equal(out_ones, out_none)
    assert torch.equal(k_ones.view(torch.uint8), k_none.view(torch.uint8))


def test_saturating_append(backend: str) -> None:
    """New values beyond 448 * descale saturate to +-448 (no inf / NaN in the cache)."""
    c = replace(BASE, s_new=2)
    x = _fp8_inputs(c)
    x["k"] = x["k"] * 1000
    x, _, _, kc, _ = _run(c, x)
    assert torch.isfinite(kc.float()).all() and kc.float().abs().max().item() == 448.0
    assert torch.equal(kc.view(torch.uint8), _expected_caches(x, c)[0].view(torch.uint8))


def test_repeated_calls_agree(backend: str) -> None:
    """A repeated call signature (the 16-bit calls' recorded fast path) gives the same out."""
    c = replace(BASE, num_splits=2)
    x = _fp8_inputs(c)
    outs = [_run(c, dict(x))[1] for _ in range(3)]
    assert torch.equal(outs[0], outs[1]) and torch.equal(outs[0], outs[2])


def _bad(**over):
    c = replace(BASE, s_new=1)
    x = _fp8_inputs(c)
    x.update(over)
    return c, x


@pytest.mark.parametrize("over, exc, match", [
    (dict(k_descale=torch.ones(2, 3)), ValueError, "k_descale must have shape"),
    (dict(v_descale=torch.ones(2, 2, dtype=torch.float16)), TypeError, "v_descale must have dtype"),
    (dict(k_descale=torch.ones(2, 2, device="meta")), ValueError, "k_descale must have the device"),
    (dict(k_descale=[[1.0, 1.0]]), TypeError, "k_descale must be None or a float32 tensor"),
    (dict(v_descale=-torch.ones(2, 2)), ValueError, "v_descale must be finite and > 0"),
], ids=["shape", "dtype", "device", "not-a-tensor", "negative"])
def test_bad_descales(cpu_backend: str, over, exc, match) -> None:
    c, x = _bad(**over)
    with pytest.raises(exc, match=match):
        _run(c, x)


def test_descales_need_fp8_cache(cpu_backend: str) -> None:
    c = BASE
    x = make_inputs(c, "cpu")
    with pytest.raises(ValueError, match="k_descale was given but k_cache has dtype"):
        flash_attn_with_kvcache(x["q"], x["k_cache"], x["v_cache"],
                                cache_seqlens=x["cache_seqlens"],
                                k_descale=torch.ones(c.b, c.h_k))


def test_mixed_cache_dtypes(cpu_backend: str) -> None:
    c, x = _bad()
    with pytest.raises(TypeError, match="v_cache has dtype torch.float16 but k_cache"):
        flash_attn_with_kvcache(x["q"], x["k_cache"], x["v_cache"].to(c.dtype),
                                cache_seqlens=x["cache_seqlens"])


def test_new_kv_dtype(cpu_backend: str) -> None:
    c, x = _bad()
    with pytest.raises(TypeError, match="k must be float16 / bfloat16 / float32"):
        _run(c, {**x, "k": x["k"].to(FP8)})


def test_fp8_query_not_implemented(cpu_backend: str) -> None:
    c, x = _bad()
    with pytest.raises(NotImplementedError, match="pass a bf16 / fp16 q"):
        _run(c, {**x, "q": x["q"].to(FP8)})
    with pytest.raises(NotImplementedError, match="q_descale"):
        fa3.flash_attn_with_kvcache(x["q"], x["k_cache"], x["v_cache"],
                                    cache_seqlens=x["cache_seqlens"],
                                    q_descale=torch.ones(c.b, c.h_k))


def test_plan_decode_refuses_fp8(cpu_backend: str) -> None:
    with pytest.raises(NotImplementedError, match="plan_decode does not take FP8 KV caches"):
        flashattn.plan_decode(2, 4, 2, 32, max_seqlen_k=48, dtype=FP8, device="cpu")
    plan = flashattn.plan_decode(2, 4, 2, 32, max_seqlen_k=48, dtype=torch.float16,
                                 device="cpu")
    x = _fp8_inputs(BASE)
    with pytest.raises(ValueError, match="k_cache must be a torch.float16 tensor"):
        plan.run(x["q"], x["k_cache"], x["v_cache"], cache_seqlens=x["cache_seqlens"])


def test_packed_queries_and_new_keys(backend: str) -> None:
    """FlashAttention-3's packed forms (cu_seqlens_q, cu_seqlens_k_new) over an FP8 cache:
    the same cache bytes and out as the dense call."""
    c = replace(BASE, s_q=2, s_new=2, causal=True, page=3)
    x = _fp8_inputs(c)
    _, out, _, kc, vc = _run(c, dict(x))
    cu = torch.arange(0, 2 * c.b + 1, 2, dtype=torch.int32)
    k8, v8 = x["k_cache"].clone(), x["v_cache"].clone()
    packed = fa3.flash_attn_with_kvcache(
        x["q"].flatten(0, 1), k8, v8, x["k"].flatten(0, 1), x["v"].flatten(0, 1),
        cache_seqlens=x["cache_seqlens"], page_table=x["block_table"], cu_seqlens_q=cu,
        max_seqlen_q=c.s_q, cu_seqlens_k_new=cu, causal=True, k_descale=x["k_descale"],
        v_descale=x["v_descale"])
    assert torch.equal(k8.view(torch.uint8), kc.view(torch.uint8))
    assert torch.equal(v8.view(torch.uint8), vc.view(torch.uint8))
    torch.testing.assert_close(packed, out.flatten(0, 1), atol=2e-3, rtol=0)
