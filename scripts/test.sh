#!/usr/bin/env bash
# The CPU test suite: the real Triton kernels run under the Triton interpreter, plus the
# chunked torch path, the API, the reference and the tools. Creates .venv on first use.
#   bash scripts/test.sh [pytest args]     e.g. bash scripts/test.sh -k causal
# GPU tests (marker `gpu`) are skipped here; on a GPU machine see scripts/gpu_check.sh.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
# shellcheck source=scripts/setup.sh
source scripts/setup.sh
export TRITON_INTERPRET=1
# pytest exits 5 when it collected nothing: that fails this script too, as it should.
# --dist loadgroup: tests marked xdist_group (a module that compiles once for all its tests)
# go to one worker together; every other test is balanced as with the default.
python -m pytest -n "${PYTEST_WORKERS:-2}" --dist loadgroup -m "not gpu" tests "$@"
