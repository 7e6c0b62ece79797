"""flashattn.parallel on 2 GPUs with NCCL and the GPU kernels (Hopper's where they apply):
the cases of tests/parallel/cases.py at GPU sizes against the float64 oracle, and a
deterministic ring repeated bitwise. Needs 2 CUDA devices (the device tool's nvidia-h100-x2
or larger)."""
from __future__ import annotations

import pytest
import torch

from tests.parallel import cases as c
from tests.parallel.harness import run

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs 2 GPUs")]

BF16 = torch.bfloat16
BIG = dict(b=1, s_per_rank=512, h=8, hk=2, d=128, dtype=BF16)


def test_parallel_calls_nccl():
    cases = [
        ("ring causal", c.ring_dense, dict(BIG)),
        ("ring full d64", c.ring_dense, dict(BIG, causal=False, d=64, hk=8)),
        ("ring sliding window", c.ring_dense, dict(BIG, window_size=(300, 0))),
        ("ring two-sided window softcap", c.ring_dense,
         dict(BIG, causal=False, window_size=(200, 100), softcap=20.0)),
        ("ring contiguous causal", c.ring_dense, dict(BIG, layout="contiguous")),
        ("ring deterministic repeated bitwise", c.ring_dense, dict(BIG, deterministic=True)),
        ("ring fp16 d256 MQA", c.ring_dense, dict(BIG, d=256, hk=1, dtype=torch.float16)),
        ("varlen ring causal", c.ring_varlen,
         dict(lengths=(64, 256, 128, 512), h=8, hk=2, d=128, dtype=BF16)),
        ("varlen ring full", c.ring_varlen,
         dict(lengths=(96, 320), h=8, hk=8, d=128, dtype=BF16, causal=False)),
        ("varlen ring sliding window", c.ring_varlen,
         dict(lengths=(64, 256, 0, 512), h=8, hk=2, d=128, dtype=BF16, window_size=(200, 0))),
        ("varlen ring alibi causal deterministic repeated bitwise", c.ring_varlen,
         dict(lengths=(128, 64, 128), h=8, hk=2, d=64, dtype=BF16, alibi="docs",
              deterministic=True)),
        ("ulysses causal", c.ulysses_dense, dict(b=1, s_per_rank=512, d=128, dtype=BF16)),
        ("ulysses window alibi MQA", c.ulysses_dense,
         dict(b=1, s_per_rank=384, d=128, dtype=BF16, hk=1, window_size=(128, 0), alibi=True)),
        ("ulysses varlen", c.ulysses_varlen,
         dict(lengths=(300, 700, 1024), d=128, dtype=BF16)),
        ("bad inputs", c.bad_inputs, dict()),
        ("ring alibi causal", c.ring_dense,
         dict(b=1, s_per_rank=384, d=128, dtype=BF16, alibi=True)),
        ("ring alibi full GQA", c.ring_dense,
         dict(b=1, s_per_rank=256, d=64, dtype=BF16, hk=2, causal=False, alibi=True)),
    ]
    failures = run(2, cases, seed=1234, backend="nccl")
    assert not failures, "\n".join(failures)


@pytest.mark.skipif(torch.cuda.device_count() < 4, reason="needs 4 GPUs")
def test_ring_calls_nccl_four_ranks():
    """Four ranks: K / V blocks chained ahead of the compute on the side stream (three
    exchanges in the forward, not one), and dK / dV partials sent home from one, two and
    three ranks away."""
    cases = [
        ("ring causal", c.ring_dense, dict(BIG)),
        ("ring full GQA", c.ring_dense, dict(BIG, causal=False)),
        ("ring sliding window (ends early)", c.ring_dense, dict(BIG, window_size=(600, 0))),
        ("ring contiguous causal", c.ring_dense, dict(BIG, layout="contiguous")),
        ("ring deterministic repeated bitwise", c.ring_dense, dict(BIG, deterministic=True)),
        ("varlen ring causal", c.ring_varlen,
         dict(lengths=(64, 256, 128, 512), h=8, hk=2, d=128, dtype=BF16)),
    ]
    failures = run(4, cases, seed=4321, backend="nccl")
    assert not failures, "\n".join(failures)
