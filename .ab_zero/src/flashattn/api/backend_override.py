"""Forcing a backend at run time: ``flashattn.use_backend(name)``."""
from __future__ import annotations

import contextlib
from typing import Iterator

from flashattn.runtime import env


@contextlib.contextmanager
def use_backend(name: str) -> Iterator[None]:
    """Run the calls inside the ``with`` block on backend ``name``:

    - ``"auto"``: the default choice (Hopper kernels on sm90 where they cover the call and
      measured faster, portable Triton kernels on other GPUs, chunked torch on CPU);
    - ``"portable"``: the portable Triton kernels (CUDA tensors, or CPU tensors under
      ``TRITON_INTERPRET=1``); never the Hopper kernels;
    - ``"hopper"``: the Hopper kernels for every call they cover, short ones included;
    - ``"cpu"``: the chunked torch path, on any device.

    The same as the ``FLASHATTN_BACKEND`` environment variable, without touching
    ``os.environ``. Process-wide (not per thread), for tests, benchmarks and debugging.
    """
    if not isinstance(name, str) or name.strip().lower() not in env.BACKENDS:
        raise ValueError(f"use_backend: name must be one of {', '.join(env.BACKENDS)}, "
                         f"got {name!r}")
    with env.override(backend=name.strip().lower()):
        yield


__all__ = ["use_backend"]
