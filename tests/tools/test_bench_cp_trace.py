"""``bench_cp``'s trace summary (``_profiled``): the span, NCCL time, NCCL time with no other
kernel beside it, time with no kernel at all, and the attention kernels in launch order, read
from profiler events (a stand-in profiler here: the real one needs CUDA)."""
from __future__ import annotations

import contextlib
from types import SimpleNamespace

import pytest
import torch

from flashattn import bench_cp


def _event(name, start_us, end_us):
    return SimpleNamespace(name=name, device_type=torch.autograd.DeviceType.CUDA,
                           time_range=SimpleNamespace(start=start_us, end=end_us))


def _fake_profiler(monkeypatch, events):
    """torch.profiler.profile yielding ``events``; no CUDA sync, no process group."""
    @contextlib.contextmanager
    def fake_profile(activities):
        yield SimpleNamespace(events=lambda: events)

    monkeypatch.setattr("torch.profiler.profile", fake_profile)
    monkeypatch.setattr(torch.cuda, "synchronize", lambda: None)
    monkeypatch.setattr(bench_cp.dist, "barrier", lambda: None)


def test_union_merges_overlapping_intervals():
    assert bench_cp._union([(5, 7), (0, 2), (1, 3), (3, 4)]) == [[0, 4], [5, 7]]
    assert bench_cp._union([]) == []


def test_profiled_summary(monkeypatch):
    # attention 0-10 ms and 12-20 ms; NCCL 8-11 ms (1 ms of it alone) and 25-27 ms (alone);
    # an add 21-22 ms; no kernel at 11-12, 20-21, 22-25 ms: 5 ms idle of a 27 ms span
    events = [_event("attn_fwd_kernel", 0, 10_000), _event("ncclDevKernel_SendRecv", 8_000, 11_000),
              _event("attn_fwd_kernel", 12_000, 20_000), _event("add_kernel", 21_000, 22_000),
              _event("ncclDevKernel_SendRecv", 25_000, 27_000),
              SimpleNamespace(name="cpu op", device_type=torch.autograd.DeviceType.CPU,
                              time_range=SimpleNamespace(start=0, end=99_000))]

    _fake_profiler(monkeypatch, events)
    calls = []
    row = bench_cp._profiled(lambda: calls.append(1), "", "unused")
    assert calls == [1, 1]  # a warm call, then the profiled one
    assert row["span_ms"] == pytest.approx(27.0)
    assert row["nccl_ms"] == pytest.approx(5.0)
    assert row["exposed_nccl_ms"] == pytest.approx(3.0)
    assert row["idle_ms"] == pytest.approx(5.0)
    assert row["attention_kernels_ms"] == [10.0, 8.0]
    assert row["top_kernels_ms"][0] == ("attn_fwd_kernel", 18.0, 2)


def test_profiled_host_stalls(monkeypatch):
    # host=True: the host's runtime calls that can hold the launch queue, by name (total ms,
    # count); launches are not stalls; without host the key is absent
    cpu = lambda name, a, b: SimpleNamespace(name=name, device_type=torch.autograd.DeviceType.CPU,
                                             time_range=SimpleNamespace(start=a, end=b))
    events = [_event("attn_fwd_kernel", 0, 10_000), cpu("cudaStreamSynchronize", 0, 4_000),
              cpu("cudaStreamSynchronize", 5_000, 5_500), cpu("cudaMalloc", 6_000, 8_000),
              cpu("cudaLaunchKernel", 8_000, 8_010)]

    _fake_profiler(monkeypatch, events)
    row = bench_cp._profiled(lambda: None, "", "unused", host=True)
    assert row["host_stalls"] == {"cudaStreamSynchronize": (4.5, 2), "cudaMalloc": (2.0, 1)}
    assert "host_stalls" not in bench_cp._profiled(lambda: None, "", "unused")


def test_window_pairs_count_the_visible_cells():
    """The varlen rows' FLOPs under a causal sliding window count each visible pair once."""
    for n in range(0, 12):
        for left in (-1, 0, 1, 3, 11, 20):
            brute = sum(1 for i in range(n) for j in range(i + 1) if left < 0 or i - j <= left)
            assert bench_cp._window_pairs(n, left) == brute, (n, left)
