#!/usr/bin/env bash
# Same-machine A/B of the zigzag ring between two source trees, runs alternating:
#   [NPROC=4] bash benchmarks/probes/cp_tree_ab.sh OLD_SRC [PER_GPU] [ROUNDS] [MODE]
# OLD_SRC: a `src` directory of the baseline tree (e.g. `git archive <commit> src | tar -x -C
# .ab`), against this checkout's src. Each run is `torchrun --nproc-per-node $NPROC (2) -m
# flashattn.bench_cp --modes MODE` (ring, the default: fwd + bwd and the forward alone; or
# varlen: packed documents), each with its own one-GPU baseline; prints one line per run and
# writes the JSON rows under $OUT (or /tmp).
set -eu
OLD=$(cd "$1" && pwd); PER=${2:-32768}; ROUNDS=${3:-2}; MODE=${4:-ring}; DEST=${OUT:-/tmp}
NPROC=${NPROC:-2}
for round in $(seq "$ROUNDS"); do
  for side in old new; do
    if [ "$side" = old ]; then SRC=$OLD; else SRC=$PWD/src; fi
    PYTHONPATH=$SRC torchrun --nproc-per-node "$NPROC" -m flashattn.bench_cp --modes "$MODE" \
      --per-gpu "$PER" --varlen-per-gpu "$PER" \
      --out "$DEST/cp_${MODE}_${side}_${PER}_${round}.json" > /dev/null 2>&1
    python - "$DEST/cp_${MODE}_${side}_${PER}_${round}.json" "$side" "$round" <<'PY'
import json, sys
for r in json.load(open(sys.argv[1]))["rows"]:
    print(sys.argv[2], sys.argv[3], r["mode"], r["per_gpu"], " ".join(
        "%s %.4f" % (k, r[k]) for k in ("efficiency", "fwd_efficiency", "cp_s", "cp_fwd_s",
                                         "single_s") if k in r), r.get("error", ""))
PY
  done
done
