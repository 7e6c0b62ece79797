#!/usr/bin/env bash
# Run a command on the device machine with another Triton release in front of the image's
# (triton 3.6): the parts made by scripts/repack_triton_wheel.sh, carried with the device tool's
# `carry` (at most 64 MiB per call; several calls while the machine is warm if there are more
# parts: files under /tmp survive between them).
#
#   bash scripts/gpu_triton_overlay.sh .wheels/triton-3.9.0 -- python3 -m pytest -m gpu tests/backends/sm90
#
# The run counts as the GPU verification of that Triton's Gluon kernels: a sitecustomize on the
# path adds its minor version to flashattn.backends.sm90.support.GPU_VERIFIED_TRITON for every Python
# process of the command (pytest-xdist workers included), so the Hopper path runs instead of
# falling back with the "not GPU-verified" warning.
set -euo pipefail
parts="${1:?usage: gpu_triton_overlay.sh PARTS_DIR -- COMMAND...}"
shift
[ "${1:-}" = "--" ] && shift
version="$(basename "$parts")"; version="${version#triton-}"
minor="$(echo "$version" | cut -d. -f1,2)"
dest="/tmp/triton-$version"
# (re-extracted when the parts changed: a machine kept warm keeps /tmp between calls)
if ! cmp -s "$parts/SHA256SUMS" "$dest/SHA256SUMS" 2>/dev/null || [ ! -d "$dest/triton" ]; then
    rm -rf "$dest"
    mkdir -p "$dest"
    (cd "$parts" && sha256sum -c --quiet SHA256SUMS)
    cat "$parts"/part_* | xz -d | tar -x -C "$dest"
    cp "$parts/SHA256SUMS" "$dest/SHA256SUMS"
fi
site="/tmp/flashattn-verify-$version"
mkdir -p "$site"
cat > "$site/sitecustomize.py" <<PYEOF
# written by scripts/gpu_triton_overlay.sh: this run GPU-verifies triton $version's Gluon kernels
try:
    import flashattn.backends.sm90.support as _support
    if "$minor" not in _support.GPU_VERIFIED_TRITON:
        _support.GPU_VERIFIED_TRITON = _support.GPU_VERIFIED_TRITON + ("$minor",)
except Exception:  # not on the path yet, or no torch: nothing to mark
    pass
PYEOF
# Triton 3.9 compiles sm_90 with its "ptxas-blackwell" (the repack drops it): point it, and any
# other missing bundled tool, at the image's CUDA ptxas
cuda_ptxas="$(ls /usr/local/cuda*/bin/ptxas 2>/dev/null | head -1 || true)"
for tool in ptxas ptxas-blackwell; do
    var="TRITON_$(echo "$tool" | tr 'a-z-' 'A-Z_')_PATH"
    if [ ! -x "$dest/triton/backends/nvidia/bin/$tool" ] && [ -n "$cuda_ptxas" ] && [ -z "${!var:-}" ]; then
        export "$var=$cuda_ptxas"
        echo "$var=$cuda_ptxas"
    fi
done
export PYTHONPATH="$dest:$site:$PWD/src${PYTHONPATH:+:$PYTHONPATH}"
python3 -c 'import triton; print("triton", triton.__version__, "from", triton.__file__)'
exec "$@"
