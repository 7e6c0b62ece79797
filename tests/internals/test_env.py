"""The runtime's environment contract: every variable read once into Settings, documented,
overridable at run time without touching os.environ; use_backend validates its argument."""
from __future__ import annotations

import os
import subprocess
import sys

import pytest
import torch

import flashattn
from flashattn.dispatch import select as dispatch_select
from flashattn.runtime import env


def test_every_variable_parses_from_its_default_and_is_documented():
    assert env.read({}) == env.Settings(interpret=False)
    # the full table lives in docs/configuration.md (README links it)
    table = open(os.path.join(os.path.dirname(__file__), "..", "..", "docs",
                              "configuration.md")).read()
    for name, var in env.VARIABLES.items():
        assert var.field in {f for f in env.Settings.__dataclass_fields__}
        assert f"`{name}`" in table, f"docs/configuration.md's environment table lacks {name}"


@pytest.mark.parametrize("raw,expected", [("0", False), ("false", False), ("OFF", False),
                                          ("1", True), ("", True), ("yes", True)])
def test_boolean_spellings(raw, expected):
    assert env.read({"FLASHATTN_AUTOTUNE": raw}).autotune is expected


def test_override_restores_and_rejects_unknown_fields():
    before = env.settings()
    with env.override(autotune=False, decode_waves="3") as s:
        assert s is env.settings() and not s.autotune and s.decode_waves == "3"
    assert env.settings() is before
    with pytest.raises(TypeError, match="unknown setting"):
        with env.override(no_such_field=1):
            pass


def test_use_backend_forces_and_restores(monkeypatch):
    before = dispatch_select.requested_backend()
    with flashattn.use_backend("CPU"):
        assert dispatch_select.requested_backend() == "cpu"
        assert dispatch_select.backend_for("cpu") == "cpu"
    assert dispatch_select.requested_backend() == before
    with pytest.raises(ValueError, match="use_backend: name must be one of"):
        with flashattn.use_backend("cuda-please"):
            pass


def test_the_package_reads_the_environment_only_in_runtime_env():
    """No module outside runtime/env.py reads os.environ / os.getenv (a source scan)."""
    root = os.path.join(os.path.dirname(flashattn.__file__))
    offenders = []
    for dirpath, _, files in os.walk(root):
        for name in files:
            path = os.path.join(dirpath, name)
            if not name.endswith(".py") or path.endswith(os.path.join("runtime", "env.py")):
                continue
            text = open(path).read()
            for needle in ("os.environ.get(", "os.getenv(", "os.environ["):
                if needle in text:
                    offenders.append(f"{os.path.relpath(path, root)}: {needle}")
    # the command line prints CUDA_VISIBLE_DEVICES for the reader (not a setting)
    assert offenders == ["cli.py: os.environ.get("], offenders


def test_variables_are_read_at_import():
    code = ("import flashattn; from flashattn.runtime import env; "
            "print(env.settings().backend, env.settings().autotune)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         env=dict(os.environ, FLASHATTN_BACKEND="cpu", FLASHATTN_AUTOTUNE="0"),
                         check=True).stdout.split()
    assert out == ["cpu", "False"]


def test_checks_mode_decides_device_metadata_checks():
    """CPU metadata is always checked; other devices only inside flashattn.checks() (a meta
    tensor stands in for a GPU one here)."""
    from flashattn import metadata

    cpu, dev = torch.zeros(3, dtype=torch.int32), torch.zeros(3, dtype=torch.int32, device="meta")
    assert metadata.values_checkable(cpu) and not metadata.values_checkable(dev)
    with flashattn.checks():
        assert metadata.values_checkable(dev) and env.settings().checks
        with flashattn.checks(False):
            assert not metadata.values_checkable(dev)
    assert not metadata.values_checkable(dev)
    with pytest.raises(TypeError, match="enabled must be a bool"):
        with flashattn.checks("yes"):
            pass


def test_to_host_is_one_copy_of_everything():
    from flashattn import metadata

    a, b = torch.tensor([0, 3, 7], dtype=torch.int32), torch.tensor([2, 5], dtype=torch.int32)
    assert metadata.to_host(a, None, b) == (a, None, b)  # CPU tensors pass through


def test_former_variable_names_still_read():
    assert env.read({"FLASHATTN_KVCACHE_CHECKS": "1"}).checks
    assert not env.read({"FLASHATTN_KVCACHE_CHECKS": "1", "FLASHATTN_CHECKS": "0"}).checks


def test_effective_values_show_what_unset_variables_mean(monkeypatch):
    """`flashattn info` prints each variable's value in force: an unset one its default (not
    an empty string), a set one its parsed value and, where it differs, the raw spelling."""
    for name in list(env.VARIABLES) + list(env.ALIASES) + ["FLASH_ATTENTION_DETERMINISTIC"]:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("FLASHATTN_AUTOTUNE", "off")
    with env.override(**env.fields_from_raw(FLASHATTN_AUTOTUNE="off", FLASHATTN_BACKEND=None)):
        shown = env.effective_values()
    assert set(shown) == set(env.raw_values())
    assert shown["FLASHATTN_BACKEND"] == "auto (unset: default)"
    assert shown["FLASHATTN_AUTOTUNE"] == "0 (set to 'off')"
    assert shown["FLASHATTN_DECODE_CONFIG"] == "(unset: built-in default)"
    assert all(value and value != "''" for value in shown.values())


def test_info_prints_no_empty_values(capsys):
    from flashattn import cli

    assert cli.main(["info"]) == 0
    lines = capsys.readouterr().out.split("environment variables")[1].splitlines()
    assert not [line for line in lines if line.rstrip().endswith("=''")]
    assert any(line.strip().startswith("FLASHATTN_BACKEND=") for line in lines)


def test_use_backend_portable_without_triton_names_the_call(monkeypatch):
    """use_backend('portable') on a machine that cannot run Triton on CPU tensors: a
    RuntimeError (the name is valid; the machine cannot run it) naming the call, not only the
    environment variable the user did not set, and what to use instead."""
    monkeypatch.setattr(dispatch_select, "interpreting", lambda: False)
    with flashattn.use_backend("portable"):
        with pytest.raises(RuntimeError, match=r"use_backend\('portable'\).*use_backend\('cpu'\)"):
            dispatch_select.backend_for(torch.zeros(1))
