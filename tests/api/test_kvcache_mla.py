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
from dataclasses import dataclass, replace

import pytest
import torch

from flashattn import fa3, flash_attn_with_kvcache
from flashattn.reference import (attention_probs_ref, attention_ref, default_scale, kvcache_ref,
                                 rotary_ref)
from tests.accuracy import assert_close_rule
from tests.api.test_kvcache import KVCase, _ulp, make_inputs

FP8 = torch.float8_e4m3fn


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


# ---------------------------------------------------------------------------------------------
# Against the float64 oracle
# ---------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class MLACase(KVCase):
    """A KV-cache case (tests/api/test_kvcache.py's) with the latent query: qv and v_cache
    d_v wide (the KV case's d is q's and k's), and optionally an FP8 (e4m3) cache."""
    d_v: int = 64
    fp8: bool = False
    packed: bool = False  # FlashAttention-3's packed queries (cu_seqlens_q): flashattn.fa3
    latent: bool = True  # False: no qv (a plain KV-cache call with a wide V)

    @property
    def id(self) -> str:
        return super().id + f"-dv{self.d_v}" + ("-fp8" if self.fp8 else "") + (
            "-packed" if self.packed else "") + ("" if self.latent else "-noqv")


def mla_inputs(c: MLACase) -> dict:
    """make_inputs of the KV case (q, k_cache, lengths, pages, rotary, ...) with v_cache / v
    d_v wide, qv, and for an FP8 case both caches in e4m3 with (b, h_k) descales."""
    x = make_inputs(c, "cpu")
    rn = lambda *shape: torch.randn(*shape).to(c.dtype)  # noqa: E731
    x["v_cache"] = rn(*x["k_cache"].shape[:-1], c.d_v)
    if x["v"] is not None:
        x["v"] = rn(*x["k"].shape[:-1], c.d_v)
    x["qv"] = rn(*x["q"].shape[:-1], c.d_v) if c.latent else None
    if c.fp8:
        for n in ("k_cache", "v_cache"):
            x[n] = (x[n].float() * 4).clamp(-448, 448).to(FP8)
        x["k_descale"] = torch.rand(c.b, c.h_k) + 0.25
        x["v_descale"] = torch.rand(c.b, c.h_k) + 0.25
    return x


def _quantize(x: torch.Tensor, descale: torch.Tensor) -> torch.Tensor:
    return (x.float() / descale[:, None, :, None]).clamp(-448, 448).to(FP8)


def _expected_caches(x: dict, c: MLACase):
    """The caches as the call leaves them: the new rows written at cache_seqlens (keys rotated
    there), quantized with their row's descales in an FP8 cache; nothing else moved."""
    cpu = dict(x)
    cpu.pop("qv"), cpu.pop("k_descale", None), cpu.pop("v_descale", None)
    if not c.fp8:
        _, _, k_after, v_after = kvcache_ref(**cpu, rotary_interleaved=c.rotary != "neox")
        return k_after, v_after
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
    page = x["k_cache"].shape[1]
    for row in range(c.b):
        pos = int(lens[row]) + torch.arange(c.s_new)
        if x["block_table"] is not None:
            d0, d1 = x["block_table"][row].long()[pos // page], pos % page
        else:
            idx = x["cache_batch_idx"]
            d0, d1 = torch.full_like(pos, row if idx is None else int(idx[row])), pos
        k_after[d0, d1], v_after[d0, d1] = k8[row], v8[row]
    return k_after, v_after


def mla_reference(x: dict, c: MLACase, k_after: torch.Tensor, v_after: torch.Tensor,
                  upcast: bool):
    """(out, lse) of the oracle over the caches after the append (float64 when upcast, else
    in q's dtype, the low-precision baseline); an FP8 cache dequantized with each row's
    descales, so qv . v scores against the real values."""
    local = c.causal or c.window != (-1, -1)
    q = x["q"]
    if x["rotary_cos"] is not None:
        pos = x["cache_seqlens"].long().view(-1, 1) + (1 if local else 0) * torch.arange(c.s_q)
        q = rotary_ref(q, x["rotary_cos"], x["rotary_sin"], pos, c.rotary != "neox").to(q.dtype)
    dtype = torch.float64 if upcast else q.dtype
    outs, lses = [], []
    one = lambda t, row: None if t is None else t[row:row + 1]  # noqa: E731
    for row in range(c.b):
        kc, vc = k_after, v_after
        if c.fp8:
            kc = (kc.double() * x["k_descale"][row].double()[None, None, :, None]).to(dtype)
            vc = (vc.double() * x["v_descale"][row].double()[None, None, :, None]).to(dtype)
        # (a batch of one: a contiguous cache's row is named, a paged row's pages are its own)
        cache_row = one(x["cache_batch_idx"], row)
        if cache_row is None and x["block_table"] is None:
            cache_row = torch.tensor([row], dtype=torch.int32)
        o, l, _, _ = kvcache_ref(
            q[row:row + 1], kc, vc, qv=None if x["qv"] is None else x["qv"][row:row + 1],
            cache_seqlens=(x["cache_seqlens"].long() + c.s_new)[row:row + 1].to(torch.int32),
            cache_batch_idx=cache_row, cache_leftpad=one(x["cache_leftpad"], row),
            block_table=one(x["block_table"], row), causal=c.causal, window_size=c.window,
            softcap=c.softcap, alibi_slopes=one(x["alibi_slopes"], row), upcast=upcast)
        outs.append(o)
        lses.append(l)
    return torch.cat(outs), torch.cat(lses)


def run_mla(c: MLACase, x: dict, device: str = "cpu"):
    """The call on ``device`` on copies of x's caches: (out, lse, k_cache, v_cache) after it,
    on the CPU. Packed cases go through flashattn.fa3 with cu_seqlens_q (and k / v packed
    with cu_seqlens_k_new)."""
    x = {k: v.to(device) if isinstance(v, torch.Tensor) else v for k, v in x.items()}
    kc, vc = x["k_cache"].clone(), x["v_cache"].clone()
    kw = dict(rotary_cos=x["rotary_cos"], rotary_sin=x["rotary_sin"],
              cache_seqlens=x["cache_seqlens"], cache_batch_idx=x["cache_batch_idx"],
              cache_leftpad=x["cache_leftpad"], causal=c.causal, window_size=c.window,
              softcap=c.softcap, rotary_interleaved=c.rotary != "neox",
              num_splits=c.num_splits, return_softmax_lse=True,
              k_descale=x.get("k_descale"), v_descale=x.get("v_descale"))
    if c.packed:
        cu_q = torch.arange(0, c.b * c.s_q + 1, c.s_q, dtype=torch.int32, device=device)
        packed = {}
        if x["k"] is not None:
            packed = dict(k=x["k"].flatten(0, 1), v=x["v"].flatten(0, 1),
                          cu_seqlens_k_new=torch.arange(0, c.b * c.s_new + 1, c.s_new,
                                                        dtype=torch.int32, device=device))
        out, lse = fa3.flash_attn_with_kvcache(
            x["q"].flatten(0, 1), kc, vc, page_table=x["block_table"],
            qv=None if x["qv"] is None else x["qv"].flatten(0, 1),
            cu_seqlens_q=cu_q, max_seqlen_q=c.s_q, **packed, **kw)
        out = out.unflatten(0, (c.b, c.s_q))
        lse = lse.unflatten(1, (c.b, c.s_q)).permute(1, 0, 2)
    else:
        out, lse = flash_attn_with_kvcache(x["q"], kc, vc, x["k"], x["v"], qv=x["qv"],
                                           block_table=x["block_table"],
                                           alibi_slopes=x["alibi_slopes"], **kw)
    return out.cpu(), lse.cpu(), kc.cpu(), vc.cpu()


def check_mla(c: MLACase, device: str = "cpu") -> None:
    """One call of case c on ``device`` against the oracle: the caches after the append
    (exact, or within rotary's rounding), out and lse by flash-attn's rule."""
    x = mla_inputs(c)
    out, lse, kc, vc = run_mla(c, x, device)
    k_after, v_after = _expected_caches(x, c)
    bits = (lambda t: t.view(torch.uint8)) if c.fp8 else (lambda t: t)
    if c.rotary and c.s_new > 0 and not c.fp8:  # (fp32 vs fp64 rotation, then rounding)
        diff = (kc.double() - k_after.double()).abs().max().item()
        assert diff <= 2 * _ulp(c.dtype) * max(1.0, k_after.abs().max().item()), "k_cache"
    else:
        assert torch.equal(bits(kc), bits(k_after)), "k_cache after the append"
    assert torch.equal(bits(vc), bits(v_after)), "v_cache after the append"
    ref, ref_lse = mla_reference(x, c, k_after, v_after, upcast=True)
    low, low_lse = mla_reference(x, c, k_after, v_after, upcast=False)
    assert out.shape == (c.b, c.s_q, c.h, c.d_v) and out.dtype == c.dtype
    assert lse.shape == (c.b, c.h, c.s_q) and lse.dtype == torch.float32
    atol, lse_atol = 1e-5, 1e-4
    if c.dtype == torch.bfloat16 and device == "cpu":
        # the interpreter truncates fp32 -> bf16 (1 ulp, not 0.5) when it writes out
        atol += _ulp(c.dtype) * ref.abs().max().item()
    if c.dtype == torch.float32:
        # fp32 math against the naive fp32 oracle: both errors are rounding noise of the same
        # size (exp of scores in the hundreds over a dequantized FP8 cache), so twice one draw
        # of it is a tight bound at |out| ~ 10: a few units in the last place at the output's
        # magnitude (one seed of 26 on the cpu backend: 1.80e-5 against 1.79e-5, 2026-11-28)
        atol += 4 * _ulp(c.dtype) * ref.abs().max().item()
    assert_close_rule(out, ref, low, atol=atol, name="out")
    assert_close_rule(lse, ref_lse, low_lse.float(), atol=lse_atol, name="lse")


# d = 16 / d_v = 64 (DeepSeek's 64 / 512 in one case each: the interpreter is slow), one KV
# head (MQA) unless said; each case adds a feature or two
BASE = MLACase(d=16, d_v=64, h=4, h_k=1, s_cache=40)
_FEATURES = {
    "deepseek-page64": dict(d=64, d_v=512, h=16, page=64, s_cache=128, s_new=1, num_splits=0,
                            dtype=torch.bfloat16),
    "contiguous": {},
    "page1-append": dict(page=1, s_cache=12, s_new=1),
    "page3-leftpad-causal": dict(page=3, s_new=2, s_q=2, causal=True, leftpad=True,
                                 num_splits=3),
    "page64-gqa-splits": dict(page=64, s_cache=128, s_new=1, h=8, h_k=2, num_splits=3),
    "empty-rows": dict(empty_row=True, b=3, num_splits=3),
    "sq4-causal-append": dict(s_q=4, s_new=4, causal=True, num_splits=2, h=8, h_k=2),
    "rotary-causal": dict(s_new=2, s_q=2, rotary="interleaved", causal=True),
    "window-softcap": dict(s_q=3, causal=True, window=(5, 0), softcap=2.0, num_splits=3),
    "alibi-batch-idx": dict(alibi=True, batch_idx=True, s_new=2),
    "fp32": dict(dtype=torch.float32, s_new=1, num_splits=2),
    "packed-append": dict(packed=True, s_q=2, s_new=2, causal=True, page=3, num_splits=2),
    "fp8-deepseek-page64": dict(fp8=True, d=64, d_v=512, h=16, page=64, s_cache=128, s_new=1,
                                num_splits=2, dtype=torch.bfloat16),
    "fp8-gqa-splits": dict(fp8=True, h=8, h_k=2, s_new=1, num_splits=3),
    "fp8-page3-causal": dict(fp8=True, page=3, s_q=2, s_new=2, causal=True, empty_row=True),
    # V head dim past 256 without qv: the plain KV-cache call
    "noqv-dv512-page64": dict(latent=False, d=64, d_v=512, h=8, page=64, s_cache=128, s_new=1,
                              num_splits=2, dtype=torch.bfloat16),
    "noqv-dv320-causal": dict(latent=False, d=32, d_v=320, s_q=2, s_new=2, causal=True,
                              num_splits=3, h=4, h_k=2),
    "noqv-fp8-dv512": dict(latent=False, fp8=True, d=64, d_v=512, s_new=1, num_splits=2),
    # fp32 past 256: 64 packed rows, which the decode kernel tiles 32 at a time
    "fp32-dv384-64heads": dict(dtype=torch.float32, d_v=384, h=64, s_new=1, num_splits=2,
                               s_cache=24),
}
CASES = [replace(BASE, **kw) for kw in _FEATURES.values()]


@pytest.mark.parametrize("case", CASES, ids=list(_FEATURES))
def test_mla_kvcache(case: MLACase, backend: str) -> None:
    check_mla(case)


def test_default_scale_counts_both_widths(cpu_backend: str) -> None:
    """softmax_scale=None with qv is (d + d_v) ** -0.5 (FlashAttention-3's default)."""
    c = replace(BASE, s_new=0)
    x = mla_inputs(c)
    q, kc, vc, qv, lens = x["q"], x["k_cache"], x["v_cache"], x["qv"], x["cache_seqlens"]
    out = fa3.flash_attn_with_kvcache(q, kc, vc, qv=qv, cache_seqlens=lens)
    want = fa3.flash_attn_with_kvcache(q, kc, vc, qv=qv, cache_seqlens=lens,
                                       softmax_scale=(c.d + c.d_v) ** -0.5)
    assert torch.equal(out, want)
    other = fa3.flash_attn_with_kvcache(q, kc, vc, qv=qv, cache_seqlens=lens,
                                        softmax_scale=c.d ** -0.5)
    assert not torch.equal(out, other)


def test_mla_decode_step_compiles(cpu_backend: str) -> None:
    """An MLA decode step (append + attention with qv, FA3's API) under torch.compile
    (fullgraph, through the fwd_kvcache op): the eager call's output and caches."""
    c = replace(BASE, s_new=1, page=3)
    x = mla_inputs(c)

    def step(q, qv, k_cache, v_cache, k, v, seqlens, table):
        return fa3.flash_attn_with_kvcache(q, k_cache, v_cache, k, v, qv=qv,
                                           cache_seqlens=seqlens, page_table=table,
                                           causal=True)

    args = [x[n] for n in ("q", "qv")]
    caches = [x[n].clone() for n in ("k_cache", "v_cache")]
    rest = [x[n] for n in ("k", "v", "cache_seqlens", "block_table")]
    out = torch.compile(step, fullgraph=True, backend="aot_eager")(*args, *caches, *rest)
    ref_caches = [x[n].clone() for n in ("k_cache", "v_cache")]
    ref = step(*args, *ref_caches, *rest)
    torch.testing.assert_close(out, ref, rtol=0, atol=0)
    assert all(torch.equal(a, b) for a, b in zip(caches, ref_caches))


# ---------------------------------------------------------------------------------------------
# qv meets the FP8 KV cache's second round: the FP8 launch configuration, FA3's FP8 query
# ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32],
                         ids=["bf16", "fp16", "fp32"])
def test_mla_fp8_cache_through_the_fp8_launch_config(dtype, backend: str,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    """qv over an FP8 cache with d_v <= 256 takes the FP8 launch configuration on a GPU (128
    keys a step for 16-bit math, 16 for fp32; pointer loads) while V stays in the math's dtype
    for both of its dots (not the fp16 of the FP8 path without qv). The interpreter's own
    config is 16 keys, so the GPU's tile is forced through FLASHATTN_DECODE_CONFIG and the
    call checked against the oracle (paged, appends, causal, splits, GQA)."""
    from flashattn.backends.triton import decode as dec
    from tests.settings import set_env

    c = replace(BASE, fp8=True, dtype=dtype, d=32, d_v=64, h=8, h_k=2, page=3, s_q=2,
                s_new=2, causal=True, num_splits=2)
    elem = torch.empty((), dtype=dtype).element_size()
    with monkeypatch.context() as m:  # the configuration a GPU takes for this call
        m.setattr(dec.config, "INTERPRET", False)
        fp8_cfg = dec.launch_config(c.d, elem, True, kv_fp8=True, head_dim_v=c.d_v)
        # (a latent cache past 256 keeps its wide-V configuration: 128 keys of 512 would not fit)
        wide = dec.launch_config(64, elem, True, kv_fp8=True, head_dim_v=512)
    assert fp8_cfg == ((16, 8, 3, False) if dtype == torch.float32 else (128, 4, 3, False))
    assert wide == dec._WIDE_V_CONFIG[elem >= 4]
    set_env(monkeypatch, FLASHATTN_DECODE_CONFIG=",".join(str(int(v)) for v in fp8_cfg))
    if backend == "portable":  # the decode call the kernel runs: qv and the FP8 cache together
        x = mla_inputs(c)
        lens = x["cache_seqlens"] + c.s_new
        call = dec.DecodeCall(x["q"], x["k_cache"], x["v_cache"], lens, 0, softmax_scale=0.1,
                              window_left=-1, window_right=0, softcap=0.0, alibi_slopes=None,
                              num_splits=c.num_splits, max_seqlen_k=lens.max().item(),
                              block_table=x["block_table"], k_descale=x["k_descale"],
                              v_descale=x["v_descale"], qv=x["qv"])
        assert call.kwargs["BLOCK_N"] == fp8_cfg[0] and not call.use_tma
        assert call.kwargs["HAS_QV"] and call.kwargs["KV_FP8"] and not call.kwargs["Q_FP8"]
    check_mla(c)


def test_fp8_query_with_qv_is_refused(cpu_backend: str) -> None:
    """FA3's FP8 query (float8_e4m3fn q, q_descale) with qv raises NotImplementedError naming
    qv (whatever qv's dtype), in both APIs and after the same signature without qv has been
    recorded by the fast path (an FP8 query with qv is never recorded: its first call raises)."""
    from flashattn.api import fastpath

    q, kc, vc, qv, lens = _small(d=16, d_v=32, dtype=torch.bfloat16)
    q8 = (q.float() * 4).clamp(-448, 448).to(FP8)
    kc8, vc8 = (kc.float() * 4).to(FP8), (vc.float() * 4).to(FP8)
    kw = dict(cache_seqlens=lens, q_descale=torch.rand(2, 1) + 0.5,
              k_descale=torch.rand(2, 1) + 0.5, v_descale=torch.rand(2, 1) + 0.5)
    fastpath.KVCACHE.clear()
    try:
        for _ in range(2):  # recorded, then replayed by the fast path
            out = flash_attn_with_kvcache(q8, kc8, vc8, **kw)
        assert out.dtype == torch.bfloat16
        for fn in (flash_attn_with_kvcache, fa3.flash_attn_with_kvcache):
            for latent in (qv, qv.float().clamp(-448, 448).to(FP8)):
                with pytest.raises(NotImplementedError, match=r"qv .*float8_e4m3fn q"):
                    fn(q8, kc8, vc8, qv=latent, **kw)
    finally:
        fastpath.KVCACHE.clear()
    # a 16-bit q with qv over the same FP8 cache is fine
    out = flash_attn_with_kvcache(q, kc8, vc8, qv=qv, cache_seqlens=lens,
                                  k_descale=kw["k_descale"], v_descale=kw["v_descale"])
    assert out.shape == (2, 1, 4, 32) and out.dtype == torch.bfloat16


def test_qv_calls_over_an_fp8_cache_replay_their_signature(backend: str) -> None:
    """The recorded-call fast path keys qv calls (qv as a tensor): repeated qv calls over an
    FP8 cache make one entry and give the same output every time; the same call without qv
    is another signature."""
    from flashattn.api import fastpath

    c = replace(BASE, fp8=True, dtype=torch.bfloat16, s_new=0, num_splits=2)
    x = mla_inputs(c)
    kw = dict(cache_seqlens=x["cache_seqlens"], k_descale=x["k_descale"],
              v_descale=x["v_descale"])
    fastpath.KVCACHE.clear()
    try:
        outs = [flash_attn_with_kvcache(x["q"], x["k_cache"], x["v_cache"], qv=x["qv"], **kw)
                for _ in range(3)]
        assert len(fastpath.KVCACHE._entries) == 1
        assert all(torch.equal(outs[0], o) for o in outs[1:])
        flash_attn_with_kvcache(x["q"], x["k_cache"], x["v_cache"], **kw)  # (no qv)
        assert len(fastpath.KVCACHE._entries) == 2
    finally:
        fastpath.KVCACHE.clear()
