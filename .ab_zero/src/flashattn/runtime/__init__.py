"""The runtime layer: the only code that reads the environment or touches Triton internals.

    env.py             every environment variable, read once (Settings, override, use_backend)
    device.py          cached device properties (SM count, compute capability)
    grid.py            host-side integer helpers for grids (cdiv, next_pow2, axis limits)
    compat.py          the Triton internals the launcher needs, behind one small interface
    gluon_builtins.py  Gluon builtins from Triton's IR builder (TMA reduce-add)
    launch.py          cached launches: autotune winners, trimmed JIT launch, launch plans
"""
