# shellcheck shell=bash
# Creates the project's virtual environment on first use and activates it. Sourced by
# scripts/test.sh, scripts/bench.sh and .ci/run (the one place that installs anything).
#
#   source scripts/setup.sh      # from any directory; idempotent
#
# Knobs (environment):
#   FLASHATTN_VENV    where the venv lives (default: <repo>/.venv)
#   PYTHON            the interpreter that creates it (default: python3)
#   FLASHATTN_TORCH   the torch requirement (default: torch==2.13.0). Pinned on purpose: these
#                     machines serve a local CPU wheel for exactly that version, and an unpinned
#                     torch would pull a multi-GB CUDA build.
# The venv is (re)installed when pyproject.toml or this file changed since the last install.

_fa_root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
FLASHATTN_VENV="${FLASHATTN_VENV:-$_fa_root/.venv}"
_fa_stamp="$FLASHATTN_VENV/.flashattn-installed"
_fa_want="$(cat "$_fa_root/pyproject.toml" "$_fa_root/scripts/setup.sh" | cksum | cut -d' ' -f1)"

_fa_install() {
    local py="${PYTHON:-python3}"
    local torch_req="${FLASHATTN_TORCH:-torch==2.13.0}"
    local extra=("numpy<2.4")
    # Triton 3.6.0 is what the GPU image runs (same compiler, same Gluon API); it needs numpy < 2.4.
    if [ "$(uname -s)" = "Linux" ]; then extra+=("triton==3.6.0"); fi
    # The transformers version the integration tests were written against (tests/api/test_transformers.py);
    # it brings only small pure-Python / tokenizer wheels, no torchvision.
    extra+=("transformers==4.57.1")
    echo "setup: creating $FLASHATTN_VENV ($("$py" --version 2>&1))" >&2
    if [ ! -x "$FLASHATTN_VENV/bin/python" ]; then
        "$py" -m venv "$FLASHATTN_VENV" || return 1
    fi
    local pip=("$FLASHATTN_VENV/bin/python" -m pip install --disable-pip-version-check -q)
    echo "setup: installing $torch_req ${extra[*]}" >&2
    "${pip[@]}" "$torch_req" "${extra[@]}" || return 1
    # The bench extra (matplotlib, tqdm) too: the documented `bench --plot` needs matplotlib.
    # Editable on purpose: source edits take effect without reinstalling. To add extras by
    # hand inside this venv, keep -e (`pip install -e '.[bench]'`): a plain `pip install .`
    # replaces the editable install with a copy of today's tree (and leaves a build/ folder).
    echo "setup: installing flashattn (editable) with its test and bench extras" >&2
    "${pip[@]}" -e "$_fa_root[test,bench]" || return 1
    echo "$_fa_want" > "$_fa_stamp"
}

if [ ! -f "$_fa_stamp" ] || [ "$(cat "$_fa_stamp")" != "$_fa_want" ]; then
    _fa_install || { echo "setup: installation failed" >&2; return 1 2>/dev/null || exit 1; }
fi
# shellcheck disable=SC1091
source "$FLASHATTN_VENV/bin/activate"
unset _fa_root _fa_stamp _fa_want
unset -f _fa_install
