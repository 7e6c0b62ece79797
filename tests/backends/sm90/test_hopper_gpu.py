"""Hopper (sm90, Gluon) forward: accuracy grid against the float64 oracle, dispatch, fallbacks.

Accuracy rule (flash-attn's, tests/accuracy.py): max|out - ref64| <= 2 * max|out_torch_lowprec
- ref64| + atol, for out and lse. Everything here needs an sm90 GPU with the Gluon API the
kernels are written for; elsewhere the module is skipped (the CPU side is test_hopper_aot.py).
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
                softcap=softcap, alibi_slopes=None, dropout_p=0.0, philox_seed=0,
                return_softmax=False)


def _check(q, k, v, params, out, lse):
    ref_kw = dict(softmax_scale=params["softmax_scale"],
                  window_size=(params["window_left"], params["window_right"]),
                  softcap=params["softcap"])
    out_ref, lse_ref = attention_ref(q.double(), k.double(), v.double(), **ref_kw)
    out_lp, lse_lp = attention_ref(q, k, v, upcast=False, **ref_kw)
    assert out.shape == out_ref.shape and out.dtype == q.dtype
    assert lse.shape == lse_ref.shape and lse.dtype == torch.float32
    assert_close_rule(out, out_ref, out_lp, factor=2.0, name="out")
    assert_close_rule(lse, lse_ref, lse_lp, factor=2.0, name="lse")
    empty = torch.isneginf(lse_ref).transpose(1, 2)
    if empty.any():
        assert (out[empty] == 0).all(), "rows with no visible key must have out == 0"


def _run_hopper(q, k, v, params, **overrides):
    from flashattn.backends.sm90.fwd import flash_fwd_hopper

    _poison_allocator(q.numel() * q.element_size() * 2)
    out, lse, _ = flash_fwd_hopper(q, k, v, config_overrides=overrides or None, **params)
    torch.cuda.synchronize()
    return out, lse


# ---------------------------------------------------------------------------------------------
# Accuracy grid: the most used subset in full, the rest pairwise-ish
# ---------------------------------------------------------------------------------------------
_SHAPES = [(2, 1024, 1024, 4, 4), (1, 257, 771, 4, 2), (2, 700, 300, 6, 1), (1, 1, 513, 2, 2),
           (3, 129, 129, 2, 1)]
_CORE = [(d, dt, causal, shape) for d in (64, 128) for dt in (torch.bfloat16, torch.float16)
         for causal in (False, True) for shape in _SHAPES]


@pytest.mark.parametrize("d,dtype,causal,shape", _CORE,
                         ids=[f"d{d}-{str(dt)[6:]}-{'causal' if c else 'full'}-"
                              f"b{s[0]}s{s[1]}x{s[2]}h{s[3]}k{s[4]}" for d, dt, c, s in _CORE])
def test_core_grid(d, dtype, causal, shape):
    b, s_q, s_k, h, h_k = shape
    q, k, v = _inputs(b, s_q, s_k, h, h_k, d, dtype)
    params = _params(d, causal)
    out, lse = _run_hopper(q, k, v, params)
    _check(q, k, v, params, out, lse)


_EXTRA = [
    # (d, dtype, causal, window, softcap, shape)
    (96, torch.bfloat16, False, (-1, -1), 0.0, (2, 600, 600, 4, 2)),
    (96, torch.float16, True, (-1, -1), 0.0, (1, 333, 555, 4, 4)),
    (192, torch.bfloat16, True, (-1, -1), 0.0, (2, 500, 500, 2, 1)),
    (192, torch.float16, False, (-1, -1), 5.0, (1, 300, 700, 2, 2)),
    (256, torch.bfloat16, False, (-1, -1), 0.0, (2, 640, 640, 2, 2)),
    (256, torch.float16, True, (64, -1), 0.0, (1, 900, 450, 4, 1)),
    (128, torch.bfloat16, False, (100, 50), 0.0, (2, 1000, 1000, 4, 2)),
    (128, torch.float16, True, (37, -1), 0.0, (1, 513, 1025, 2, 2)),
    (64, torch.bfloat16, False, (0, 0), 0.0, (1, 300, 300, 2, 1)),
    (64, torch.bfloat16, False, (-1, 10), 0.0, (1, 777, 300, 2, 2)),
    (128, torch.bfloat16, False, (-1, -1), 30.0, (2, 800, 800, 4, 4)),
    (128, torch.float16, True, (-1, -1), 15.0, (1, 511, 1023, 4, 1)),
    (64, torch.float16, False, (200, 200), 20.0, (2, 1000, 1000, 2, 2)),
    (256, torch.bfloat16, True, (-1, -1), 10.0, (1, 300, 300, 2, 2)),
]


@pytest.mark.parametrize("d,dtype,causal,window,softcap,shape", _EXTRA,
                         ids=[f"d{e[0]}-{str(e[1])[6:]}-{'causal' if e[2] else 'full'}-win{e[3][0]}_{e[3][1]}"
                              f"-cap{e[4]:g}-s{e[5][1]}x{e[5][2]}h{e[5][3]}k{e[5][4]}" for e in _EXTRA])
def test_features(d, dtype, causal, window, softcap, shape):
    b, s_q, s_k, h, h_k = shape
    q, k, v = _inputs(b, s_q, s_k, h, h_k, d, dtype)
    params = _params(d, causal, window, softcap, s_k)
    out, lse = _run_hopper(q, k, v, params)
    _check(q, k, v, params, out, lse)


@pytest.mark.parametrize("overrides", [dict(pingpong=True), dict(intra_overlap=False),
                                       dict(persistent=False), dict(dynamic=False),
                                       dict(pingpong=True, intra_overlap=False),
                                       dict(warp_specialized=False),
                                       dict(warp_specialized=False, num_stages=3,
                                            separate_o=False),
                                       dict(pingpong=2), dict(pingpong=2, intra_overlap=False),
                                       dict(thread_release=True),
                                       dict(thread_release=True, warp_specialized=False)],
                         ids=["pingpong", "no_intra_overlap", "not_persistent", "static_sched",
                              "pingpong_no_intra", "no_ws", "no_ws_stages3", "pingpong_named",
                              "pingpong_named_no_intra", "thread_release",
                              "thread_release_no_ws"])
@pytest.mark.parametrize("causal", [False, True])
def test_ablation_variants_are_exact(overrides, causal):
    """The ablation switches change the schedule, never the function."""
    q, k, v = _inputs(2, 1000, 1000, 4, 2, 128, torch.bfloat16)
    params = _params(128, causal)
    out, lse = _run_hopper(q, k, v, params, **overrides)
    _check(q, k, v, params, out, lse)


@pytest.mark.parametrize("d,dtype,causal,window,softcap,overrides", [
    (128, torch.bfloat16, False, (-1, -1), 0.0, {}),
    (128, torch.bfloat16, True, (-1, -1), 0.0, {}),
    (64, torch.bfloat16, False, (-1, -1), 0.0, {}),
    (64, torch.float16, True, (-1, -1), 0.0, {}),
    (256, torch.bfloat16, True, (-1, -1), 0.0, {}),
    (96, torch.bfloat16, False, (200, 30), 0.0, {}),
    (128, torch.bfloat16, False, (-1, -1), 30.0, {}),
    (128, torch.bfloat16, True, (-1, -1), 0.0, dict(intra_overlap=False)),
    (128, torch.bfloat16, True, (-1, -1), 0.0, dict(pingpong=2))],
    ids=["d128", "d128-causal", "d64", "d64-fp16-causal", "d256-causal", "d96-window",
         "d128-softcap", "d128-causal-no-overlap", "d128-causal-pingpong"])
def test_row_sum_on_the_tensor_core_is_within_the_rule(d, dtype, causal, window, softcap,
                                                       overrides):
    """FwdConfig.rowsum_mma: l = P · ones by wgmma, summing the rounded P that P·V multiplies.
    out and lse within flash-attn's rule; s_q > s_k under causal leaves rows with no key,
    whose out must be exactly 0 (_check)."""
    q, k, v = _inputs(2, 1100 if causal else 1000, 1000, 4, 2, d, dtype)
    params = _params(d, causal, window, softcap, 1000)
    out, lse = _run_hopper(q, k, v, params, rowsum_mma=True, **overrides)
    _check(q, k, v, params, out, lse)


_THREE_CONSUMERS = dict(consumers=3, block_m=192, consumer_regs=160, maxnreg=128)


@pytest.mark.parametrize("overrides", [_THREE_CONSUMERS,
                                       dict(_THREE_CONSUMERS, block_n=64, num_stages=4)],
                         ids=["bn128", "bn64"])
@pytest.mark.parametrize("causal,window,softcap,shape", [
    (False, (-1, -1), 0.0, (2, 1000, 1000, 4, 2)), (True, (-1, -1), 0.0, (1, 700, 1300, 4, 4)),
    (True, (-1, -1), 0.0, (2, 385, 385, 2, 1)), (False, (100, 30), 0.0, (1, 1000, 800, 2, 2)),
    (False, (-1, -1), 20.0, (1, 193, 500, 2, 2)), (True, (-1, -1), 0.0, (1, 1, 1, 2, 2))],
    ids=["full", "causal_sk_gt_sq", "causal_ragged", "window", "softcap", "one_token"])
def test_three_consumer_warpgroups(overrides, causal, window, softcap, shape):
    """BLOCK_M = 192 as three consumer warpgroups of 64 rows (small head dims)."""
    b, s_q, s_k, h, h_k = shape
    q, k, v = _inputs(b, s_q, s_k, h, h_k, 64, torch.bfloat16)
    params = _params(64, causal, window, softcap, s_k)
    out, lse = _run_hopper(q, k, v, params, **overrides)
    _check(q, k, v, params, out, lse)


def test_strided_inputs_and_persistent_many_tiles():
    """(b, h, s, d) memory viewed as (b, s, h, d), and more tiles than SMs (persistent loop)."""
    d = 128
    q, k, v = (torch.randn(4, 8, 2048, d, device="cuda", dtype=torch.bfloat16).transpose(1, 2)
               for _ in range(3))
    params = _params(d, True)
    out, lse = _run_hopper(q, k, v, params)
    sl = (slice(0, 1), slice(None), slice(0, 2))
    _check(q[sl], k[sl], v[sl], params, out[sl], lse[0:1, 0:2])
    _check(q[3:4, :, 6:8], k[3:4, :, 6:8], v[3:4, :, 6:8], params, out[3:4, :, 6:8],
           lse[3:4, 6:8])


@pytest.mark.parametrize("causal", [False, True])
def test_replayed_launches_match_full_launches(monkeypatch, causal):
    """A repeated call shape replays its launch plan (kernels/launch.py) with the new tensors:
    bitwise the full launch's result, a new plan for new strides, none with the switch off."""
    from flashattn.backends.sm90 import fwd
    from flashattn.runtime import launch

    d, params = 128, _params(128, causal)
    fwd._PLANS.clear()
    runs = [_inputs(2, 700, 900, 4, 2, d, torch.bfloat16) for _ in range(3)]
    # (b, h, s, d) memory viewed as (b, s, h, d): same shape, other strides, so another plan
    runs.append(tuple(torch.randn(2, h, s, d, device="cuda", dtype=torch.bfloat16)
                      .transpose(1, 2) for h, s in ((4, 700), (2, 900), (2, 900))))
    replayed = [_run_hopper(q, k, v, params) for q, k, v in runs]
    assert len(fwd._PLANS._plans) == 2
    set_env(monkeypatch, FLASHATTN_FAST_LAUNCH="0")  # Triton's own launch path, every call
    for (q, k, v), (out, lse) in zip(runs, replayed):
        out_full, lse_full = _run_hopper(q, k, v, params)
        assert torch.equal(out, out_full) and torch.equal(lse, lse_full)
    _check(*runs[1], params, *replayed[1])
    _check(*runs[3], params, *replayed[3])


@pytest.mark.bigmem  # tens of GiB: run alone (gpu_check.sh), not beside other workers
def test_large_offsets():
    """b * h * s_q * d past 2**31 elements: 64-bit offsets in the lse store, TMA for the rest."""
    b, s, h, d = 1, 131072, 128, 128  # 2**31 elements of q
    try:
        q = torch.randn(b, s, h, d, device="cuda", dtype=torch.bfloat16)
    except torch.OutOfMemoryError:
        pytest.skip("not enough GPU memory")
    k = torch.randn(b, 256, 1, d, device="cuda", dtype=torch.bfloat16)
    v = torch.randn_like(k)
    params = _params(d, False)
    out, lse = _run_hopper(q, k, v, params)
    rows = slice(s - 300, s)
    for hh in (0, h - 1):
        _check(q[:, rows, hh:hh + 1], k, v, params, out[:, rows, hh:hh + 1],
               lse[:, hh:hh + 1, rows])
    del q, out


_MIXED = [((192, 128), False, (2, 600, 600, 4, 2)), ((192, 128), True, (1, 700, 1300, 4, 1)),
          ((128, 64), True, (2, 385, 385, 2, 2)), ((64, 128), False, (1, 257, 771, 4, 2)),
          ((128, 256), True, (1, 300, 300, 2, 2)), ((256, 192), False, (1, 500, 200, 2, 1))]


@pytest.mark.parametrize("dims,causal,shape", _MIXED,
                         ids=[f"d{d[0]}x{d[1]}-{'causal' if c else 'full'}-"
                              f"b{s[0]}s{s[1]}x{s[2]}h{s[3]}k{s[4]}" for d, c, s in _MIXED])
def test_mixed_head_dims(dims, causal, shape):
    """head_dim_v != head_dim (192 / 128 is DeepSeek's MLA prefill): V and O boxes of their own
    width, O in its own shared-memory slot when the padded widths differ."""
    (d, d_v), (b, s_q, s_k, h, h_k) = dims, shape
    q = torch.randn(b, s_q, h, d, device="cuda", dtype=torch.bfloat16)
    k = torch.randn(b, s_k, h_k, d, device="cuda", dtype=torch.bfloat16)
    v = torch.randn(b, s_k, h_k, d_v, device="cuda", dtype=torch.bfloat16)
    params = _params(d, causal)
    out, lse = _run_hopper(q, k, v, params)
    _check(q, k, v, params, out, lse)


def test_mixed_head_dims_end_to_end(monkeypatch):
    """A 192 / 128 call runs the Hopper forward and the portable backward (fed the Hopper
    lse)."""
    set_env(monkeypatch, FLASHATTN_BACKEND="hopper")
    set_env(monkeypatch, FLASHATTN_AUTOTUNE="0")
    b, s, h = 1, 600, 4
    q = torch.randn(b, s, h, 192, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    k = torch.randn(b, s, h, 192, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    v = torch.randn(b, s, h, 128, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    assert dispatch_select.forward_family(q, k, v, **_params(192, True)) == "hopper"
    out = flash_attn_func(q, k, v, causal=True)
    g = torch.randn_like(out)
    grads = torch.autograd.grad(out, (q, k, v), g)
    assert_attention_close(q, k, v, out, g, grads, window_size=(-1, 0))


# ---------------------------------------------------------------------------------------------
# Dispatch on sm90: covered calls take the Hopper forward, the rest fall back (never wrong)
# ---------------------------------------------------------------------------------------------
def test_dispatch_picks_hopper(monkeypatch):
    set_env(monkeypatch, FLASHATTN_BACKEND=None)
    q, k, v = _inputs(2, 300, 300, 4, 2, 128, torch.bfloat16)
    assert dispatch_select.family_for(q) == "hopper"
    # auto keeps short key lengths on the portable kernels (measured faster there)
    assert dispatch_select.forward_family(q, k, v, **_params(128, True)) == "portable"
    q_long, k_long, v_long = _inputs(1, 300, 4096, 4, 2, 128, torch.bfloat16)
    assert dispatch_select.forward_family(q_long, k_long, v_long, **_params(128, True)) == "hopper"
    set_env(monkeypatch, FLASHATTN_BACKEND="hopper")
    assert dispatch_select.forward_family(q, k, v, **_params(128, True)) == "hopper"
    set_env(monkeypatch, FLASHATTN_BACKEND="portable")
    assert dispatch_select.family_for(q) == "portable"
    assert dispatch_select.forward_family(q, k, v, **_params(128, True)) == "portable"


@pytest.mark.parametrize("backend", ["auto", "hopper"])
def test_end_to_end_with_portable_backward(monkeypatch, backend):
    """flash_attn_func on sm90: Hopper forward, portable backward fed the Hopper lse."""
    set_env(monkeypatch, FLASHATTN_BACKEND=backend)
    set_env(monkeypatch, FLASHATTN_AUTOTUNE="0")
    from flashattn.backends.sm90 import support
    monkeypatch.setattr(support, "MIN_SEQLEN_K_MASKED", 0)  # auto: take Hopper at this small size
    b, s, h, h_k, d = 2, 700, 4, 2, 128
    q, k, v = (x.requires_grad_() for x in _inputs(b, s, s, h, h_k, d, torch.bfloat16))
    assert dispatch_select.forward_family(q, k, v, **_params(d, True)) == "hopper"
    out, lse, _ = flash_attn_func(q, k, v, causal=True, return_attn_probs=True)
    g = torch.randn_like(out)
    grads = torch.autograd.grad(out, (q, k, v), g)
    assert_attention_close(q, k, v, out, g, grads, lse=lse, window_size=(-1, 0))


_FALLBACKS = {
    "dropout": dict(dropout_p=0.1),
    "alibi": dict(alibi=True),
    "fp32": dict(dtype=torch.float32),
    "d80": dict(d=80),
    "dv_not_a_hopper_dim": dict(d_v=80),  # d != d_v is covered when both are Hopper dims
    "unaligned_stride": dict(unaligned=True),
    "return_softmax": dict(return_softmax=True),
}


@pytest.mark.parametrize("what", list(_FALLBACKS))
def test_uncovered_calls_fall_back(monkeypatch, what):
    set_env(monkeypatch, FLASHATTN_BACKEND="hopper")
    set_env(monkeypatch, FLASHATTN_AUTOTUNE="0")
    opt = _FALLBACKS[what]
    d = opt.get("d", 128)
    dtype = opt.get("dtype", torch.bfloat16)
    b, s, h = 1, 200, 2
    if opt.get("unaligned"):
        # row stride of h * (d + 1) elements: not a multiple of 16 bytes
        base = torch.randn(b, s, h, d + 1, device="cuda", dtype=dtype)
        q = base[..., :d]
        k = torch.randn(b, s, h, d, device="cuda", dtype=dtype)
        v = torch.randn_like(k)
    else:
        q, k, _ = _inputs(b, s, s, h, h, d, dtype)
        v = torch.randn(b, s, h, opt.get("d_v", d), device="cuda", dtype=dtype)
    params = _params(d, True)
    params["dropout_p"] = opt.get("dropout_p", 0.0)
    params["return_softmax"] = opt.get("return_softmax", False)
    slopes = torch.rand(h, device="cuda") if opt.get("alibi") else None
    params["alibi_slopes"] = slopes
    assert dispatch_select.forward_family(q, k, v, **params) == "portable"
    if params["dropout_p"]:
        return  # the dropout path itself is tested in test_attention.py
    out, lse, _ = flash_attn_func(q, k, v, causal=True, alibi_slopes=slopes,
                                  return_attn_probs=True)
    ref_kw = dict(window_size=(-1, 0), alibi_slopes=slopes)
    out_ref, lse_ref = attention_ref(q.double(), k.double(), v.double(), **ref_kw)
    out_lp, _ = attention_ref(q, k, v, upcast=False, **ref_kw)
    assert_close_rule(out, out_ref, out_lp, name="out")


@pytest.mark.parametrize("d,dtype,shape,causal,window", [
    (64, torch.bfloat16, (2, 1000, 1000, 4, 2), True, (-1, -1)),
    (64, torch.float16, (1, 4096, 4096, 2, 2), True, (-1, -1)),  # 4096 = 21 1/3 tiles of 192
    (128, torch.bfloat16, (1, 777, 1100, 4, 4), True, (-1, -1)),  # s_q < s_k
    (128, torch.bfloat16, (2, 700, 300, 2, 1), True, (-1, -1)),  # rows that see no key
    (96, torch.bfloat16, (1, 900, 900, 4, 2), False, (128, 16)),
    (64, torch.bfloat16, (1, 1, 513, 2, 2), True, (-1, -1)),  # one row: a tile of 191 < 0
], ids=["d64-1000", "d64-4096-fp16", "d128-sq<sk", "d128-sq>sk", "d96-window", "d64-one-row"])
def test_bottom_aligned_tiles_are_bitwise_the_top_aligned_ones(d, dtype, shape, causal, window):
    """BOTTOM_ALIGN (FwdConfig.bottom_align) regroups the query rows into tiles that end at
    seqlen_q. Each row still visits its key blocks in the same order, and the blocks a tile
    adds are fully masked for that row (p = 0, alpha = 1), so out and lse are bitwise those of
    the top-aligned tiles; both within the rule; the rows of the first tile that lie before 0
    are neither stored nor written to the LSE (NaN-poisoned memory would show)."""
    b, s_q, s_k, h, h_k = shape
    q, k, v = _inputs(b, s_q, s_k, h, h_k, d, dtype)
    params = _params(d, causal, window, 0.0, s_k)
    out, lse = _run_hopper(q, k, v, params)
    out_top, lse_top = _run_hopper(q, k, v, params, bottom_align=False)
    assert torch.equal(out, out_top) and torch.equal(lse, lse_top)
    _check(q, k, v, params, out, lse)
