"""flash_attn_with_kvcache with an FP8 (float8_e4m3fn) KV cache and FA3's k_descale / v_descale
(and q_descale with FA3's float8_e4m3fn query).

The oracle is ``reference.kvcache_ref`` in float64 on the *dequantized* cache (``fp8 * descale``
of each batch row; an FP8 q dequantized the same way, its query heads sharing their KV head's
descale), by flash-attn's rule (2x the error of the same reference computed in q's dtype, or
bf16 for an FP8 q, + atol). Appended keys / values must equal the quantize rule bit for bit:
``(x.float() / descale).clamp(-448, 448).to(torch.float8_e4m3fn)``, x rotated first (in x's
dtype) where rotary is asked; float8_e4m3fn new rows are stored as they are (descale 1; a
rotated one rounded once from its rotation). Both backends ('cpu': torch; 'portable': the
Triton decode kernel, under TRITON_INTERPRET=1 here). Inputs come from test_kvcache's
``make_inputs``; ``check_case`` is shared with test_kvcache_fp8_gpu.py.
"""
from __future__ import annotations

import contextlib
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
from tests.conftest import use_backend

FP8 = torch.float8_e4m3fn


def _fp8_inputs(c: KVCase, fp8_q: bool = False, fp8_new: bool = False, device: str = "cpu"):
    """make_inputs with the caches in FP8 (random values within e4m3's range) and descales
    (b, h_k) float32 in [0.25, 1.25); ``fp8_q``: q in FP8 too with its q_descale (FA3's),
    ``fp8_new``: the new k / v in FP8 (FA3's, in the cache's units)."""
    x = make_inputs(c, device)
    names = ["k_cache", "v_cache"] + (["q"] if fp8_q else []) + (
        ["k", "v"] if fp8_new and x["k"] is not None else [])
    for n in names:
        x[n] = (x[n].float() * 4).clamp(-448, 448).to(FP8)
    for n in ("k_descale", "v_descale") + (("q_descale",) if fp8_q else ()):
        x[n] = (torch.rand(c.b, c.h_k) + 0.25).to(device)
    if not fp8_q:
        x["q_descale"] = None
    return x


def _math_dtype(x: dict) -> torch.dtype:
    """The dtype the call computes in and returns: q's, bf16 for an FP8 q."""
    return torch.bfloat16 if x["q"].dtype == FP8 else x["q"].dtype


def _quantize(x: torch.Tensor, descale: torch.Tensor) -> torch.Tensor:
    return (x.float() / descale[:, None, :, None]).clamp(-448, 448).to(FP8)


def _slots(x: dict, row: int, positions: torch.Tensor):
    """(dim-0, dim-1) cache indices of batch row ``row``'s cache positions."""
    bt = x["block_table"]
    if bt is not None:
        page = x["k_cache"].shape[1]
        return bt[row].long().cpu()[positions // page], positions % page
    idx = x["cache_batch_idx"]
    r = row if idx is None else int(idx[row])
    return torch.full_like(positions, r), positions


def _expected_caches(x: dict, c: KVCase):
    """The caches as the call must leave them: new rows (rotated at their cache positions)
    quantized with their batch row's descales."""
    k_after, v_after = x["k_cache"].cpu().clone(), x["v_cache"].cpu().clone()
    if x["k"] is None:
        return k_after, v_after
    lens = x["cache_seqlens"].long().cpu()
    k_new, v_new = x["k"].cpu(), x["v"].cpu()
    # FP8 new rows: already in the cache's units (descale 1), rotated in float32 (no rounding
    # to their own dtype before the quantization)
    k_desc = torch.ones(c.b, c.h_k) if k_new.dtype == FP8 else x["k_descale"].cpu()
    v_desc = torch.ones(c.b, c.h_k) if v_new.dtype == FP8 else x["v_descale"].cpu()
    if x["rotary_cos"] is not None:
        pos = lens.view(-1, 1) + torch.arange(c.s_new)
        k_new = rotary_ref(k_new.float(), x["rotary_cos"].cpu(), x["rotary_sin"].cpu(), pos,
                           c.rotary != "neox").to(
                               torch.float32 if k_new.dtype == FP8 else k_new.dtype)
    k8, v8 = _quantize(k_new, k_desc), _quantize(v_new, v_desc)
    for row in range(c.b):
        d0, d1 = _slots(x, row, int(lens[row]) + torch.arange(c.s_new))
        k_after[d0, d1], v_after[d0, d1] = k8[row], v8[row]
    return k_after, v_after


def _reference(x: dict, c: KVCase, k_after: torch.Tensor, v_after: torch.Tensor,
               upcast: bool):
    """out / lse of every batch row against its dequantized cache (float64 when upcast, else
    in q's dtype, bf16 for an FP8 q): q rotated (exactly when upcast; the low-precision
    baseline rounds the rotation to the math's dtype, as the call keeps it: an FP8 q in bf16),
    dequantized with q_descale, the new keys already in the cache."""
    x = {k: (t.cpu() if isinstance(t, torch.Tensor) else t) for k, t in x.items()}
    q = x["q"]
    math = _math_dtype(x)
    lens = x["cache_seqlens"].long()
    local = c.causal or c.window != (-1, -1)
    if x["rotary_cos"] is not None:
        pos = lens.view(-1, 1) + (1 if local else 0) * torch.arange(c.s_q)
        q = rotary_ref(q.float(), x["rotary_cos"], x["rotary_sin"], pos, c.rotary != "neox")
        if not upcast:  # (the oracle keeps the exact rotation: the call's rounding is error)
            q = q.to(math)
    dtype = torch.float64 if upcast else math
    if x["q_descale"] is not None:  # query head j: its KV head's descale, j // (h / h_k)
        qd = x["q_descale"].double().repeat_interleave(c.h // c.h_k, dim=1)
        q = q.double() * qd[:, None, :, None]
    q = q.to(dtype)
    outs, lses = [], []
    for row in range(c.b):
        def deq(cache, descale):
            """Batch row ``row``'s cache (its pages in order, or its cache row) as one
            contiguous (1, capacity, h_k, d) row, dequantized (only this row: GPU sizes)."""
            if x["block_table"] is not None:
                cache = cache[x["block_table"][row].long()].flatten(0, 1)[None]
            else:
                r = row if x["cache_batch_idx"] is None else int(x["cache_batch_idx"][row])
                cache = cache[r:r + 1]
            return (cache.double() * descale[row].double()[None, None, :, None]).to(dtype)

        one = lambda t: None if t is None else t[row:row + 1]  # noqa: E731
        o, l, _, _ = kvcache_ref(
            q[row:row + 1], deq(k_after, x["k_descale"]), deq(v_after, x["v_descale"]),
            cache_seqlens=(lens + c.s_new)[row:row + 1].to(torch.int32),
            cache_leftpad=one(x["cache_leftpad"]), causal=c.causal, window_size=c.window,
            softcap=c.softcap, alibi_slopes=one(x["alibi_slopes"]), upcast=upcast)
        outs.append(o)
        lses.append(l)
    return torch.cat(outs), torch.cat(lses)


def _run(c: KVCase, x: Optional[dict] = None, fa3_api: bool = False):
    x = _fp8_inputs(c) if x is None else x
    x.setdefault("q_descale", None)
    kc, vc = x["k_cache"].clone(), x["v_cache"].clone()
    kw = dict(k=x["k"], v=x["v"], rotary_cos=x["rotary_cos"], rotary_sin=x["rotary_sin"],
              cache_seqlens=x["cache_seqlens"], cache_batch_idx=x["cache_batch_idx"],
              cache_leftpad=x["cache_leftpad"], causal=c.causal, window_size=c.window,
              softcap=c.softcap, rotary_interleaved=c.rotary != "neox",
              num_splits=c.num_splits, return_softmax_lse=True, k_descale=x["k_descale"],
              v_descale=x["v_descale"], q_descale=x["q_descale"])
    if fa3_api:
        out, lse = fa3.flash_attn_with_kvcache(x["q"], kc, vc, page_table=x["block_table"],
                                               **kw)
    else:
        out, lse = flash_attn_with_kvcache(x["q"], kc, vc, block_table=x["block_table"],
                                           alibi_slopes=x["alibi_slopes"], **kw)
    return x, out, lse, kc, vc


def _assert_appended(kc: torch.Tensor, want: torch.Tensor, name: str, exact: bool) -> None:
    """The cache after the append: bit for bit (``exact``), or within one e4m3 step (a GPU's
    rotation may fuse a multiply-add; the interpreter truncates a bf16 rotation)."""
    kc = kc.cpu()
    if exact:
        assert torch.equal(kc.view(torch.uint8), want.view(torch.uint8)), f"{name} after append"
        return
    diff = (kc.float() - want.float()).abs()
    assert (diff <= 2.0**-3 * want.float().abs() + 2.0**-9).all(), f"{name} after append"


def _out_atol(ref: torch.Tensor, math: torch.dtype, device: str) -> float:
    """out's absolute tolerance: 1e-5, plus one bf16 step at out's magnitude for a bf16 out
    under the interpreter (it truncates fp32 -> bf16, 1 ulp, not 0.5, when it writes out)."""
    atol = 1e-5
    if math == torch.bfloat16 and device == "cpu":
        atol += 2.0**-7 * ref.abs().max().item()
    return atol


def check_case(c: KVCase, fa3_api: bool = False, fp8_q: bool = False, fp8_new: bool = False,
               device: str = "cpu") -> None:
    x, out, lse, kc, vc = _run(c, _fp8_inputs(c, fp8_q, fp8_new, device), fa3_api=fa3_api)
    k_after, v_after = _expected_caches(x, c)
    # the append is the quantize rule bit for bit, and nothing else in the caches moved
    # rotated rows: bit for bit on CPU, except bf16 rows under the interpreter (which
    # truncates the rotation to bf16 instead of rounding it before the quantization)
    exact = c.rotary is None or (device == "cpu" and (fp8_new or c.dtype != torch.bfloat16))
    _assert_appended(kc, k_after, "k_cache", exact)
    _assert_appended(vc, v_after, "v_cache", True)
    ref, ref_lse = _reference(x, c, kc.cpu(), vc.cpu(), upcast=True)
    low, low_lse = _reference(x, c, kc.cpu(), vc.cpu(), upcast=False)
    math = _math_dtype(x)
    assert out.dtype == math and out.shape == (c.b, c.s_q, c.h, c.d)
    assert_close_rule(out, ref, low, atol=_out_atol(ref, math, device), name="out")
    lse_atol = 1e-4
    if fp8_q and c.rotary and device == "cpu":
        # the rotated FP8 q is kept in bf16, truncated by the interpreter: up to 1 ulp of each
        # element of q in every score (|q| |k| scale per ulp)
        qn = (x["q"].cpu().float().norm(dim=-1).max() * x["q_descale"].max().cpu()).item()
        kn = (k_after.float().norm(dim=-1).max() * x["k_descale"].max().cpu()).item()
        lse_atol += 2 * 2.0**-7 * c.d ** -0.5 * qn * kn
    assert_close_rule(lse, ref_lse, low_lse.float(), atol=lse_atol, name="lse")


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
    # a head dim below its power-of-two tile: V's byte pairs masked at d / 2
    "bf16-d40-page3": dict(dtype=torch.bfloat16, d=40, page=3, s_new=1, num_splits=2),
}
CASES = [replace(BASE, **kw) for kw in _FEATURES.values()]


@pytest.mark.parametrize("case", CASES, ids=list(_FEATURES))
def test_kvcache_fp8(case: KVCase, backend: str) -> None:
    check_case(case)


# FA3's FP8 query (q float8_e4m3fn + q_descale, out bf16) over the FP8 cache; new k / v in
# FP8 (FA3's) or bf16 (quantized in)
BASE_Q8 = replace(BASE, dtype=torch.bfloat16)
_Q8_FEATURES = {
    "plain-gqa": (dict(), False),
    "append-splits": (dict(s_new=1, num_splits=3), False),
    "append-fp8-kv": (dict(s_new=2, num_splits=2), True),
    "rotary-causal-fp8-kv": (dict(s_new=3, rotary="interleaved", causal=True, s_q=3), True),
    "rotary-neox-bf16-kv": (dict(s_new=2, rotary="neox", rotary_frac=0.5, s_q=2), False),
    "page3-leftpad": (dict(page=3, s_new=2, num_splits=3, causal=True, s_q=2, leftpad=True),
                      True),
    "page1": (dict(page=1, s_cache=12, s_new=1), True),
    "page64-mqa": (dict(page=64, s_cache=64, s_new=1, h=8, h_k=1, num_splits=0), False),
    "window-alibi-softcap": (dict(s_q=3, causal=True, window=(5, 0), alibi=True, softcap=2.0),
                             False),
    "batch-idx": (dict(batch_idx=True, s_new=2, num_splits=3), True),
}
Q8_CASES = [(replace(BASE_Q8, **kw), new) for kw, new in _Q8_FEATURES.values()]


@pytest.mark.parametrize("case,fp8_new", Q8_CASES, ids=list(_Q8_FEATURES))
def test_kvcache_fp8_query(case: KVCase, fp8_new: bool, backend: str) -> None:
    check_case(case, fp8_q=True, fp8_new=fp8_new)


def test_fa3_kvcache_fp8_query_paged(backend: str) -> None:
    """flashattn.fa3's signature with FA3's FP8 q, FP8 new k / v and a page table."""
    check_case(replace(BASE_Q8, page=3, s_new=2, causal=True, s_q=2), fa3_api=True,
               fp8_q=True, fp8_new=True)


def test_fp8_new_rows_with_a_16bit_query(backend: str) -> None:
    """float8_e4m3fn k / v over an FP8 cache with a bf16 / fp16 q are stored as they are."""
    check_case(replace(BASE, s_new=2, num_splits=2), fp8_new=True)


def test_fp8_query_out_is_bf16_and_q_descale_none_is_one(backend: str) -> None:
    c = replace(BASE_Q8, s_new=1, num_splits=2)
    x = _fp8_inputs(c, fp8_q=True)
    x["q_descale"] = torch.ones(c.b, c.h_k)
    _, out_ones, lse_ones, _, _ = _run(c, dict(x))
    x["q_descale"] = None
    _, out_none, lse_none, _, _ = _run(c, dict(x))
    assert out_none.dtype == torch.bfloat16
    assert torch.equal(out_ones, out_none) and torch.equal(lse_ones, lse_none)


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
    """A repeated call signature gives the same out."""
    c = replace(BASE, num_splits=2)
    x = _fp8_inputs(c)
    outs = [_run(c, dict(x))[1] for _ in range(3)]
    assert torch.equal(outs[0], outs[1]) and torch.equal(outs[0], outs[2])


def _misaligned(t: torch.Tensor, shift: int) -> torch.Tensor:
    """A copy of ``t`` whose storage starts ``shift`` bytes past a 16-byte boundary."""
    buf = torch.empty(t.numel() * t.element_size() + 16, dtype=torch.uint8, device=t.device)
    skip = (shift - buf.data_ptr()) % 16
    out = buf[skip:skip + t.numel() * t.element_size()].view(t.dtype).view(t.shape)
    out.copy_(t)
    return out


def _decode_choices(monkeypatch, name: str) -> list:
    """A list that receives attribute ``name`` of every decode launch built from now on (the
    decode kernel's DecodeCall: which path its launches take)."""
    from flashattn.backends.triton import decode

    taken = []
    init = decode.DecodeCall.__init__

    def spy(self, *args, **kwargs):
        init(self, *args, **kwargs)
        taken.append(getattr(self, name))
    monkeypatch.setattr(decode.DecodeCall, "__init__", spy)
    return taken


def _read_as_given(c: KVCase, x: dict):
    """(out, lse) of a call that only reads the caches of ``x`` (no append), passed as they
    are (``_run`` copies them, which would realign a misaligned one), under fresh settings so
    that no call recorded before answers."""
    from flashattn.runtime import env

    assert c.s_new == 0
    with env.override(decode_config=""):
        return flash_attn_with_kvcache(
            x["q"], x["k_cache"], x["v_cache"], cache_seqlens=x["cache_seqlens"],
            block_table=x["block_table"], causal=c.causal, num_splits=c.num_splits,
            return_softmax_lse=True, k_descale=x["k_descale"], v_descale=x["v_descale"])


def check_v_byte_pairs(c: KVCase, monkeypatch, device: str = "cpu") -> None:
    """The decode kernel reads an e4m3 V tile as int16 byte pairs and runs P V over the even
    and the odd columns (decode.V_PAIRS): the same products summed in the same order as the
    plain tile's, so out and lse equal that path's bit for bit; a V cache whose base is not
    16-byte aligned takes the plain path (an int16 load needs an even address) and agrees.
    Each call runs under fresh settings, so no recorded call of another mode answers it."""
    from flashattn.backends.triton import decode

    if device == "cpu":  # (CUDA tensors: the default dispatch runs the decode kernel)
        use_backend(monkeypatch, "portable")
    x = _fp8_inputs(c, device=device)
    taken = _decode_choices(monkeypatch, "v_pairs")

    def call(v_cache, pairs):
        monkeypatch.setattr(decode, "V_PAIRS", pairs)
        return _read_as_given(c, dict(x, v_cache=v_cache))
    runs = {True: call(x["v_cache"], True), False: call(x["v_cache"], False)}
    shifted = _misaligned(x["v_cache"], 2)
    assert shifted.data_ptr() % 16 == 2
    runs["shifted"] = call(shifted, True)
    assert taken == [True, False, False]
    for name in (False, "shifted"):
        for got, want in zip(runs[name], runs[True]):
            assert torch.equal(got, want), name


@pytest.mark.parametrize("page", [None, 3], ids=["contiguous", "page3"])
def test_v_byte_pairs_equal_the_plain_widening_bitwise(monkeypatch, page) -> None:
    check_v_byte_pairs(replace(BASE, dtype=torch.bfloat16, d=40, s_cache=40, page=page,
                               num_splits=2), monkeypatch)


@contextlib.contextmanager
def k_byte_pairs(monkeypatch):
    """decode.K_PAIRS on (Q K^T over K's even / odd columns in fp16: the default, set here so
    that a probe's switch cannot leak in) under fresh settings, so no call recorded before
    answers; yields the list of each decode launch's choice."""
    from flashattn.backends.triton import decode
    from flashattn.runtime import env

    taken = _decode_choices(monkeypatch, "k_pairs")
    monkeypatch.setattr(decode, "K_PAIRS", True)
    with env.override(decode_config=""):
        yield taken


_K_PAIR_CASES = {
    "d40-bf16-page3": dict(dtype=torch.bfloat16, d=40, page=3, s_new=1, num_splits=2),
    "d64-fp16-rotary-causal": dict(d=64, s_new=3, rotary="interleaved", causal=True, s_q=3),
    "d40-bf16-window-leftpad": dict(dtype=torch.bfloat16, d=40, s_q=3, causal=True,
                                    window=(5, 0), num_splits=3, leftpad=True),
}


@pytest.mark.parametrize("over", _K_PAIR_CASES.values(), ids=list(_K_PAIR_CASES))
def test_k_byte_pairs(over, monkeypatch) -> None:
    """With decode.K_PAIRS the FP8 cache's Q K^T runs over K's even and odd columns in fp16:
    flash-attn's accuracy rule against the float64 reference, as the default path."""
    use_backend(monkeypatch, "portable")
    with k_byte_pairs(monkeypatch) as taken:
        check_case(replace(BASE, **over))
    assert taken and all(taken)


def check_k_casts(c: KVCase, monkeypatch, device: str = "cpu") -> None:
    """The paths K_PAIRS leaves: with the switch off, and with it on for a K cache whose base
    is not 16-byte aligned (an int16 load needs an even address), Q K^T widens e4m3 K to the
    math's dtype by casts; both keep flash-attn's rule against the float64 reference, and
    the launches say which path they took. Fresh settings: no recorded call answers."""
    from flashattn.backends.triton import decode

    if device == "cpu":
        use_backend(monkeypatch, "portable")
    taken = _decode_choices(monkeypatch, "k_pairs")
    for pairs, shift in ((False, 0), (True, 2)):
        x = _fp8_inputs(c, device=device)
        if shift:
            x["k_cache"] = _misaligned(x["k_cache"], shift)
            assert x["k_cache"].data_ptr() % 16 == shift
        monkeypatch.setattr(decode, "K_PAIRS", pairs)
        out, _ = _read_as_given(c, x)
        ref, _ = _reference(x, c, x["k_cache"].cpu(), x["v_cache"].cpu(), upcast=True)
        low, _ = _reference(x, c, x["k_cache"].cpu(), x["v_cache"].cpu(), upcast=False)
        assert_close_rule(out, ref, low, atol=_out_atol(ref, _math_dtype(x), device),
                          name=f"out (K_PAIRS {pairs}, shift {shift})")
    assert taken and not any(taken)


@pytest.mark.parametrize("page", [None, 3], ids=["contiguous", "page3"])
def test_k_casts_where_byte_pairs_do_not_apply(monkeypatch, page) -> None:
    check_k_casts(replace(BASE, dtype=torch.bfloat16, d=64, s_cache=40, page=page,
                          num_splits=2), monkeypatch)


@pytest.mark.parametrize("q_scale", [2.0**20, 2.0**-30, 0.0, "one-large"],
                         ids=["beyond-fp16", "tiny", "zero", "one-large-element"])
def test_k_byte_pairs_bf16_query_magnitudes(q_scale, monkeypatch) -> None:
    """K_PAIRS scales a bf16 q tile by a power of two into fp16's range: a q far beyond fp16's
    range, one far below it, an all-zero q and a q whose one large element sets the scale for
    the others keep flash-attn's rule against the float64 reference (no inf, no lost rows)."""
    use_backend(monkeypatch, "portable")
    c = replace(BASE, dtype=torch.bfloat16, d=64, s_q=2, causal=True, num_splits=2)
    x = _fp8_inputs(c)
    # every causal query row sees a key (a cache of one key leaves the first row none: lse -inf
    # is then right, and not this test's subject)
    x["cache_seqlens"] = x["cache_seqlens"].clamp(min=c.s_q)
    if q_scale == "one-large":
        x["q"][:, :, :, 0] = 3.0e4  # (fp16's largest is 65504: the rest keep 10-bit precision)
    else:
        x["q"] = (x["q"].float() * q_scale).to(torch.bfloat16)
    with k_byte_pairs(monkeypatch) as taken:
        x, out, lse, kc, vc = _run(c, x)
    assert taken and all(taken)
    ref, ref_lse = _reference(x, c, kc, vc, upcast=True)
    low, low_lse = _reference(x, c, kc, vc, upcast=False)
    assert torch.isfinite(out).all() and torch.isfinite(lse).all()
    assert_close_rule(out, ref, low, atol=_out_atol(ref, torch.bfloat16, "cpu"), name="out")
    assert_close_rule(lse, ref_lse, low_lse.float(),
                      atol=1e-4 + 1e-6 * ref_lse.abs().max().item(), name="lse")


def _bad(fp8_q: bool = False, **over):
    c = replace(BASE, s_new=1)
    x = _fp8_inputs(c, fp8_q=fp8_q)
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
    with pytest.raises(TypeError, match="k must be float16 / bfloat16 / float32 .* or "
                                        "float8_e4m3fn"):
        _run(c, {**x, "k": x["k"].to(torch.float8_e5m2)})


@pytest.mark.parametrize("over, exc, match", [
    (dict(q_descale=torch.ones(2, 4)), ValueError, "q_descale must have shape"),
    (dict(q_descale=torch.ones(2, 2, dtype=torch.float64)), TypeError,
     "q_descale must have dtype"),
    (dict(q_descale=torch.ones(2, 2, device="meta")), ValueError,
     "q_descale must have the device"),
    (dict(q_descale=1.0), TypeError, "q_descale must be None or a float32 tensor"),
    (dict(q_descale=torch.tensor([[1.0, float("nan")], [1.0, 1.0]])), ValueError,
     "q_descale must be finite and > 0"),
], ids=["shape", "dtype", "device", "not-a-tensor", "nan"])
def test_bad_q_descale(cpu_backend: str, over, exc, match) -> None:
    c, x = _bad(fp8_q=True, **over)
    with pytest.raises(exc, match=match):
        _run(c, x)


def test_q_descale_needs_an_fp8_query(cpu_backend: str) -> None:
    c, x = _bad(q_descale=torch.ones(2, 2))
    with pytest.raises(ValueError, match="q_descale was given but q has dtype torch.float16"):
        _run(c, x)


def test_fp8_query_needs_an_fp8_cache(cpu_backend: str) -> None:
    """FlashAttention-3 takes an FP8 q with FP8 k / v only: a 16-bit cache names q."""
    c = BASE
    x = make_inputs(c, "cpu")
    with pytest.raises(TypeError, match="q has dtype torch.float8_e4m3fn but k_cache is "
                                        "torch.float16"):
        flash_attn_with_kvcache(x["q"].to(FP8), x["k_cache"], x["v_cache"],
                                cache_seqlens=x["cache_seqlens"])


def test_e5m2_query_is_refused(cpu_backend: str) -> None:
    c, x = _bad()
    with pytest.raises(TypeError, match="q has dtype torch.float8_e5m2"):
        _run(c, {**x, "q": x["q"].to(torch.float8_e5m2)})


def _plan_case(page: Optional[int], fp8_q: bool, s_q: int = 1):
    """Inputs of a planned FP8 step (no new keys) and the plan_decode arguments matching them."""
    c = replace(BASE, page=page, s_q=s_q, num_splits=0,
                dtype=torch.bfloat16 if fp8_q else BASE.dtype)
    x = _fp8_inputs(c, fp8_q=fp8_q)
    cap = c.s_cache if page is None else x["block_table"].shape[1] * page
    kw = dict(max_seqlen_k=cap, seqlen_q=s_q, page_size=page, device="cpu", causal=True,
              dtype=x["q"].dtype, kv_dtype=FP8)
    return c, x, kw


@pytest.mark.parametrize("page", [None, 3], ids=["contiguous", "page3"])
@pytest.mark.parametrize("fp8_q", [False, True], ids=["q16", "q8"])
@pytest.mark.parametrize("descales", ["given", "none"])
def test_plan_decode_fp8_equals_the_call_bitwise(backend: str, page, fp8_q, descales) -> None:
    """plan_decode(kv_dtype=float8_e4m3fn) (and FA3's FP8 q) runs the call's kernels with the
    call's decisions: out and lse bit for bit those of flash_attn_with_kvcache, run after run
    (new lengths, new descale values read in place)."""
    c, x, kw = _plan_case(page, fp8_q, s_q=2)
    if descales == "none":
        x.update(q_descale=None, k_descale=None, v_descale=None)
    plan = flashattn.plan_decode(c.b, c.h, c.h_k, c.d, **kw)
    fp8 = {n: x[n] for n in ("q_descale", "k_descale", "v_descale")}
    for step in range(2):
        out, lse = plan.run(x["q"], x["k_cache"], x["v_cache"], x["cache_seqlens"],
                            x["block_table"], return_softmax_lse=True, **fp8)
        want, want_lse = flash_attn_with_kvcache(
            x["q"], x["k_cache"], x["v_cache"], cache_seqlens=x["cache_seqlens"],
            block_table=x["block_table"], causal=True, return_softmax_lse=True, **fp8)
        assert out.dtype == (torch.bfloat16 if fp8_q else c.dtype)
        assert torch.equal(out, want) and torch.equal(lse, want_lse), f"step {step}"
        x["cache_seqlens"] = torch.randint(1, kw["max_seqlen_k"] + 1, (c.b,),
                                           dtype=torch.int32)
        for n, d in fp8.items():
            if d is not None:
                d.copy_(torch.rand_like(d) + 0.25)


def test_plan_decode_fp8_arguments(cpu_backend: str) -> None:
    c, x, kw = _plan_case(None, False)
    with pytest.raises(TypeError, match="needs kv_dtype=torch.float8_e4m3fn"):
        flashattn.plan_decode(c.b, c.h, c.h_k, c.d, **{**kw, "dtype": FP8,
                                                       "kv_dtype": torch.bfloat16})
    with pytest.raises(TypeError, match="kv_dtype must be None, dtype"):
        flashattn.plan_decode(c.b, c.h, c.h_k, c.d, **{**kw, "kv_dtype": torch.bfloat16})
    with pytest.raises(TypeError, match="dtype must be one of"):
        flashattn.plan_decode(c.b, c.h, c.h_k, c.d, **{**kw, "dtype": torch.float8_e5m2})
    plan = flashattn.plan_decode(c.b, c.h, c.h_k, c.d, **kw)
    assert "kv_dtype=torch.float8_e4m3fn" in repr(plan)
    args = (x["q"], x["k_cache"], x["v_cache"], x["cache_seqlens"])
    with pytest.raises(ValueError, match="k_cache must be a torch.float8_e4m3fn tensor"):
        plan.run(x["q"], x["k_cache"].to(c.dtype), x["v_cache"], x["cache_seqlens"])
    with pytest.raises(ValueError, match="k_descale must have shape"):
        plan.run(*args, k_descale=torch.ones(c.b, c.h_k + 1))
    with pytest.raises(ValueError, match="q_descale was given but q has dtype"):
        plan.run(*args, q_descale=torch.ones(c.b, c.h_k))
    plan16 = flashattn.plan_decode(c.b, c.h, c.h_k, c.d, **{**kw, "kv_dtype": None})
    with pytest.raises(ValueError, match="k_cache must be a torch.float16 tensor"):
        plan16.run(*args)


@pytest.mark.parametrize("d", [32, 64], ids=["d32", "d64"])
@pytest.mark.parametrize("fp8_q", [False, True], ids=["q16", "q8"])
def test_packed_queries_and_new_keys(backend: str, fp8_q: bool, d: int) -> None:
    """FlashAttention-3's packed forms (cu_seqlens_q, cu_seqlens_k_new) over an FP8 cache
    (and with an FP8 q, FP8 new keys, rotary): the same cache bytes and out as the dense
    call (d 64: V read as byte pairs on the packed route too)."""
    c = replace(BASE, s_q=2, s_new=2, causal=True, page=3, d=d)
    if fp8_q:
        c = replace(c, dtype=torch.bfloat16, rotary="interleaved")
    x = _fp8_inputs(c, fp8_q=fp8_q, fp8_new=fp8_q)
    _, out, _, kc, vc = _run(c, dict(x))
    cu = torch.arange(0, 2 * c.b + 1, 2, dtype=torch.int32)
    k8, v8 = x["k_cache"].clone(), x["v_cache"].clone()
    packed = fa3.flash_attn_with_kvcache(
        x["q"].flatten(0, 1), k8, v8, x["k"].flatten(0, 1), x["v"].flatten(0, 1),
        cache_seqlens=x["cache_seqlens"], page_table=x["block_table"], cu_seqlens_q=cu,
        max_seqlen_q=c.s_q, cu_seqlens_k_new=cu, causal=True, k_descale=x["k_descale"],
        v_descale=x["v_descale"], q_descale=x["q_descale"], rotary_cos=x["rotary_cos"],
        rotary_sin=x["rotary_sin"])
    assert torch.equal(k8.view(torch.uint8), kc.view(torch.uint8))
    assert torch.equal(v8.view(torch.uint8), vc.view(torch.uint8))
    # (fp16 out: 2e-3; bf16 out (FP8 q): one bf16 step of the largest output)
    atol = 2.0**-7 * out.abs().max().item() if fp8_q else 2e-3
    torch.testing.assert_close(packed, out.flatten(0, 1), atol=atol, rtol=0)


def test_op_fake_gives_bf16_out_for_an_fp8_query() -> None:
    """The op's fake (what torch.compile traces) agrees with the body: bf16 out for an FP8
    q, q's dtype otherwise."""
    from flashattn import ops

    meta = dict(device="meta")
    kc = torch.empty(2, 48, 2, 32, dtype=FP8, **meta)
    args = (kc, kc, None, None, None, None, None, None, None, None, None, 0.1, False, -1, -1,
            0.0, True, 1)
    for q_dtype, want in ((FP8, torch.bfloat16), (torch.float16, torch.float16)):
        q = torch.empty(2, 1, 4, 32, dtype=q_dtype, **meta)
        out, lse = ops._fwd_kvcache_fake(q, *args)
        assert out.dtype == want and out.shape == (2, 1, 4, 32) and lse.dtype == torch.float32


# ---------------------------------------------------------------------------------------------
# The recorded-call fast path (api/fastpath.py) with FP8 caches / queries
# ---------------------------------------------------------------------------------------------
_FAST = {
    "q16-append-rotary": (dict(s_new=1, rotary="neox", causal=True, num_splits=2), False, False),
    "q16-fp8-rows-paged": (dict(s_new=2, page=3, num_splits=0), False, True),
    "q8-paged-rotary-fp8-rows": (dict(s_new=1, page=3, rotary="interleaved", s_q=2,
                                      causal=True, dtype=torch.bfloat16), True, True),
    "q8-descales-none": (dict(num_splits=3, dtype=torch.bfloat16), True, False),
}


@pytest.mark.parametrize("kw,fp8_q,fp8_new", _FAST.values(), ids=list(_FAST))
def test_fp8_fast_path_replays_the_full_path_bitwise(backend: str, kw, fp8_q, fp8_new) -> None:
    """A repeated FP8 signature takes the fast path (one entry; on the portable backend its
    recorded decode call, replayed) and gives the full path's out, lse and cache bytes bit
    for bit, step after step (new lengths, new descale values, new rows and queries)."""
    from flashattn.api import fastpath

    c = replace(BASE, **kw)
    x = _fp8_inputs(c, fp8_q, fp8_new)
    if kw.get("num_splits") == 3:  # FA3's None descales, ones inside
        x.update(q_descale=None, k_descale=None, v_descale=None)
    steps = []
    for _ in range(4):
        steps.append(dict(x))
        if x["k"] is not None:  # the next step: new lengths, rows, queries, descale values
            x["cache_seqlens"] = torch.randint(0, c.s_cache - c.s_new, (c.b,),
                                               dtype=torch.int32)
            for n in ("k", "v"):
                x[n] = (torch.randn_like(x[n].float()) * 4).to(x[n].dtype)
        for n in ("q_descale", "k_descale", "v_descale"):
            if x[n] is not None:
                x[n] = torch.rand_like(x[n]) + 0.25
        x["q"] = (torch.randn_like(x["q"].float()) * 4).to(x["q"].dtype)
    init = (x["k_cache"], x["v_cache"])

    fastpath.KVCACHE.clear()
    fast, kc, vc = [], init[0], init[1]
    for st in steps:  # one signature: the first call records, the others replay
        _, out, lse, kc, vc = _run(c, {**st, "k_cache": kc, "v_cache": vc})  # (caches cloned)
        fast.append((out, lse, kc, vc))
    entries = list(fastpath.KVCACHE._entries.values())
    assert len(entries) == 1, "the FP8 signature was not kept"
    if backend == "portable":
        assert entries[0][1][1] is not None, "no recorded decode call"
    kc, vc = init
    for i, st in enumerate(steps):
        fastpath.KVCACHE.clear()  # the reference takes the full path
        _, want, want_lse, kc, vc = _run(c, {**st, "k_cache": kc, "v_cache": vc})
        out, lse, fk, fv = fast[i]
        assert torch.equal(out, want) and torch.equal(lse, want_lse), f"step {i}"
        assert torch.equal(fk.view(torch.uint8), kc.view(torch.uint8)), f"k_cache, step {i}"
        assert torch.equal(fv.view(torch.uint8), vc.view(torch.uint8)), f"v_cache, step {i}"
    fastpath.KVCACHE.clear()


def test_fp8_fast_path_keys_descales_and_checks_their_values(cpu_backend: str) -> None:
    """Descale presence is part of the signature (None and a tensor are two entries); CPU
    descale values are checked on every call; a descale that is not a tensor takes the full
    path, which raises."""
    from flashattn.api import fastpath

    c = replace(BASE, num_splits=2)
    x = _fp8_inputs(c)
    fastpath.KVCACHE.clear()
    _run(c, dict(x))
    _run(c, dict(x))
    assert len(fastpath.KVCACHE._entries) == 1
    _run(c, {**x, "v_descale": None})
    assert len(fastpath.KVCACHE._entries) == 2
    with pytest.raises(ValueError, match="k_descale must be finite and > 0"):
        _run(c, {**x, "k_descale": -x["k_descale"]})
    with pytest.raises(TypeError, match="k_descale must be None or a float32 tensor"):
        _run(c, {**x, "k_descale": [[1.0, 1.0], [1.0, 1.0]]})
    fastpath.KVCACHE.clear()
