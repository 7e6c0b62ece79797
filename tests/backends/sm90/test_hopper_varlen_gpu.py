"""The Hopper forward's varlen mode (packed sequences, sm90/fwd_kernel.py VARLEN) on the GPU.

Same oracle and rule as tests/api/test_varlen.py (per-sequence ``attention_ref`` in float64,
error <= 2x PyTorch's own low-precision error), with ``FLASHATTN_BACKEND=hopper`` and a spy
that fails the test if the Hopper varlen kernel did not run. On top: equal lengths packed give
the dense Hopper call's output bit for bit (same tiles, same order of operations), rows past
the last sequence stay 0 / -inf, the tile map survives lengths of 0 and 1 and tiles that cross
a sequence's end, and a CUDA graph replays with new lengths (no device value read on the host).
"""
from __future__ import annotations

import pytest
import torch

from flashattn import flash_attn_func, flash_attn_varlen_func
from flashattn.dispatch import select as dispatch_select
from flashattn.replay import fp8 as replay_fp8
from flashattn.replay import varlen as replay_varlen
from flashattn.backends.sm90 import bwd as sm90_bwd
from flashattn.backends.sm90 import fwd as sm90_fwd
from tests.api.test_varlen import VCase, check_varlen, cu_seqlens
from tests.settings import set_env
from tests.backends.sm90.hopper_marks import hopper_gpu_marks

pytestmark = hopper_gpu_marks()


@pytest.fixture
def hopper_varlen_calls(monkeypatch):
    """Force the Hopper family and record the varlen kernels' launches ("fwd", "bwd"): the
    packed calls' __call__, which the full path (flash_fwd_hopper_varlen / ..._bwd_...) and a
    repeated signature's recorded call (replay_varlen.VarlenRunner) both run."""
    set_env(monkeypatch, FLASHATTN_BACKEND="hopper")
    calls = []
    for cls, tag in ((sm90_fwd.PackedFwdCall, "fwd"), (sm90_bwd.PackedBwdCall, "bwd")):
        real = cls.__call__

        def spy(self, *args, _real=real, _tag=tag, **kwargs):
            calls.append(_tag)
            return _real(self, *args, **kwargs)

        monkeypatch.setattr(cls, "__call__", spy)
    return calls


# lengths: 0, 1, shorter than a warpgroup's rows, tile multiples, pieces that cross the end
LENS = (1000, 1, 0, 1537, 128, 17, 2048, 777)
LENS_K = (900, 1537, 10, 4096, 3000, 1, 513, 2047)  # cross: s_q > s_k and s_q < s_k
LENS_LONG = (2048, 1, 0, 1537, 3000, 17, 5000, 777)  # 1547.5 rows per sequence on average
CASES = [
    VCase(LENS, LENS, d=128, dtype=torch.bfloat16, h=8, h_k=2),
    VCase(LENS, LENS, d=128, dtype=torch.bfloat16, h=8, h_k=2, causal=True),
    VCase(LENS, LENS_K, d=128, dtype=torch.bfloat16, h=4, h_k=4, causal=True),
    VCase(LENS, LENS_K, d=64, dtype=torch.bfloat16, h=6, h_k=3),
    VCase(LENS, LENS, d=64, dtype=torch.float16, h=4, h_k=1, causal=True),
    VCase(LENS, LENS_K, d=96, dtype=torch.bfloat16, h=4, h_k=2, window=(256, 64)),
    VCase(LENS, LENS, d=128, dtype=torch.bfloat16, h=4, h_k=2, softcap=30.0, causal=True),
    VCase((1000, 1, 2047, 333), (1000, 77, 2047, 900), d=192, d_v=128, dtype=torch.bfloat16,
          h=4, h_k=4, causal=True),
    VCase((700, 1, 1100, 0), (700, 50, 1100, 3), d=256, dtype=torch.bfloat16, h=2, h_k=1),
    VCase((700, 1, 1100, 0), (700, 50, 1100, 3), d=256, dtype=torch.float16, h=2, h_k=2,
          window=(100, 0)),
    # d = 64 over sequences of >= PACKED_D64_MIN_MEAN_ROWS rows on average: the backward's
    # 128-row blocks with the row-split dQ (the cases above average fewer: 64-row blocks)
    VCase(LENS_LONG, LENS_LONG, d=64, dtype=torch.bfloat16, h=8, h_k=2, causal=True),
    VCase(LENS_LONG, LENS_K, d=64, dtype=torch.float16, h=4, h_k=4),
    # the wide backward (d = 192 / 256): pieces crossing the end, lengths 0 / 1, GQA, masks
    VCase(LENS, LENS, d=256, dtype=torch.bfloat16, h=4, h_k=2, causal=True),
    VCase(LENS, LENS_K, d=192, dtype=torch.bfloat16, h=4, h_k=1),
    VCase(LENS, LENS_K, d=256, dtype=torch.float16, h=2, h_k=2, causal=True, softcap=20.0),
    # seqused_k (FA3's varlen): only the first seqused_k[b] keys of each slot, 0 and 1 too
    VCase((2048, 100, 0, 1500, 77), (3000, 1000, 64, 1500, 90), d=128, dtype=torch.bfloat16,
          h=8, h_k=2, causal=True, seqused_k=(2500, 1, 0, 1200, 0)),
    VCase((2048, 100, 1500), (3000, 1000, 1500), d=64, dtype=torch.bfloat16, h=4, h_k=4,
          seqused_k=(3000, 999, 33)),
    VCase((700, 1, 1100, 5), (1000, 64, 1100, 300), d=256, dtype=torch.bfloat16, h=4, h_k=2,
          causal=True, seqused_k=(900, 0, 1100, 129)),
]


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.id)
def test_hopper_varlen_matches_oracle(case, hopper_varlen_calls, monkeypatch):
    """Forward and backward (check_varlen takes the gradients too): the backward runs the
    varlen mode (bwd_kernel.py, bwd_wide_kernel.py at d = 192 / 256) with d_v = d."""
    check_varlen(case, device="cuda", monkeypatch=monkeypatch)
    assert "fwd" in hopper_varlen_calls, "the Hopper varlen forward did not run"
    covered = case.d_v in (None, case.d)
    assert ("bwd" in hopper_varlen_calls) == covered, hopper_varlen_calls


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("d", [64, 128, 256])
def test_equal_lengths_equal_dense_bitwise(causal, d, hopper_varlen_calls):
    """Equal lengths (a multiple of every tile height): the same tiles as the dense Hopper call,
    so the same bits."""
    b, s, h, h_k = 3, 1536, 4, 2
    q = torch.randn(b, s, h, d, device="cuda", dtype=torch.bfloat16)
    k, v = (torch.randn(b, s, h_k, d, device="cuda", dtype=torch.bfloat16) for _ in range(2))
    out_d, lse_d, _ = flash_attn_func(q, k, v, causal=causal, return_attn_probs=True)
    cu = cu_seqlens([s] * b).cuda()
    out_v, lse_v, _ = flash_attn_varlen_func(q.flatten(0, 1), k.flatten(0, 1), v.flatten(0, 1),
                                             cu, cu, s, s, causal=causal,
                                             return_attn_probs=True)
    assert hopper_varlen_calls
    assert torch.equal(out_v.view(b, s, h, d), out_d)
    assert torch.equal(lse_v.view(h, b, s).transpose(0, 1), lse_d)


def test_rows_past_the_last_sequence(hopper_varlen_calls):
    """q holds more rows than cu_seqlens_q covers: those rows are 0 with lse -inf (the
    portable varlen contract), even over memory that held NaN."""
    junk = torch.full((1 << 24,), float("nan"), device="cuda")
    del junk
    lens = (300, 129)
    total = sum(lens) + 200
    q = torch.randn(total, 4, 128, device="cuda", dtype=torch.bfloat16)
    k = torch.randn(sum(lens), 4, 128, device="cuda", dtype=torch.bfloat16)
    cu = cu_seqlens(lens).cuda()
    out, lse, _ = flash_attn_varlen_func(q, k, k, cu, cu, max(lens), max(lens), causal=True,
                                         return_attn_probs=True)
    assert hopper_varlen_calls
    assert (out[sum(lens):] == 0).all() and torch.isneginf(lse[:, sum(lens):]).all()
    assert torch.isfinite(out[:sum(lens)]).all() and torch.isfinite(lse[:, :sum(lens)]).all()


def test_cuda_graph_replays_new_lengths(hopper_varlen_calls):
    """Captured once, replayed after cu_seqlens changed in place: the result follows the new
    lengths (the tile map reads them on the device)."""
    h, d, total = 4, 128, 4096
    q, k, v = (torch.randn(total, h, d, device="cuda", dtype=torch.bfloat16) for _ in range(3))
    cu = cu_seqlens((1000, 3096)).cuda()
    flash_attn_varlen_func(q, k, v, cu, cu, 4096, 4096, causal=True)  # compile outside
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = flash_attn_varlen_func(q, k, v, cu, cu, 4096, 4096, causal=True)
    for lens in ((4000, 96), (1, 4095), (2048, 2048)):
        cu.copy_(cu_seqlens(lens).cuda())
        graph.replay()
        want = flash_attn_varlen_func(q, k, v, cu, cu, 4096, 4096, causal=True)
        assert torch.equal(out, want), lens
    assert hopper_varlen_calls


def test_auto_dispatch_takes_hopper_for_long_sequences(monkeypatch):
    """auto: packed calls with a long mean key length start from the Hopper kernel (with
    seqused_k too); short sequences stay portable."""
    set_env(monkeypatch, FLASHATTN_BACKEND="auto")
    q = torch.empty(8192, 8, 128, device="cuda", dtype=torch.bfloat16)
    from flashattn.params import AttnParams

    p = AttnParams(softmax_scale=128 ** -0.5, causal=False, window_left=-1, window_right=-1,
                   softcap=0.0, alibi_slopes=None, dropout_p=0.0, philox_seed=0,
                   deterministic=False)
    assert dispatch_select.varlen_forward_family(q, q, q, 2, None, p) == "hopper"
    # mean 128 < 512
    assert dispatch_select.varlen_forward_family(q, q, q, 64, None, p) == "portable"
    used = torch.zeros(2, dtype=torch.int32, device="cuda")
    assert dispatch_select.varlen_forward_family(q, q, q, 2, used, p) == "hopper"


# FP8 (e4m3 Q, K, V; one descale per sequence and KV head, FA3's varlen API): the packed V^T
# puts every sequence on a whole wgmma key group, so lengths off a multiple of 32 matter here
FP8_LENS = (300, 0, 1000, 17, 1, 129)
FP8_LENS_K = (333, 5, 900, 64, 40, 129)
FP8_CASES = [  # (d, d_v, lens_k, causal, window, softcap, out_dtype[, seqused_k])
    (64, 64, FP8_LENS, True, (-1, -1), 0.0, torch.bfloat16),
    (128, 128, FP8_LENS, False, (-1, -1), 0.0, torch.bfloat16),
    (128, 128, FP8_LENS_K, True, (-1, -1), 0.0, torch.float32),
    (128, 128, FP8_LENS_K, False, (100, 20), 30.0, torch.bfloat16),
    (256, 256, FP8_LENS, True, (-1, -1), 0.0, torch.bfloat16),
    (192, 128, FP8_LENS_K, True, (-1, -1), 0.0, torch.bfloat16),
    (128, 128, FP8_LENS_K, True, (-1, -1), 0.0, torch.bfloat16, (300, 1, 899, 0, 40, 64)),
]


@pytest.mark.parametrize("case", FP8_CASES)
def test_hopper_varlen_fp8(case, monkeypatch):
    from flashattn.reference import attention_fp8_ref

    d, d_v, lens_k, causal, window, softcap, out_dtype = case[:7]
    used = case[7] if len(case) > 7 else lens_k
    set_env(monkeypatch, FLASHATTN_BACKEND="hopper")
    calls = []
    real = sm90_fwd.flash_fwd_hopper_fp8_varlen
    monkeypatch.setattr(sm90_fwd, "flash_fwd_hopper_fp8_varlen",
                        lambda *a, **k: calls.append(1) or real(*a, **k))
    torch.manual_seed(3)
    h, h_k = 4, 2
    cu_q, cu_k = cu_seqlens(FP8_LENS).cuda(), cu_seqlens(lens_k).cuda()
    tq, tk = sum(FP8_LENS), sum(lens_k)
    q8 = (torch.randn(tq, h, d, device="cuda") * 3).to(torch.float8_e4m3fn)
    k8 = (torch.randn(tk, h_k, d, device="cuda") * 3).to(torch.float8_e4m3fn)
    v8 = (torch.randn(tk, h_k, d_v, device="cuda") * 3).to(torch.float8_e4m3fn)
    b = len(FP8_LENS)
    qd, kd, vd = (torch.rand(b, h_k, device="cuda") + 0.1 for _ in range(3))
    seqused = (None if len(case) == 7
               else torch.tensor(used, dtype=torch.int32, device="cuda"))
    out = flash_attn_varlen_func(q8, k8, v8, cu_q, cu_k, max(FP8_LENS), max(used),
                                 causal=causal, window_size=window, softcap=softcap,
                                 q_descale=qd, k_descale=kd, v_descale=vd, out_dtype=out_dtype,
                                 seqused_k=seqused)
    assert calls, "the Hopper FP8 varlen kernel did not run"
    assert out.dtype == out_dtype and out.shape == (tq, h, d_v)
    kw = dict(causal=causal, window_size=window, softcap=softcap)
    for i, (n, m) in enumerate(zip(FP8_LENS, used)):
        if n == 0:
            continue
        sq = slice(int(cu_q[i]), int(cu_q[i + 1]))
        sk = slice(int(cu_k[i]), int(cu_k[i]) + m)
        if m == 0:
            assert (out[sq] == 0).all()
            continue
        tables = (qd[i:i + 1].repeat_interleave(h // h_k, 1)[..., None].cpu(),
                  kd[i:i + 1, :, None].cpu(), vd[i:i + 1, :, None].cpu())
        args = (q8[sq][None].cpu(), k8[sk][None].cpu(), v8[sk][None].cpu(), *tables, n, m)
        exact = attention_fp8_ref(*args, **kw, p_scale=None)[0]
        rounded = attention_fp8_ref(*args, **kw)[0]
        allowed = (2 * _rmse(rounded, exact) + 2 * _rmse(exact.to(out_dtype).double(), exact)
                   + 1e-6)
        err = _rmse(out[sq].cpu(), exact)
        assert err <= allowed, (i, err, allowed)


def _rmse(a, b) -> float:
    return (a.double() - b.double()).pow(2).mean().sqrt().item()


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("d", [64, 128, 256])
def test_equal_lengths_backward_matches_dense(causal, d, hopper_varlen_calls):
    """Equal lengths packed: the varlen backward's gradients equal the dense Hopper backward's
    up to the order of dQ's fp32 additions (one CTA per key tile against the dense call's
    persistent schedule)."""
    b, s, h, h_k = 3, 1536, 4, 2
    q = torch.randn(b, s, h, d, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    k, v = (torch.randn(b, s, h_k, d, device="cuda", dtype=torch.bfloat16, requires_grad=True)
            for _ in range(2))
    g = torch.randn(b, s, h, d, device="cuda", dtype=torch.bfloat16)
    dense = torch.autograd.grad(flash_attn_func(q, k, v, causal=causal), (q, k, v), g)
    packed = [x.detach().flatten(0, 1).requires_grad_() for x in (q, k, v)]
    cu = cu_seqlens([s] * b).cuda()
    out = flash_attn_varlen_func(*packed, cu, cu, s, s, causal=causal)
    grads = torch.autograd.grad(out, packed, g.flatten(0, 1))
    assert "bwd" in hopper_varlen_calls
    for name, got, want in zip("qkv", grads, dense):
        err = (got.float() - want.flatten(0, 1).float()).abs().max().item()
        assert err <= 2e-2 * want.float().abs().max().item() + 1e-3, (name, err)


def _poison(x: torch.Tensor, rows, value: float) -> torch.Tensor:
    """x with ``rows`` (a slice or index tensor of its first dim) set to ``value``."""
    x = x.clone()
    x[rows] = value
    return x


def _clean_and_poisoned_calls(d, causal, lens, lead=0, pad=0):
    """(out, dq, dk, dv) of one bf16 packed call over ``lens`` (h 4 / h_k 2) with ``lead``
    rows of no sequence before the first and ``pad`` after the last, those rows 0; then of
    the same call with them NaN in q, v and dout and Inf in k."""
    used = sum(lens)
    total = lead + used + pad
    cu = (cu_seqlens(lens) + lead).int().cuda()
    bad = torch.ones(total, dtype=torch.bool, device="cuda")
    bad[lead:lead + used] = False
    clean = [torch.randn(total, n, d, device="cuda", dtype=torch.bfloat16) for n in (4, 2, 2)]
    for x in clean:
        x[bad] = 0
    g = torch.randn(total, 4, d, device="cuda", dtype=torch.bfloat16)
    g[bad] = 0
    dirty = [_poison(clean[0], bad, float("nan")), _poison(clean[1], bad, float("inf")),
             _poison(clean[2], bad, float("nan"))]
    results = []
    for inputs, grad in ((clean, g), (dirty, _poison(g, bad, float("nan")))):
        xs = [x.detach().requires_grad_() for x in inputs]
        out = flash_attn_varlen_func(*xs, cu, cu, max(lens), max(lens), causal=causal)
        results.append((out, *torch.autograd.grad(out, xs, grad)))
    return results


def _assert_rows_unchanged(results, rows):
    """The poisoned call's ``rows`` are finite and the clean call's bits (dq within 1 %: its
    TMA reduce-add has no fixed order, so it is not bitwise repeatable)."""
    for name, want, got in zip(("out", "dq", "dk", "dv"), *results):
        assert torch.isfinite(got[rows]).all(), name
        if name == "dq":
            err = (got[rows].float() - want[rows].float()).abs().max().item()
            assert err <= 1e-2 * want[rows].float().abs().max().item(), (name, err)
        else:
            assert torch.equal(got[rows], want[rows]), name


@pytest.mark.parametrize("d,causal", [(128, False), (128, True), (64, True), (256, True),
                                      (192, False)])
def test_padding_rows_do_not_reach_the_sequences(d, causal, hopper_varlen_calls):
    """Packed tensors padded past the last sequence (static shapes, a case reported to
    flash-attn upstream) with NaN / Inf rows: every tile that crosses a sequence's end reads them, yet outputs
    and gradients are the bits of the same call with zero padding (row_guard.py), and the
    gradients of the padding rows are 0."""
    torch.manual_seed(5)
    lens = (700, 1, 1100, 333)
    used = sum(lens)
    results = _clean_and_poisoned_calls(d, causal, lens, pad=77)
    assert hopper_varlen_calls.count("fwd") == 2 and hopper_varlen_calls.count("bwd") == 2
    _assert_rows_unchanged(results, slice(None, used))
    for name, got in zip(("dq", "dk", "dv"), results[1][1:]):
        assert (got[used:] == 0).all(), name


@pytest.mark.parametrize("d,causal", [(128, False), (64, True), (256, True)])
def test_rows_before_the_first_sequence_do_not_reach_it(d, causal, hopper_varlen_calls):
    """cu_seqlens[0] > 0: the rows before the first sequence belong to no sequence (a packed
    tensor sliced out of a bigger buffer), so NaN / Inf there change nothing. The first
    sequence is shorter than a key block, whose forward tile would otherwise start before
    its first key; the rows outside every sequence read 0 in out and in the gradients, as
    on the cpu and portable backends."""
    torch.manual_seed(7)
    lead, lens = 50, (5, 700, 1, 333)
    results = _clean_and_poisoned_calls(d, causal, lens, lead=lead)
    assert hopper_varlen_calls.count("fwd") == 2 and hopper_varlen_calls.count("bwd") == 2
    _assert_rows_unchanged(results, slice(lead, None))
    for name, got in zip(("out", "dq", "dk", "dv"), results[1]):
        assert (got[:lead] == 0).all(), name


@pytest.mark.parametrize("fp8", [False, True])
def test_unused_keys_do_not_reach_the_sequences(fp8, monkeypatch):
    """seqused_k (FA3's varlen: cache slots of which only the first seqused_k[b] keys are
    filled): NaN in the unused keys changes nothing, 16-bit (row_guard.py) and FP8 (the packed
    V^T copies only the used keys)."""
    set_env(monkeypatch, FLASHATTN_BACKEND="hopper")
    torch.manual_seed(6)
    slots, used, lens_q = (1024, 512, 700), (1000, 129, 1), (300, 128, 1)
    h, h_k, d = 4, 2, 128
    cu_q, cu_k = cu_seqlens(lens_q).cuda(), cu_seqlens(slots).cuda()
    seqused = torch.tensor(used, dtype=torch.int32, device="cuda")
    q = torch.randn(sum(lens_q), h, d, device="cuda", dtype=torch.bfloat16)
    k, v = (torch.randn(sum(slots), h_k, d, device="cuda", dtype=torch.bfloat16)
            for _ in range(2))
    gaps = torch.cat([torch.arange(int(cu_k[b]) + u, int(cu_k[b + 1]), device="cuda")
                      for b, u in enumerate(used)])
    kw = dict(causal=True, seqused_k=seqused)
    k0, v0 = _poison(k, gaps, 0.0), _poison(v, gaps, 0.0)
    if fp8:  # (poisoned through the bytes: 0x7F is e4m3's NaN)
        q, k0, v0 = (x.to(torch.float8_e4m3fn) for x in (q, k0, v0))
        k1, v1 = k0.clone(), v0.clone()
        k1.view(torch.uint8)[gaps] = 0x7F
        v1.view(torch.uint8)[gaps] = 0x7F
    else:
        k1, v1 = _poison(k0, gaps, float("inf")), _poison(v0, gaps, float("nan"))
    want = flash_attn_varlen_func(q, k0, v0, cu_q, cu_k, max(lens_q), max(slots), **kw)
    got = flash_attn_varlen_func(q, k1, v1, cu_q, cu_k, max(lens_q), max(slots), **kw)
    assert torch.isfinite(got.float()).all()
    assert torch.equal(got, want)


def _dout(kind: str, like: torch.Tensor) -> torch.Tensor:
    """A backward's dout of a given layout: contiguous; autograd's expanded ones (out.sum():
    every stride 0); a column slice (unit last stride, other strides: TMA reads it as it is);
    a contiguous view 2 bytes off 16-byte alignment (TMA cannot read it: copied)."""
    if kind == "contiguous":
        return torch.randn_like(like)
    if kind == "expanded":
        return torch.ones((), dtype=like.dtype, device=like.device).expand(like.shape)
    if kind == "sliced":
        wide = torch.randn(*like.shape[:-1], 2 * like.shape[-1], dtype=like.dtype,
                           device=like.device)
        return wide[..., :like.shape[-1]]
    flat = torch.randn(like.numel() + 8, dtype=like.dtype, device=like.device)
    return flat[1:1 + like.numel()].view(like.shape)


@pytest.mark.parametrize("d,causal,used", [(128, False, False), (128, True, True),
                                           (64, True, False), (256, True, False),
                                           (256, False, True)])
def test_recorded_call_matches_the_full_path(d, causal, used, monkeypatch):
    """A repeated packed signature (api/fastpath.VARLEN: replay_varlen.VarlenRunner's recorded
    PackedFwdCall / PackedBwdCall, their launch plans replayed) gives the full path's out,
    lse, dk and dv bit for bit and dq within its reduce-order noise, for dout of every layout
    autograd or a caller hands the backward (a misaligned one is copied first)."""
    from flashattn.api import fastpath

    set_env(monkeypatch, FLASHATTN_BACKEND="hopper")
    torch.manual_seed(7)
    lens, h, h_k = (1000, 1, 0, 1537, 128), 4, 2
    cu = cu_seqlens(lens).cuda()
    m = max(lens)
    seqused = torch.tensor((900, 1, 0, 1537, 64), dtype=torch.int32, device="cuda") if used \
        else None
    q = torch.randn(sum(lens), h, d, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    k, v = (torch.randn(sum(lens), h_k, d, device="cuda", dtype=torch.bfloat16,
                        requires_grad=True) for _ in range(2))

    def run(kind):
        torch.manual_seed(8)
        out, lse, _ = flash_attn_varlen_func(q, k, v, cu, cu, m, m, causal=causal,
                                             seqused_k=seqused, return_attn_probs=True)
        return (out, lse) + torch.autograd.grad(out, (q, k, v), _dout(kind, out))

    for kind in ("contiguous", "expanded", "sliced", "misaligned"):
        fastpath.VARLEN.clear()
        full = run(kind)
        (runner,) = (entry[1] for entry in fastpath.VARLEN._entries.values())
        fast = run(kind)
        assert isinstance(runner._fwd_call, sm90_fwd.PackedFwdCall), kind
        assert isinstance(runner._bwd_call, sm90_bwd.PackedBwdCall), kind
        for name, a, b in zip(("out", "lse", "dq", "dk", "dv"), fast, full):
            assert name == "lse" or torch.isfinite(a).all(), (kind, name)  # (lse: -inf rows)
            if name == "dq":
                err = (a.float() - b.float()).abs().max().item()
                assert err <= 1e-2 * b.float().abs().max().item(), (kind, name, err)
            else:
                assert torch.equal(a, b), (kind, name)


@pytest.mark.parametrize("h,h_k,given,used", [(4, 2, True, False), (4, 4, False, True),
                                              (8, 2, True, True)])
def test_fp8_recorded_call_matches_the_full_path(h, h_k, given, used, monkeypatch):
    """A repeated FP8 packed signature (FA3's descale API; api/fastpath.FA3_FP8_VARLEN:
    replay_fp8.Fp8VarlenCall over the sm90 PackedFwdCall, V^T pass and forward replayed) gives
    the full path's output bit for bit, and reads the descales of each call (new values,
    same tensors, follow)."""
    from flashattn.api import fastpath

    set_env(monkeypatch, FLASHATTN_BACKEND="hopper")
    torch.manual_seed(9)
    d = 128
    cu_q, cu_k = cu_seqlens(FP8_LENS).cuda(), cu_seqlens(FP8_LENS_K).cuda()
    b, tq, tk = len(FP8_LENS), sum(FP8_LENS), sum(FP8_LENS_K)
    q8 = (torch.randn(tq, h, d, device="cuda") * 3).to(torch.float8_e4m3fn)
    k8, v8 = ((torch.randn(tk, h_k, d, device="cuda") * 3).to(torch.float8_e4m3fn)
              for _ in range(2))
    descales = ([torch.rand(b, h_k, device="cuda") + 0.1 for _ in range(3)] if given
                else [None, None, None])
    seqused = (torch.tensor((300, 0, 899, 64, 1, 100), dtype=torch.int32, device="cuda")
               if used else None)

    def call():
        return flash_attn_varlen_func(q8, k8, v8, cu_q, cu_k, max(FP8_LENS), max(FP8_LENS_K),
                                      causal=True, q_descale=descales[0],
                                      k_descale=descales[1], v_descale=descales[2],
                                      seqused_k=seqused)

    fastpath.FA3_FP8_VARLEN.clear()
    full = call()
    (entry,) = fastpath.FA3_FP8_VARLEN._entries.values()
    assert isinstance(entry[1], replay_fp8.Fp8VarlenCall)
    fast = call()
    assert torch.isfinite(fast.float()).all() and torch.equal(fast, full)
    if given:  # new descale values in the same tensors
        for x in descales:
            x.mul_(1.5)
        fast = call()
        fastpath.FA3_FP8_VARLEN.clear()
        assert torch.equal(fast, call()) and not torch.equal(fast, full)
