"""flashattn.plan_decode / DecodePlan.run: same answers as flash_attn_with_kvcache
without new keys, buffers reused between runs, shapes checked against the plan, and (GPU) a
CUDA graph captured once and replayed with new cache_seqlens values."""
from __future__ import annotations

import pytest
import torch

import flashattn
from flashattn import flash_attn_with_kvcache, plan_decode


def _case(paged: bool, device="cpu", dtype=torch.float32, b=3, h=8, h_k=2, d=32, cap=48,
          page=8, s_q=1):
    g = torch.Generator(device=device).manual_seed(0)
    q = torch.randn(b, s_q, h, d, device=device, dtype=dtype, generator=g)
    seqlens = torch.tensor([5, cap, 17][:b], dtype=torch.int32, device=device)
    if paged:
        n_pages = b * cap // page
        kc = torch.randn(n_pages, page, h_k, d, device=device, dtype=dtype, generator=g)
        vc = torch.randn(n_pages, page, h_k, d, device=device, dtype=dtype, generator=g)
        table = torch.randperm(n_pages, generator=torch.Generator().manual_seed(1)).to(
            torch.int32).view(b, cap // page).to(device)
    else:
        kc = torch.randn(b, cap, h_k, d, device=device, dtype=dtype, generator=g)
        vc = torch.randn(b, cap, h_k, d, device=device, dtype=dtype, generator=g)
        table = None
    return q, kc, vc, seqlens, table


@pytest.mark.parametrize("backend", ["cpu", "portable"])
@pytest.mark.parametrize("paged", [False, True])
@pytest.mark.parametrize("s_q,causal,window", [(1, True, (-1, -1)), (4, True, (6, -1)),
                                               (3, False, (-1, -1))])
def test_plan_matches_flash_attn_with_kvcache(backend, paged, s_q, causal, window):
    q, kc, vc, seqlens, table = _case(paged, s_q=s_q)
    plan = plan_decode(3, 8, 2, 32, max_seqlen_k=48, seqlen_q=s_q,
                       page_size=8 if paged else None, dtype=torch.float32, device="cpu",
                       causal=causal, window_size=window)
    with flashattn.use_backend(backend):
        ref, ref_lse = flash_attn_with_kvcache(q, kc, vc, cache_seqlens=seqlens,
                                               block_table=table, causal=causal,
                                               window_size=window, return_softmax_lse=True)
        out, lse = plan.run(q, kc, vc, seqlens, table, return_softmax_lse=True)
        torch.testing.assert_close(out, ref, atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(lse, ref_lse, atol=1e-5, rtol=1e-5)
        # another step, other lengths: same plan, same answers as the plain call
        seqlens2 = torch.tensor([48, 1, 30], dtype=torch.int32)
        out2 = plan.run(q, kc, vc, seqlens2, table).clone()
        ref2 = flash_attn_with_kvcache(q, kc, vc, cache_seqlens=seqlens2, block_table=table,
                                       causal=causal, window_size=window)
        torch.testing.assert_close(out2, ref2, atol=1e-5, rtol=1e-5)


def test_plan_reuses_its_buffers_on_the_triton_path():
    q, kc, vc, seqlens, _ = _case(False)
    plan = plan_decode(3, 8, 2, 32, max_seqlen_k=48, dtype=torch.float32, device="cpu")
    with flashattn.use_backend("portable"):
        a = plan.run(q, kc, vc, seqlens)
        b = plan.run(q, kc, vc, seqlens)
    assert a.data_ptr() == b.data_ptr()  # the plan's output buffer, overwritten by each run


@pytest.mark.parametrize("bad,match", [
    (dict(q=torch.zeros(3, 2, 8, 32)), "planned shape"),
    (dict(q=torch.zeros(3, 1, 8, 32, dtype=torch.float16)), "float32 tensor"),
    (dict(seqlens=torch.tensor([1, 2, 3])), "int32"),
    (dict(seqlens=5), "int32"),
    (dict(kc=torch.zeros(3, 40, 2, 32)), "48 positions"),
    (dict(table=torch.zeros(3, 6, dtype=torch.int32)), "block_table must be given"),
])
def test_plan_run_checks_against_the_plan(bad, match):
    q, kc, vc, seqlens, table = _case(False)
    args = dict(q=q, kc=kc, vc=vc, seqlens=seqlens, table=table)
    args.update(bad)
    if "kc" in bad:
        args["vc"] = bad["kc"]
    plan = plan_decode(3, 8, 2, 32, max_seqlen_k=48, dtype=torch.float32, device="cpu")
    with pytest.raises(ValueError, match=match):
        plan.run(args["q"], args["kc"], args["vc"], args["seqlens"], args["table"])


@pytest.mark.parametrize("kw,match", [
    (dict(nheads=6, nheads_k=4), "multiple of nheads_k"),
    (dict(max_seqlen_k=0), "max_seqlen_k"),
    (dict(page_size=7), "multiple of page_size"),
    (dict(dtype=torch.int8), "dtype"),
    (dict(headdim=300), "headdim"),
    (dict(num_splits=-1), "num_splits"),
])
def test_plan_decode_bad_arguments_name_them(kw, match):
    args = dict(batch=2, nheads=8, nheads_k=2, headdim=64, max_seqlen_k=64, device="cpu")
    args.update(kw)
    with pytest.raises((ValueError, TypeError), match=match):
        plan_decode(**args)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("paged", [False, True])
def test_plan_run_in_a_cuda_graph_with_new_lengths(paged):
    """Captured once, replayed with new cache_seqlens written into the captured tensor: each
    replay equals the plain call at those lengths (the split decision is the plan's)."""
    b, h, h_k, d, cap = 4, 32, 8, 128, 4096
    q, kc, vc, seqlens, table = _case(paged, "cuda", torch.bfloat16, b=4, h=h, h_k=h_k, d=d,
                                      cap=cap, page=16)
    seqlens = torch.tensor([5, cap, 1000, 17], dtype=torch.int32, device="cuda")
    plan = plan_decode(b, h, h_k, d, max_seqlen_k=cap, page_size=16 if paged else None,
                       dtype=torch.bfloat16)
    plan.run(q, kc, vc, seqlens, table)  # warm-up (compiles, allocates the buffers)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = plan.run(q, kc, vc, seqlens, table)
    for lens in ([7, 4000, 1, 4096], [4096, 4096, 4096, 4096], [1, 2, 3, 4]):
        seqlens.copy_(torch.tensor(lens, dtype=torch.int32))
        graph.replay()
        ref = flash_attn_with_kvcache(q, kc, vc, cache_seqlens=seqlens, block_table=table,
                                      causal=True)
        torch.testing.assert_close(out, ref, atol=2e-2, rtol=2e-2)


def _mla_case(paged: bool, device="cpu", dtype=torch.float32, b=3, h=16, d=16, dv=64, cap=48,
              page=8, s_q=1):
    """MLA's shape in small: one latent KV head, q d wide, qv and V dv wide, K = V's first d
    columns (DeepSeek's layout: the rotary part rides on the latent cache)."""
    g = torch.Generator(device=device).manual_seed(0)
    q = torch.randn(b, s_q, h, d, device=device, dtype=dtype, generator=g)
    qv = torch.randn(b, s_q, h, dv, device=device, dtype=dtype, generator=g)
    seqlens = torch.tensor([5, cap, 17][:b], dtype=torch.int32, device=device)
    rows = b * cap // page if paged else b
    kv = torch.randn(rows, page if paged else cap, 1, dv, device=device, dtype=dtype,
                     generator=g)
    table = (torch.randperm(rows, generator=torch.Generator().manual_seed(1)).to(torch.int32)
             .view(b, cap // page).to(device)) if paged else None
    return q, qv, kv[..., :d], kv, seqlens, table


@pytest.mark.parametrize("backend", ["cpu", "portable"])
@pytest.mark.parametrize("paged", [False, True])
@pytest.mark.parametrize("s_q", [1, 2])
def test_plan_with_qv_matches_flash_attn_with_kvcache(backend, paged, s_q):
    """has_qv: each run adds qv . v to the scores as the plain call does, with the default
    scale (headdim + headdim_v) ** -0.5 of both; a second step at other lengths too."""
    q, qv, kc, vc, seqlens, table = _mla_case(paged, s_q=s_q)
    plan = plan_decode(3, 16, 1, 16, headdim_v=64, max_seqlen_k=48, seqlen_q=s_q,
                       page_size=8 if paged else None, dtype=torch.float32, device="cpu",
                       has_qv=True)
    assert plan.params.softmax_scale == pytest.approx((16 + 64) ** -0.5)
    with flashattn.use_backend(backend):
        for lens in ([5, 48, 17], [48, 1, 30]):
            seqlens = torch.tensor(lens, dtype=torch.int32)
            ref, ref_lse = flash_attn_with_kvcache(q, kc, vc, cache_seqlens=seqlens,
                                                   block_table=table, causal=True, qv=qv,
                                                   return_softmax_lse=True)
            out, lse = plan.run(q, kc, vc, seqlens, table, return_softmax_lse=True, qv=qv)
            assert out.shape == (3, s_q, 16, 64)
            torch.testing.assert_close(out, ref, atol=1e-5, rtol=1e-5)
            torch.testing.assert_close(lse, ref_lse, atol=1e-5, rtol=1e-5)


def test_plan_with_qv_checks_qv():
    q, qv, kc, vc, seqlens, table = _mla_case(False)
    plan = plan_decode(3, 16, 1, 16, headdim_v=64, max_seqlen_k=48, dtype=torch.float32,
                       device="cpu", has_qv=True)
    with pytest.raises(ValueError, match="qv must be a torch.float32 tensor of shape"):
        plan.run(q, kc, vc, seqlens)  # qv missing
    with pytest.raises(ValueError, match="qv must be"):
        plan.run(q, kc, vc, seqlens, qv=qv[..., :32])
    with pytest.raises(ValueError, match="qv must be"):
        plan.run(q, kc, vc, seqlens, qv=qv.double())
    plain = plan_decode(3, 16, 1, 16, headdim_v=64, max_seqlen_k=48, dtype=torch.float32,
                        device="cpu")
    with pytest.raises(ValueError, match="has_qv=True"):
        plain.run(q, kc, vc, seqlens, qv=qv)


@pytest.mark.parametrize("kw,exc,match", [
    (dict(has_qv=True, dtype=torch.float8_e4m3fn, kv_dtype=torch.float8_e4m3fn),
     NotImplementedError, "has_qv"),
    (dict(has_qv=1), TypeError, "has_qv"),
    (dict(headdim_v=1024), ValueError, "headdim_v must be in 1..512"),
])
def test_plan_decode_qv_arguments(kw, exc, match):
    args = dict(batch=2, nheads=8, nheads_k=1, headdim=64, headdim_v=512, max_seqlen_k=64,
                device="cpu")
    args.update(kw)
    with pytest.raises(exc, match=match):
        plan_decode(**args)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("kv_fp8", [False, True])
def test_plan_with_qv_in_a_cuda_graph(kv_fp8):
    """DeepSeek's decode shape (128 heads over one latent head, d 64, d_v 512, page 64), a
    bf16 or FP8 latent cache: captured once, replayed with new lengths, each replay equal to
    the plain call (bf16 tolerance)."""
    b, h, d, dv, cap, page = 4, 128, 64, 512, 2048, 64
    q, qv, kc, vc, seqlens, table = _mla_case(True, "cuda", torch.bfloat16, b=b, h=h, d=d,
                                              dv=dv, cap=cap, page=page)
    seqlens = torch.tensor([5, cap, 1000, 17], dtype=torch.int32, device="cuda")
    kw = {}
    if kv_fp8:
        vc = vc.to(torch.float8_e4m3fn)
        kc = vc[..., :d]
        kw = dict(k_descale=torch.full((b, 1), 0.5, device="cuda"),
                  v_descale=torch.full((b, 1), 0.5, device="cuda"))
    plan = plan_decode(b, h, 1, d, headdim_v=dv, max_seqlen_k=cap, page_size=page,
                       dtype=torch.bfloat16, kv_dtype=vc.dtype, has_qv=True)
    plan.run(q, kc, vc, seqlens, table, qv=qv, **kw)  # warm-up (compiles, allocates)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = plan.run(q, kc, vc, seqlens, table, qv=qv, **kw)
    for lens in ([7, 2000, 1, 2048], [2048] * 4, [1, 2, 3, 4]):
        seqlens.copy_(torch.tensor(lens, dtype=torch.int32))
        graph.replay()
        ref = flash_attn_with_kvcache(q, kc, vc, cache_seqlens=seqlens, block_table=table,
                                      causal=True, qv=qv, **kw)
        torch.testing.assert_close(out, ref, atol=2e-2, rtol=2e-2)
