"""Shared test setup.

- TRITON_INTERPRET=1 is set here when no CUDA device is present, before anything imports the
  kernels (Triton reads it when a ``@triton.jit`` function is defined), so plain
  ``pytest -n 2`` runs the real Triton kernels through the interpreter on CPU.
- Every test is seeded from one base seed (random per run, printed in the header; replay with
  ``--seed N`` or ``FLASHATTN_TEST_SEED=N``) mixed with the test id.
- Tests marked ``gpu`` are skipped without CUDA; run them with ``pytest -m gpu`` on a GPU box.
  Tests marked ``bigmem`` are skipped under pytest-xdist with more than one worker (they
  would share the GPU's memory); run them alone: ``pytest -m "gpu and bigmem"``.
- ``backend`` fixture: 'cpu' (chunked torch) and 'portable' (Triton kernels), forced through
  ``flashattn.use_backend`` for the duration of one test (``set_env`` changes any setting).
"""
from __future__ import annotations

import importlib
import os
import random
import zlib

import pytest
import torch

from tests.settings import set_env

HAS_CUDA = torch.cuda.is_available()

if not HAS_CUDA:
    os.environ.setdefault("TRITON_INTERPRET", "1")

# Under pytest-xdist, share the cores between workers instead of every worker's torch
# spawning one thread per core (oversubscription makes the CPU tests several times slower).
if os.environ.get("PYTEST_XDIST_WORKER_COUNT"):
    _workers = int(os.environ["PYTEST_XDIST_WORKER_COUNT"])
    torch.set_num_threads(max(1, (os.cpu_count() or 1) // _workers))

_SEED_ENV = "FLASHATTN_TEST_SEED"
SMOKE_ENV = "FLASHATTN_TEST_SMOKE"


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--seed",
        type=int,
        default=None,
        help=f"base seed for random test inputs (default: ${_SEED_ENV}, else random)",
    )
    parser.addoption(
        "--smoke",
        action="store_true",
        help="the smoke tier: only the first case of every test function (every feature "
        "once; e.g. `pytest -m gpu -n 6 --smoke tests` on the GPU machine)",
    )


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "gpu: needs a CUDA GPU (skipped without one)")
    config.addinivalue_line("markers", "slow: larger CPU cases")
    config.addinivalue_line("markers", "bigmem: GPU tests that take tens of GiB (run serially)")
    # numpy >= 1.25 deprecation raised inside triton's interpreter, thousands of times a test
    config.addinivalue_line(
        "filterwarnings", "ignore:Conversion of an array with ndim > 0:DeprecationWarning"
    )
    # Chosen once in the controller; pytest-xdist workers are spawned later and inherit the
    # environment, so every worker uses the same base seed.
    seed = config.getoption("--seed")
    if seed is None:
        seed = int(os.environ.get(_SEED_ENV) or random.SystemRandom().randrange(2**31))
    os.environ[_SEED_ENV] = str(seed)
    if config.getoption("--smoke"):
        # read by tests/api/test_properties.py: two hypothesis examples, not dozens (each
        # example of a GPU property test is a cold kernel compile)
        os.environ[SMOKE_ENV] = "1"


def pytest_report_header(config: pytest.Config) -> str:
    interp = os.environ.get("TRITON_INTERPRET", "")
    return (
        f"flashattn: base seed {os.environ[_SEED_ENV]} (replay: --seed or {_SEED_ENV}); "
        f"cuda={HAS_CUDA}; TRITON_INTERPRET={interp!r}"
    )


@pytest.hookimpl(trylast=True)  # (after -m / -k have deselected: the first case left)
def pytest_collection_modifyitems(config: pytest.Config, items: list) -> None:
    if config.getoption("--smoke"):
        _keep_first_case_per_function(config, items)
    if HAS_CUDA:
        _skip_bigmem_beside_other_workers(items)
        return
    skip_gpu = pytest.mark.skip(reason="needs a CUDA GPU (marker 'gpu')")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip_gpu)


def _skip_bigmem_beside_other_workers(items: list) -> None:
    """Tests marked bigmem take tens of GiB of the one GPU: beside other pytest-xdist workers
    they run out of memory for reasons that are not theirs, so there they are skipped with
    the command that runs them (scripts/gpu_check.sh runs them so after its parallel step)."""
    if int(os.environ.get("PYTEST_XDIST_WORKER_COUNT") or 1) <= 1:
        return
    skip = pytest.mark.skip(reason="bigmem beside other xdist workers: run alone, "
                            "`pytest -m 'gpu and bigmem'` without -n")
    for item in items:
        if "bigmem" in item.keywords:
            item.add_marker(skip)


def _keep_first_case_per_function(config: pytest.Config, items: list) -> None:
    """--smoke: deselect every parametrized case but the first of each test function."""
    seen, kept, dropped = set(), [], []
    for item in items:
        key = (item.nodeid.split("::")[0], getattr(item, "originalname", item.name))
        (dropped if key in seen else kept).append(item)
        seen.add(key)
    if dropped:
        config.hook.pytest_deselected(items=dropped)
        items[:] = kept


def seed_for(nodeid: str) -> int:
    return (int(os.environ[_SEED_ENV]) + zlib.crc32(nodeid.encode())) % 2**31


@pytest.fixture(autouse=True)
def seed(request: pytest.FixtureRequest) -> int:
    """Seeds torch and random for this test; the value is in the failure report."""
    s = seed_for(request.node.nodeid)
    torch.manual_seed(s)
    random.seed(s)
    return s


def portable_skip_reason() -> "str | None":
    """Why the Triton kernels cannot run on CPU tensors here (None when they can)."""
    # The CPU-grid tests use CPU tensors: the kernels need the interpreter for those, also on
    # a GPU machine (where conftest leaves TRITON_INTERPRET alone; gpu tests cover the kernels).
    if os.environ.get("TRITON_INTERPRET", "").strip().lower() not in ("1", "true", "on", "yes"):
        return "Triton kernels on CPU tensors need TRITON_INTERPRET=1"
    for mod, fn in (("flashattn.backends.triton.fwd", "flash_fwd"), ("flashattn.backends.triton.bwd", "flash_bwd")):
        try:
            m = importlib.import_module(mod)
        except ModuleNotFoundError as e:
            if e.name == mod:  # the kernel file is not written yet; other import errors fail
                return f"{mod} does not exist yet"
            raise
        if not hasattr(m, fn):
            return f"{mod}.{fn} does not exist yet"
    return None


def use_backend(monkeypatch: pytest.MonkeyPatch, name: str) -> str:
    """Force backend ``name`` for one test (what ``flashattn.use_backend`` does in a with
    block), skipping when the portable kernels cannot run here."""
    if name == "portable":
        reason = portable_skip_reason()
        if reason:
            pytest.skip(reason)
    set_env(monkeypatch, FLASHATTN_BACKEND=name)
    return name


@pytest.fixture(params=["cpu", "portable"])
def backend(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """Each backend in turn, forced as flashattn.use_backend does."""
    return use_backend(monkeypatch, request.param)


@pytest.fixture
def cpu_backend(monkeypatch: pytest.MonkeyPatch) -> str:
    """Force the chunked torch path (fast on CPU): for tests of API conventions."""
    return use_backend(monkeypatch, "cpu")


@pytest.fixture
def device() -> str:
    return "cuda" if HAS_CUDA else "cpu"
