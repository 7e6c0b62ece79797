#!/usr/bin/env bash
# CI: compile the Gluon (Hopper) kernels for sm_90 ahead of time on every Triton release that
# torch 2.12-2.15 install (3.6, the pinned one, is covered by tests/backends/sm90/test_hopper_aot.py in
# the CPU suite) and print a register / spill report per release (tools/aot_versions.py).
#   bash scripts/aot_triton_versions.sh [VERSION ...]      # default 3.7.1 3.8.0 3.9.0
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
exec "${PYTHON:-python}" -m tools.aot_versions "$@"
