"""flash_attn_with_kvcache against the float64 oracle (``reference.kvcache_ref``), small shapes.

Every case runs on both backends ('cpu': torch; 'portable': the Triton kernels, under
TRITON_INTERPRET=1 without a GPU) and checks (1) out and lse by flash-attn's accuracy rule
(tests/accuracy.py), (2) the caches after the call: the new keys (rotated) and values written
in place at cache_seqlens, everything else untouched. ``run_case`` is shared with
tests/test_kvcache_gpu.py, which repeats the grid at realistic sizes.
"""
from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Optional, Tuple

import pytest
import torch

from tests.accuracy import assert_close_rule
from tests.settings import set_env
from flashattn import flash_attn_with_kvcache
from flashattn.reference import kvcache_ref


@dataclass(frozen=True)
class KVCase:
    b: int = 2
    s_q: int = 1
    s_new: int = 0
    s_cache: int = 48
    h: int = 4
    h_k: int = 2
    d: int = 32
    dtype: torch.dtype = torch.float16
    page: Optional[int] = None  # paged cache page size (None: contiguous)
    rotary: Optional[str] = None  # None | "interleaved" | "neox"
    rotary_frac: float = 1.0  # rotary_dim / d
    batch_idx: bool = False
    leftpad: bool = False
    causal: bool = False
    window: Tuple[int, int] = (-1, -1)
    softcap: float = 0.0
    alibi: bool = False
    num_splits: int = 1
    seqlens_int: bool = False
    empty_row: bool = False  # one row with no key at all (cache_seqlens 0, no new tokens)

    @property
    def id(self) -> str:
        dt = {torch.float16: "fp16", torch.bfloat16: "bf16", torch.float32: "fp32"}[self.dtype]
        parts = [dt, f"b{self.b}q{self.s_q}n{self.s_new}c{self.s_cache}",
                 f"h{self.h}k{self.h_k}d{self.d}", f"sp{self.num_splits}"]
        for flag, name in ((self.page, f"page{self.page}"), (self.rotary, f"rot-{self.rotary}"),
                           (self.batch_idx, "bidx"), (self.leftpad, "leftpad"),
                           (self.causal, "causal"), (self.softcap, f"cap{self.softcap:g}"),
                           (self.alibi, "alibi"), (self.seqlens_int, "seqint"),
                           (self.empty_row, "emptyrow")):
            if flag:
                parts.append(name)
        if self.window != (-1, -1):
            parts.append(f"win{self.window[0]}_{self.window[1]}")
        return "-".join(parts)


def make_inputs(c: KVCase, device: str):
    """All tensors of a call, on ``device``; the page table is a shuffled permutation."""
    g = torch.Generator().manual_seed(torch.randint(0, 2**31, (1,)).item())

    def rn(*shape):
        return torch.randn(*shape, generator=g).to(c.dtype).to(device)

    b, h_k = c.b, c.h_k
    q = rn(b, c.s_q, c.h, c.d)
    b_cache = b + 2 if c.batch_idx else b
    block_table = None
    if c.page is None:
        k_cache, v_cache = rn(b_cache, c.s_cache, h_k, c.d), rn(b_cache, c.s_cache, h_k, c.d)
    else:
        n_pages = -(-c.s_cache // c.page)
        num_blocks = b * n_pages + 3  # spare pages that nobody owns
        k_cache, v_cache = rn(num_blocks, c.page, h_k, c.d), rn(num_blocks, c.page, h_k, c.d)
        perm = torch.randperm(num_blocks, generator=g)[: b * n_pages]
        block_table = perm.view(b, n_pages).to(torch.int32).to(device)
    capacity = c.s_cache if c.page is None else block_table.shape[1] * c.page
    hi = capacity - c.s_new
    lo = 0 if (c.s_new > 0 or c.empty_row) else 1
    if c.seqlens_int:
        seqlens = torch.full((b,), (lo + hi) // 2, dtype=torch.int32)
    else:
        seqlens = torch.randint(lo, hi + 1, (b,), generator=g, dtype=torch.int32)
        seqlens[0] = hi  # the cache's last position is used
    if c.empty_row:
        seqlens[-1] = 0
    leftpad = None
    if c.leftpad:
        leftpad = torch.stack([torch.randint(0, int(n) + 1, (1,), generator=g)[0]
                               for n in seqlens]).to(torch.int32)
    batch_idx = torch.randperm(b_cache, generator=g)[:b].to(torch.int32) if c.batch_idx else None
    k = v = cos = sin = None
    if c.s_new > 0:
        k, v = rn(b, c.s_new, h_k, c.d), rn(b, c.s_new, h_k, c.d)
    if c.rotary:
        rot = max(2, int(c.d * c.rotary_frac) // 2 * 2)
        s_ro = capacity + c.s_q
        angle = torch.rand(s_ro, rot // 2, generator=g, dtype=torch.float64) * 6.28
        cos, sin = torch.cos(angle).to(c.dtype).to(device), torch.sin(angle).to(c.dtype).to(device)
    alibi = torch.rand(b, c.h, generator=g).to(device) * 0.3 if c.alibi else None
    return dict(q=q, k_cache=k_cache, v_cache=v_cache, k=k, v=v, rotary_cos=cos,
                rotary_sin=sin,
                cache_seqlens=int(seqlens[0]) if c.seqlens_int else seqlens.to(device),
                cache_batch_idx=None if batch_idx is None else batch_idx.to(device),
                cache_leftpad=None if leftpad is None else leftpad.to(device),
                block_table=block_table, alibi_slopes=alibi)


def _ulp(dtype: torch.dtype) -> float:
    return {torch.float16: 2.0**-10, torch.bfloat16: 2.0**-7, torch.float32: 2.0**-23}[dtype]


def run_case(c: KVCase, device: str) -> None:
    """Call flash_attn_with_kvcache on c's inputs and check out, lse and the caches."""
    x = make_inputs(c, device)
    kc0, vc0 = x["k_cache"].clone(), x["v_cache"].clone()
    kw = dict(causal=c.causal, window_size=c.window, softcap=c.softcap,
              rotary_interleaved=c.rotary != "neox")
    out, lse = flash_attn_with_kvcache(**x, **kw, num_splits=c.num_splits,
                                       return_softmax_lse=True)
    seqlens = x["cache_seqlens"]
    if isinstance(seqlens, int):
        seqlens = torch.full((c.b,), seqlens, dtype=torch.int32)
    cpu = {k: (v.cpu() if isinstance(v, torch.Tensor) else v) for k, v in x.items()}
    cpu.update(k_cache=kc0.cpu(), v_cache=vc0.cpu(), cache_seqlens=seqlens.cpu())
    ref, ref_lse, k_after, v_after = kvcache_ref(**cpu, **kw)
    low, low_lse, _, _ = kvcache_ref(**cpu, **kw, upcast=False)

    # caches: written in place at cache_seqlens, rotated keys within 1 ulp (fp32 vs fp64
    # rotation, then rounding), every other entry untouched
    if c.s_new > 0 and c.rotary:
        diff = (x["k_cache"].cpu().double() - k_after.double()).abs()
        assert diff.max().item() <= 2 * _ulp(c.dtype) * max(1.0, k_after.abs().max().item()), \
            f"rotated keys in the cache differ from the reference by {diff.max().item():.3e}"
    else:
        assert torch.equal(x["k_cache"].cpu(), k_after), "k_cache differs after the append"
    assert torch.equal(x["v_cache"].cpu(), v_after), "v_cache differs after the append"

    atol, lse_atol = 1e-5, 1e-4
    if c.dtype == torch.bfloat16 and device == "cpu":
        # the interpreter truncates fp32 -> bf16 (1 ulp, not 0.5): in out, and under rotary in
        # the rotated q and keys the scores are made of (|q| |k| scale per ulp of each)
        atol += _ulp(c.dtype) * ref.abs().max().item()
        if c.rotary:
            norms = x["q"].double().norm(dim=-1).max() * k_after.double().norm(dim=-1).max()
            lse_atol += 2 * _ulp(c.dtype) * c.d ** -0.5 * norms.item()
    assert out.shape == (c.b, c.s_q, c.h, c.d) and out.dtype == c.dtype
    assert lse.shape == (c.b, c.h, c.s_q) and lse.dtype == torch.float32
    assert_close_rule(out, ref, low, atol=atol, name="out")
    assert_close_rule(lse, ref_lse, low_lse, atol=lse_atol, name="lse")


# ---------------------------------------------------------------------------------------------
# The CPU grid (small: the interpreter is slow). Each case adds one or two features to a base.
# ---------------------------------------------------------------------------------------------
BASE = KVCase()
CASES = [
    BASE,
    replace(BASE, s_new=1, num_splits=3),
    replace(BASE, s_new=3, rotary="interleaved", causal=True, s_q=3),
    replace(BASE, s_new=1, rotary="neox", rotary_frac=0.5, num_splits=0),
    replace(BASE, s_new=2, rotary="interleaved", s_q=2),  # non-causal: q at cache_seqlens
    replace(BASE, page=1, s_cache=20, s_new=1),
    replace(BASE, page=16, s_new=2, num_splits=3, causal=True, s_q=2),
    replace(BASE, page=256, s_cache=300, s_new=1, num_splits=0, h=8, h_k=1),
    replace(BASE, page=5, s_new=1, leftpad=True, rotary="neox"),
    replace(BASE, batch_idx=True, s_new=2, num_splits=3),
    replace(BASE, leftpad=True, s_new=1, causal=True),
    replace(BASE, s_q=4, s_new=4, causal=True, num_splits=3, h=6, h_k=2),
    replace(BASE, s_q=3, causal=True, window=(5, 0), num_splits=3),
    replace(BASE, s_q=2, window=(6, 2), alibi=True),
    # a right side >= the capacity is unbounded (flash-attn 2 clamps it to -1), which differs
    # from the side itself when the queries outnumber the row's keys (found by hypothesis)
    replace(BASE, s_q=6, s_cache=4, window=(1, 4)),
    replace(BASE, softcap=2.0, num_splits=0, dtype=torch.bfloat16),
    replace(BASE, seqlens_int=True, s_new=1, h_k=4),
    replace(BASE, empty_row=True, num_splits=3, b=3),
    replace(BASE, dtype=torch.float32, s_new=1, d=24, num_splits=3),
    # 80 packed rows (G = 4 x 20 positions): two query tiles, chunked prefill into pages
    replace(BASE, s_q=20, s_new=20, h=8, h_k=2, causal=True, num_splits=3, page=16, s_cache=64),
]


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_kvcache(case: KVCase, backend: str) -> None:
    run_case(case, "cpu")


def test_no_cache_seqlens_uses_whole_cache(cpu_backend: str) -> None:
    c = replace(BASE, s_cache=20)
    x = make_inputs(c, "cpu")
    x["cache_seqlens"] = None
    out = flash_attn_with_kvcache(**x)
    full = flash_attn_with_kvcache(**{**x, "cache_seqlens": 20})
    assert torch.equal(out, full)


def test_causal_single_query_equals_full(backend: str) -> None:
    """With one query token the bottom-right causal mask hides nothing."""
    x = make_inputs(BASE, "cpu")
    a = flash_attn_with_kvcache(**x, causal=True)
    b = flash_attn_with_kvcache(**x, causal=False)
    torch.testing.assert_close(a, b, atol=2e-3, rtol=0)


def test_splits_agree(backend: str) -> None:
    """num_splits 1, 3 and the heuristic compute the same function (combine included)."""
    c = replace(BASE, s_cache=64, b=2, s_q=2, causal=True)
    x = make_inputs(c, "cpu")
    outs = [flash_attn_with_kvcache(**x, causal=True, num_splits=n, return_softmax_lse=True)
            for n in (1, 3, 0)]
    for o, l in outs[1:]:
        torch.testing.assert_close(o, outs[0][0], atol=2e-3, rtol=0)
        torch.testing.assert_close(l, outs[0][1], atol=1e-4, rtol=0)


def test_varlen_paged_forward(backend: str) -> None:
    """The varlen engineer's entry point: packed queries against a paged cache."""
    from flashattn.dispatch import varlen as dispatch_varlen
    from flashattn.params import AttnParams
    from flashattn.reference import attention_ref

    h, h_k, d, page = 4, 2, 32, 8
    lens_q, lens_k = [3, 0, 1], [20, 5, 33]
    cu_q = torch.tensor([0, 3, 3, 4], dtype=torch.int32)
    cu_k = torch.tensor([0, 20, 25, 58], dtype=torch.int32)
    n_pages = 5
    num_blocks = 3 * n_pages + 1
    kc = torch.randn(num_blocks, page, h_k, d, dtype=torch.float16)
    vc = torch.randn(num_blocks, page, h_k, d, dtype=torch.float16)
    table = torch.randperm(num_blocks)[: 3 * n_pages].view(3, n_pages).to(torch.int32)
    q = torch.randn(sum(lens_q) + 1, h, d, dtype=torch.float16)  # one row outside
    for seqused in (None, torch.tensor([17, 5, 40], dtype=torch.int32)):
        used = lens_k if seqused is None else seqused.tolist()
        params = AttnParams(d ** -0.5, True, -1, 0, 0.0, None, 0.0, 0)
        out, lse = dispatch_varlen.varlen_paged_forward(q, kc, vc, cu_q, cu_k, seqused, 3, 40,
                                                        table, params)
        assert out.shape == (q.shape[0], h, d) and lse.shape == (h, q.shape[0])
        for i in range(3):
            q0, q1 = int(cu_q[i]), int(cu_q[i + 1])
            if q1 == q0:
                continue
            pos = torch.arange(used[i])
            rows = table[i].long()[pos // page]
            k_i, v_i = kc[rows, pos % page].unsqueeze(0), vc[rows, pos % page].unsqueeze(0)
            ref, ref_lse = attention_ref(q[q0:q1].unsqueeze(0), k_i, v_i, causal=True)
            low, low_lse = attention_ref(q[q0:q1].unsqueeze(0), k_i, v_i, causal=True,
                                         upcast=False)
            assert_close_rule(out[q0:q1], ref[0], low[0], name=f"out seq {i}")
            assert_close_rule(lse[:, q0:q1], ref_lse[0], low_lse[0], atol=1e-4, name="lse")
        assert torch.all(out[-1] == 0) and torch.all(lse[:, -1] == float("-inf"))


# ---------------------------------------------------------------------------------------------
# Errors: each names the argument
# ---------------------------------------------------------------------------------------------
def _base_inputs(**over):
    x = make_inputs(replace(BASE, s_new=1), "cpu")
    x.update(over)
    return x


@pytest.mark.parametrize("over, exc, words", [
    (dict(cache_seqlens=torch.tensor([1, 2])), TypeError, "cache_seqlens must have dtype torch.int32"),
    (dict(cache_seqlens=torch.tensor([1.0, 2.0])), TypeError, "cache_seqlens"),
    (dict(cache_seqlens=torch.tensor([1], dtype=torch.int32)), ValueError, "cache_seqlens must have shape"),
    (dict(cache_seqlens=2.5), TypeError, "cache_seqlens"),
    (dict(cache_seqlens=torch.tensor([48, 3], dtype=torch.int32)), ValueError, "too short"),
    (dict(cache_seqlens=torch.tensor([-1, 3], dtype=torch.int32)), ValueError, "cache_seqlens[0]"),
    (dict(k=None), ValueError, "v was given without k"),
    (dict(k=torch.randn(2, 1, 3, 32, dtype=torch.float16)), ValueError, "k must have shape"),
    (dict(v=torch.randn(2, 1, 2, 32)), TypeError, "v must have the dtype"),
    (dict(k=torch.randn(2, 49, 2, 32, dtype=torch.float16),
          v=torch.randn(2, 49, 2, 32, dtype=torch.float16)), ValueError, "too short"),
    (dict(cache_batch_idx=torch.tensor([0, 7], dtype=torch.int32)), ValueError, "cache_batch_idx[1]"),
    (dict(cache_batch_idx=torch.tensor([0, 1])), TypeError, "cache_batch_idx must have dtype"),
    (dict(cache_leftpad=torch.tensor([0, 99], dtype=torch.int32)), ValueError, "cache_leftpad[1]"),
    (dict(rotary_cos=torch.randn(64, 8, dtype=torch.float16)), ValueError, "rotary_cos was given without rotary_sin"),
    (dict(rotary_cos=torch.randn(64, 17, dtype=torch.float16),
          rotary_sin=torch.randn(64, 17, dtype=torch.float16)), ValueError, "rotary_dim"),
    (dict(rotary_cos=torch.randn(64, 8, dtype=torch.float16),
          rotary_sin=torch.randn(63, 8, dtype=torch.float16)), ValueError, "same shape"),
    (dict(rotary_cos=torch.randn(8, 8, dtype=torch.float16),
          rotary_sin=torch.randn(8, 8, dtype=torch.float16)), ValueError, "rotary_cos / rotary_sin have 8 positions"),
    (dict(k=None, v=None, rotary_cos=torch.randn(64, 8, dtype=torch.float16),
          rotary_sin=torch.randn(64, 8, dtype=torch.float16)), ValueError, "need new keys"),
    (dict(num_splits=-1), ValueError, "num_splits"),
    (dict(num_splits=1.5), TypeError, "num_splits"),
    (dict(v_cache=torch.randn(2, 47, 2, 32, dtype=torch.float16)), ValueError, "seqlen_cache mismatch"),
    (dict(q=torch.randn(2, 1, 3, 32, dtype=torch.float16)), ValueError, "nheads"),
    (dict(cache_seqlens=None), ValueError, "cache_seqlens is required"),
])
def test_errors(over, exc, words, cpu_backend: str) -> None:
    with pytest.raises(exc, match=None) as info:
        flash_attn_with_kvcache(**_base_inputs(**over))
    assert words in str(info.value), str(info.value)


def _paged_inputs(**over):
    x = make_inputs(replace(BASE, s_new=1, page=16), "cpu")
    x.update(over)
    return x


@pytest.mark.parametrize("over, exc, words", [
    (dict(block_table=torch.zeros(2, 3, dtype=torch.int64)), TypeError, "block_table must have dtype"),
    (dict(block_table=torch.zeros(3, 3, dtype=torch.int32)), ValueError, "block_table must have shape"),
    (dict(block_table=torch.full((2, 3), 99, dtype=torch.int32)), ValueError, "out of range"),
    (dict(block_table=torch.full((2, 3), -1, dtype=torch.int32)), ValueError, "out of range"),
    (dict(v_cache=torch.randn(9, 8, 2, 32, dtype=torch.float16)), ValueError, "mismatch"),
    # (cache_batch_idx with block_table picks table rows, FA3: tests/api/test_kvcache_varlen.py)
    (dict(cache_batch_idx=torch.tensor([0, 5], dtype=torch.int32)), ValueError,
     "cache_batch_idx[1] = 5 is out of range"),
])
def test_paged_errors(over, exc, words, cpu_backend: str) -> None:
    x = _paged_inputs()
    if "v_cache" in over:
        over = dict(v_cache=torch.randn(x["k_cache"].shape[0], 8, 2, 32, dtype=torch.float16))
    x.update(over)
    with pytest.raises(exc) as info:
        flash_attn_with_kvcache(**x)
    assert words in str(info.value), str(info.value)


def test_public_names() -> None:
    import flashattn

    assert callable(flashattn.flash_attn_with_kvcache)
    assert callable(flashattn.flash_attn_combine)


# ---------------------------------------------------------------------------------------------
# The GPU kernels compile for sm_90 (no GPU needed): no spills, K/V streamed asynchronously
# ---------------------------------------------------------------------------------------------
def test_decode_kernels_compile_for_sm90() -> None:
    import json
    import os
    import subprocess
    import sys

    root = os.path.join(os.path.dirname(__file__), "..", "..")
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["PYTHONPATH"] = os.pathsep.join([os.path.join(root, "src"), env.get("PYTHONPATH", "")])
    r = subprocess.run([sys.executable, os.path.join(root, "tools", "aot_decode.py")],
                       capture_output=True, text=True, env=env, timeout=600)
    if r.returncode != 0 and "cuobjdump" in r.stderr:
        pytest.skip("no cuobjdump in this triton install")
    assert r.returncode == 0, r.stderr[-3000:]
    rows = [json.loads(line) for line in r.stdout.splitlines() if line.startswith("{")]
    assert len(rows) >= 8
    for row in rows:
        assert row["error"] is None, f"{row['key']}: {row['error']}"
        # no spills on the pinned Triton, but for the 512-wide qv variant's 64-key tile (40
        # bytes, measured faster than the 32-key tile that does not spill: decode.py's
        # _WIDE_V_CONFIG); other releases allocate registers their own way (the 512-wide qv
        # variants spill 136 bytes on Triton 3.9): there only the qv rows may spill
        pinned = __import__("triton").__version__.startswith("3.6.")
        if "_dv512" in row["key"] and "_kv8" in row["key"] and pinned:
            # the FP8 latent cache with qv: 392 bytes at _WIDE_V_CONFIG's 64 keys x 2 stages,
            # 288-392 at every BLOCK_N / stage count tried (608 with 16 warps); the same before
            # and after V's widening moved to the loaded layout (decode.py's _WIDE_V_CONFIG)
            assert row["spills"] <= 400, row
        elif "_dv512" in row["key"] and pinned:
            assert row["spills"] <= 64, row
        elif row["key"] == "decode_contig_sq1_ptr_cfg64-4-3-0_kv8" and not pinned:
            # the e4m3 cache's long-stream config: 112 registers, no spill on the pinned
            # Triton; 128 registers and 24 bytes spilled on Triton 3.9 (2026-11-28)
            assert row["spills"] <= 32, row
        elif pinned or "_qv_" not in row["key"]:
            assert row["spills"] == 0, row
        if row["key"].startswith("decode_"):
            # K/V tiles stream asynchronously: TMA (contiguous, aligned) or cp.async
            assert row["tma"] if row["key"].endswith("_tma") else row["cp_async"], row
            assert row["shared"] <= 227 * 1024, row
        if "_kv8" in row["key"]:
            # an FP8 cache: V widened in the loaded layout and transposed through shared
            # memory as 16-bit values (ldmatrix), not gathered byte by byte into the dot
            # operand (with qv too: widened to qv's dtype for both of its dots); 16-byte
            # copies of 16/32-bit math
            assert row["ld_shared_b8"] == 0, row
            assert row["cp_narrow"] == 0 or "float32" in row["key"], row
    # multi-head latent attention's variants compiled too (bf16 and FP8 latent caches, and
    # every math dtype over an FP8 cache: each dot's operands share a dtype)
    assert sum("_qv" in row["key"] for row in rows) == 5, [row["key"] for row in rows]
    # the residency the split heuristic assumes (decode.RESIDENT: programs per SM, read off
    # Nsight Compute) is what these compiles' registers and shared memory allow
    from flashattn.backends.triton import decode as _dec

    by_key = {row["key"]: row for row in rows}
    compiled = {(True, False, 128, 4, 3): "decode_paged16_sq1_ptr",
                (True, True, 128, 4, 3): "decode_paged16_sq1_ptr_kv8",
                (False, True, 128, 4, 3): "decode_contig_sq1_ptr_kv8",
                (False, True, 64, 4, 3): "decode_contig_sq1_ptr_cfg64-4-3-0_kv8"}
    assert set(compiled) == set(_dec.RESIDENT)
    if pinned:
        for cfg, key in compiled.items():
            row = by_key[key]
            got = _dec.programs_per_sm(row["registers"], row["shared"], row["num_warps"])
            assert got == _dec.RESIDENT[cfg], (key, row["registers"], row["shared"], got)


def test_decode_host_helpers_match_triton(monkeypatch):
    """The plain-int helpers on the decode launch path agree with triton.cdiv / next_power_of_2,
    and the cached launch plan tracks the environment overrides (part of its key)."""
    import triton

    from flashattn.backends.triton import config
    from flashattn.backends.triton import decode as _dec

    for n in range(0, 300):
        if n > 0:  # callers pass >= 1 (triton's gives 0 for 0, ours 1)
            assert config.next_pow2(n) == triton.next_power_of_2(n), n
        for b in (1, 3, 16, 64):
            assert config.cdiv(n, b) == triton.cdiv(n, b), (n, b)
    cpu = torch.device("cpu")
    plan = _dec._launch_plan(128, 128, 2, False, 4, 1, 1, 8, 16384, 0, cpu, "", "")
    assert plan[6] == _dec.num_splits_heuristic(1, 8, plan[5], 16384, plan[0], cpu)
    forced = _dec._launch_plan(128, 128, 2, False, 4, 1, 1, 8, 16384, 3, cpu, "", "")
    assert forced[6] == 3
    set_env(monkeypatch, FLASHATTN_DECODE_CONFIG="32,4,2")
    over = _dec._launch_plan(128, 128, 2, False, 4, 1, 1, 8, 16384, 0, cpu, "32,4,2", "")
    assert over[:3] == (32, 4, 2)


def test_decode_splits_fill_whole_waves(monkeypatch):
    """The decode configs whose residency was measured (decode.RESIDENT: programs per SM)
    split a grid that is full without splitting into the count that ends nearest a whole
    number of waves of those slots, the unsplit and the split configs' slots each (H200 sweep,
    GQA 32 / 8, d 128, 32k keys, benchmarks/NOTES.md 2026-11-28: every count chosen below was
    the fastest measured or within 1 % of it), and short grids fill that many programs per
    SM. The contiguous 16-bit configs and overridden configs keep one split."""
    from flashattn.backends.triton import config
    from flashattn.backends.triton import decode as _dec

    # the GPU's launch configs (the interpreter's are tiny) on an H100 / H200's 132 SMs; the
    # plans are cached per shape, so none computed under other settings may answer here
    monkeypatch.setattr(config, "INTERPRET", False)
    monkeypatch.setattr(config, "sm_count", lambda device: 132)
    _dec._launch_plan.cache_clear()
    cpu = torch.device("cpu")

    def splits(batch, keys, paged, fp8, env_config="", forced=0):
        # (d, d_v, elem_bytes, paged, g, s_q, batch, h_k, keys, splits, device, env config,
        #  env waves, fp8)
        return _dec._launch_plan(128, 128, 2, paged, 4, 1, batch, 8, keys, forced, cpu,
                                 env_config, "", fp8)[6]

    try:
        assert _dec._whole_waves(512, 132, 3, 3, 4) == 3   # 1.29 waves unsplit, 3.88 at 3
        assert _dec._whole_waves(396, 132, 3, 3, 4) == 1   # exactly one wave: no split
        assert _dec._whole_waves(512, 132, 3, 3, 1) == 1   # too few key blocks to split
        # (batch -> splits): paged e4m3 (3 per SM), paged bf16 (2), contiguous e4m3 (4
        # unsplit on long streams, 3 split)
        for batch, want in ((64, 3), (40, 4), (80, 3)):
            assert splits(batch, 32768, True, True) == want, (batch, want)
        for batch, want in ((64, 1), (40, 4), (48, 2), (80, 2)):
            assert splits(batch, 32768, True, False) == want, (batch, want)
        for batch, want in ((64, 1), (40, 4), (48, 2), (80, 3)):
            assert splits(batch, 32768, False, True) == want, (batch, want)
        # the contiguous 16-bit cache, an overridden config: one split; a forced count is kept
        assert [splits(b, 32768, False, False) for b in (40, 48, 64, 80)] == [1, 1, 1, 1]
        assert splits(64, 32768, True, True, env_config="128,4,3,0") == 1
        assert splits(64, 32768, True, True, forced=2) == 2
        # other head dims (their residency differs) keep the former rule
        assert _dec._launch_plan(64, 64, 2, True, 4, 1, 40, 8, 32768, 0, cpu, "", "")[6] == 1
        # short keys: splits keep >= 16 key blocks (2k keys = 16 blocks of 128: no split)
        assert splits(40, 2048, True, False) == 1
        # one sequence of 128k keys (8 head groups): 3 programs per SM for paged e4m3
        assert splits(1, 131072, True, True) == 396 // 8
        assert splits(1, 131072, True, False) == 264 // 8   # (2 per SM, as before)
    finally:
        _dec._launch_plan.cache_clear()


# ---------------------------------------------------------------------------------------------
# a window side at least as long as the cache is unbounded BEFORE the
# rotary positions of q are decided (flash-attn 2's mha_fwd_kvcache clamps, then a call that
# is neither causal nor local rotates every query token at cache_seqlens). The expected output
# is computed here by hand from that documented rule, not by reference.kvcache_ref.
# ---------------------------------------------------------------------------------------------
def _rotate_interleaved(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
                        pos: torch.Tensor) -> torch.Tensor:
    """GPT-J rotary of x (b, s, h, d) at integer positions pos (b, s), float64."""
    x = x.double().clone()
    half = cos.shape[1]
    c = cos.double()[pos].unsqueeze(2)  # (b, s, 1, half)
    s_ = sin.double()[pos].unsqueeze(2)
    x0, x1 = x[..., 0:2 * half:2].clone(), x[..., 1:2 * half:2].clone()
    x[..., 0:2 * half:2] = x0 * c - x1 * s_
    x[..., 1:2 * half:2] = x0 * s_ + x1 * c
    return x


@pytest.mark.parametrize("window", [(256, -1), (-1, 300), (500, 256), (-1, -1)])
def test_window_at_least_the_cache_is_unbounded_before_rotary(backend, window):
    torch.manual_seed(0)
    b, s_q, s_new, h, h_k, d, cap = 2, 4, 4, 4, 2, 64, 256
    seqlens = torch.tensor([100, 30], dtype=torch.int32)
    q = torch.randn(b, s_q, h, d)
    k_new, v_new = torch.randn(b, s_new, h_k, d), torch.randn(b, s_new, h_k, d)
    k_cache, v_cache = torch.randn(b, cap, h_k, d), torch.randn(b, cap, h_k, d)
    angles = torch.rand(cap + s_new, d // 2) * 6.28
    cos, sin = angles.cos(), angles.sin()
    kc, vc = k_cache.clone(), v_cache.clone()
    out, lse = flash_attn_with_kvcache(q, kc, vc, k_new, v_new, cos, sin, seqlens,
                                       window_size=window, rotary_interleaved=True,
                                       num_splits=1, return_softmax_lse=True)
    # by hand: every window here is at least the cache capacity (or -1): unbounded, not local,
    # not causal -> keys [0, seqlens + s_new), q rotated at cache_seqlens for every token
    scale = d ** -0.5
    for row in range(b):
        n = int(seqlens[row])
        pos_k = (n + torch.arange(s_new)).view(1, -1)
        keys = torch.cat([k_cache[row:row + 1, :n].double(),
                          _rotate_interleaved(k_new[row:row + 1], cos, sin, pos_k)], dim=1)
        vals = torch.cat([v_cache[row:row + 1, :n], v_new[row:row + 1]], dim=1).double()
        qr = _rotate_interleaved(q[row:row + 1], cos, sin, torch.full((1, s_q), n))
        keys = keys.repeat_interleave(h // h_k, dim=2)
        vals = vals.repeat_interleave(h // h_k, dim=2)
        scores = torch.einsum("bqhd,bkhd->bhqk", qr, keys) * scale
        want_lse = torch.logsumexp(scores, dim=-1)  # (1, h, s_q)
        want = torch.einsum("bhqk,bkhd->bqhd", scores.softmax(-1), vals)
        torch.testing.assert_close(out[row:row + 1].double(), want, atol=2e-4, rtol=0)
        torch.testing.assert_close(lse[row:row + 1].double(), want_lse, atol=2e-4, rtol=0)
    # the oracle agrees with that rule too (it is what the other kvcache tests compare against)
    ref_out, ref_lse, _, _ = kvcache_ref(q, k_cache, v_cache, k_new, v_new, cos, sin, seqlens,
                                         window_size=window, rotary_interleaved=True)
    torch.testing.assert_close(out.double(), ref_out, atol=2e-4, rtol=0)


@pytest.mark.parametrize("seqlens", [8, "tensor"])
def test_block_table_capacity_guard_names_block_table(seqlens):
    """flash-attn 2.8's guard: keys past block_table's pages x page_size raise, naming
    block_table (a host int is checked for free, as are CPU tensors)."""
    q, k = torch.randn(2, 1, 4, 16), torch.randn(2, 1, 2, 16)
    cache = torch.randn(6, 4, 2, 16)
    table = torch.tensor([[0, 1], [2, 3]], dtype=torch.int32)
    cs = 8 if seqlens == 8 else torch.tensor([8, 2], dtype=torch.int32)
    with pytest.raises(ValueError, match="block_table has 2 pages of 4 positions"):
        flash_attn_with_kvcache(q, cache, cache.clone(), k, k, cache_seqlens=cs,
                                          block_table=table)
    # at the capacity exactly: fine
    out = flash_attn_with_kvcache(q, cache, cache.clone(), k, k,
                                            cache_seqlens=7 if seqlens == 8 else
                                            torch.tensor([7, 2], dtype=torch.int32),
                                            block_table=table)
    assert torch.isfinite(out).all()
