"""The kernel families behind the ops, one package each, independent of each other:

    interface.py  the backend interface (typing.Protocol): what every ``<backend>/backend.py``
                  exposes (checked per backend by tests/internals/test_backend_interface.py)
    sm90/         Gluon kernels for Hopper (TMA, wgmma, warp specialisation, FP8)
    triton/       portable Triton kernels (every CUDA GPU; the interpreter on CPU)
    cpu/          exact torch paths for machines without a GPU

Nothing here imports a backend: :mod:`flashattn.dispatch.select` imports the one a call needs,
on first use, so ``import flashattn`` works where Triton does not.
"""
