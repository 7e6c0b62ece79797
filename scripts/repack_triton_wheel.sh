#!/usr/bin/env bash
# Repack a Triton release for the H100 device machine, which has no internet and takes at most
# 64 MiB per call (device tool README): download the wheel for the image's Python, drop what an
# H100 never loads, compress, split into parts of at most 60 MB.
#
#   bash scripts/repack_triton_wheel.sh 3.9.0            # -> .wheels/triton-3.9.0/part_aa ...
#   PYVER=3.12 bash scripts/repack_triton_wheel.sh 3.8.0 OUTDIR
#
# Dropped (sizes for 3.9.0, unpacked): backends/amd's libraries (104 MB), the CUPTI libraries of the
# profiler (278 MB), ptxas-blackwell (50 MB), libproton.so and the instrumentation plugins
# (32 MB); libtriton.so loses its symbol tables (strip --strip-unneeded). Kept: the sm_90
# compiler (libtriton, ptxas, cuobjdump, nvdisasm, libdevice) and the Python package.
#
# On the device machine, one part per call while it stays warm (files under /tmp survive
# between calls on the same machine; carry the part with run's `carry`, e.g. .wheels/...):
#   mkdir -p /tmp/tw && cp .wheels/triton-3.9.0/part_aa /tmp/tw/      # call 1, then part_ab ...
#   cat /tmp/tw/part_* | tar -xJ -C /tmp/triton-3.9.0                 # last call
#   PYTHONPATH=/tmp/triton-3.9.0:$PWD/src python3 -c 'import triton; print(triton.__version__)'
# (scripts/gpu_check.sh does the last two steps with TRITON_OVERLAY=/tmp/triton-3.9.0.)
set -euo pipefail
VERSION="${1:?usage: repack_triton_wheel.sh VERSION [OUTDIR]}"
OUTDIR="${2:-.wheels/triton-$VERSION}"
PYVER="${PYVER:-3.12}"   # the device image's python3 (torch 2.11 in /opt/torch/.venv)
PART_MB="${PART_MB:-60}"
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT

pip download --quiet --no-deps --only-binary=:all: --python-version "$PYVER" \
    --platform manylinux_2_27_x86_64 --platform manylinux_2_28_x86_64 \
    "triton==$VERSION" -d "$work/dl"
wheel="$(ls "$work"/dl/triton-*.whl)"
mkdir -p "$work/pkg"
python3 -m zipfile -e "$wheel" "$work/pkg"
t="$work/pkg/triton"
# (backends/amd keeps its Python files: Triton discovers backends through entry points, and
# the image's own triton dist-info names triton.backends.amd too, so the module must import)
rm -rf "$t/backends/amd/lib" "$t/backends/amd/include" "$t/backends/nvidia/lib/cupti" "$t/backends/nvidia/lib/cupti-blackwell" \
       "$t/backends/nvidia/bin/ptxas-blackwell" "$t/_C/libproton.so" "$t/instrumentation"
strip --strip-unneeded "$t/_C/libtriton.so" || true
chmod +x "$t"/backends/nvidia/bin/* 2>/dev/null || true
du -sh "$t"
mkdir -p "$OUTDIR"
rm -f "$OUTDIR"/part_*
tar -C "$work/pkg" -cf - triton "$(basename "$(ls -d "$work"/pkg/triton-*.dist-info)")" \
    | xz -T2 -9 -c | split -b "${PART_MB}m" - "$OUTDIR/part_"
ls -la "$OUTDIR"
(cd "$OUTDIR" && sha256sum part_* > SHA256SUMS)
