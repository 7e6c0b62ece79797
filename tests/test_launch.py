"""The launch helpers' decisions that need no GPU: when ``launch_jit`` must take Triton's own
path (profiler hooks, stand-ins for kernels, the switch), and the hook test itself. The fast
path's launches are covered by every GPU test (all kernels go through it)."""
from __future__ import annotations

import triton

from flashattn.kernels import launch


def test_has_hooks_reads_triton_hook_chains() -> None:
    chain = triton.knobs.HookChain()
    assert not launch._has_hooks(None)
    assert not launch._has_hooks(chain)  # Triton 3.6's default: an empty chain
    chain.add(lambda *a: None)
    assert launch._has_hooks(chain)
    assert launch._has_hooks(lambda *a: None)  # a plain callable (older Triton)


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
    monkeypatch.setattr(launch, "FAST_LAUNCH", False)
    fn = _StandIn()
    launch.launch_jit(fn, (1,), (), {})
    assert fn.calls == [((1,), (), {})]
