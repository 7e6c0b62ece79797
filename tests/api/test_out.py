"""``out=`` on every public attention function: written in place and returned,
checked for shape / dtype / device before anything runs, no autograd."""
from __future__ import annotations

import inspect

import pytest
import torch

import flashattn
import flashattn.fa3 as fa3
from flashattn.api import fp8_attention

PUBLIC = [flashattn.flash_attn_func, flashattn.flash_attn_qkvpacked_func,
          flashattn.flash_attn_kvpacked_func, flashattn.flash_attn_varlen_func,
          flashattn.flash_attn_varlen_qkvpacked_func, flashattn.flash_attn_varlen_kvpacked_func,
          flashattn.flash_attn_with_kvcache, flashattn.flash_attn_fp8_func,
          fp8_attention.attention_quantized, fa3.flash_attn_func, fa3.flash_attn_varlen_func,
          fa3.flash_attn_with_kvcache, fa3.flash_attn_combine, flashattn.flash_attn_combine]


@pytest.mark.parametrize("fn", PUBLIC, ids=lambda f: f"{f.__module__}.{f.__name__}")
def test_every_public_function_takes_out(fn):
    assert "out" in inspect.signature(fn).parameters
    assert "out:" in (fn.__doc__ or "") or "``out``" in (fn.__doc__ or "")


def _cases():
    torch.manual_seed(0)
    q = torch.randn(2, 6, 4, 16)
    k = torch.randn(2, 9, 2, 16)
    v = torch.randn(2, 9, 2, 8)
    cu_q = torch.tensor([0, 5, 12], dtype=torch.int32)
    cu_k = torch.tensor([0, 9, 18], dtype=torch.int32)
    qp, kp, vp = q.reshape(12, 4, 16), k.reshape(18, 2, 16), v.reshape(18, 2, 8)
    qkv = torch.randn(2, 6, 3, 4, 16)
    cache_k, cache_v = torch.randn(2, 12, 2, 16), torch.randn(2, 12, 2, 8)
    lens = torch.tensor([3, 7], dtype=torch.int32)
    return [
        ("dense", lambda **o: flashattn.flash_attn_func(q, k, v, causal=True, **o)),
        ("qkvpacked", lambda **o: flashattn.flash_attn_qkvpacked_func(qkv, **o)),
        ("kvpacked", lambda **o: flashattn.flash_attn_kvpacked_func(
            q, torch.stack([k, k], 2), **o)),
        ("varlen", lambda **o: flashattn.flash_attn_varlen_func(qp, kp, vp, cu_q, cu_k, 7, 9,
                                                                **o)),
        ("varlen_qkvpacked", lambda **o: flashattn.flash_attn_varlen_qkvpacked_func(
            qkv.reshape(12, 3, 4, 16), torch.tensor([0, 6, 12], dtype=torch.int32), 6, **o)),
        ("varlen_kvpacked", lambda **o: flashattn.flash_attn_varlen_kvpacked_func(
            qp, torch.stack([kp, kp], 1), cu_q, cu_k, 7, 9, **o)),
        ("kvcache", lambda **o: flashattn.flash_attn_with_kvcache(
            q, cache_k, cache_v, cache_seqlens=lens, causal=True, **o)),
        ("fa3", lambda **o: fa3.flash_attn_func(q, k, v, **o)),
        ("fa3_varlen", lambda **o: fa3.flash_attn_varlen_func(qp, kp, vp, cu_q, cu_k, 7, 9,
                                                              **o)),
        ("fa3_kvcache", lambda **o: fa3.flash_attn_with_kvcache(q, cache_k, cache_v,
                                                                cache_seqlens=lens, **o)),
        ("fp8_func", lambda **o: flashattn.flash_attn_fp8_func(q, k, k, **o)),
    ]


@pytest.mark.parametrize("name,call", _cases(), ids=[c[0] for c in _cases()])
def test_written_in_place_and_equal(name, call):
    want = call()
    out = torch.full_like(want, float("nan"))
    got = call(out=out)
    assert got is out
    torch.testing.assert_close(out, want, rtol=0, atol=0)
    # a strided (non-contiguous) out is fine too
    wide = torch.zeros(want.shape[:-1] + (2 * want.shape[-1],), dtype=want.dtype)
    view = wide[..., ::2]
    assert call(out=view) is view
    torch.testing.assert_close(view, want, rtol=0, atol=0)


def test_tuple_returns_keep_lse():
    q = torch.randn(1, 5, 2, 8)
    out = torch.empty_like(q)
    got, lse, _ = flashattn.flash_attn_func(q, q, q, return_attn_probs=True, out=out)
    _, lse_plain, _ = flashattn.flash_attn_func(q, q, q, return_attn_probs=True)
    assert got is out
    torch.testing.assert_close(lse, lse_plain)


def test_errors_name_out_and_leave_the_cache_untouched():
    q = torch.randn(1, 2, 2, 8)
    cache = torch.zeros(1, 8, 2, 8)
    new = torch.randn(1, 2, 2, 8)
    for bad, err, match in ((torch.empty(1, 2, 2, 4), ValueError, "shape"),
                            (torch.empty(1, 2, 2, 8, dtype=torch.float64), ValueError, "dtype"),
                            (torch.empty(1, 2, 2, 8, device="meta"), ValueError, "device"),
                            ([1.0], TypeError, "out must be")):
        with pytest.raises(err, match=match):
            flashattn.flash_attn_with_kvcache(q, cache, cache, new, new, cache_seqlens=0,
                                              out=bad)
        assert (cache == 0).all()
    x = torch.randn(1, 4, 2, 8, requires_grad=True)
    with pytest.raises(RuntimeError, match="autograd"):
        flashattn.flash_attn_func(x, x, x, out=torch.empty(1, 4, 2, 8))
    with torch.no_grad():
        out = torch.empty(1, 4, 2, 8)
        assert flashattn.flash_attn_func(x, x, x, out=out) is out


@pytest.mark.gpu
def test_out_gpu_kvcache_in_cuda_graph():
    """A preallocated out keeps its address, so a decode step with out= captures in a graph."""
    dev = "cuda"
    q = torch.randn(2, 1, 8, 128, device=dev, dtype=torch.bfloat16)
    cache = torch.randn(2, 1024, 2, 128, device=dev, dtype=torch.bfloat16)
    lens = torch.tensor([100, 900], dtype=torch.int32, device=dev)
    out = torch.empty_like(q)
    flashattn.flash_attn_with_kvcache(q, cache, cache, cache_seqlens=lens, out=out)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        flashattn.flash_attn_with_kvcache(q, cache, cache, cache_seqlens=lens, out=out)
    lens.copy_(torch.tensor([500, 3], dtype=torch.int32, device=dev))
    graph.replay()
    want = flashattn.flash_attn_with_kvcache(q, cache, cache, cache_seqlens=lens)
    torch.testing.assert_close(out, want)
