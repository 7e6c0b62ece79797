"""The ``bigmem`` marker on a GPU machine: skipped beside other pytest-xdist workers (they
would share the GPU's memory), run when pytest runs alone."""
from __future__ import annotations

import pytest

from tests import conftest


class _Item:
    def __init__(self, *markers: str) -> None:
        self.keywords = {m: True for m in markers}
        self.added = []

    def add_marker(self, marker) -> None:
        self.added.append(marker)


@pytest.mark.parametrize("workers,skipped", [(None, False), ("1", False), ("6", True)])
def test_bigmem_tests_skip_only_beside_other_workers(monkeypatch, workers, skipped):
    if workers is None:
        monkeypatch.delenv("PYTEST_XDIST_WORKER_COUNT", raising=False)
    else:
        monkeypatch.setenv("PYTEST_XDIST_WORKER_COUNT", workers)
    big, small = _Item("gpu", "bigmem"), _Item("gpu")
    conftest._skip_bigmem_beside_other_workers([big, small])
    assert not small.added
    assert bool(big.added) is skipped
    if skipped:
        (mark,) = big.added
        assert mark.name == "skip" and "gpu and bigmem" in mark.kwargs["reason"]
