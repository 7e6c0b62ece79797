#!/usr/bin/env bash
# Nsight Compute profiles of the same bf16 attention calls by several implementations
# (probes/fa4_profile.py: ours, fa4, cudnn), packed into one archive for the trip back from the
# GPU machine (whose $OUT returns at most 8 files).
#
#   bash benchmarks/probes/ncu_side_by_side.sh "ours fa4" "fwd:128:8192:0 bwd:64:8192:1" $OUT/ncu_tag
#
# A case is mode:d:s:causal (causal 0 / 1; the bench grid's shape: 16k tokens, hidden 2048).
# Per (impl, case): the details page of every kernel the call launches (--set full, clocks left
# alone: --clock-control none, as the device notes ask) and the per-instruction SASS source
# page as gzipped CSV (stall samples per instruction: where the cycles go, and in which order
# the compiler put the waits), plus the do_bench median of the call (--time, outside ncu).
# Writes <prefix>.tar.gz and prints the per-kernel duration lines.
set -uo pipefail
impls=$1; cases=$2; prefix=$3
work=$(mktemp -d)
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
for case in $cases; do
  IFS=: read -r mode d s causal <<<"$case"
  flag=""; tag="${mode}_d${d}_${s}_dense"
  if [ "$causal" = 1 ]; then flag="--causal"; tag="${mode}_d${d}_${s}_causal"; fi
  for impl in $impls; do
    name="${tag}_${impl}"
    python3 "$here/fa4_profile.py" --impl "$impl" --mode "$mode" --d "$d" --s "$s" $flag --time \
      | tee -a "$work/times.txt"
    ncu --profile-from-start off --clock-control none --set full --import-source no -f \
      -o "$work/$name" python3 "$here/fa4_profile.py" --impl "$impl" --mode "$mode" --d "$d" \
      --s "$s" $flag > "$work/$name.log" 2>&1 || { echo "ncu failed: $name"; tail -5 "$work/$name.log"; continue; }
    ncu --import "$work/$name.ncu-rep" --page details > "$work/$name.txt" 2>&1
    ncu --import "$work/$name.ncu-rep" --page source --csv --print-source sass 2>&1 \
      | gzip -9 > "$work/${name}_sass.csv.gz"
    echo "== $name"; grep -E "^  [A-Za-z_].*\(|Duration  " "$work/$name.txt" | head -12
    rm -f "$work/$name.ncu-rep"
  done
done
tar -C "$work" -czf "$prefix.tar.gz" . && ls -la "$prefix.tar.gz"
rm -rf "$work"
