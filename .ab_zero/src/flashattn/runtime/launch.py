"""Launch autotuned Triton kernels without paying ``Autotuner.run`` on every call.

Triton 3.6's ``Autotuner.run`` rebuilds its cache key on each launch (a dict of every
argument, a list scan per argument name, ``str()`` of every tensor's dtype): measured 58 us
per launch of the forward kernel on the H100 host (``benchmarks/probes/overhead_probe.py``,
``autotuner.run`` vs ``jit.run``), more GPU time than a small attention call takes. Here the
first launch for a key goes through the autotuner (it tunes, or reads Triton's on-disk cache),
its winner is remembered under a key the caller builds from values it already has, and later
launches go straight to the JIT function with the winner's meta-parameters: the same compiled
kernel the autotuner would launch.

``launch_jit`` then trims Triton's own ``JITFunction.run`` (see its docstring): every kernel of
the package launches through it.
"""
from __future__ import annotations

from typing import Any, Callable, Dict, Hashable, List, Optional, Sequence, Tuple

import torch
import triton

from flashattn.runtime import compat, env
from flashattn.runtime.buffers import stream_buffer
from flashattn.runtime.env import INTERPRET

_WINNERS: Dict[Tuple[Hashable, ...], triton.Config] = {}


def launch_tuned(tuner: Any, grid: Callable[..., Tuple[int, ...]], key: Hashable,
                 *args: Any, **kwargs: Any) -> None:
    """``tuner[grid](*args, **kwargs)``, skipping the autotuner once ``key`` has a winner.

    ``key`` with the keyword (constexpr) arguments must separate every call the autotuner
    keys apart: callers pass the runtime values among its ``key=`` arguments (the seq bucket)
    and the dtypes of the tensor arguments; the constexpr keyword values are added here.
    """
    if INTERPRET:  # one config, interpreted: nothing to save
        tuner[grid](*args, **kwargs)
        return
    full_key = (id(tuner), key, *kwargs.values())
    winner = _WINNERS.get(full_key)
    if winner is None:
        tuner[grid](*args, **kwargs)
        best = getattr(tuner, "best_config", None)  # unset when a launch was only recorded (AOT)
        if best is not None:
            _WINNERS[full_key] = best
        return
    launch_jit(tuner.fn, grid, args, {**kwargs, **winner.all_kwargs()})


def launch_tuned_planned(plans: Optional["LaunchPlans"], tuner: Any,
                         grid: Callable[..., Tuple[int, ...]], key: Hashable, *args: Any,
                         **kwargs: Any) -> Optional["LaunchPlan"]:
    """``launch_tuned``, and once the winner is known a replayed launch plan: the tensor
    arguments lead ``args`` (the plans' slots must be ``range(n)``); every other argument goes
    into the plan's key with ``key``. A repeated call shape then skips the binder and the
    argument specialisation (the causal tiny dense call). ``plans`` None: plain
    ``launch_tuned``. Returns the plan that launched or was recorded (None: the tuned path
    ran)."""
    full_key = (id(tuner), key, *kwargs.values())
    winner = None if INTERPRET or plans is None else _WINNERS.get(full_key)
    if winner is None:
        launch_tuned(tuner, grid, key, *args, **kwargs)
        return None
    n = len(plans.slots)
    tensors, others = args[:n], args[n:]
    # (the grid follows from the scalars and the winner's block sizes, but also from values the
    # kernel never sees, e.g. a varlen call's batch: it is resolved here and keyed)
    plan_key = (full_key, others, tuple(t.dtype for t in tensors),
                tuple(grid(winner.all_kwargs())))
    return plans.launch(plan_key, tensors,
                        lambda: (tuner.fn, grid, args, {**kwargs, **winner.all_kwargs()}))


def fast_launch_allowed() -> bool:
    """FLASHATTN_FAST_LAUNCH (default on), no profiler hook listening (then Triton's own path
    runs, with its launch metadata)."""
    return env.settings().fast_launch and not compat.profiler_hooked()


# how many launch plans a caller keeps before it drops them all (each holds a few hundred bytes
# of Python objects and no tensors; shapes that never repeat should not grow the cache forever)
MAX_PLANS = 1024

# (id(fn), device index, specialisation, options) -> compiled kernel
_KERNELS: Dict[Tuple[Hashable, ...], Any] = {}


def launch_jit(fn: Any, grid: Any, args: Sequence[Any], kwargs: Dict[str, Any],
               plan_slots: Optional[Sequence[int]] = None) -> Optional["LaunchPlan"]:
    """``fn[grid](*args, **kwargs)`` for a ``triton.jit`` / ``gluon.jit`` function, minus the
    parts of ``JITFunction.run`` that cost host time on every call without changing the launch.

    Kept from Triton's path: the binder (argument binding and Triton's own specialisation of
    every argument: dtypes, 16-byte alignment of pointers, integers equal to 1 or divisible by
    16), because the compiled kernel depends on it; the key here is exactly that
    specialisation plus the options, so a call whose arguments specialise differently never
    reuses another's binary. Skipped on a hit: ``compute_cache_key``'s tuple and ``str`` of the
    options, the knob reads, the pre-run hooks (none are registered on our kernels), the
    launch-metadata object (None unless a profiler hook is set: then Triton's path is taken).
    The first launch of each key, and every launch while a profiler's ``launch_enter_hook`` is
    set, go through ``fn.run`` unchanged. ``TRITON_DEBUG`` toggled after a kernel's first
    launch does not recompile it here (it is read at that first launch).

    ``plan_slots``: positions in ``args`` of the tensors (or tensor descriptors) that change
    from call to call; the launch then also returns a :class:`LaunchPlan` that replays it with
    new tensors in those positions (None when this launch took Triton's own path).
    """
    if (INTERPRET or compat.jit_run_patched()  # interpreted, AOT recorder
            or not compat.is_jit_function(fn)  # a recorder standing in for the kernel
            or not fast_launch_allowed()):  # switched off, or a profiler listens
        fn[grid](*args, **kwargs)
        return None
    device = torch.cuda.current_device()
    bound, spec, options = compat.binder(fn, device)(*args, **kwargs)
    key = (id(fn), device, tuple(spec), tuple(options.items()))
    try:
        kernel = _KERNELS.get(key)
    except TypeError:  # an unhashable option or constexpr: Triton's path (it str()s them)
        key, kernel = None, None
    if callable(grid):
        grid = grid(bound)
    n = len(grid)
    grid3 = (grid[0], grid[1] if n > 1 else 1, grid[2] if n > 2 else 1)
    if kernel is None:
        kernel = fn.run(*args, grid=grid, warmup=False, **kwargs)
        if key is None or kernel is None or compat.is_compile_future(kernel):
            # (a future from async compilation is not a kernel yet: keep asking Triton)
            return None
        _KERNELS[key] = kernel
    else:
        compat.launch_compiled(kernel, grid3, device, bound.values())
    if plan_slots is None:
        return None
    return LaunchPlan(kernel, list(bound.values()), grid3, device,
                      [(i, args[i]) for i in plan_slots])


class TensorDescArg:
    """What Triton's launcher reads from a host tensor descriptor (``base.data_ptr()``,
    ``shape``, ``strides``, ``padding``, and from 3.9 ``round_f32_to_tf32``: nvidia driver
    ``make_tensordesc_arg``), without ``TensorDescriptor``'s construction-time validation (~6 us
    of Python per descriptor on the H100 host): a replayed launch changes only the base; the
    shape and strides it replays were validated when the plan was recorded."""

    __slots__ = ("base", "shape", "strides", "padding", "round_f32_to_tf32")

    def __init__(self, base: torch.Tensor, shape: Any, strides: Any, padding: str,
                 round_f32_to_tf32: bool = False) -> None:
        self.base, self.shape, self.strides, self.padding = base, shape, strides, padding
        self.round_f32_to_tf32 = round_f32_to_tf32


class LaunchPlan:
    """One recorded launch (compiled kernel, bound argument values, grid) that later calls
    replay with new tensors in the recorded slots: no binder, no descriptor validation.

    Contract: a caller replays a plan only for calls whose every non-slot argument, constexpr,
    option and grid equals the recorded call's, and whose slot descriptors cover tensors of the
    recorded shape and strides: it caches plans under a key made of exactly what determines
    those (shapes, strides, dtypes, scalars, config). What the key cannot see is checked in
    :meth:`launch`: the 16-byte alignment of plain tensor slots (part of Triton's
    specialisation), the current device, and whether the fast path is allowed right now.
    """

    __slots__ = ("kernel", "values", "grid", "device", "slots")

    def __init__(self, kernel: Any, values: List[Any], grid: Tuple[int, int, int], device: int,
                 slots: Sequence[Tuple[int, Any]]) -> None:
        self.kernel, self.grid, self.device = kernel, grid, device
        # (position, descriptor (shape, strides, padding) or None, alignment of a plain tensor)
        self.slots = tuple(
            (i, (list(a.shape), list(a.strides), a.padding,
                 bool(getattr(a, "round_f32_to_tf32", False))) if hasattr(a, "block_shape")
             else None, None if hasattr(a, "block_shape") else a.data_ptr() % 16 == 0)
            for i, a in slots)
        # the recorded call's tensors leave the template: a cached plan must not keep them alive
        positions = {i for i, _ in slots}
        self.values = [None if i in positions else a for i, a in enumerate(values)]

    def launch(self, *tensors: torch.Tensor) -> bool:
        """Launch with ``tensors`` in the slots (in ``plan_slots`` order; a descriptor slot
        takes the tensor the descriptor covers). False, with nothing launched, when this call
        must take the full path: fast launches off or a profiler hook set, another current
        device, or a plain tensor whose 16-byte alignment differs from the recorded one."""
        args = []
        for (_, desc, aligned), t in zip(self.slots, tensors):
            if desc is None:
                if (t.data_ptr() % 16 == 0) != aligned:
                    return False
                args.append(t)
            else:
                args.append(TensorDescArg(t, *desc))
        return self.replay(args)

    def replay(self, slot_values: Sequence[Any]) -> bool:
        """:meth:`launch` for a caller that has checked what :meth:`launch` checks per tensor:
        ``slot_values`` are the slots' arguments as the launcher takes them (device addresses
        as ints: no ``data_ptr()`` call and no driver pointer query per argument; tensors;
        descriptors), with the recorded 16-byte alignment. False, with nothing launched, when
        fast launches are off, a profiler listens or another device is current."""
        if not fast_launch_allowed() or torch.cuda.current_device() != self.device:
            return False
        values = self.values.copy()
        for (i, _, _), x in zip(self.slots, slot_values):
            values[i] = x
        compat.launch_compiled(self.kernel, self.grid, self.device, values)
        return True

    def replay_addresses(self, addresses: Sequence[int]) -> bool:
        """:meth:`replay` with every slot given as a device address (int), descriptor slots
        included: a descriptor slot gets the recorded shape and strides over ``addresses[i]``
        (for memory the caller places itself, e.g. a reused workspace: no tensor view per
        call). The caller guarantees the recorded 16-byte alignment of each address."""
        return self.replay([a if desc is None else TensorDescArg(_Address(a), *desc)
                            for (_, desc, _), a in zip(self.slots, addresses)])


class _Address:
    """A device address standing in for a descriptor's base tensor: Triton's launcher reads
    only ``base.data_ptr()`` from it (``make_tensordesc_arg``, Triton 3.6-3.9)."""

    __slots__ = ("address",)

    def __init__(self, address: int) -> None:
        self.address = address

    def data_ptr(self) -> int:
        return self.address


def forget_winners() -> None:
    """Drop the remembered winners and compiled kernels (tests that change spaces or env)."""
    _WINNERS.clear()
    _KERNELS.clear()


class LaunchPlans:
    """One call site's launch plans by key, at most MAX_PLANS (then dropped all at once:
    shapes that never repeat must not grow the cache forever).

    ``key`` must determine every argument of the launch apart from the slot tensors (see
    :class:`LaunchPlan`'s contract); ``build()`` returns ``(fn, grid, args, kwargs)`` with
    ``args[slots[i]]`` made from ``tensors[i]`` (the tensor itself, or a descriptor over it)
    and runs only when no plan replays the call.
    """

    def __init__(self, slots: Sequence[int]) -> None:
        self.slots = tuple(slots)
        self._plans: Dict[Hashable, LaunchPlan] = {}

    def launch(self, key: Hashable, tensors: Sequence[torch.Tensor],
               build: Callable[[], Tuple[Any, Any, Sequence[Any], Dict[str, Any]]]
               ) -> Optional[LaunchPlan]:
        """Launch: replay ``key``'s plan with ``tensors``, or build the arguments, launch through
        :func:`launch_jit` on ``tensors[0]``'s device and keep the plan it records. Returns the
        plan that launched or was recorded (None: Triton's own path ran, nothing recorded)."""
        plan = self._plans.get(key)
        if plan is not None and plan.launch(*tensors):
            return plan
        fn, grid, args, kwargs = build()
        device = tensors[0].device
        if device.type == "cuda":  # (CPU tensors: the interpreter)
            with torch.cuda.device(device):
                recorded = launch_jit(fn, grid, args, kwargs, plan_slots=self.slots)
        else:
            recorded = launch_jit(fn, grid, args, kwargs, plan_slots=self.slots)
        if recorded is not None:
            if len(self._plans) >= MAX_PLANS:
                self._plans.clear()
            self._plans[key] = recorded
        return recorded

    def clear(self) -> None:
        self._plans.clear()


def _scratch(size: int, alignment: int, stream):
    """Triton's launcher asks for the global scratch of one launch (its kernels' TMA maps):
    the stream's reused buffer (``runtime.buffers``; a decode step saved one ``torch.empty``,
    4-6 µs of host time). The scratch lives only while that launch runs, and the next launch
    on the stream starts after it."""
    if INTERPRET:
        return torch.empty(size, dtype=torch.int8, device="cpu")
    return stream_buffer("triton-scratch", size, torch.cuda.current_device(), stream)


def install_allocator() -> None:
    """In-kernel tensor descriptors need global scratch for their TMA maps: give Triton an
    allocator (the context variable is per thread, so set it on every launch)."""
    compat.set_allocator(_scratch)
