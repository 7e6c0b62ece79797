#!/usr/bin/env bash
# Context parallelism on one multi-GPU host (device tool kinds nvidia-h100-x2 / -x4 / -x8 or
# their H200 twins): the parallel GPU tests, PyTorch's context_parallel + cuDNN anchor and our
# rings (flashattn.bench_cp) in the same call, and one summary table of both. Every file lands
# under $OUT, flat. Uses the image's python3 and torchrun; the package comes from PYTHONPATH=src.
#
#   STEPS=tests bash scripts/cp_check.sh             # call 1: the GPU tests of tests/parallel
#   STEPS=anchor,bench bash scripts/cp_check.sh      # call 2: anchor, then our rings
#
# On 4 GPUs the two calls took about 3 + 8 minutes (tests compile the kernels cold; the anchor's
# one-GPU call of 512k tokens is ~16 s per step on an H200). On 8 GPUs: PER_GPU=32768 first,
# 131072 in a call of its own.
#
# Knobs (environment):
#   STEPS=tests,anchor,bench      what runs, in this order                   (default: all three)
#   NPROC                          ranks (default: every visible GPU)
#   PER_GPU=32768,131072           tokens per GPU of the ring and the anchor
#   MODES=ring,ulysses,varlen,scale,trace     bench_cp modes (usp2x2 on 4 GPUs: Ulysses x ring)
#   BENCH_ARGS                     more bench_cp arguments (e.g. --scale-per-gpu 262144)
#   ANCHOR=shared/tools/cp/torch_cp_anchor.py   PyTorch's anchor (copy ../shared/tools/cp/ into
#                                  the checkout's shared/ first: only the checkout travels)
#   BUDGET=570  TEST_TIMEOUT=240   seconds for the whole script / the tests
# Files: env.txt pytest_parallel.log cp_torch_anchor.json anchor.log cp_bench.json bench.log
#        cp_summary.txt
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
ROOT="$PWD"
OUT="${OUT:-$ROOT/.device_out}"
mkdir -p "$OUT"
export OUT
export PYTHONPATH="$ROOT/src${PYTHONPATH:+:$PYTHONPATH}"
export PYTHONUNBUFFERED=1
STEPS=",${STEPS:-tests,anchor,bench},"
PER_GPU="${PER_GPU:-32768,131072}"
MODES="${MODES:-ring,ulysses,varlen,scale,trace}"
BUDGET="${BUDGET:-570}"; TEST_TIMEOUT="${TEST_TIMEOUT:-240}"
ANCHOR="${ANCHOR:-shared/tools/cp/torch_cp_anchor.py}"
if [ ! -f "$ANCHOR" ] && [ -f "../$ANCHOR" ]; then ANCHOR="../$ANCHOR"; fi
PY=python3
NGPU="$("$PY" -c 'import torch; print(torch.cuda.device_count())' 2>/dev/null || echo 0)"
NPROC="${NPROC:-$NGPU}"
status=()
note() { status+=("$(printf '%-7s %s' "$1" "$2")"); }
left() { echo $(( BUDGET - SECONDS )); }
wants() { case "$STEPS" in *",$1,"*) return 0;; *) return 1;; esac; }

{
    echo "== date: $(date -u +%FT%TZ)  host: $(hostname)  GPUs: $NGPU  ranks: $NPROC"
    nvidia-smi --query-gpu=index,name,clocks_event_reasons.active --format=csv 2>/dev/null
    "$PY" -c 'import torch, triton; print("torch", torch.__version__, "triton", triton.__version__, "nccl", ".".join(map(str, torch.cuda.nccl.version())))'
    "$PY" scripts/gpu_health.py
} 2>&1 | tee "$OUT/env.txt"
note env "$NGPU GPUs, $NPROC ranks"

if wants tests; then
    cap=$(( $(left) < TEST_TIMEOUT ? $(left) : TEST_TIMEOUT ))
    echo "== pytest -m gpu tests/parallel (cap ${cap}s)"
    timeout -s INT -k 20 "$cap" "$PY" -m pytest -m gpu -q -p no:cacheprovider tests/parallel \
        2>&1 | tee "$OUT/pytest_parallel.log"
    rc=${PIPESTATUS[0]}
    note tests "rc=$rc: $(grep -E '[0-9]+ (passed|failed)' "$OUT/pytest_parallel.log" | tail -1)"
fi

if wants anchor; then
    if [ ! -f "$ANCHOR" ]; then
        note anchor "not run: $ANCHOR not found (copy ../shared/tools/cp into shared/)"
    else
        cap=$(( $(left) - 60 ))
        echo "== PyTorch context_parallel + cuDNN (cap ${cap}s)"
        timeout -s INT -k 20 "$cap" torchrun --nproc-per-node "$NPROC" "$ANCHOR" \
            --per-gpu "$PER_GPU" --backends cudnn 2>&1 | tee "$OUT/anchor.log"
        note anchor "rc=${PIPESTATUS[0]} -> cp_torch_anchor.json"
    fi
fi

if wants bench; then
    cap=$(( $(left) - 15 ))
    echo "== flashattn.bench_cp --modes $MODES (cap ${cap}s)"
    # shellcheck disable=SC2086
    timeout -s INT -k 20 "$cap" torchrun --nproc-per-node "$NPROC" -m flashattn.bench_cp \
        --modes "$MODES" --per-gpu "$PER_GPU" --out "$OUT/cp_bench.json" ${BENCH_ARGS:-} \
        2>&1 | tee "$OUT/bench.log"
    note bench "rc=${PIPESTATUS[0]} -> cp_bench.json"
fi

{
    "$PY" - "$OUT/cp_bench.json" "$OUT/cp_torch_anchor.json" <<'PYEOF'
import json, os, sys
ours, anchor = (json.load(open(p)) if os.path.exists(p) else None for p in sys.argv[1:])
ref = {r["per_gpu"]: r for r in (anchor or {}).get("rows", []) if "cp_s" in r}
print("mode          tokens/GPU  efficiency  TFLOP/s/GPU  x PyTorch CP   (anchor: efficiency, TFLOP/s/GPU)")
for r in (ours or {}).get("rows", []):
    if "cp_tflops_per_gpu" not in r:
        continue
    a = ref.get(r["per_gpu"]) if r["mode"] == "ring" else None
    vs = "%.3f" % (r["cp_tflops_per_gpu"] / a["cp_tflops_per_gpu"]) if a else "-"
    eff = "%.3f" % r["efficiency"] if "efficiency" in r else "-"
    print("%-13s %10d  %10s  %11.0f  %11s" % (r["mode"], r["per_gpu"], eff,
                                             r["cp_tflops_per_gpu"], vs))
for per, a in sorted(ref.items()):
    print("anchor        %10d  %10.3f  %11.0f" % (per, a["efficiency"], a["cp_tflops_per_gpu"]))
PYEOF
    echo
    echo "== cp_check summary (${SECONDS}s of ${BUDGET}s budget)"
    printf '%s\n' "${status[@]}"
} 2>&1 | tee "$OUT/cp_summary.txt"
