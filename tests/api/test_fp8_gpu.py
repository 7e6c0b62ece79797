"""FP8 attention on the GPU: the Gluon FP8 kernel (sm90) and the portable FP8 kernel against
FA3's numerics, FA3's descale API, varlen, the fused quantize pass, and the accuracy targets
of the FP8 work on the FA3 paper's input distribution.

Criterion (the oracle is ``reference.attention_fp8_ref`` in float64 over the same fp8 values):
the kernel's RMSE against exact attention of the dequantized values is at most twice the RMSE
that rounding P to e4m3 the way FA3 does (x 2^8) costs the oracle, plus the bf16 output's own
rounding.
"""
from __future__ import annotations

import pytest
import torch

import flashattn
from flashattn import fp8
from flashattn.dispatch import select as dispatch_select
from flashattn.replay import fp8 as replay_fp8
from flashattn.reference import attention_fp8_ref, attention_ref

pytestmark = pytest.mark.gpu
if not torch.cuda.is_available():
    pytestmark = [pytest.mark.gpu, pytest.mark.skip(reason="needs CUDA")]


def _hopper() -> bool:
    from flashattn.backends.sm90.support import device_unavailable

    return torch.cuda.is_available() and device_unavailable(torch.device("cuda")) is None


def _rmse(a, b) -> float:
    return (a.double() - b.double()).pow(2).mean().sqrt().item()


def _bf16_rounding(x) -> float:
    return _rmse(x.bfloat16(), x)


def _quantized(b, s_q, s_k, h, h_k, d, d_v, seed=0, dist="normal"):
    g = torch.Generator(device="cuda").manual_seed(seed)
    shapes = ((b, s_q, h, d), (b, s_k, h_k, d), (b, s_k, h_k, d_v))
    xs = []
    for shape in shapes:
        x = torch.randn(shape, device="cuda", generator=g)
        if dist == "outliers":
            x = x + torch.randn(shape, device="cuda", generator=g) * 10 * (
                torch.rand(shape, device="cuda", generator=g) < 1e-3)
        xs.append(x.bfloat16())
    return xs, fp8.quantize(*xs, seed=seed)


def _check(r, out, causal, window, softcap):
    args = (r.q, r.k, r.v, r.q_descale, r.k_descale, r.v_descale, r.block_m, r.block_n)
    kw = dict(causal=causal, window_size=window, softcap=softcap)
    exact = attention_fp8_ref(*args, **kw, p_scale=None)
    p_rounded = attention_fp8_ref(*args, **kw)
    allowed = 2 * _rmse(p_rounded, exact) + 2 * _bf16_rounding(exact)
    err = _rmse(out, exact)
    assert err <= allowed, f"rmse {err:.3e} > allowed {allowed:.3e}"


CASES = [(False, (-1, -1), 0.0), (True, (-1, -1), 0.0), (False, (300, 40), 0.0),
         (True, (-1, -1), 20.0)]


@pytest.mark.parametrize("backend", ["auto", "portable"])
@pytest.mark.parametrize("dims", [(64, 64), (96, 96), (128, 128), (192, 192), (256, 256),
                                  (192, 128)])
@pytest.mark.parametrize("causal,window,softcap", CASES)
def test_fp8_forward_matches_fa3_numerics(backend, dims, causal, window, softcap):
    d, d_v = dims
    b, s_q, s_k, h, h_k = 2, 1000, 1100, 4, 2
    _, r = _quantized(b, s_q, s_k, h, h_k, d, d_v)
    expected = "hopper" if backend == "auto" and _hopper() else "portable"
    from flashattn.api.normalise import window as norm_window
    from flashattn.params import AttnParams, Fp8Scales
    left, right = norm_window(*window, causal, s_k)
    params = AttnParams(d ** -0.5, causal, left, right, softcap, None, 0.0, 0)
    scales = Fp8Scales(r.q_descale, r.k_descale, r.v_descale, 7, 7)
    with flashattn.use_backend(backend):
        assert dispatch_select.select("fp8_fwd", r.q, r.k, r.v, params, scales=scales) == expected
        out, lse = fp8.attention(r, causal=causal, window_size=window, softcap=softcap,
                                 return_lse=True)
    assert out.dtype == torch.bfloat16 and out.shape == (b, s_q, h, d_v)
    _check(r, out.float(), causal, window, softcap)
    assert torch.isfinite(lse).all()


@pytest.mark.parametrize("d", [64, 128, 256])
def test_float32_output(d):
    """out_dtype=float32 through fp8.attention and FA3's API, and flash_attn_fp8_func on
    float32 inputs: the Hopper FP8 kernel writes O in fp32 where its shared memory allows it
    (d <= 128 here; d = 256's fp32 O slot does not fit beside its tiles: the portable kernel),
    with FA3's numerics. On the Hopper kernel the bf16 output is the fp32 one rounded."""
    from flashattn.api import fastpath
    from flashattn.params import AttnParams, Fp8Scales

    b, s, h, h_k = 1, 1000, 4, 2
    xs, r = _quantized(b, s, s, h, h_k, d, d)
    params = AttnParams(d ** -0.5, True, -1, 0, 0.0, None, 0.0, 0)
    scales = Fp8Scales(r.q_descale, r.k_descale, r.v_descale, 7, 7)
    hopper = _hopper() and d <= 128
    assert dispatch_select.select("fp8_fwd", r.q, r.k, r.v, params, scales=scales,
                           out_dtype=torch.float32) == ("hopper" if hopper else "portable")
    out32 = fp8.attention(r, causal=True, out_dtype=torch.float32)
    out16 = fp8.attention(r, causal=True)
    assert out32.dtype == torch.float32 and out16.dtype == torch.bfloat16
    _check(r, out32, True, (-1, -1), 0.0)
    if hopper:
        assert torch.equal(out32.bfloat16(), out16)
    fa3_32 = flashattn.flash_attn_func(r.q, r.k, r.v, causal=True, out_dtype=torch.float32)
    fa3_16 = flashattn.flash_attn_func(r.q, r.k, r.v, causal=True)
    assert fa3_32.dtype == torch.float32 and torch.isfinite(fa3_32).all()
    if hopper:
        assert torch.equal(fa3_32.bfloat16(), fa3_16)
    q, k, v = (x.float() for x in xs)
    fastpath.FP8.clear()
    for _ in range(2):  # (the first call records, the second replays)
        got = fp8.flash_attn_fp8_func(q, k, v, causal=True, seed=0)
        assert got.dtype == torch.float32
        assert torch.equal(got, _full_path(q, k, v, True, (-1, -1), 0)[0])
    fastpath.FP8.clear()


@pytest.mark.parametrize("backend", ["auto", "portable"])
def test_fa3_descale_api_and_v_layout(backend):
    """FA3's flash_attn_func(fp8 q, k, v, q/k/v_descale (b, h_k)) with V in its own layout
    (transposed for the FP8 wgmma inside the call) against exact attention of fp8 x descale."""
    torch.manual_seed(0)
    b, s, h, h_k, d = 2, 2048, 8, 2, 128
    q8, k8, v8 = ((torch.randn(b, s, hh, d, device="cuda") * 4).to(torch.float8_e4m3fn)
                  for hh in (h, h_k, h_k))
    qd, kd, vd = (torch.rand(b, h_k, device="cuda") * 0.1 + 0.01 for _ in range(3))
    with flashattn.use_backend(backend):
        out = flashattn.flash_attn_func(q8, k8, v8, causal=True, q_descale=qd, k_descale=kd,
                                        v_descale=vd)
    tables = (qd.repeat_interleave(h // h_k, 1)[..., None].cpu(), kd[..., None].cpu(),
              vd[..., None].cpu())
    args = (q8.cpu(), k8.cpu(), v8.cpu(), *tables, s, s)
    exact = attention_fp8_ref(*args, causal=True, p_scale=None)
    allowed = 2 * _rmse(attention_fp8_ref(*args, causal=True), exact) + 2 * _bf16_rounding(exact)
    assert _rmse(out.float().cpu(), exact) <= allowed


@pytest.mark.parametrize("d,s_k,block_n", [(128, 1100, 128), (64, 777, 128), (256, 300, 128),
                                            (128, 500, 32)])
def test_flash_attn_fp8_func_writes_v_in_kernel_order(d, s_k, block_n):
    """On the Hopper kernels flash_attn_fp8_func's quantize writes V in their key order (no
    permuting pass): the output is bitwise that of fp8.attention over fp8.quantize (V in key
    order, permuted inside the forward). block_n 32 is not a Hopper kv block: the portable
    kernel runs it, on V handed back in key order."""
    xs, _ = _quantized(2, 900, s_k, 4, 2, d, d)
    for causal in (False, True):
        want = fp8.attention(fp8.quantize(*xs, seed=0, block_n=block_n), causal=causal,
                             out_dtype=torch.bfloat16)
        got = fp8.flash_attn_fp8_func(*xs, causal=causal, seed=0, block_n=block_n)
        assert torch.equal(got, want)


def test_kv_scale_blocks_below_the_smallest_key_tile_are_refused():
    """One V descale per key tile: scale blocks of fewer keys than the GPU's smallest FP8 dot K
    (32) would straddle tiles; they raise, naming block_n (before: a compile error at 16,
    silently mis-scaled below)."""
    xs, _ = _quantized(1, 100, 100, 2, 2, 64, 64)
    for block_n in (16, 8):
        with pytest.raises(ValueError, match="block_n"):
            fp8.attention(fp8.quantize(*xs, seed=0, block_n=block_n))
        with pytest.raises(ValueError, match="block_n"):
            fp8.flash_attn_fp8_func(*xs, seed=0, block_n=block_n)


def test_varlen_fp8_gpu():
    torch.manual_seed(1)
    lens = [300, 0, 1000, 17]
    h, h_k, d = 4, 2, 64
    cu = torch.tensor([0, 300, 300, 1300, 1317], dtype=torch.int32, device="cuda")
    q8, k8, v8 = ((torch.randn(1317, hh, d, device="cuda") * 3).to(torch.float8_e4m3fn)
                  for hh in (h, h_k, h_k))
    qd, kd, vd = (torch.rand(4, h_k, device="cuda") + 0.1 for _ in range(3))
    out = flashattn.flash_attn_varlen_func(q8, k8, v8, cu, cu, 1000, 1000, causal=True,
                                           q_descale=qd, k_descale=kd, v_descale=vd,
                                           out_dtype=torch.float32)
    for i, n in enumerate(lens):
        if n == 0:
            continue
        sl = slice(int(cu[i]), int(cu[i + 1]))
        tables = (qd[i:i + 1].repeat_interleave(h // h_k, 1)[..., None].cpu(),
                  kd[i:i + 1, :, None].cpu(), vd[i:i + 1, :, None].cpu())
        args = (q8[sl][None].cpu(), k8[sl][None].cpu(), v8[sl][None].cpu(), *tables, n, n)
        exact = attention_fp8_ref(*args, causal=True, p_scale=None)[0]
        allowed = 2 * _rmse(attention_fp8_ref(*args, causal=True)[0], exact) + 1e-6
        assert _rmse(out[sl].cpu(), exact) <= allowed


@pytest.mark.parametrize("s_q,s_k,chunk,causal", [(1024, 1024, 256, True), (1024, 1024, 300, True),
                                                (113, 203, 57, False), (640, 128, 100, True)])
@pytest.mark.parametrize("backend", ["auto", "portable"])
def test_fa3_fp8_attention_chunk_gpu(backend, s_q, s_k, chunk, causal):
    """FA3's dense FP8 call with attention_chunk (its tests draw one): a chunk dividing equal
    lengths runs the dense FP8 kernels over b * s / chunk sequences, other shapes the FP8
    varlen kernel over segments; both keep FA3's numerics under the chunk mask."""
    from flashattn import fa3
    torch.manual_seed(3)
    b, h, h_k, d = 3, 6, 2, 128
    q8, k8, v8 = ((torch.randn(b, s, hh, d, device="cuda") * 3).to(torch.float8_e4m3fn)
                  for s, hh in ((s_q, h), (s_k, h_k), (s_k, h_k)))
    qd, kd, vd = (torch.rand(b, h_k, device="cuda") + 0.1 for _ in range(3))
    with flashattn.use_backend(backend):
        out, lse = fa3.flash_attn_func(q8, k8, v8, causal=causal, attention_chunk=chunk,
                                       q_descale=qd, k_descale=kd, v_descale=vd,
                                       return_attn_probs=True)
    assert lse.shape == (b, h, s_q)
    tables = (qd.repeat_interleave(h // h_k, 1)[..., None].cpu(), kd[..., None].cpu(),
              vd[..., None].cpu())
    args = (q8.cpu(), k8.cpu(), v8.cpu(), *tables, s_q, s_k)
    exact = attention_fp8_ref(*args, causal=causal, p_scale=None, attention_chunk=chunk)
    rounded = attention_fp8_ref(*args, causal=causal, attention_chunk=chunk)
    allowed = 2 * _rmse(rounded, exact) + 2 * _bf16_rounding(exact)
    assert _rmse(out.float().cpu(), exact) <= allowed


def test_varlen_fp8_seqused_q_and_chunk_gpu():
    """FA3's varlen FP8 call with seqused_q / seqused_k (its add_unused_qkv cases) and a
    chunk: each sequence's used rows against its used keys, by FA3's numerics; rows past
    seqused_q are 0."""
    torch.manual_seed(4)
    lens_q, lens_k = [300, 64, 1000, 17], [300, 500, 1000, 40]
    used_q, used_k = [250, 0, 1000, 17], [300, 400, 900, 0]
    h, h_k, d = 6, 1, 128
    cu = (lambda ls: torch.tensor([0, *torch.tensor(ls).cumsum(0).tolist()],
                                  dtype=torch.int32, device="cuda"))
    cu_q, cu_k = cu(lens_q), cu(lens_k)
    q8 = (torch.randn(sum(lens_q), h, d, device="cuda") * 3).to(torch.float8_e4m3fn)
    k8, v8 = ((torch.randn(sum(lens_k), h_k, d, device="cuda") * 3).to(torch.float8_e4m3fn)
              for _ in range(2))
    qd, kd, vd = (torch.rand(4, h_k, device="cuda") + 0.1 for _ in range(3))
    for chunk in (0, 128):
        out = flashattn.flash_attn_varlen_func(
            q8, k8, v8, cu_q, cu_k, 1000, 1000, causal=True, q_descale=qd, k_descale=kd,
            v_descale=vd, out_dtype=torch.float32, attention_chunk=chunk,
            seqused_q=torch.tensor(used_q, dtype=torch.int32, device="cuda"),
            seqused_k=torch.tensor(used_k, dtype=torch.int32, device="cuda"))
        for i in range(4):
            q0, k0 = int(cu_q[i]), int(cu_k[i])
            assert not out[q0 + used_q[i]:int(cu_q[i + 1])].any(), f"rows past seqused_q {i}"
            rows, keys = slice(q0, q0 + used_q[i]), slice(k0, k0 + used_k[i])
            if used_q[i] == 0:
                continue
            if used_k[i] == 0:
                assert not out[rows].any()
                continue
            tables = (qd[i:i + 1].repeat_interleave(h // h_k, 1)[..., None].cpu(),
                      kd[i:i + 1, :, None].cpu(), vd[i:i + 1, :, None].cpu())
            args = (q8[rows][None].cpu(), k8[keys][None].cpu(), v8[keys][None].cpu(), *tables,
                    used_q[i], used_k[i])
            exact = attention_fp8_ref(*args, causal=True, p_scale=None,
                                      attention_chunk=chunk)[0]
            allowed = 2 * _rmse(attention_fp8_ref(*args, causal=True,
                                                  attention_chunk=chunk)[0], exact) + 1e-6
            assert _rmse(out[rows].cpu(), exact) <= allowed, f"chunk {chunk}, sequence {i}"


@pytest.mark.parametrize("d,d_v", [(128, 96), (96, 96), (192, 192), (192, 128)])
def test_quantize_pass_gpu_matches_cpu_semantics(d, d_v):
    """The pass on the GPU against cpu/fp8.py; d = 96 / 192 take the three-chunk rotation."""
    torch.manual_seed(2)
    q = torch.randn(2, 1000, 8, d).bfloat16()
    k = torch.randn(2, 1000, 2, d).bfloat16()
    v = torch.randn(2, 1000, 2, d_v).bfloat16()
    with flashattn.use_backend("cpu"):
        a = fp8.quantize(q, k, v, seed=3)
    c = fp8.quantize(q.cuda(), k.cuda(), v.cuda(), seed=3)
    assert c.v.stride(1) == 1
    for x, y in zip(a[:3], c[:3]):
        assert (x.float() != y.float().cpu()).float().mean().item() < 1e-3
    for x, y in zip(a[3:6], c[3:6]):
        # (the tensor-core rotation sums in another order than the CPU: descales to a few ulp)
        torch.testing.assert_close(x, y.cpu(), atol=0, rtol=1e-6)


@pytest.mark.parametrize("d,dtype,block_m,block_n", [
    (128, torch.bfloat16, 128, 256), (256, torch.bfloat16, 256, 256),
    (192, torch.bfloat16, 256, 128), (256, torch.float32, 128, 128),
    (128, torch.bfloat16, 1024, 4096), (64, torch.bfloat16, 2 ** 20, 2 ** 20)])
def test_quantize_blocks_past_the_default_and_float32_inputs(d, dtype, block_m, block_n):
    """Scale blocks of 256 rows and float32 d = 256 inputs asked the fused pass for more
    shared memory than an SM has (240-409 KB with 3 stages: OutOfResources); they now run one
    stage. Blocks past fp8_format.PASS_MAX_BLOCK (up to one per head) take the torch ops on the
    GPU. All against cpu/fp8.py, and the attention over them within the numerics rule."""
    torch.manual_seed(6)
    q = torch.randn(1, 700, 4, d).to(dtype)
    k, v = (torch.randn(1, 700, 2, d).to(dtype) for _ in range(2))
    with flashattn.use_backend("cpu"):
        a = fp8.quantize(q, k, v, seed=3, block_m=block_m, block_n=block_n)
    c = fp8.quantize(q.cuda(), k.cuda(), v.cuda(), seed=3, block_m=block_m, block_n=block_n)
    for x, y in zip(a[:3], c[:3]):
        assert (x.float() != y.float().cpu()).float().mean().item() < 1e-3
    for x, y in zip(a[3:6], c[3:6]):
        torch.testing.assert_close(x, y.cpu(), atol=0, rtol=1e-6)
    out = fp8.attention(c, causal=True)
    _check(c, out.float(), True, (-1, -1), 0.0)


@pytest.mark.parametrize("d", [64, 128, 256])
def test_accuracy_targets_on_the_papers_distribution(d):
    """N(0,1) + N(0,100)·Bernoulli(0.001), b=1, h=16, s=4k: the full method (block scales +
    incoherent processing) against a per-tensor FP8 baseline and bf16. Asserted: at d >= 128
    RMSE <= 9e-3 (the issue's target; FA3 paper 9.1e-3), the gain over the baseline >= 2x at
    this length (the measured gain grows with s: benchmarks/NOTES.md), bf16 far below both."""
    b, s, h = 1, 4096, 16
    (q, k, v), r = _quantized(b, s, s, h, h, d, d, seed=5, dist="outliers")
    exact = torch.cat([attention_ref(q[:, :, i:i + 1].double(), k[:, :, i:i + 1].double(),
                                     v[:, :, i:i + 1].double())[0] for i in range(h)], dim=2)
    full = fp8.attention(r)
    # baseline: one scale per tensor, no rotation, through FA3's descale API
    amax = [x.float().abs().amax() / 448.0 for x in (q, k, v)]
    x8 = [(x.float() / a).to(torch.float8_e4m3fn) for x, a in zip((q, k, v), amax)]
    descales = [a.expand(b, h).contiguous() for a in amax]
    base = flashattn.flash_attn_func(*x8, q_descale=descales[0], k_descale=descales[1],
                                     v_descale=descales[2])
    bf16 = flashattn.flash_attn_func(q, k, v)
    e_full, e_base, e_bf16 = _rmse(full, exact), _rmse(base, exact), _rmse(bf16, exact)
    print(f"d={d}: bf16 {e_bf16:.2e}, fp8 per-tensor {e_base:.2e}, full {e_full:.2e}, "
          f"gain {e_base / e_full:.2f}")
    assert e_bf16 < e_full / 3
    assert e_base / e_full >= 2.0
    if d >= 128:
        assert e_full <= 9e-3


@pytest.mark.skipif(not _hopper(), reason="the Gluon FP8 kernel needs an sm90 GPU")
@pytest.mark.parametrize("d,causal,window,softcap", [
    (128, False, (-1, -1), 0.0), (128, True, (-1, -1), 0.0), (64, False, (-1, -1), 0.0),
    (64, True, (-1, -1), 0.0), (256, False, (-1, -1), 0.0), (256, True, (-1, -1), 0.0),
    (128, False, (300, 40), 0.0), (128, True, (-1, -1), 20.0)])
def test_row_sum_on_the_tensor_core_keeps_fa3_numerics(d, causal, window, softcap):
    """FwdConfig.rowsum_mma: l = P · ones by wgmma (the same e4m3 P that P·V multiplies)
    instead of the fp32 sum. Same criterion as the shipped kernel; causal with s_q > s_k
    leaves the first rows with no key: out 0 and lse -inf there."""
    from flashattn.api.normalise import window as norm_window
    from flashattn.params import Fp8Scales
    from flashattn.backends.sm90.fwd import flash_fwd_hopper_fp8

    b, s_q, s_k, h, h_k = 2, 1100 if causal else 1000, 1000, 4, 2
    _, r = _quantized(b, s_q, s_k, h, h_k, d, d, seed=3)
    scales = Fp8Scales(r.q_descale, r.k_descale, r.v_descale, r.block_m.bit_length() - 1,
                       r.block_n.bit_length() - 1)
    left, right = norm_window(*window, causal, s_k)
    out, lse = flash_fwd_hopper_fp8(r.q, r.k, r.v, scales, softmax_scale=d ** -0.5,
                                    window_left=left, window_right=right, softcap=softcap,
                                    out_dtype=torch.bfloat16,
                                    config_overrides=dict(rowsum_mma=True))
    _check(r, out.float(), causal, window, softcap)
    if causal:
        assert (out[:, :s_q - s_k] == 0).all()
        assert (lse[:, :, :s_q - s_k] == float("-inf")).all()
        assert torch.isfinite(lse[:, :, s_q - s_k:]).all()
    else:
        assert torch.isfinite(lse).all()


# the recorded call of flash_attn_fp8_func (replay_fp8.Fp8Call): shapes interleaved so that one
# signature's workspace is written by another's between its calls; windows and causal use the
# tile queue's counter; s_k not a multiple of 32 leaves V^T padding positions
_RECORDED_SHAPES = [
    dict(b=2, s_q=900, s_k=1100, h=4, h_k=2, d=128, causal=True, window_size=(-1, -1)),
    dict(b=1, s_q=777, s_k=777, h=4, h_k=4, d=64, causal=False, window_size=(-1, -1)),
    dict(b=2, s_q=300, s_k=301, h=2, h_k=1, d=256, causal=True, window_size=(-1, -1)),
    dict(b=1, s_q=1000, s_k=1000, h=4, h_k=2, d=128, causal=False, window_size=(200, 30)),
]


def _full_path(q, k, v, causal, window_size, seed):
    """flash_attn_fp8_func's semantics through the public two-step route (V in key order,
    permuted inside the forward): (out, lse)."""
    return fp8.attention(fp8.quantize(q, k, v, seed=seed), causal=causal,
                         window_size=window_size, out_dtype=q.dtype, return_lse=True)


def test_recorded_fp8_call_matches_the_full_path():
    """Repeated flash_attn_fp8_func signatures replay the recorded call (Hopper: quantize pass
    and FP8 forward from their launch plans, outputs in a reused workspace): every call,
    with and without the LSE, is bitwise the two-step route's result, and outputs returned
    earlier stay intact after later calls."""
    from flashattn.dispatch import select as dispatch_select
    from flashattn.replay import fp8 as replay_fp8
    from flashattn.api import fastpath

    fastpath.FP8.clear()
    kept = []
    for rnd in range(3):
        for i, sh in enumerate(_RECORDED_SHAPES):
            xs, _ = _quantized(sh["b"], sh["s_q"], sh["s_k"], sh["h"], sh["h_k"], sh["d"],
                               sh["d"], seed=10 * rnd + i)
            want, want_lse = _full_path(*xs, sh["causal"], sh["window_size"], 5)
            for return_lse in (False, True):
                got = fp8.flash_attn_fp8_func(*xs, causal=sh["causal"],
                                              window_size=sh["window_size"], seed=5,
                                              return_lse=return_lse)
                if return_lse:
                    got, lse = got
                    assert torch.equal(lse, want_lse), (rnd, i)
                assert torch.equal(got, want), (rnd, i, return_lse)
            kept.append((got, want))
    for got, want in kept:
        assert torch.equal(got, want)
    runs = [entry[1] for entry in fastpath.FP8._entries.values()]
    assert len(runs) == 2 * len(_RECORDED_SHAPES)
    if _hopper():
        assert all(isinstance(r, replay_fp8.Fp8Call) and r._recorded for r in runs)
    fastpath.FP8.clear()


def test_recorded_fp8_call_on_two_streams_and_in_a_cuda_graph():
    """The workspace is per (stream, thread): a call on a side stream runs beside one on the
    main stream without sharing it. Under CUDA-graph capture the call takes fresh memory from
    the graph's pool; replays after new inputs are copied in match eager calls, and eager
    calls between replays do not disturb them."""
    from flashattn.api import fastpath

    fastpath.FP8.clear()
    args = dict(causal=True, seed=0)
    (q, k, v), _ = _quantized(1, 1024, 1024, 4, 2, 128, 128, seed=1)
    (q2, k2, v2), _ = _quantized(1, 1024, 1024, 4, 2, 128, 128, seed=2)
    want1 = _full_path(q, k, v, True, (-1, -1), 0)[0]
    want2 = _full_path(q2, k2, v2, True, (-1, -1), 0)[0]
    for _ in range(2):
        assert torch.equal(fp8.flash_attn_fp8_func(q, k, v, **args), want1)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        got_side = fp8.flash_attn_fp8_func(q2, k2, v2, **args)
    got_main = fp8.flash_attn_fp8_func(q, k, v, **args)
    torch.cuda.synchronize()
    assert torch.equal(got_side, want2) and torch.equal(got_main, want1)

    sq, sk, sv = q.clone(), k.clone(), v.clone()
    warm = torch.cuda.Stream()
    warm.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(warm):
        fp8.flash_attn_fp8_func(sq, sk, sv, **args)
    torch.cuda.current_stream().wait_stream(warm)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        g_out = fp8.flash_attn_fp8_func(sq, sk, sv, **args)
    for (a, b_, c), want in (((q2, k2, v2), want2), ((q, k, v), want1)):
        sq.copy_(a), sk.copy_(b_), sv.copy_(c)
        graph.replay()
        eager = fp8.flash_attn_fp8_func(q2, k2, v2, **args)  # between replays
        torch.cuda.synchronize()
        assert torch.equal(g_out, want) and torch.equal(eager, want2)
    fastpath.FP8.clear()


# the recorded call of FA3's FP8 API (replay_fp8.Fp8DescaleCall): descales given or None, a GQA
# group (q's table copied per query head), a non-contiguous descale (copied), V in FA3's layout
# or with its keys contiguous, the long causal tiles (4096 keys), a window
_FA3_RECORDED = [
    dict(b=2, s_q=900, s_k=1100, h=4, h_k=2, d=128, causal=True, window_size=(-1, -1),
         given="qkv"),
    dict(b=1, s_q=777, s_k=777, h=4, h_k=4, d=64, causal=False, window_size=(-1, -1),
         given=""),
    dict(b=2, s_q=300, s_k=301, h=2, h_k=1, d=256, causal=True, window_size=(-1, -1),
         given="qk", strided=True),
    dict(b=1, s_q=4096, s_k=4096, h=4, h_k=2, d=128, causal=True, window_size=(-1, -1),
         given="qkv", v_keys_contiguous=True),
    dict(b=1, s_q=1000, s_k=1000, h=4, h_k=2, d=192, causal=False, window_size=(200, 30),
         given="v"),
]


def _fa3_inputs(sh, seed):
    g = torch.Generator(device="cuda").manual_seed(seed)
    q8, k8, v8 = ((torch.randn(sh["b"], s, hh, sh["d"], device="cuda", generator=g) * 3)
                  .to(torch.float8_e4m3fn) for s, hh in ((sh["s_q"], sh["h"]),
                                                          (sh["s_k"], sh["h_k"]),
                                                          (sh["s_k"], sh["h_k"])))
    if sh.get("v_keys_contiguous"):
        v8 = v8.transpose(1, 3).contiguous().transpose(1, 3)
    ds = []
    for name in "qkv":
        x = torch.rand(sh["b"], sh["h_k"], device="cuda", generator=g) * 0.1 + 0.01
        if sh.get("strided"):
            x = torch.rand(sh["h_k"], sh["b"], device="cuda", generator=g).t() * 0.1 + 0.01
        ds.append(x if name in sh["given"] else None)
    return (q8, k8, v8), dict(q_descale=ds[0], k_descale=ds[1], v_descale=ds[2])


def _recorded_equals_full_path(monkeypatch, key_name, cache, rounds):
    """Every call of ``rounds`` (lists of zero-argument calls, one per signature, the same
    signatures each round) is bitwise the full path's (``fastpath.<key_name>`` giving no
    signature), results returned earlier stay intact after later calls, and on Hopper every
    signature's entry is a recorded replay_fp8.Fp8DescaleCall."""
    from flashattn.dispatch import select as dispatch_select
    from flashattn.replay import fp8 as replay_fp8
    from flashattn.api import fastpath

    cache.clear()
    kept = []
    for rnd, calls in enumerate(rounds):
        for i, call in enumerate(calls):
            with monkeypatch.context() as m:
                m.setattr(fastpath, key_name, lambda *a: None)
                want = call()
            got = call()
            assert torch.equal(got, want), (rnd, i)
            kept.append((got, want))
    for got, want in kept:
        assert torch.equal(got, want)
    runs = [entry[1] for entry in cache._entries.values()]
    assert len(runs) == len(rounds[0])
    if _hopper():
        assert all(isinstance(r, replay_fp8.Fp8DescaleCall) and r._recorded for r in runs)
    cache.clear()


def test_recorded_fa3_fp8_call_matches_the_full_path(monkeypatch):
    """Repeated FP8 flash_attn_func signatures (FA3's descale API) replay the recorded call
    (V^T pass and FP8 forward from their launch plans, V^T and copied descale tables in a
    reused workspace): every call is bitwise the full path's result with its own descale
    values, and outputs returned earlier stay intact after later calls."""
    from flashattn.api import fastpath

    def call(sh, seed):
        xs, ds = _fa3_inputs(sh, seed)
        return lambda: flashattn.flash_attn_func(*xs, causal=sh["causal"],
                                                 window_size=sh["window_size"], **ds)

    rounds = [[call(sh, 10 * rnd + i) for i, sh in enumerate(_FA3_RECORDED)]
              for rnd in range(3)]
    _recorded_equals_full_path(monkeypatch, "fa3_fp8_key", fastpath.FA3_FP8, rounds)


def test_recorded_quantized_attention_matches_the_full_path(monkeypatch):
    """Repeated fp8.attention signatures (fp8.quantize's block tables) replay the recorded
    call: each result is bitwise the full path's, with the call's own quantized values (a new
    QuantizedQKV of the same layout each round), including 64-key blocks at d = 192, 256-key
    blocks at d = 128 over 4k causal keys and a non-contiguous descale table."""
    from flashattn.api import fastpath

    shapes = [dict(b=2, s=900, h=4, h_k=2, d=128, block_n=128, causal=True, strided=False),
              dict(b=1, s=1100, h=4, h_k=2, d=192, block_n=64, causal=False, strided=True),
              dict(b=1, s=4096, h=4, h_k=2, d=128, block_n=256, causal=True, strided=False)]

    def call(sh, seed):
        xs = _quantized(sh["b"], sh["s"], sh["s"], sh["h"], sh["h_k"], sh["d"], sh["d"],
                        seed=seed)[0]
        r = fp8.quantize(*xs, seed=seed, block_n=sh["block_n"])
        if sh["strided"]:
            r = r._replace(v_descale=r.v_descale.transpose(1, 2).contiguous().transpose(1, 2))
        return lambda: fp8.attention(r, causal=sh["causal"])

    rounds = [[call(sh, 10 * rnd + i) for i, sh in enumerate(shapes)] for rnd in range(3)]
    _recorded_equals_full_path(monkeypatch, "quantized_key", fastpath.FP8_QUANTIZED, rounds)


def test_recorded_fa3_fp8_call_on_two_streams_and_in_a_cuda_graph(monkeypatch):
    """As flash_attn_fp8_func's recorded call: a side stream gets its own workspace; under
    CUDA-graph capture the call takes fresh memory from the graph's pool, and replays with new
    inputs and descales copied in match eager calls, with eager calls between replays."""
    from flashattn.api import fastpath

    fastpath.FA3_FP8.clear()
    sh = _FA3_RECORDED[0]
    (x1, d1), (x2, d2) = _fa3_inputs(sh, 1), _fa3_inputs(sh, 2)
    kw = dict(causal=True)
    with monkeypatch.context() as m:
        m.setattr(fastpath, "fa3_fp8_key", lambda *a: None)
        want1 = flashattn.flash_attn_func(*x1, **kw, **d1)
        want2 = flashattn.flash_attn_func(*x2, **kw, **d2)
    for _ in range(2):
        assert torch.equal(flashattn.flash_attn_func(*x1, **kw, **d1), want1)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        got_side = flashattn.flash_attn_func(*x2, **kw, **d2)
    got_main = flashattn.flash_attn_func(*x1, **kw, **d1)
    torch.cuda.synchronize()
    assert torch.equal(got_side, want2) and torch.equal(got_main, want1)

    static = [t.clone() for t in x1]
    static_d = {n: t.clone() for n, t in d1.items()}
    warm = torch.cuda.Stream()
    warm.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(warm):
        flashattn.flash_attn_func(*static, **kw, **static_d)
    torch.cuda.current_stream().wait_stream(warm)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        g_out = flashattn.flash_attn_func(*static, **kw, **static_d)
    for (xs, ds), want in (((x2, d2), want2), ((x1, d1), want1)):
        for dst, src in zip(static, xs):
            dst.copy_(src)
        for n in static_d:
            static_d[n].copy_(ds[n])
        graph.replay()
        eager = flashattn.flash_attn_func(*x2, **kw, **d2)  # between replays
        torch.cuda.synchronize()
        assert torch.equal(g_out, want) and torch.equal(eager, want2)
    fastpath.FA3_FP8.clear()


@pytest.mark.skipif(not _hopper(), reason="the Gluon FP8 kernel needs an sm90 GPU")
@pytest.mark.parametrize("d,s_q,causal,window", [(64, 1088, True, (-1, -1)),
                                                 (128, 960, True, (-1, -1)),
                                                 (64, 4096, False, (500, 0)),
                                                 (64, 1000, True, (-1, -1))])
def test_bottom_aligned_fp8_tiles_keep_fa3_numerics(d, s_q, causal, window):
    """FP8 tiles shifted by whole warpgroup pieces (fwd_kernel BOTTOM_ALIGN: 1088 at d = 64
    by 64, ending at seqlen_q; 960 at d = 128 by 64; 1000 at d = 64 by 128 of 152), so each
    warpgroup's rows stay inside one Q scale block.
    Both within the numerics rule. Between the two, the LSE is the same and out differs by
    bf16 rounding flips at most: blocks one tiling adds past a row's diagonal are fully
    masked, but each still carries V's descale ratio into the accumulator (fp32 rounding)."""
    from flashattn.api.normalise import window as norm_window
    from flashattn.params import Fp8Scales
    from flashattn.backends.sm90.fwd import flash_fwd_hopper_fp8
    from flashattn.backends.sm90.v_layout import wgmma_ordered_vt

    s_k, b, h, h_k = s_q, 2, 4, 2
    _, r = _quantized(b, s_q, s_k, h, h_k, d, d, seed=7)
    scales = Fp8Scales(r.q_descale, r.k_descale, r.v_descale, r.block_m.bit_length() - 1,
                       r.block_n.bit_length() - 1)
    left, right = norm_window(*window, causal, s_k)
    vt = wgmma_ordered_vt(r.v)
    outs = []
    for bottom in (True, False):
        out, lse = flash_fwd_hopper_fp8(r.q, r.k, vt, scales, softmax_scale=d ** -0.5,
                                        window_left=left, window_right=right, softcap=0.0,
                                        out_dtype=torch.bfloat16, v_in_wgmma_order=True,
                                        config_overrides=dict(bottom_align=bottom))
        _check(r, out.float(), causal, window, 0.0)
        assert torch.isfinite(lse).all()
        outs.append((out.float(), lse))
    torch.testing.assert_close(outs[0][0], outs[1][0], atol=1e-6, rtol=2 ** -7)
    torch.testing.assert_close(outs[0][1], outs[1][1], atol=1e-5, rtol=0)


@pytest.mark.skipif(not _hopper(), reason="the Gluon FP8 kernel needs an sm90 GPU")
@pytest.mark.parametrize("d,s,block_n,causal,key_block", [
    (128, 4096, 256, True, 256),   # config.FP8_LONG_CAUSAL: 256-key tiles, no overlap
    (128, 4096, 128, True, 128),   # descales of 128 keys: the table's tiles
    (128, 4096, 256, False, 128),  # dense calls keep 128-key tiles
    (192, 1100, 64, True, 64),     # 64-key descales shrink d = 192's 128-key tiles
    (192, 1100, 128, False, 128)])
def test_fp8_key_tiles_follow_the_scale_blocks(d, s, block_n, causal, key_block):
    """The Hopper FP8 kernel's key tile is what config.fp8_fwd_config picks for the call's
    K / V descale blocks (never straddling one) and stays within the numerics rule."""
    from flashattn.api.normalise import window as norm_window
    from flashattn.params import AttnParams, Fp8Scales
    from flashattn.backends.sm90.config import fp8_fwd_config, fp8_long_causal

    b, h, h_k = 1, 4, 2
    xs = _quantized(b, s, s, h, h_k, d, d, seed=3)[0]
    r = fp8.quantize(*xs, seed=3, block_n=block_n)
    left, right = norm_window(-1, -1, causal, s)
    cfg = fp8_fwd_config(d, d, False, masked=causal, kv_block_keys=block_n,
                         long_causal=fp8_long_causal(left, right, s))
    assert cfg.block_n == key_block
    params = AttnParams(d ** -0.5, causal, left, right, 0.0, None, 0.0, 0)
    scales = Fp8Scales(r.q_descale, r.k_descale, r.v_descale, 7, block_n.bit_length() - 1)
    assert dispatch_select.select("fp8_fwd", r.q, r.k, r.v, params, scales=scales) == "hopper"
    out = fp8.attention(r, causal=causal)
    _check(r, out.float(), causal, (-1, -1), 0.0)


@pytest.mark.skipif(not _hopper(), reason="the Gluon FP8 kernel needs an sm90 GPU")
def test_fa3_api_long_causal_call_keeps_fa3_numerics():
    """FA3's one descale per (batch, kv head) over 4k causal keys at d = 128 runs
    config.FP8_LONG_CAUSAL's 256-key tiles: exact attention of fp8 x descale within the rule."""
    torch.manual_seed(1)
    b, s, h, h_k, d = 1, 4096, 4, 2, 128
    q8, k8, v8 = ((torch.randn(b, s, hh, d, device="cuda") * 4).to(torch.float8_e4m3fn)
                  for hh in (h, h_k, h_k))
    qd, kd, vd = (torch.rand(b, h_k, device="cuda") * 0.1 + 0.01 for _ in range(3))
    out = flashattn.flash_attn_func(q8, k8, v8, causal=True, q_descale=qd, k_descale=kd,
                                    v_descale=vd)
    tables = (qd.repeat_interleave(h // h_k, 1)[..., None], kd[..., None], vd[..., None])
    args = (q8, k8, v8, *tables, s, s)
    exact = attention_fp8_ref(*args, causal=True, p_scale=None)
    allowed = 2 * _rmse(attention_fp8_ref(*args, causal=True), exact) + 2 * _bf16_rounding(exact)
    assert _rmse(out.float(), exact) <= allowed


def test_recorded_quantize_matches_the_full_path():
    """A repeated fp8.quantize signature replays the recorded pass (replay_fp8.Fp8QuantizeCall):
    fresh outputs every call (the caller owns them), bitwise the full path's, signs a copy;
    signatures interleaved, incoherent and not."""
    from flashattn.dispatch import select as dispatch_select
    from flashattn.replay import fp8 as replay_fp8
    from flashattn.api import fastpath

    def full(*xs, seed, incoherent=True, block_m=128, block_n=128):
        from flashattn.api.fp8_quantize import quantize_for_kernels  # (quantize's body, no fast path)

        return quantize_for_kernels(*xs, incoherent, seed, block_m, block_n, v_wgmma=False)

    def same(a, b):
        for x, y in zip(a[:6], b[:6]):
            assert x.shape == y.shape and x.stride() == y.stride()
            assert torch.equal(x.view(torch.uint8) if x.element_size() == 1 else x,
                               y.view(torch.uint8) if y.element_size() == 1 else y)

    fastpath.QUANTIZE.clear()
    cases = [((2, 900, 1100, 4, 2, 128, 128), dict(seed=3)),
             ((1, 777, 777, 4, 4, 64, 64), dict(seed=4, incoherent=False)),
             ((1, 300, 301, 2, 1, 256, 256), dict(seed=5, block_n=64))]
    kept = []
    g = torch.Generator(device="cuda").manual_seed(0)
    for rnd in range(3):
        for dims, kw in cases:
            b, s_q, s_k, h, h_k, d, d_v = dims
            xs = [torch.randn(shape, device="cuda", generator=g).bfloat16() for shape in
                  ((b, s_q, h, d), (b, s_k, h_k, d), (b, s_k, h_k, d_v))]
            got = fp8.quantize(*xs, **kw)
            kept.append((got, xs, kw))
    runs = [e[1] for e in fastpath.QUANTIZE._entries.values()]
    assert len(runs) == len(cases)
    if _hopper():
        assert all(isinstance(r, replay_fp8.Fp8QuantizeCall) for r in runs)
    ptrs = set()
    for got, xs, kw in kept:  # (earlier results intact after later calls)
        same(got, full(*xs, **kw))
        ptrs.add(got.q.data_ptr())
        if kw.get("incoherent", True):
            assert got.signs is not None
    assert len(ptrs) == len(kept)
    fastpath.QUANTIZE.clear()
