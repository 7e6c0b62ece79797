"""``pytest --smoke``: the smoke tier keeps the first case of every test function."""
from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _collected(*args: str) -> list:
    out = subprocess.run([sys.executable, "-m", "pytest", "--co", "-q", "-p", "no:cacheprovider",
                          *args], cwd=ROOT, capture_output=True, text=True, check=True).stdout
    return [line for line in out.splitlines() if "::" in line]


def test_smoke_keeps_the_first_case_of_every_function():
    path = "tests/backends/sm90/test_hopper_gpu.py"
    every = _collected(path)
    smoke = _collected("--smoke", path)
    functions = {re.sub(r"\[.*\]$", "", nodeid) for nodeid in every}
    assert len(every) > len(smoke) == len(functions)
    # each kept case is its function's first
    firsts = {}
    for nodeid in every:
        firsts.setdefault(re.sub(r"\[.*\]$", "", nodeid), nodeid)
    assert set(smoke) == set(firsts.values())
    # -k narrows first, then the first case of what is left (this function's first case
    # overall is not causal)
    first = firsts[f"{path}::test_row_sum_on_the_tensor_core_is_within_the_rule"]
    assert "causal" not in first
    row_sum = _collected("--smoke", "-k", "row_sum_on_the_tensor_core and causal", path)
    assert len(row_sum) == 1 and "causal" in row_sum[0]
