"""Launch autotuned Triton kernels without paying ``Autotuner.run`` on every call.

Triton 3.6's ``Autotuner.run`` rebuilds its cache key on each launch (a dict of every
argument, a list scan per argument name, ``str()`` of every tensor's dtype): measured 58 us
per launch of the forward kernel on the H100 host (``benchmarks/overhead_probe.py``,
``autotuner.run`` vs ``jit.run``), more GPU time than a small attention call takes. Here the
first launch for a key goes through the autotuner (it tunes, or reads Triton's on-disk cache),
its winner is remembered under a key the caller builds from values it already has, and later
launches go straight to the JIT function with the winner's meta-parameters: the same compiled
kernel the autotuner would launch.

``launch_jit`` then trims Triton's own ``JITFunction.run`` (see its docstring): every kernel of
the package launches through it.
"""
from __future__ import annotations

import os
from typing import Any, Callable, Dict, Hashable, Sequence, Tuple

import torch
import triton
from triton.runtime.jit import JITFunction

from flashattn.kernels.config import INTERPRET

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


try:  # what Triton's driver itself uses for the current stream (no Stream object built)
    from torch._C import _cuda_getCurrentRawStream as _current_stream
except ImportError:  # pragma: no cover - CPU-only builds without the CUDA bindings
    def _current_stream(device: int) -> int:
        return torch.cuda.current_stream(device).cuda_stream

_JIT_RUN = JITFunction.run  # Triton's own, as imported (the AOT recorder patches it)
# FLASHATTN_FAST_LAUNCH=0: every launch through Triton's own path (an escape hatch, and the
# A/B switch of benchmarks/launch_probe.py, which flips this attribute)
FAST_LAUNCH = os.environ.get("FLASHATTN_FAST_LAUNCH", "1") != "0"


def _has_hooks(hook: Any) -> bool:
    # Triton 3.6 keeps a HookChain here, empty unless a profiler (proton) added a hook
    return hook is not None and bool(getattr(hook, "calls", True))


# (id(fn), device index, specialisation, options) -> compiled kernel
_KERNELS: Dict[Tuple[Hashable, ...], Any] = {}


def launch_jit(fn: Any, grid: Any, args: Sequence[Any], kwargs: Dict[str, Any]) -> None:
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
    """
    if (not FAST_LAUNCH or INTERPRET or JITFunction.run is not _JIT_RUN  # interpreted, AOT
            or not isinstance(fn, JITFunction)  # a recorder standing in for the kernel
            or _has_hooks(triton.knobs.runtime.launch_enter_hook)):  # a profiler listens
        fn[grid](*args, **kwargs)
        return
    device = torch.cuda.current_device()
    binder = fn.device_caches[device][4]
    bound, spec, options = binder(*args, **kwargs)
    key = (id(fn), device, tuple(spec), tuple(options.items()))
    try:
        kernel = _KERNELS.get(key)
    except TypeError:  # an unhashable option or constexpr: Triton's path (it str()s them)
        key, kernel = None, None
    if kernel is None:
        kernel = fn.run(*args, grid=grid, warmup=False, **kwargs)
        if key is not None and kernel is not None and not hasattr(kernel, "result"):
            # (a future from async compilation is not a kernel yet: keep asking Triton)
            _KERNELS[key] = kernel
        return
    if callable(grid):
        grid = grid(bound)
    n = len(grid)
    kernel.run(grid[0], grid[1] if n > 1 else 1, grid[2] if n > 2 else 1,
               _current_stream(device), kernel.function,
               kernel.packed_metadata, None, None, None, *bound.values())


def forget_winners() -> None:
    """Drop the remembered winners and compiled kernels (tests that change spaces or env)."""
    _WINNERS.clear()
    _KERNELS.clear()
