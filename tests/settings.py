"""Changing flashattn's settings for one test: flashattn reads its environment variables once
(:mod:`flashattn.runtime.env`), so tests change the parsed settings, not ``os.environ``."""
from __future__ import annotations

import dataclasses
from typing import Optional

import pytest


def set_env(monkeypatch: pytest.MonkeyPatch, **variables: Optional[str]) -> None:
    """Settings as if the environment variables had these raw values (None = unset) for the
    rest of the test, e.g. ``set_env(monkeypatch, FLASHATTN_AUTOTUNE="0")``."""
    from flashattn.runtime import env

    monkeypatch.setattr(env, "_settings",
                        dataclasses.replace(env.settings(), **env.fields_from_raw(**variables)))
