"""The packed (varlen) Hopper forwards' and backward's launch plans on the CPU (no GPU: the kernel is never
launched). A plan replays a recorded launch with new tensors in its slots, so the tensors each
call hands to the plan must be, slot for slot, the ones the built arguments hold (the tensor
itself, or a view of the memory a TMA descriptor covers). A mismatch would launch on the wrong memory
only on a replay, which the GPU tests reach on a repeated call."""
from __future__ import annotations

import pytest
import torch

pytest.importorskip("triton")

from flashattn.params import ONE_BLOCK_SHIFT, Fp8Scales  # noqa: E402
from flashattn.backends.sm90 import fwd as sm90_fwd  # noqa: E402


class _Recorder:
    def __init__(self, slots):
        self.slots = slots
        self.calls = []

    def launch(self, key, tensors, build):
        self.calls.append((tensors, build()))


@pytest.fixture
def recorders(monkeypatch):
    recs = {k: _Recorder(p.slots) for k, p in sm90_fwd._PACKED_PLANS.items()}
    monkeypatch.setattr(sm90_fwd, "_PACKED_PLANS", recs)
    monkeypatch.setattr(sm90_fwd, "sm_count", lambda device: 132)
    return recs


def _check_slots(rec):
    (tensors, (_, _, args, _)), = rec.calls
    # (distinct memory in every slot but O's two, its descriptor and its pointer, so that a
    # swapped pair cannot pass)
    assert len({t.data_ptr() for t in tensors}) == len(tensors) - 1
    assert len(tensors) == len(rec.slots)
    for slot, t in zip(rec.slots, tensors):
        arg = args[slot]
        held = arg.base if hasattr(arg, "block_shape") else arg
        # (a replay passes the slot tensor's address: a descriptor's base may be another view
        # of it, as FP8's V^T is, a permutation of the (1, s, h_k, d_v) view)
        assert held.data_ptr() == t.data_ptr(), f"slot {slot}: another tensor's address"


@pytest.mark.parametrize("sink", [False, True])
@pytest.mark.parametrize("used", [False, True])
def test_bf16_packed_plan_slots(recorders, used, sink):
    cu = torch.tensor([0, 100, 300], dtype=torch.int32)
    q = torch.randn(300, 4, 128).bfloat16()
    k = torch.randn(300, 2, 128).bfloat16()
    seqused = torch.tensor([50, 200], dtype=torch.int32) if used else None
    sinks = torch.randn(4) if sink else None
    sm90_fwd.flash_fwd_hopper_varlen(q, k, k.clone(), cu, cu.clone(), softmax_scale=0.1,
                                     causal=True, window_left=-1, window_right=0, softcap=0.0,
                                     seqused_k=seqused, sink=sinks)
    rec = recorders[(False, used, sink)]
    _check_slots(rec)
    (_, (_, _, args, _)), = rec.calls
    assert args[sm90_fwd.SINK_ARG] is sinks  # (None: the kernel's variant without sinks)


@pytest.mark.parametrize("used", [False, True])
def test_fp8_packed_plan_slots(recorders, used):
    cu = torch.tensor([0, 100, 300], dtype=torch.int32)
    q8 = torch.randn(300, 4, 128).to(torch.float8_e4m3fn)
    k8 = torch.randn(300, 2, 128).to(torch.float8_e4m3fn)
    qd, kd, vd = torch.ones(2, 4, 1), torch.ones(2, 2, 1), torch.ones(2, 2, 1)
    scales = Fp8Scales(qd, kd, vd, ONE_BLOCK_SHIFT, ONE_BLOCK_SHIFT)
    seqused = torch.tensor([50, 200], dtype=torch.int32) if used else None
    sm90_fwd.flash_fwd_hopper_fp8_varlen(q8, k8, k8.clone(), cu, cu.clone(), 200, scales,
                                         softmax_scale=0.1, window_left=-1, window_right=0,
                                         softcap=0.0,
                                         out_dtype=torch.bfloat16, seqused_k=seqused)
    _check_slots(recorders[(True, used, False)])


@pytest.mark.parametrize("d", [128, 256])
@pytest.mark.parametrize("used", [False, True])
def test_packed_backward_plan_slots(monkeypatch, d, used):
    """The packed backward's launch plans (bwd_kernel.py at d = 128, bwd_wide_kernel.py at
    d = 256), with and without seqused_k: every slot holds the memory its argument uses."""
    from flashattn.backends.sm90 import bwd as sm90_bwd

    recs = {k: _Recorder(p.slots) for k, p in sm90_bwd._VARLEN_PLANS.items()}
    monkeypatch.setattr(sm90_bwd, "_VARLEN_PLANS", recs)
    cu = torch.tensor([0, 100, 300], dtype=torch.int32)
    q = torch.randn(300, 4, d).bfloat16()
    k, v = torch.randn(300, 2, d).bfloat16(), torch.randn(300, 2, d).bfloat16()
    lse = torch.randn(4, 300)
    seqused = torch.tensor([50, 200], dtype=torch.int32) if used else None
    sm90_bwd.flash_bwd_hopper_varlen(q.clone(), q, k, v, q.clone(), lse, cu, cu.clone(),
                                     softmax_scale=0.1, causal=True, window_left=-1,
                                     window_right=0, softcap=0.0, seqused_k=seqused)
    rec = recs[used]
    (tensors, (_, _, args, _)), = rec.calls
    assert len(tensors) == len(rec.slots)
    # (the dQ workspace sits in two slots, its descriptor and its pointer, and lse2 stands in
    # for the unused tile counter: every other slot is distinct memory)
    assert len({t.data_ptr() for t in tensors}) == len(tensors) - 2
    for slot, t in zip(rec.slots, tensors):
        arg = args[slot]
        held = arg.base if hasattr(arg, "block_shape") else arg
        assert held.data_ptr() == t.data_ptr(), f"slot {slot}: another tensor's address"
    if used:
        assert args[rec.slots[-1]] is tensors[-1]  # seqused_k in the kernel's argument
