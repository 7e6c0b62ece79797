"""Hopper (sm90, Gluon) backward: dq / dk / dv against the float64 oracle, dispatch, fallbacks.

Accuracy rule (flash-attn's, tests/accuracy.py): max|grad - ref64| <= 3 * max|grad_torch_lowprec
- ref64| + atol. out / lse come from the Hopper forward (tested in test_hopper_gpu.py). Needs an
sm90 GPU with the Gluon API the kernels are written for; elsewhere the module is skipped (the
CPU side is test_hopper_aot.py).
"""
from __future__ import annotations

import pytest
import torch

from tests.accuracy import assert_attention_close, assert_close_rule
from flashattn import flash_attn_func
from flashattn.dispatch import select as dispatch_select
from flashattn.reference import attention_ref
from tests.settings import set_env
from tests.backends.sm90.hopper_marks import hopper_gpu_marks

pytestmark = hopper_gpu_marks()


def _poison_allocator(nbytes: int) -> None:
    """Fill freed cached blocks with NaN so outputs the kernel forgets to write show up."""
    junk = torch.full((nbytes // 4 + 1024,), float("nan"), device="cuda")
    del junk


def _inputs(b, s_q, s_k, h, h_k, d, dtype):
    q = torch.randn(b, s_q, h, d, device="cuda", dtype=dtype)
    k = torch.randn(b, s_k, h_k, d, device="cuda", dtype=dtype)
    v = torch.randn(b, s_k, h_k, d, device="cuda", dtype=dtype)
    return q, k, v


def _params(d, causal=False, window=(-1, -1), softcap=0.0, s_k=None):
    left, right = (-1 if w < 0 or (s_k is not None and w >= s_k) else int(w) for w in window)
    if causal:
        right = 0
    return dict(softmax_scale=d ** -0.5, causal=causal, window_left=left, window_right=right,
                softcap=softcap, alibi_slopes=None, dropout_p=0.0, philox_seed=0)


def _reference_grads(q, k, v, dout, params):
    ref_kw = dict(softmax_scale=params["softmax_scale"],
                  window_size=(params["window_left"], params["window_right"]),
                  softcap=params["softcap"])
    x64 = [x.detach().double().requires_grad_() for x in (q, k, v)]
    out64, _ = attention_ref(*x64, **ref_kw)
    g64 = torch.autograd.grad(out64, x64, dout.double())
    xlp = [x.detach().clone().requires_grad_() for x in (q, k, v)]
    outlp, _ = attention_ref(*xlp, upcast=False, **ref_kw)
    glp = torch.autograd.grad(outlp, xlp, dout)
    return g64, glp


def _run(q, k, v, params, dout=None, deterministic=False, **overrides):
    from flashattn.backends.sm90.bwd import flash_bwd_hopper
    from flashattn.backends.sm90.fwd import flash_fwd_hopper

    out, lse, _ = flash_fwd_hopper(q, k, v, return_softmax=False, **params)
    if dout is None:
        dout = torch.randn_like(out)
    _poison_allocator(4 * (q.numel() + k.numel() + v.numel()) * 2)
    grads = flash_bwd_hopper(dout, q, k, v, out, lse, deterministic=deterministic,
                             config_overrides=overrides or None, **params)
    torch.cuda.synchronize()
    return grads, dout


def _check(q, k, v, params, grads, dout):
    g64, glp = _reference_grads(q, k, v, dout, params)
    for name, got, x, ref, lp in zip(("dq", "dk", "dv"), grads, (q, k, v), g64, glp):
        assert got.shape == x.shape and got.dtype == x.dtype, name
        assert_close_rule(got, ref, lp, factor=3.0, name=name)


# ---------------------------------------------------------------------------------------------
# Accuracy grid
# ---------------------------------------------------------------------------------------------
_SHAPES = [(2, 1024, 1024, 4, 4), (1, 257, 771, 4, 2), (2, 700, 300, 6, 1), (1, 1, 513, 2, 2),
           (3, 129, 129, 2, 1)]
_CORE = [(d, dt, causal, shape) for d in (64, 128, 256) for dt in (torch.bfloat16, torch.float16)
         for causal in (False, True) for shape in _SHAPES]


@pytest.mark.parametrize("d,dtype,causal,shape", _CORE,
                         ids=[f"d{d}-{str(dt)[6:]}-{'causal' if c else 'full'}-"
                              f"b{s[0]}s{s[1]}x{s[2]}h{s[3]}k{s[4]}" for d, dt, c, s in _CORE])
def test_core_grid(d, dtype, causal, shape):
    b, s_q, s_k, h, h_k = shape
    q, k, v = _inputs(b, s_q, s_k, h, h_k, d, dtype)
    params = _params(d, causal)
    grads, dout = _run(q, k, v, params)
    _check(q, k, v, params, grads, dout)


_EXTRA = [
    # (d, dtype, causal, window, softcap, shape)
    (96, torch.bfloat16, False, (-1, -1), 0.0, (2, 600, 600, 4, 2)),
    (96, torch.float16, True, (-1, -1), 0.0, (1, 333, 555, 4, 4)),
    (128, torch.bfloat16, False, (100, 50), 0.0, (2, 1000, 1000, 4, 2)),
    (128, torch.float16, True, (37, -1), 0.0, (1, 513, 1025, 2, 2)),
    (64, torch.bfloat16, False, (0, 0), 0.0, (1, 300, 300, 2, 1)),
    (64, torch.bfloat16, False, (-1, 10), 0.0, (1, 777, 300, 2, 2)),
    (128, torch.bfloat16, False, (-1, -1), 30.0, (2, 800, 800, 4, 4)),
    (128, torch.float16, True, (-1, -1), 15.0, (1, 511, 1023, 4, 1)),
    (64, torch.float16, False, (200, 200), 20.0, (2, 1000, 1000, 2, 2)),
    (64, torch.bfloat16, True, (-1, -1), 0.0, (1, 1000, 200, 8, 1)),  # many rows see no key
    # bwd_wide_kernel.py (d = 192 runs as 256, zero-padded)
    (192, torch.bfloat16, False, (-1, -1), 0.0, (2, 600, 600, 4, 2)),
    (192, torch.float16, True, (-1, -1), 0.0, (1, 333, 555, 4, 4)),
    (256, torch.bfloat16, False, (100, 50), 0.0, (2, 1000, 1000, 4, 2)),
    (256, torch.float16, True, (37, -1), 0.0, (1, 513, 1025, 2, 2)),
    (192, torch.bfloat16, False, (-1, 10), 0.0, (1, 777, 300, 2, 2)),
    (256, torch.bfloat16, False, (-1, -1), 30.0, (2, 800, 800, 4, 4)),
    (192, torch.float16, True, (-1, -1), 15.0, (1, 511, 1023, 4, 1)),
    (256, torch.float16, False, (200, 200), 20.0, (2, 1000, 1000, 2, 2)),
    (256, torch.bfloat16, True, (-1, -1), 0.0, (1, 1000, 200, 8, 1)),
]


@pytest.mark.parametrize("d,dtype,causal,window,softcap,shape", _EXTRA,
                         ids=[f"d{e[0]}-{str(e[1])[6:]}-{'causal' if e[2] else 'full'}-win{e[3][0]}_{e[3][1]}"
                              f"-cap{e[4]:g}-s{e[5][1]}x{e[5][2]}h{e[5][3]}k{e[5][4]}" for e in _EXTRA])
def test_features(d, dtype, causal, window, softcap, shape):
    b, s_q, s_k, h, h_k = shape
    q, k, v = _inputs(b, s_q, s_k, h, h_k, d, dtype)
    params = _params(d, causal, window, softcap, s_k)
    grads, dout = _run(q, k, v, params)
    _check(q, k, v, params, grads, dout)


_VARIANTS = [(128, dict(dq_async=False)), (128, dict(pipeline=True)),
             (128, dict(dq_tma=False)), (128, dict(pipeline=True, dq_async=False)),
             (64, dict(block_m=128)), (64, dict(block_m=128, dq_async=False)),
             (64, dict(pipeline=True)), (64, dict(dq_async=False)),
             (256, dict(pipeline=False)), (192, dict(pipeline=False)),
             (128, dict(longest_first=True)), (256, dict(longest_first=True)),
             (128, dict(persistent=True)), (64, dict(persistent=True, longest_first=True)),
             (128, dict(persistent=True, dq_async=False)), (128, dict(persistent=False)),
             (64, dict(persistent=False)), (128, dict(persistent=True, dynamic=True)),
             (64, dict(persistent=True, dynamic=True, longest_first=True)),
             (96, dict(persistent=True, dynamic=True))]


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("d,overrides", _VARIANTS,
                         ids=[f"d{d}-" + "-".join(f"{k}{int(v)}" for k, v in o.items())
                              for d, o in _VARIANTS])
def test_config_variants_are_exact(d, overrides, causal):
    """The schedule switches (dQ by atomics / synchronous TMA reduce, pipelining, BLOCK_M,
    program order, persistence) change the schedule, never the function."""
    q, k, v = _inputs(2, 1000, 900, 4, 2, d, torch.bfloat16)
    params = _params(d, causal)
    grads, dout = _run(q, k, v, params, **overrides)
    _check(q, k, v, params, grads, dout)


# causal GQA calls at d = 64 / 128 walk longest-first in modelled groups of KV heads
# (config.GQA_LONGEST_FIRST); shapes whose group is smaller than the L2 budget and, at d = 128,
# leaves a partial last group (32 pairs in groups of 11)
_GQA_GROUPS = [(64, (4, 2048, 16, 4), 8), (128, (8, 1024, 16, 4), 11)]


@pytest.mark.parametrize("d,shape,group", _GQA_GROUPS,
                         ids=[f"d{d}-b{s[0]}s{s[1]}h{s[2]}k{s[3]}" for d, s, _ in _GQA_GROUPS])
def test_gqa_longest_first_groups_match_head_major(d, shape, group):
    """The causal GQA default order (key block 0 of every KV head in a group first) computes
    the head-major order's function: dK / dV bitwise (each tile's work is the same), dQ up to
    the order of its fp32 adds; and the group size really is the modelled one. Whole tiles
    (tile_split off: cut tiles are test_tile_split_matches_whole_tiles')."""
    from flashattn.backends.sm90 import bwd
    from flashattn.backends.sm90.descriptors import heads_per_group
    from flashattn.backends.sm90.tile_order import backward_level_costs, modelled_group

    b, s, h, h_k = shape
    q, k, v = _inputs(b, s, s, h, h_k, d, torch.bfloat16)
    params = _params(d, True)
    cfg = bwd.padded_config(q, k, -1, 0, 0.0, False, {"tile_split": False})
    assert cfg.longest_first and cfg.head_groups == 2
    budget = heads_per_group(b * h_k, 2 * s * d * 2 * (h // h_k))
    costs = backward_level_costs(s, s, cfg.block_m, cfg.block_n, -1, 0)
    assert modelled_group(costs, b * h_k, budget, 132) == group < min(budget, b * h_k)
    grads, dout = _run(q, k, v, params, tile_split=False)
    head_major, _ = _run(q, k, v, params, dout=dout, longest_first=False)
    assert torch.equal(grads[1], head_major[1]) and torch.equal(grads[2], head_major[2])
    assert not torch.isnan(grads[0]).any()
    torch.testing.assert_close(grads[0], head_major[0], rtol=2e-2, atol=1e-3)
    # against the float64 oracle on batch 0, KV head 0 and its query heads
    q_sl = (slice(0, 1), slice(None), slice(0, h // h_k))
    kv_sl = (slice(0, 1), slice(None), slice(0, 1))
    _check(q[q_sl], k[kv_sl], v[kv_sl], params,
           (grads[0][q_sl], grads[1][kv_sl], grads[2][kv_sl]), dout[q_sl])


# BwdConfig.tile_split: the first key blocks of every KV head cut in two by query heads, the
# parts' fp32 dK / dV summed by the host. The cut count forced (the model's choice depends on
# the SM count): some of the key blocks, and all of them; s_q != s_k (bottom-right causal),
# a right window without a causal mask, the last key block partial, fp16, GQA 2:1 / 4:1 / 8:1,
# and odd groups (3:1, 7:1: parts of ceil / floor half the heads)
_SPLITS = [(128, torch.bfloat16, (2, 1000, 1000, 8, 2), (-1, 0), 3),
           (128, torch.bfloat16, (1, 900, 900, 7, 1), (-1, 0), 4),
           (64, torch.float16, (2, 600, 700, 6, 2), (-1, 0), 2),
           (128, torch.bfloat16, (1, 700, 1300, 8, 1), (-1, 0), 11),
           (64, torch.bfloat16, (2, 1000, 1000, 16, 2), (-1, 0), 2),
           (64, torch.float16, (1, 1500, 900, 4, 2), (-1, 200), 4),
           (128, torch.float16, (3, 129, 129, 8, 4), (-1, 0), 1)]


@pytest.mark.parametrize("d,dtype,shape,window,split", _SPLITS,
                         ids=[f"d{d}-{str(dt)[6:]}-win{w[1]}-b{s[0]}s{s[1]}x{s[2]}h{s[3]}k{s[4]}"
                              f"-cut{c}" for d, dt, s, w, c in _SPLITS])
def test_tile_split_matches_whole_tiles(d, dtype, shape, window, split, monkeypatch):
    """Cut key blocks compute the function of whole ones: against the float64 oracle, and
    dK / dV against the unsplit order up to the one extra fp32 add per cut key block. The
    cut rows come from the workspace (poisoned by _run's allocator otherwise)."""
    from flashattn.backends.sm90 import bwd

    b, s_q, s_k, h, h_k = shape
    q, k, v = _inputs(b, s_q, s_k, h, h_k, d, dtype)
    params = _params(d, False, window, s_k=s_k)
    cuts = []
    real = bwd.split_blocks

    def forced(cfg, *args):
        cuts.append(real(cfg, *args))  # the model's own answer runs (and must not raise)
        return split if cfg.tile_split else 0

    monkeypatch.setattr(bwd, "split_blocks", forced)
    grads, dout = _run(q, k, v, params, tile_split=True)
    whole, _ = _run(q, k, v, params, dout=dout, tile_split=False)
    assert len(cuts) == 2 and cuts[1] == 0
    for name, got, ref in zip(("dq", "dk", "dv"), grads, whole):
        assert not torch.isnan(got).any(), name
        torch.testing.assert_close(got, ref, rtol=2e-2, atol=2e-3, msg=name)
    _check(q, k, v, params, grads, dout)


@pytest.mark.parametrize("shape", [(1, 2048, 28, 4), (2, 1024, 21, 3)],
                         ids=["b1s2048h28k4", "b2s1024h21k3"])
def test_odd_group_default_cut(shape):
    """An odd GQA group (7:1, as Qwen2.5-7B's 28 / 4 heads) with the default config: the
    model cuts key blocks (parts of four heads and three), and the gradients hold against
    the float64 oracle and the whole tiles."""
    from flashattn.backends.sm90 import bwd

    b, s, h, h_k = shape
    q, k, v = _inputs(b, s, s, h, h_k, 128, torch.bfloat16)
    params = _params(128, True)
    assert bwd.split_blocks(bwd.padded_config(q, k, -1, 0, 0.0, False, {}), q, k, -1, 0) > 0
    grads, dout = _run(q, k, v, params)
    whole, _ = _run(q, k, v, params, dout=dout, tile_split=False)
    for name, got, ref in zip(("dq", "dk", "dv"), grads, whole):
        assert not torch.isnan(got).any(), name
        torch.testing.assert_close(got, ref, rtol=2e-2, atol=2e-3, msg=name)
    q_sl = (slice(0, 1), slice(None), slice(0, h // h_k))
    kv_sl = (slice(0, 1), slice(None), slice(0, 1))
    _check(q[q_sl], k[kv_sl], v[kv_sl], params,
           (grads[0][q_sl], grads[1][kv_sl], grads[2][kv_sl]), dout[q_sl])


# deterministic=True: dQ added in descending key-block order (BwdConfig.deterministic; the
# masked rows run the kernel directly: dispatch sends masked deterministic calls to portable)
_DETERMINISTIC = [(64, False, (-1, -1), (2, 1000, 900, 4, 2)),
                  (128, False, (-1, -1), (1, 2048, 2048, 8, 2)),
                  (128, True, (-1, -1), (2, 1000, 1000, 4, 4)),
                  (64, True, (-1, -1), (1, 700, 1300, 6, 2)),
                  (128, False, (-1, 100), (1, 900, 600, 4, 1)),
                  (128, True, (-1, -1), (3, 129, 129, 2, 1))]


@pytest.mark.parametrize("d,causal,window,shape", _DETERMINISTIC,
                         ids=[f"d{d}-{'causal' if c else 'full'}-win{w[1]}-"
                              f"b{s[0]}s{s[1]}x{s[2]}h{s[3]}k{s[4]}"
                              for d, c, w, s in _DETERMINISTIC])
def test_deterministic_backward_is_exact_and_bitwise_repeatable(d, causal, window, shape):
    """Ordered dQ: within the accuracy rule, and the same bits on every run (5 runs, fresh
    workspaces and turn counters each time)."""
    b, s_q, s_k, h, h_k = shape
    q, k, v = _inputs(b, s_q, s_k, h, h_k, d, torch.bfloat16)
    params = _params(d, causal, window, s_k=s_k)
    first, dout = _run(q, k, v, params, deterministic=True)
    _check(q, k, v, params, first, dout)
    for _ in range(4):
        again, _ = _run(q, k, v, params, dout=dout, deterministic=True)
        for name, a, bb in zip(("dq", "dk", "dv"), first, again):
            assert torch.equal(a, bb), f"{name} differs between deterministic runs"


_KV_VIEWS = [(64, False, (2, 1000, 900, 4, 2), False), (128, True, (2, 1000, 1000, 4, 4), False),
             (96, True, (1, 700, 1300, 6, 2), False), (128, False, (1, 2048, 2048, 8, 2), True),
             (64, True, (1, 700, 1300, 6, 2), True)]


@pytest.mark.parametrize("d,causal,shape,deterministic", _KV_VIEWS,
                         ids=[f"d{d}-{'causal' if c else 'full'}-b{s[0]}s{s[1]}x{s[2]}h{s[3]}"
                              f"k{s[4]}{'-det' if det else ''}" for d, c, s, det in _KV_VIEWS])
def test_kv_views_per_block_is_exact(d, causal, shape, deterministic):
    """BwdConfig.kv_views_per_block: K / V views rebuilt every query block through a run-time
    zero index (the d = 64 default) give the same gradients: against the float64 oracle, dK /
    dV bitwise those of the views held across blocks (the same GEMMs on the same shared
    memory), and with deterministic=True dQ bitwise too. The cases cover the persistent d = 64
    row-split dQ, the causal one tile per CTA kernel, d = 96 with the GQA tile split, and the
    deterministic dQ writer."""
    b, s_q, s_k, h, h_k = shape
    q, k, v = _inputs(b, s_q, s_k, h, h_k, d, torch.bfloat16)
    params = _params(d, causal, s_k=s_k)
    grads, dout = _run(q, k, v, params, deterministic=deterministic, kv_views_per_block=True)
    base, _ = _run(q, k, v, params, dout=dout, deterministic=deterministic,
                   kv_views_per_block=False)
    _check(q, k, v, params, grads, dout)
    assert torch.equal(grads[1], base[1]) and torch.equal(grads[2], base[2])
    if deterministic:
        assert torch.equal(grads[0], base[0])
    else:
        torch.testing.assert_close(grads[0], base[0], rtol=2e-2, atol=1e-3)


def test_deterministic_backward_through_the_api(monkeypatch):
    """flash_attn_func(deterministic=True) at d = 128 runs the Hopper backward when unmasked,
    the portable one under a causal mask (measured faster there)."""
    calls = []
    from flashattn.backends.sm90 import bwd as hopper_bwd
    real = hopper_bwd.flash_bwd_hopper

    def spy(*a, **kw):
        calls.append(kw["deterministic"])
        return real(*a, **kw)

    monkeypatch.setattr(hopper_bwd, "flash_bwd_hopper", spy)
    _end_to_end(monkeypatch, d=128, deterministic=True, causal=False)
    assert calls == [True]
    _end_to_end(monkeypatch, d=128, deterministic=True)
    assert calls == [True]


def test_strided_inputs_and_expanded_dout():
    """(b, h, s, d) memory viewed as (b, s, h, d); dout an expanded (stride 0) view."""
    d = 128
    q, k, v = (torch.randn(2, 4, 700, d, device="cuda", dtype=torch.bfloat16).transpose(1, 2)
               for _ in range(3))
    params = _params(d, True)
    dout = torch.randn(1, 1, 4, d, device="cuda", dtype=torch.bfloat16).expand(2, 700, 4, d)
    grads, dout = _run(q, k, v, params, dout=dout)
    _check(q, k, v, params, grads, dout)


@pytest.mark.parametrize("d", [128, 256])
def test_replayed_launches_match_full_launches(monkeypatch, d):
    """Repeated call shapes replay the launch plans of the three backward launches (row
    statistics, the Gluon kernel, the dQ pass) with the new tensors: each call checked against
    the oracle, a new plan for new strides (an expanded dout is copied: its strides repeat).
    Causal GQA shapes may take the tile split, whose launches keep their own plans: the two
    stores together hold one plan per stride pattern."""
    from flashattn.backends.sm90 import bwd, bwd_postprocess, bwd_preprocess

    for plans in (bwd._PLANS, bwd._SPLIT_PLANS, bwd_preprocess._PLANS, bwd_postprocess._PLANS):
        plans.clear()
    params = _params(d, True)
    runs = [_inputs(1, 600, 600, 4, 2, d, torch.bfloat16) for _ in range(2)]
    runs.append(tuple(torch.randn(1, h, 600, d, device="cuda", dtype=torch.bfloat16)
                      .transpose(1, 2) for h in (4, 2, 2)))
    for q, k, v in runs + runs[:1]:
        grads, dout = _run(q, k, v, params)
        _check(q, k, v, params, grads, dout)
    assert len(bwd._PLANS._plans) + len(bwd._SPLIT_PLANS._plans) == 2


@pytest.mark.bigmem  # tens of GiB: run alone (gpu_check.sh), not beside other workers
@pytest.mark.parametrize("d", [128, 256])
def test_large_offsets(d):
    """q, dO, dq (and the fp32 dQ workspace) past 2**31 elements: dq rows at the far end
    against the float64 oracle, dk / dv against the portable backward (they sum over all
    8M query rows of the 2**31-element tensors)."""
    from flashattn.backends.sm90.bwd import flash_bwd_hopper
    from flashattn.backends.sm90.fwd import flash_fwd_hopper
    from flashattn.backends.triton.bwd import flash_bwd

    b, s, h = 1, 131072, 2**31 // (131072 * d)  # 2**31 elements of q
    try:
        q = torch.randn(b, s, h, d, device="cuda", dtype=torch.bfloat16)
        dout = torch.randn_like(q)
    except torch.OutOfMemoryError:
        pytest.skip("not enough GPU memory")
    k = torch.randn(b, 128, 1, d, device="cuda", dtype=torch.bfloat16)
    v = torch.randn_like(k)
    params = _params(d, False)
    out, lse, _ = flash_fwd_hopper(q, k, v, return_softmax=False, **params)
    dq, dk, dv = flash_bwd_hopper(dout, q, k, v, out, lse, deterministic=False, **params)
    torch.cuda.synchronize()
    rows = slice(s - 200, s)
    for hh in (0, h - 1):
        sl = (slice(None), rows, slice(hh, hh + 1))
        g64, glp = _reference_grads(q[sl], k, v, dout[sl], params)
        assert_close_rule(dq[sl], g64[0], glp[0], factor=3.0, name=f"dq head {hh}")
    del dq
    _, dk_ref, dv_ref = flash_bwd(dout, q, k, v, out, lse, deterministic=False, **params)
    for name, got, ref in (("dk", dk, dk_ref), ("dv", dv, dv_ref)):
        err = (got.float() - ref.float()).norm() / ref.float().norm()
        assert err < 1e-2, f"{name}: relative error {err:.2e} against the portable backward"


@pytest.mark.bigmem  # ~5 GiB: run alone (gpu_check.sh), not beside other workers
@pytest.mark.parametrize("d", [64, 256])
def test_more_than_65535_heads(d):
    """b * h_k past 65535 (the limit of grid axis 1): the backward's grids keep (batch, head)
    on axis 0 / in a 1-D grid. Heads at both ends checked against the float64 oracle."""
    b, s, h = 32800, 64, 2  # b * h = 65600 (KV) heads
    try:
        q, k, v = _inputs(b, s, s, h, h, d, torch.bfloat16)
    except torch.OutOfMemoryError:
        pytest.skip("not enough GPU memory")
    params = _params(d, True)
    grads, dout = _run(q, k, v, params)
    for sl in (slice(0, 2), slice(b - 2, b)):
        _check(q[sl], k[sl], v[sl], params, tuple(g[sl] for g in grads), dout[sl])


# ---------------------------------------------------------------------------------------------
# Dispatch on sm90: covered backward calls take the Hopper kernel, the rest fall back
# ---------------------------------------------------------------------------------------------
def _end_to_end(monkeypatch, d=128, h=4, h_k=2, **kw):
    set_env(monkeypatch, FLASHATTN_BACKEND="hopper")
    set_env(monkeypatch, FLASHATTN_AUTOTUNE="0")
    b, s = 2, 700
    q, k, v = (x.requires_grad_() for x in _inputs(b, s, s, h, h_k, d, torch.bfloat16))
    causal = kw.pop("causal", True)
    out = flash_attn_func(q, k, v, causal=causal, **kw)
    g = torch.randn_like(out)
    grads = torch.autograd.grad(out, (q, k, v), g)
    assert_attention_close(q, k, v, out, g, grads,
                           window_size=kw.get("window_size", (-1, 0 if causal else -1)))
    return q, k, v


@pytest.mark.parametrize("d", [128, 256])
def test_dispatch_picks_hopper_backward(monkeypatch, d):
    calls = []
    from flashattn.backends.sm90 import bwd as hopper_bwd
    real = hopper_bwd.flash_bwd_hopper

    def spy(*a, **kw):
        calls.append("hopper")
        return real(*a, **kw)

    monkeypatch.setattr(hopper_bwd, "flash_bwd_hopper", spy)
    q, k, v = _end_to_end(monkeypatch, d=d)
    assert calls == ["hopper"]
    p = _params(d, True)
    assert dispatch_select.backward_family(q, k, v, deterministic=False, **p) == "hopper"
    set_env(monkeypatch, FLASHATTN_HOPPER_BWD="0")
    assert dispatch_select.backward_family(q, k, v, deterministic=False, **p) == "portable"
    set_env(monkeypatch, FLASHATTN_BACKEND="portable")
    set_env(monkeypatch, FLASHATTN_HOPPER_BWD=None)
    assert dispatch_select.backward_family(q, k, v, deterministic=False, **p) == "portable"


@pytest.mark.parametrize("what", ["deterministic_window", "deterministic_d256",
                                  "hopper_bwd_off"])
def test_uncovered_backward_falls_back(monkeypatch, what):
    calls = []
    from flashattn.backends.sm90 import bwd as hopper_bwd
    real = hopper_bwd.flash_bwd_hopper

    def spy(*a, **kw):
        calls.append("hopper")
        return real(*a, **kw)

    monkeypatch.setattr(hopper_bwd, "flash_bwd_hopper", spy)
    if what == "hopper_bwd_off":
        set_env(monkeypatch, FLASHATTN_HOPPER_BWD="0")
    kw = dict(deterministic=True) if what.startswith("deterministic") else {}
    if what == "deterministic_window":  # a left window: the ordered dQ does not cover it
        kw["window_size"] = (300, 0)
    _end_to_end(monkeypatch, d=256 if what.endswith("d256") else 128, **kw)
    assert calls == []


@pytest.mark.parametrize("d,causal", [(128, False), (128, True), (64, True), (256, False)])
def test_dense_grad_recorded_call_matches_the_full_path(d, causal, monkeypatch):
    """A repeated dense signature that records a gradient (replay.dense.DenseTrainEntry, kept
    by api/fastpath: the forward runner and a backward runner decided once,
    replay.autograd.dense_recorded) gives the full path's out, lse, dk and dv bit for bit and
    dq within its reduce-order noise, with autograd's expanded dout (out.sum()) and a plain
    one."""
    from flashattn.api import fastpath

    set_env(monkeypatch, FLASHATTN_BACKEND="hopper")
    torch.manual_seed(11)
    q, k, v = (x.requires_grad_(True)
               for x in _inputs(2, 1000, 1300, 4, 2, d, torch.bfloat16))

    def run(expanded):
        out, lse, _ = flash_attn_func(q, k, v, causal=causal, return_attn_probs=True)
        dout = (torch.ones((), dtype=out.dtype, device="cuda").expand(out.shape) if expanded
                else torch.randn_like(out))
        return (out, lse) + torch.autograd.grad(out, (q, k, v), dout)

    for expanded in (False, True):
        fastpath.DENSE.clear()
        torch.manual_seed(12)
        full = run(expanded)
        (entry,) = (e[1] for e in fastpath.DENSE._entries.values())
        assert isinstance(entry, fastpath.DenseTrainEntry)
        torch.manual_seed(12)
        fast = run(expanded)
        assert entry._backward is not None
        for name, a, b in zip(("out", "lse", "dq", "dk", "dv"), fast, full):
            if name == "dq":
                err = (a.float() - b.float()).abs().max().item()
                assert err <= 1e-2 * b.float().abs().max().item(), (expanded, name, err)
            else:
                assert torch.equal(a, b), (expanded, name)
