"""flash_attn_with_kvcache on a CUDA GPU: the CPU grid at realistic sizes, CUDA-graph capture
and replay of a decode step, the combine pass at many splits, and 64-bit page offsets.

Run on the device machine: ``python3 -m pytest -q -m gpu tests/test_kvcache_gpu.py``.
"""
from __future__ import annotations

from dataclasses import replace

import pytest
import torch

from tests.accuracy import assert_close_rule
from flashattn import flash_attn_combine, flash_attn_with_kvcache
from flashattn.reference import kvcache_ref
from test_kvcache import CASES, KVCase, make_inputs, run_case

pytestmark = pytest.mark.gpu

BIG = KVCase(b=3, s_cache=1536, h=32, h_k=8, d=128, dtype=torch.bfloat16)


def _scaled(c: KVCase) -> KVCase:
    """A CPU case at realistic size: 32/8 heads, d=128 (d kept when it tests odd dims)."""
    page = c.page
    if page is not None:
        page = {1: 1, 5: 7, 16: 16, 256: 256}.get(page, page)
    return replace(c, b=max(c.b, 3), s_cache=1536 if page != 1 else 300, h=32 if c.h_k != 1 else 16,
                   h_k=8 if c.h_k != 1 else 1, d=128 if c.d == 32 else c.d,
                   s_q=c.s_q * (4 if c.causal else 1), s_new=c.s_new * (4 if c.causal else 1),
                   page=page)


GPU_CASES = [_scaled(c) for c in CASES] + [
    replace(BIG, num_splits=0),
    replace(BIG, num_splits=0, page=16),
    replace(BIG, s_q=16, s_new=16, causal=True, num_splits=0),  # speculative / chunked prefill
    replace(BIG, s_q=128, causal=True, num_splits=3, page=16),  # several query tiles
    replace(BIG, d=64, h=16, h_k=16, num_splits=0, dtype=torch.float16),  # MHA
    replace(BIG, d=256, num_splits=2, s_new=1, rotary="neox"),
]


@pytest.mark.parametrize("case", GPU_CASES, ids=[c.id for c in GPU_CASES])
def test_kvcache_gpu(case: KVCase) -> None:
    run_case(case, "cuda")


REPEAT_CASES = [
    replace(BIG, b=1, num_splits=0),  # split-KV + combine
    replace(BIG, b=1, num_splits=0, page=16),
    replace(BIG, num_splits=1, seqlens_int=True),  # one split: out / lse written directly
    replace(BIG, b=1, s_new=1, rotary="neox", num_splits=0),  # append + rotary, then attention
    replace(BIG, b=2, leftpad=True, batch_idx=True, num_splits=0),
    replace(BIG, s_q=4, causal=True, num_splits=0),
]


@pytest.mark.parametrize("case", REPEAT_CASES, ids=[c.id for c in REPEAT_CASES])
def test_repeated_signature_replays_the_recorded_decode(case: KVCase, monkeypatch) -> None:
    """Calls 2 and 3 of a signature (fresh tensors, new lengths, new pages) replay the recorded
    decode launches with the new tensors' addresses (the lean path): out, lse and the
    caches still match the reference every time, and the replay did run."""
    from flashattn.runtime.launch import LaunchPlan

    replays = []
    replay = LaunchPlan.replay
    monkeypatch.setattr(LaunchPlan, "replay",
                        lambda self, values: replays.append(1) or replay(self, values))
    for _ in range(3):
        run_case(case, "cuda")
    assert replays, "the repeated calls never replayed the recorded launch"


def test_split_counts_of_one_shape_each_run_their_own() -> None:
    """One shape, several explicit split counts in a row (then the heuristic): each call runs
    its own count's launch (a replayed plan of another count gave wrong results)."""
    for n in (3, 7, 3, 0, 1, 7):
        run_case(replace(BIG, b=1, num_splits=n), "cuda")


def test_repeated_single_query_dense_calls_replay() -> None:
    """flash_attn_func with one query row (a generate() step without padding) replays the
    decode kernel's recorded launches: each call with fresh tensors matches float64."""
    from flashattn import flash_attn_func
    from flashattn.reference import attention_ref

    for step in range(6):  # with the LSE, then without (the stream's reused workspace)
        q = torch.randn(2, 1, 32, 128, device="cuda", dtype=torch.bfloat16)
        k, v = (torch.randn(2, 3000, 8, 128, device="cuda", dtype=torch.bfloat16)
                for _ in range(2))
        if step >= 3:
            out = flash_attn_func(q, k, v, causal=True)
            ref, _ = attention_ref(q.double(), k.double(), v.double(), causal=True)
            low, _ = attention_ref(q, k, v, causal=True, upcast=False)
            assert_close_rule(out, ref, low, name=f"call {step} (no lse)")
            continue
        out, lse, _ = flash_attn_func(q, k, v, causal=True, return_attn_probs=True)
        ref, _ = attention_ref(q.double(), k.double(), v.double(), causal=True)
        low, _ = attention_ref(q, k, v, causal=True, upcast=False)
        assert_close_rule(out, ref, low, name=f"call {step}")
        want_lse = torch.logsumexp(
            torch.einsum("bqhd,bkhd->bhqk", q.double(),
                         k.double().repeat_interleave(4, dim=2)) * 128 ** -0.5, dim=-1)
        torch.testing.assert_close(lse.double(), want_lse, atol=1e-3, rtol=1e-4)


def _decode_ref(q, kc, vc, lens):
    cpu = dict(q=q.cpu(), k_cache=kc.cpu(), v_cache=vc.cpu(), cache_seqlens=lens.cpu())
    ref, ref_lse, _, _ = kvcache_ref(**cpu, causal=True)
    low, _, _, _ = kvcache_ref(**cpu, causal=True, upcast=False)
    return ref, ref_lse, low


def test_decode_without_lse_reuses_the_stream_workspace() -> None:
    """Repeated b = 1 split-KV decode calls that do not ask for the LSE keep their partials in
    the stream's reused workspace (runtime.buffers): every call is still right, an LSE
    returned earlier is not overwritten by later calls, two streams do not share, and a graph
    captured after eager calls keeps its own memory (eager calls after the capture, which
    reuse the stream's workspace, leave the graph's result intact)."""
    from flashattn.runtime import buffers

    buffers.clear()
    kc, vc = (torch.randn(1, 6000, 8, 128, device="cuda", dtype=torch.bfloat16)
              for _ in range(2))
    lens = torch.tensor([5000], dtype=torch.int32, device="cuda")
    kept = []
    for step in range(6):
        q = torch.randn(1, 1, 32, 128, device="cuda", dtype=torch.bfloat16)
        want_lse = step % 3 == 0
        res = flash_attn_with_kvcache(q, kc, vc, cache_seqlens=lens, causal=True,
                                      return_softmax_lse=want_lse)
        out = res[0] if want_lse else res
        ref, ref_lse, low = _decode_ref(q, kc, vc, lens)
        assert_close_rule(out, ref, low, name=f"call {step}")
        if want_lse:
            kept.append((res[1], ref_lse))
    torch.cuda.synchronize()
    for lse, ref_lse in kept:  # (later calls ran in between)
        torch.testing.assert_close(lse.cpu().double(), ref_lse.double(), atol=1e-4, rtol=1e-4)
    assert any(k[0] == "decode-workspace" for k in buffers._BUFFERS), "workspace not reused"

    # another stream: its own workspace, right results
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        q = torch.randn(1, 1, 32, 128, device="cuda", dtype=torch.bfloat16)
        out = flash_attn_with_kvcache(q, kc, vc, cache_seqlens=lens, causal=True)
    torch.cuda.current_stream().wait_stream(side)
    ref, _, low = _decode_ref(q, kc, vc, lens)
    assert_close_rule(out, ref, low, name="side stream")
    kinds = [k for k in buffers._BUFFERS if k[0] == "decode-workspace"]
    assert len({k[2] for k in kinds}) == 2, "the two streams shared a workspace"

    # capture after eager calls of the same signature, then eager calls, then replay
    q_static = torch.randn(1, 1, 32, 128, device="cuda", dtype=torch.bfloat16)
    graph = torch.cuda.CUDAGraph()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        flash_attn_with_kvcache(q_static, kc, vc, cache_seqlens=lens, causal=True)
    torch.cuda.current_stream().wait_stream(side)
    with torch.cuda.graph(graph):
        out_static = flash_attn_with_kvcache(q_static, kc, vc, cache_seqlens=lens, causal=True)
    for step in range(3):
        q_static.copy_(torch.randn_like(q_static))
        graph.replay()
        q_eager = torch.randn_like(q_static)
        out_eager = flash_attn_with_kvcache(q_eager, kc, vc, cache_seqlens=lens, causal=True)
        torch.cuda.synchronize()
        ref, _, low = _decode_ref(q_static, kc, vc, lens)
        assert_close_rule(out_static, ref, low, name=f"graph replay {step}")
        ref, _, low = _decode_ref(q_eager, kc, vc, lens)
        assert_close_rule(out_eager, ref, low, name=f"eager after replay {step}")


def test_stream_buffer_per_stream_thread_and_capture() -> None:
    """runtime.buffers.stream_buffer: one buffer per (kind, device, stream, thread), grown
    when asked for more, a fresh one while a graph is captured."""
    import threading

    from flashattn.runtime import buffers

    buffers.clear()
    dev = torch.cuda.current_device()
    a = buffers.stream_buffer("t", 100, dev)
    assert buffers.stream_buffer("t", 4096, dev).data_ptr() == a.data_ptr()
    assert buffers.stream_buffer("u", 100, dev).data_ptr() != a.data_ptr()
    big = buffers.stream_buffer("t", 1 << 20, dev)
    assert big.numel() >= 1 << 20
    assert buffers.stream_buffer("t", 100, dev).data_ptr() == big.data_ptr()
    side = torch.cuda.Stream()
    with torch.cuda.stream(side):
        assert buffers.stream_buffer("t", 100, dev).data_ptr() != big.data_ptr()
    other = []
    th = threading.Thread(target=lambda: other.append(buffers.stream_buffer("t", 100, dev)))
    th.start()
    th.join()
    assert other[0].data_ptr() != big.data_ptr()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.stream(side):
        ptrs = [buffers.stream_buffer("t", 100, dev).data_ptr()]
        with torch.cuda.graph(graph):
            inside = buffers.stream_buffer("t", 100, dev)
            inside.zero_()
    assert inside.data_ptr() not in ptrs + [big.data_ptr()]


@pytest.mark.parametrize("page", [None, 16], ids=["contiguous", "paged16"])
def test_cuda_graph_decode_step(page) -> None:
    """Capture append + attention once; replay with new cache_seqlens values and new tokens."""
    c = replace(BIG, b=4, s_new=1, rotary="neox", page=page, s_cache=2048)
    x = make_inputs(c, "cuda")
    static = {k: v for k, v in x.items()}
    seqlens = static["cache_seqlens"]
    # warm-up (compiles) on a side stream, as torch's graph recipe asks
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for _ in range(2):
            flash_attn_with_kvcache(**static, num_splits=0, rotary_interleaved=False)
    torch.cuda.current_stream().wait_stream(s)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = flash_attn_with_kvcache(**static, num_splits=0, rotary_interleaved=False)
    for step in range(3):
        new_lens = torch.randint(0, 2047, (c.b,), dtype=torch.int32)
        seqlens.copy_(new_lens.cuda())
        static["q"].copy_(torch.randn_like(static["q"]))
        static["k"].copy_(torch.randn_like(static["k"]))
        static["v"].copy_(torch.randn_like(static["v"]))
        kc0, vc0 = static["k_cache"].clone(), static["v_cache"].clone()
        graph.replay()
        torch.cuda.synchronize()
        cpu = {k: (v.cpu() if isinstance(v, torch.Tensor) else v) for k, v in static.items()}
        cpu.update(k_cache=kc0.cpu(), v_cache=vc0.cpu())
        ref, _, k_after, v_after = kvcache_ref(**cpu, rotary_interleaved=False)
        low, _, _, _ = kvcache_ref(**cpu, rotary_interleaved=False, upcast=False)
        assert_close_rule(out, ref, low, name=f"graph replay {step}")
        assert torch.equal(static["v_cache"].cpu(), v_after)
        diff = (static["k_cache"].cpu().double() - k_after.double()).abs().max().item()
        assert diff <= 2 * 2.0**-7 * max(1.0, k_after.abs().max().item())


def test_combine_many_splits_with_empty() -> None:
    """flash_attn_combine against an unsplit float64 merge; empty splits (-inf) hold NaN."""
    n, b, s_q, h, d = 37, 3, 2, 8, 128
    out_p = torch.randn(n, b, s_q, h, d, device="cuda")
    lse_p = torch.randn(n, b, h, s_q, device="cuda") * 3
    empty = torch.rand(n, b, h, s_q, device="cuda") < 0.3
    lse_p[empty] = float("-inf")
    lse_p[:, 0, 0, 0] = float("-inf")  # a row with no key at all
    out_p.permute(0, 1, 3, 2, 4)[empty] = float("nan")
    out, lse = flash_attn_combine(out_p, lse_p, out_dtype=torch.bfloat16)
    w = torch.softmax(lse_p.double(), dim=0).nan_to_num(0.0)  # (n, b, h, s_q)
    o64 = torch.where(w.permute(0, 1, 3, 2)[..., None] > 0, out_p.double(), 0.0)
    ref = (o64 * w.permute(0, 1, 3, 2)[..., None]).sum(0)
    ref_lse = torch.logsumexp(lse_p.double(), dim=0)
    assert not torch.isnan(out).any()
    assert out.dtype == torch.bfloat16
    torch.testing.assert_close(out.double(), ref, atol=2e-2, rtol=1e-2)
    torch.testing.assert_close(lse.double(), ref_lse, atol=1e-5, rtol=1e-5)
    assert torch.all(out[0, 0, 0] == 0)


@pytest.mark.bigmem  # tens of GiB: run alone (gpu_check.sh), not beside other workers
def test_paged_offsets_beyond_2_31() -> None:
    """Pages whose element offset passes 2**31 (64-bit addressing of the gather)."""
    page, h_k, d = 256, 1, 128
    num_blocks = (2**31) // (page * h_k * d) + 64  # ~4.3 GB per cache in bf16
    try:
        kc = torch.empty(num_blocks, page, h_k, d, dtype=torch.bfloat16, device="cuda")
        vc = torch.empty_like(kc)
    except torch.cuda.OutOfMemoryError:
        pytest.skip("not enough GPU memory for a > 2**31-element cache")
    pages = torch.arange(num_blocks - 8, num_blocks, device="cuda", dtype=torch.int32)
    kc[pages.long()] = torch.randn(8, page, h_k, d, device="cuda").to(torch.bfloat16)
    vc[pages.long()] = torch.randn(8, page, h_k, d, device="cuda").to(torch.bfloat16)
    table = pages.flip(0).view(1, 8)
    q = torch.randn(1, 1, 4, d, device="cuda", dtype=torch.bfloat16)
    seqlens = torch.tensor([8 * page - 5], dtype=torch.int32, device="cuda")
    knew = torch.randn(1, 1, h_k, d, device="cuda", dtype=torch.bfloat16)
    vnew = torch.randn_like(knew)
    out = flash_attn_with_kvcache(q, kc, vc, knew, vnew, cache_seqlens=seqlens,
                                  block_table=table, num_splits=0)
    pos = torch.arange(8 * page - 4, device="cuda")
    rows = table[0].long()[pos // page]
    k_seq = kc[rows, pos % page].unsqueeze(0).cpu()
    v_seq = vc[rows, pos % page].unsqueeze(0).cpu()
    assert torch.equal(k_seq[0, -1], knew[0, 0].cpu())
    from flashattn.reference import attention_ref

    ref, _ = attention_ref(q.cpu(), k_seq, v_seq)
    low, _ = attention_ref(q.cpu(), k_seq, v_seq, upcast=False)
    assert_close_rule(out, ref, low)


@pytest.mark.bigmem  # ~2 GiB: run alone (gpu_check.sh), not beside other workers
def test_more_than_65535_query_blocks() -> None:
    """s_q * G / BLOCK_M past 65535 (grid axis 1's limit): the decode kernel's query blocks
    share grid axis 0 with (batch, KV head). 600k queries x 8 heads of one KV head = 4.8M
    rows, 75k blocks of 64; rows at both ends and in the middle checked against the oracle
    (non-causal: each row sees the whole cache, so rows are independent)."""
    s_q, h, h_k, d, s_cache = 600_000, 8, 1, 64, 96
    q = torch.randn(1, s_q, h, d, device="cuda", dtype=torch.bfloat16)
    kc = torch.randn(1, s_cache, h_k, d, device="cuda", dtype=torch.bfloat16)
    vc = torch.randn_like(kc)
    seqlens = torch.tensor([s_cache], dtype=torch.int32, device="cuda")
    out = flash_attn_with_kvcache(q, kc, vc, cache_seqlens=seqlens, num_splits=1)
    from flashattn.reference import attention_ref

    rows = torch.cat([torch.arange(0, 64), torch.arange(s_q // 2, s_q // 2 + 64),
                      torch.arange(s_q - 64, s_q)]).cuda()
    q_rows = q[:, rows].cpu()
    ref, _ = attention_ref(q_rows, kc.cpu(), vc.cpu())
    low, _ = attention_ref(q_rows, kc.cpu(), vc.cpu(), upcast=False)
    assert_close_rule(out[:, rows], ref, low)
