"""Launch autotuned Triton kernels without paying ``Autotuner.run`` on every call.

Triton 3.6's ``Autotuner.run`` rebuilds its cache key on each launch (a dict of every
argument, a list scan per argument name, ``str()`` of every tensor's dtype): measured 58 us
per launch of the forward kernel on the H100 host (``benchmarks/overhead_probe.py``,
``autotuner.run`` vs ``jit.run``), more GPU time than a small attention call takes. Here the
first launch for a key goes through the autotuner (it tunes, or reads Triton's on-disk cache),
its winner is remembered under a key the caller builds from values it already has, and later
launches go straight to the JIT function with the winner's meta-parameters: the same compiled
kernel the autotuner would launch.
"""
from __future__ import annotations

from typing import Any, Callable, Dict, Hashable, Tuple

import triton

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
    tuner.fn.run(*args, grid=grid, warmup=False, **kwargs, **winner.all_kwargs())


def forget_winners() -> None:
    """Drop the remembered winners (tests that change the autotune spaces or env)."""
    _WINNERS.clear()
