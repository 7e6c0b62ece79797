"""FlashAttention-3's ``qv`` in ``fa3.flash_attn_func`` / ``fa3.flash_attn_varlen_func`` on a
CUDA GPU, at the sizes of FA3's own tests (d 64, d_v 256 / 512, 6 query heads, MHA / GQA /
MQA, seqlen_q above and below seqlen_k up to 4096, causal, local, softcap, attention_chunk,
num_splits 3) and DeepSeek's decode shape (128 query heads over one latent head, which the
dense call hands to the Hopper MLA kernel on sm90); the float64 oracle on the GPU; a varlen
call with seqused_q captured in a CUDA graph and replayed.

Run on the device machine: ``python3 -m pytest -q -m gpu tests/api/test_fa3_qv_gpu.py``.
"""
from __future__ import annotations

from dataclasses import replace

import pytest
import torch

from flashattn import fa3
from tests.api.test_fa3_qv import (QVCase, VarlenQVCase, _cu, _varlen_ref, check_dense,
                                   check_varlen)
from tests.accuracy import assert_close_rule
from tests.graphs import capture

pytestmark = pytest.mark.gpu

FA3 = QVCase(b=9, h=6, h_k=6, d=64, d_v=512, dtype=torch.bfloat16)

GPU_DENSE = {
    "one-one": replace(FA3, s_q=1, s_k=1),
    "113x203-gqa-causal": replace(FA3, s_q=113, s_k=203, h_k=2, causal=True),
    "239x1-mqa": replace(FA3, s_q=239, s_k=1, h_k=1),
    "799x3-causal": replace(FA3, s_q=799, s_k=3, causal=True),
    "1024x1023-local": replace(FA3, s_q=1024, s_k=1023, h_k=2, window=(200, 37)),
    "640x128-softcap": replace(FA3, s_q=640, s_k=128, softcap=15.0, causal=True),
    "1024-chunk": replace(FA3, s_q=1024, s_k=1024, h_k=1, chunk=300, causal=True),
    "4096-mqa-causal": replace(FA3, b=2, s_q=4096, s_k=4096, h_k=1, causal=True),
    "dv256-splits-3": replace(FA3, s_q=128, s_k=2048, d_v=256, num_splits=3),
    "fp16": replace(FA3, s_q=256, s_k=512, dtype=torch.float16, causal=True),
    # DeepSeek decode / verification: 128 heads over one latent head (the Hopper MLA kernel)
    "deepseek-mtp": QVCase(b=8, s_q=4, s_k=8192, h=128, h_k=1, d=64, d_v=512, causal=True,
                           num_splits=0, dtype=torch.bfloat16),
}


def _dense_params() -> list:
    """The DeepSeek case's float64 oracle holds K / V repeated over 128 heads (32 GiB at
    s_k 8192, d_v 512): bigmem, so it runs alone and not beside other xdist workers."""
    return [pytest.param(c, id=n, marks=[pytest.mark.bigmem] if n == "deepseek-mtp" else [])
            for n, c in GPU_DENSE.items()]


@pytest.mark.parametrize("case", _dense_params())
def test_dense_qv_gpu(case: QVCase) -> None:
    check_dense(case, "cuda")


GPU_VARLEN = {
    "gqa-causal": VarlenQVCase(lens_q=(113, 1, 0, 517, 1024), lens_k=(203, 9, 40, 517, 1023),
                               h=6, h_k=2, d=64, d_v=512, causal=True, dtype=torch.bfloat16),
    "seqused-local": VarlenQVCase(lens_q=(300, 64, 799), lens_k=(300, 1000, 3),
                                  used_q=(250, 0, 799), used_k=(300, 700, 2), h=6, h_k=1,
                                  d=64, d_v=512, window=(100, 20), dtype=torch.bfloat16),
    "chunk-softcap": VarlenQVCase(lens_q=(1024, 77), lens_k=(1024, 300), h=6, h_k=6, d=64,
                                  d_v=256, chunk=128, softcap=15.0, causal=True,
                                  dtype=torch.bfloat16),
}


@pytest.mark.parametrize("case", list(GPU_VARLEN.values()), ids=list(GPU_VARLEN))
def test_varlen_qv_gpu(case: VarlenQVCase) -> None:
    check_varlen(case, "cuda")


def test_varlen_qv_in_a_cuda_graph() -> None:
    """A packed qv call with seqused_q / seqused_k reads no length on the host: captured
    once, replayed with new lengths and inputs, each replay matches the oracle."""
    c = VarlenQVCase(lens_q=(64, 31, 128), lens_k=(500, 77, 128), h=8, h_k=1, d=64, d_v=512,
                     causal=True, dtype=torch.bfloat16)
    x = dict(q=torch.randn(223, 8, 64), k=torch.randn(705, 1, 64), v=torch.randn(705, 1, 512),
             qv=torch.randn(223, 8, 512))
    x = {n: t.to("cuda", torch.bfloat16) for n, t in x.items()}
    cu_q, cu_k = _cu(c.lens_q, "cuda"), _cu(c.lens_k, "cuda")
    used_q = torch.tensor(c.lens_q, dtype=torch.int32, device="cuda")
    used_k = torch.tensor(c.lens_k, dtype=torch.int32, device="cuda")

    def step():
        return fa3.flash_attn_varlen_func(x["q"], x["k"], x["v"], cu_q, cu_k, 128, 500,
                                          qv=x["qv"], causal=True, seqused_q=used_q,
                                          seqused_k=used_k, return_attn_probs=True)

    graph, (out, lse) = capture(step)
    for i, (uq, uk) in enumerate((((60, 0, 128), (500, 1, 128)), ((1, 31, 5), (3, 77, 64)))):
        used_q.copy_(torch.tensor(uq, dtype=torch.int32))
        used_k.copy_(torch.tensor(uk, dtype=torch.int32))
        for t in x.values():
            t.copy_(torch.randn_like(t))
        graph.replay()
        torch.cuda.synchronize()
        case = replace(c, used_q=uq, used_k=uk)
        ref, ref_lse = _varlen_ref(case, x["q"], x["k"], x["v"], x["qv"], upcast=True)
        low, low_lse = _varlen_ref(case, x["q"], x["k"], x["v"], x["qv"], upcast=False)
        assert_close_rule(out, ref, low, name=f"out, replay {i}")
        assert_close_rule(lse, ref_lse, low_lse, name=f"lse, replay {i}")
