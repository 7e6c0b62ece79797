#!/usr/bin/env bash
# Nsight Compute profile of the forward kernels (device machine): ours (Hopper Gluon) and cuDNN,
# d=128 non-causal 16k, bf16. Text reports land in $OUT/ncu_<impl>.txt.
#   bash scripts/ncu_profile.sh            # SECTIONS="..." to change what is collected
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
OUT="${OUT:-$PWD/.device_out}"; mkdir -p "$OUT"
export PYTHONPATH="$PWD/src${PYTHONPATH:+:$PYTHONPATH}"
PY=python3; "$PY" -c 'import torch' 2>/dev/null || PY=/opt/torch/.venv/bin/python3
NCU="$(command -v ncu || ls /usr/local/cuda*/bin/ncu 2>/dev/null | head -1)"
[ -n "$NCU" ] || { echo "ncu not found"; exit 1; }
SECTIONS="${SECTIONS:-SpeedOfLight ComputeWorkloadAnalysis MemoryWorkloadAnalysis Occupancy LaunchStats WarpStateStats SchedulerStats}"
ARGS=(); for s in $SECTIONS; do ARGS+=(--section "$s"); done
for spec in "hopper:attn_fwd_kernel" "cudnn:sdpa|fmha|flash|cudnn" ${EXTRA_IMPLS:-}; do
    impl="${spec%%:*}"; regex="${spec#*:}"
    timeout "${NCU_TIMEOUT:-150}" "$NCU" --kernel-name "regex:$regex" --launch-skip 2 --launch-count 1 \
        "${ARGS[@]}" "$PY" benchmarks/profile_fwd.py --impl "$impl" ${PROFILE_ARGS:-} \
        > "$OUT/ncu_$impl.txt" 2>&1
    echo "== $impl rc=$? ($(wc -l < "$OUT/ncu_$impl.txt") lines)"
    grep -E "attn_fwd|sdpa|fmha|cudnn|Duration|Compute \(SM\) Throughput|Memory Throughput|Registers Per|Achieved Occupancy|Issue Slots Busy|No Eligible|One or More Eligible|Executed Ipc Active" "$OUT/ncu_$impl.txt" | head -20
done
