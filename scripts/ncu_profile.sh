#!/usr/bin/env bash
# Nsight Compute profile (device machine) of every kernel of one attention call: ours (Hopper
# Gluon) and cuDNN, d=128 non-causal 16k, bf16 by default. Reports land in $OUT/ncu_<mode>_<impl>.txt.
#   bash scripts/ncu_profile.sh                    # forward
#   MODE=bwd bash scripts/ncu_profile.sh           # the backward's kernels (row stats, main, dQ)
#   PROFILE_ARGS="--d 64 --causal" IMPLS="hopper cudnn" SECTIONS="..." to change what is run
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
OUT="${OUT:-$PWD/.device_out}"; mkdir -p "$OUT"
export PYTHONPATH="$PWD/src${PYTHONPATH:+:$PYTHONPATH}"
PY=python3; "$PY" -c 'import torch' 2>/dev/null || PY=/opt/torch/.venv/bin/python3
NCU="$(command -v ncu || ls /usr/local/cuda*/bin/ncu 2>/dev/null | head -1)"
[ -n "$NCU" ] || { echo "ncu not found"; exit 1; }
SECTIONS="${SECTIONS:-SpeedOfLight ComputeWorkloadAnalysis MemoryWorkloadAnalysis Occupancy LaunchStats WarpStateStats SchedulerStats}"
ARGS=(); for s in $SECTIONS; do ARGS+=(--section "$s"); done
MODE="${MODE:-fwd}"
# profile_attn.py brackets its last call with cudaProfilerStart / Stop: every kernel of that call
for impl in ${IMPLS:-hopper cudnn}; do
    rep="$OUT/ncu_${MODE}_$impl.txt"
    timeout "${NCU_TIMEOUT:-150}" "$NCU" --profile-from-start off "${ARGS[@]}" \
        "$PY" benchmarks/probes/profile_attn.py --impl "$impl" --mode "$MODE" ${PROFILE_ARGS:-} > "$rep" 2>&1
    echo "== $MODE $impl rc=$? ($(wc -l < "$rep") lines)"
    grep -E "^  [A-Za-z_].*\(|Duration|Compute \(SM\) Throughput|Memory Throughput|Registers Per|Achieved Occupancy|Issue Slots Busy|No Eligible|One or More Eligible|Executed Ipc Active" "$rep" | head -60
done
