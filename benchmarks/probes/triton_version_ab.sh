#!/usr/bin/env bash
# Same-machine A/B of two Triton releases on one probe: rounds alternate between the image's
# triton (3.6) and another release carried as repacked parts (scripts/repack_triton_wheel.sh,
# scripts/gpu_triton_overlay.sh), one process per round and release, each with its own
# Triton cache. Every output line of the probe that is a JSON object gets "triton": version.
#
#   ROUNDS=2 bash benchmarks/probes/triton_version_ab.sh .wheels/triton-3.9.0 OUT.jsonl \
#       python3 benchmarks/probes/fp8_kernel_ab.py --repeat 2
set -euo pipefail
parts="${1:?usage: triton_version_ab.sh PARTS_DIR OUT.jsonl COMMAND...}"
out="${2:?}"
shift 2
version="$(basename "$parts")"; version="${version#triton-}"
base="$(python3 -c 'import triton; print(triton.__version__)')"
tag() {  # prefix each JSON line of stdin with the release it ran on
    python3 -c 'import json, sys
for line in sys.stdin:
    line = line.strip()
    if line.startswith("{"):
        rec = json.loads(line); rec["triton"] = sys.argv[1]; print(json.dumps(rec), flush=True)
    elif line:
        print(line, file=sys.stderr)' "$1" >> "$out"
}
for round in $(seq "${ROUNDS:-2}"); do
    echo "== round $round: triton $base" >&2
    TRITON_CACHE_DIR="/tmp/tc-$base" "$@" | tag "$base"
    echo "== round $round: triton $version" >&2
    TRITON_CACHE_DIR="/tmp/tc-$version" bash scripts/gpu_triton_overlay.sh "$parts" -- "$@" \
        | tag "$version"
done
