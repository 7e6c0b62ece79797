"""The launch helpers' decisions that need no GPU: when ``launch_jit`` must take Triton's own
path (profiler hooks, stand-ins for kernels, the switch), and the hook test itself. The fast
path's launches are covered by every GPU test (all kernels go through it)."""
from __future__ import annotations

import triton

from flashattn.runtime import compat, launch
from tests.settings import set_env


def test_has_hooks_reads_triton_hook_chains() -> None:
    chain = triton.knobs.HookChain()
    assert not compat.has_hooks(None)
    assert not compat.has_hooks(chain)  # Triton 3.6's default: an empty chain
    chain.add(lambda *a: None)
    assert compat.has_hooks(chain)
    assert compat.has_hooks(lambda *a: None)  # a plain callable (older Triton)


class _StandIn:
    """Records ``kernel[grid](*args, **kwargs)`` like the AOT recorders do."""

    def __init__(self) -> None:
        self.calls = []

    def __getitem__(self, grid):
        return lambda *args, **kwargs: self.calls.append((grid, args, kwargs))


def test_stand_in_kernels_get_the_indexing_call() -> None:
    fn = _StandIn()
    launch.launch_jit(fn, (3, 1), (1, 2.0), {"BLOCK": 16, "num_warps": 4})
    assert fn.calls == [((3, 1), (1, 2.0), {"BLOCK": 16, "num_warps": 4})]


def test_switch_off_takes_triton_path(monkeypatch) -> None:
    set_env(monkeypatch, FLASHATTN_FAST_LAUNCH="0")
    fn = _StandIn()
    launch.launch_jit(fn, (1,), (), {})
    assert fn.calls == [((1,), (), {})]


class _FakeKernel:
    """Stands in for a compiled kernel: ``run`` records what the launcher would get."""

    function = "fn"
    packed_metadata = "meta"

    def __init__(self) -> None:
        self.runs = []

    def run(self, *args):
        self.runs.append(args)


class _FakeDesc:
    """A host tensor descriptor as the recorded launch saw it."""

    def __init__(self, base, shape, strides):
        self.base, self.shape, self.strides, self.padding = base, shape, strides, "zero"
        self.block_shape = [1, 64, 1, 128]


def _plan(monkeypatch):
    import torch

    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    monkeypatch.setattr(compat, "current_stream", lambda device: 1234)
    q, lse = torch.zeros(2, 4, 2, 8), torch.zeros(8)
    values = [_FakeDesc(q, [2, 4, 2, 8], [64, 16, 8, 1]), lse, 7, 0.5, True]
    kernel = _FakeKernel()
    plan = launch.LaunchPlan(kernel, values, (3, 2, 1), 0, [(0, values[0]), (1, lse)])
    return plan, kernel, q, lse


def test_plan_replays_with_new_tensors_in_the_slots(monkeypatch) -> None:
    import torch

    plan, kernel, q, lse = _plan(monkeypatch)
    assert plan.values[:2] == [None, None]  # the recorded call's tensors are not kept alive
    q2, lse2 = torch.ones(2, 4, 2, 8), torch.ones(8)
    assert plan.launch(q2, lse2)
    (run,) = kernel.runs
    assert run[:9] == (3, 2, 1, 1234, "fn", "meta", None, None, None)
    desc, lse_arg, *rest = run[9:]
    assert isinstance(desc, launch.TensorDescArg) and desc.base is q2
    assert (desc.shape, desc.strides, desc.padding) == ([2, 4, 2, 8], [64, 16, 8, 1], "zero")
    assert lse_arg is lse2 and rest == [7, 0.5, True]


def test_plan_declines_what_its_key_cannot_see(monkeypatch) -> None:
    import torch

    plan, kernel, q, lse = _plan(monkeypatch)
    misaligned = torch.zeros(9)[1:]  # 4-byte offset: Triton specialises 16-byte alignment
    assert not plan.launch(q, misaligned)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 1)  # another device is current
    assert not plan.launch(q, lse)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    set_env(monkeypatch, FLASHATTN_FAST_LAUNCH="0")
    assert not plan.launch(q, lse)
    set_env(monkeypatch, FLASHATTN_FAST_LAUNCH="1")
    chain = triton.knobs.HookChain()
    chain.add(lambda *a: None)
    monkeypatch.setattr(triton.knobs.runtime, "launch_enter_hook", chain)  # a profiler
    assert not plan.launch(q, lse)
    assert kernel.runs == []


def test_plans_build_once_per_key_and_forget_past_the_cap(monkeypatch) -> None:
    import torch

    built, replayed = [], []

    class _Plan:
        def launch(self, *tensors):
            replayed.append(tensors)
            return True

    monkeypatch.setattr(launch, "launch_jit", lambda fn, grid, args, kwargs, plan_slots: _Plan())
    monkeypatch.setattr(launch, "MAX_PLANS", 2)
    plans = launch.LaunchPlans(slots=(0,))
    t = torch.zeros(4)

    def build():
        built.append(1)
        return None, (1,), (t,), {}

    for key in ("a", "a", "b", "a", "c", "a"):
        plans.launch(key, (t,), build)
    # a: built, replayed, (b built), replayed; c: cap reached -> all dropped; a: built again
    assert len(built) == 4 and len(replayed) == 2


def test_tuned_launch_plans_once_a_winner_is_known(monkeypatch) -> None:
    """launch_tuned_planned: the autotuner's path until a winner exists, then the plans, keyed
    by the non-tensor arguments, the tensors' dtypes and the resolved grid (a varlen call's
    batch reaches only the grid); plans=None always takes launch_tuned."""
    import torch

    tuned, planned = [], []
    monkeypatch.setattr(launch, "INTERPRET", False)
    monkeypatch.setattr(launch, "launch_tuned", lambda *a, **k: tuned.append(a))

    class _Plans:
        slots = (0,)

        def launch(self, key, tensors, build):
            planned.append((key, tensors, build()))

    class _Winner:
        def all_kwargs(self):
            return {"BLOCK_M": 64, "num_warps": 4}

    tuner = type("Tuner", (), {"fn": "kernel"})()
    t = torch.zeros(4)
    n_seqs = [3]

    def grid(meta):
        return (n_seqs[0] * 2, 128 // meta["BLOCK_M"])

    launch.launch_tuned_planned(_Plans(), tuner, grid, "k", t, 5, HEAD=8)
    assert len(tuned) == 1 and not planned  # no winner yet
    monkeypatch.setitem(launch._WINNERS, (id(tuner), "k", 8), _Winner())
    launch.launch_tuned_planned(None, tuner, grid, "k", t, 5, HEAD=8)
    assert len(tuned) == 2 and not planned  # no plans: the tuned path
    launch.launch_tuned_planned(_Plans(), tuner, grid, "k", t, 5, HEAD=8)
    n_seqs[0] = 4
    launch.launch_tuned_planned(_Plans(), tuner, grid, "k", t, 5, HEAD=8)
    (key1, tensors, (fn, _, args, kwargs)), (key2, _, _) = planned
    assert tensors == (t,) and fn == "kernel" and args == (t, 5)
    assert kwargs == {"HEAD": 8, "BLOCK_M": 64, "num_warps": 4}
    assert key1 != key2 and key1[-1] == (6, 2) and key2[-1] == (8, 2)
