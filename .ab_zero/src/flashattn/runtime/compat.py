"""The Triton internals flashattn relies on, behind one small interface (Triton 3.6).

Everything here reaches past Triton's public API, so it is the one file to revisit when Triton
changes: the JIT's argument binder, the compiled kernel's positional launcher, the profiler's
launch hook, the driver's raw current-stream getter. Gluon builtins built from Triton's IR
builder live beside it (:mod:`flashattn.runtime.gluon_builtins`).
"""
from __future__ import annotations

from typing import Any, Callable, Sequence, Tuple

import torch
import triton
from triton.runtime.jit import JITFunction

try:  # what Triton's driver itself uses for the current stream (no Stream object built)
    from torch._C import _cuda_getCurrentRawStream as current_stream
except ImportError:  # pragma: no cover - CPU-only builds without the CUDA bindings
    def current_stream(device: int) -> int:
        return torch.cuda.current_stream(device).cuda_stream

# Triton's own JITFunction.run, as imported: the AOT recorder (tools/aot_portable.py) patches
# the class attribute, and launches must then take Triton's path.
_JIT_RUN = JITFunction.run


def is_jit_function(fn: Any) -> bool:
    """A ``triton.jit`` / ``gluon.jit`` function (not a recorder standing in for one)."""
    return isinstance(fn, JITFunction)


def jit_run_patched() -> bool:
    """Whether someone replaced ``JITFunction.run`` (the AOT recorder does)."""
    return JITFunction.run is not _JIT_RUN


def has_hooks(hook: Any) -> bool:
    """Whether a launch hook is set: Triton 3.6 keeps a HookChain, empty unless a hook was
    added (older Triton: a plain callable or None)."""
    return hook is not None and bool(getattr(hook, "calls", True))


def profiler_hooked() -> bool:
    """Whether a profiler (proton) listens to launches (``knobs.runtime.launch_enter_hook``)."""
    return has_hooks(triton.knobs.runtime.launch_enter_hook)


def binder(fn: Any, device: int) -> Callable[..., Tuple[Any, Any, Any]]:
    """The JIT's argument binder for ``device``: ``binder(*args, **kwargs)`` returns (bound
    arguments (an ordered dict), specialisation, options). Created by the JIT's first launch on
    that device (``fn.device_caches[device]`` is (kernel cache, ..., binder))."""
    return fn.device_caches[device][4]


def launch_compiled(kernel: Any, grid3: Tuple[int, int, int], device: int,
                    values: Sequence[Any]) -> None:
    """Launch a compiled kernel on the current stream of ``device`` with bound argument
    ``values`` (positional, in the kernel's argument order), no launch metadata or hooks."""
    kernel.run(*grid3, current_stream(device), kernel.function, kernel.packed_metadata,
               None, None, None, *values)


def is_compile_future(kernel: Any) -> bool:
    """A future from asynchronous compilation (not a kernel yet)."""
    return hasattr(kernel, "result")


def set_allocator(alloc: Callable[[int, int, Any], torch.Tensor]) -> None:
    """Global scratch for in-kernel tensor descriptors (a per-thread context variable)."""
    triton.set_allocator(alloc)


__all__ = ["binder", "current_stream", "has_hooks", "is_compile_future", "is_jit_function",
           "jit_run_patched", "launch_compiled", "profiler_hooked", "set_allocator"]
