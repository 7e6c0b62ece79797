#!/usr/bin/env bash
# CI: a slice of the CPU suite on the newest stack: torch 2.13 (the venv's, CPU) with the newest
# Triton release and the numpy it brings forward (2.4), laid over the venv with PYTHONPATH.
# The slice touches every feature once (dense / varlen / KV cache / FP8 / combine / compile /
# the ops layer / the recorded calls' autograd functions / the Hopper path's Triton passes /
# the CPU path) through the interpreted kernels; the full suite runs on the
# pinned stack (scripts/test.sh). The dense grid's dropout cases are left to the pinned stack
# (half the slice's time: the interpreter runs Philox op by op); test_api's dropout tests
# stay. Triton comes from .aot-triton/<version> (installed by tools/aot_versions.py, or here).
#   bash scripts/test_newest.sh [pytest args]
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
PY="${PYTHON:-python}"
TRITON_NEWEST="${TRITON_NEWEST:-3.9.0}"
NUMPY_NEWEST="${NUMPY_NEWEST:-2.4.*}"
tdir=".aot-triton/$TRITON_NEWEST"
ndir=".newest-stack/numpy"
[ -f "$tdir/triton/__init__.py" ] || "$PY" -m pip install --quiet --no-deps --target "$tdir" "triton==$TRITON_NEWEST"
[ -d "$ndir/numpy" ] || "$PY" -m pip install --quiet --no-deps --target "$ndir" "numpy==$NUMPY_NEWEST"
export PYTHONPATH="$tdir:$ndir:src:."
export TRITON_INTERPRET=1
"$PY" -c 'import torch, triton, numpy; print("newest stack: torch", torch.__version__, "triton", triton.__version__, "numpy", numpy.__version__)'
"$PY" -m pytest -n "${PYTEST_WORKERS:-2}" -q -m "not gpu" -p no:cacheprovider \
    tests/api/test_api.py tests/api/test_attention.py tests/api/test_varlen.py \
    tests/api/test_kvcache.py tests/api/test_combine.py tests/api/test_fp8_attention.py \
    tests/api/test_compile.py tests/internals/test_ops.py tests/api/test_fastpath_varlen.py \
    tests/backends/sm90/test_hopper_passes.py tests/backends/cpu \
    -k "not (test_attention and drop0)" "$@"
