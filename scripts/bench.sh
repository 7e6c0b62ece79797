#!/usr/bin/env bash
# The benchmark. On a CUDA machine: the grid of shared/ANCHORS.md (flashattn beside SDPA
# flash / cuDNN, Flex and FlashAttention-4 where flash_attn.cute imports), results merged into
# benchmarks/results/<gpu>.json. Without a GPU:
# the CPU demo (exactness vs the float64 reference, then memory vs naive attention).
# Creates .venv on first use.
#   bash scripts/bench.sh [flashattn bench args]   e.g. bash scripts/bench.sh --quick
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
# shellcheck source=scripts/setup.sh
source scripts/setup.sh
exec python -m flashattn bench "$@"
