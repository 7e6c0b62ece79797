"""Every environment variable flashattn reads, in one place.

The variables are read **once**, when this module is first imported, into a frozen
:class:`Settings`; the rest of the package asks :func:`settings` (a module-global read, no
``os.environ`` lookup on the hot path). To change a setting at run time use the APIs, not
``os.environ``:

- ``flashattn.use_backend(name)`` (a context manager over :func:`override`) forces a backend;
- :func:`override` (tests, probes) replaces any field for the duration of a ``with`` block;
- :func:`reload` re-reads the environment (e.g. after a script changed ``os.environ``).

``VARIABLES`` documents each one (README's table and ``python -m flashattn info`` print it).
``FLASH_ATTENTION_DETERMINISTIC`` is Hugging Face's own variable, read per call as transformers
reads it (:func:`hf_deterministic`).
"""
from __future__ import annotations

import contextlib
import dataclasses
import os
from typing import Any, Dict, Iterator, Mapping, NamedTuple

# Same truthy / falsy spellings as triton's own boolean knobs (case-insensitive).
_TRUTHY = frozenset({"1", "true", "on", "yes"})
_FALSY = frozenset({"0", "false", "off", "no"})

BACKENDS = ("auto", "portable", "cpu", "hopper")


def _truthy(raw: str) -> bool:
    return raw.strip().lower() in _TRUTHY


def _not_falsy(raw: str) -> bool:
    return raw.strip().lower() not in _FALSY


class Variable(NamedTuple):
    """One environment variable: the :class:`Settings` field it fills, its parser, its
    default (as the raw string an unset variable reads as) and what it does."""

    field: str
    parse: Any
    default: str
    doc: str


VARIABLES: Dict[str, Variable] = {
    "FLASHATTN_BACKEND": Variable(
        "backend", lambda raw: raw.strip().lower() or "auto", "auto",
        "auto | portable | cpu | hopper: force a backend (`flashattn.use_backend` does the same "
        "at run time). auto: Hopper (Gluon) kernels on sm90 for the calls they cover and where "
        "measured faster, portable Triton kernels on other GPUs, chunked torch on CPU."),
    "TRITON_INTERPRET": Variable(
        "interpret", _truthy, "",
        "Triton's own switch: 1 runs the Triton kernels in its interpreter on CPU tensors (the "
        "CPU test suite). Must be set before flashattn (and triton) are imported."),
    "FLASHATTN_AUTOTUNE": Variable(
        "autotune", _not_falsy, "1",
        "0: the portable kernels launch their first candidate config, no autotuning (tests, "
        "quick checks)."),
    "FLASHATTN_ATOMIC_DQ": Variable(
        "atomic_dq", _truthy, "0",
        "1: the portable backward (deterministic=False) adds dQ with fp32 atomics in the "
        "dK/dV pass instead of a separate dQ pass (measured slower on the H100)."),
    "FLASHATTN_FAST_LAUNCH": Variable(
        "fast_launch", _not_falsy, "1",
        "0: every kernel launches through Triton's own JITFunction.run (an escape hatch and an "
        "A/B switch for host-overhead probes)."),
    "FLASHATTN_HOPPER_BWD": Variable(
        "hopper_bwd", _not_falsy, "1",
        "0: the backward never uses the Hopper kernels (the portable backward runs)."),
    "FLASHATTN_SMALL_QUERY": Variable(
        "small_query", _not_falsy, "1",
        "0: dense calls with few query rows (seqlen_q <= 16, e.g. one decoding step through "
        "flash_attn_func) always run the prefill kernels, never the split-KV decode kernel."),
    "FLASHATTN_CHECKS": Variable(
        "checks", _truthy, "0",
        "1: the checked mode (`flashattn.checks()` does the same in a with block): the values "
        "of GPU metadata (cu_seqlens, seqused_k, max_seqlen, cache_seqlens, cache_batch_idx, "
        "cache_leftpad, block_table) are checked with a host sync per call, outside CUDA-graph "
        "capture (CPU metadata is always checked)."),
    "FLASHATTN_DECODE_CONFIG": Variable(
        "decode_config", str.strip, "",
        "BLOCK_N,num_warps,num_stages: launch config of the decode kernel (probes only; the "
        "default table was swept on the H100)."),
    "FLASHATTN_DECODE_WAVES": Variable(
        "decode_waves", str.strip, "",
        "waves of split-KV programs per SM in the num_splits heuristic (default 1 for a "
        "contiguous cache, 2 for a paged one; probes only)."),
}


@dataclasses.dataclass(frozen=True)
class Settings:
    """The parsed variables (field names as in :data:`VARIABLES`)."""

    backend: str = "auto"
    interpret: bool = False
    autotune: bool = True
    atomic_dq: bool = False
    fast_launch: bool = True
    hopper_bwd: bool = True
    small_query: bool = True
    checks: bool = False
    decode_config: str = ""
    decode_waves: str = ""


# former names still read (when the current name is unset): old name -> current name
ALIASES: Dict[str, str] = {"FLASHATTN_KVCACHE_CHECKS": "FLASHATTN_CHECKS"}


def read(environ: Mapping[str, str]) -> Settings:
    """Parse ``environ`` into :class:`Settings` (unset variables take their defaults)."""
    raw = {name: environ.get(name) for name in VARIABLES}
    for old, name in ALIASES.items():
        if raw[name] is None:
            raw[name] = environ.get(old)
    return Settings(**{var.field: var.parse(var.default if raw[name] is None else raw[name])
                       for name, var in VARIABLES.items()})


_settings = read(os.environ)
# Triton reads TRITON_INTERPRET when a @triton.jit function is defined: this is the value the
# kernels were built with, for the whole process (an override cannot change it).
INTERPRET: bool = _settings.interpret


def settings() -> Settings:
    """The settings in force (the environment at import, plus any :func:`override`)."""
    return _settings


@contextlib.contextmanager
def override(**fields: Any) -> Iterator[Settings]:
    """Replace settings fields (``override(autotune=False)``) inside a ``with`` block.

    Process-wide, not per thread: meant for tests, probes and the self-check."""
    global _settings
    unknown = set(fields) - {f.name for f in dataclasses.fields(Settings)}
    if unknown:
        raise TypeError(f"override: unknown setting(s) {sorted(unknown)}; known: "
                        f"{[f.name for f in dataclasses.fields(Settings)]}")
    saved = _settings
    _settings = dataclasses.replace(saved, **fields)
    try:
        yield _settings
    finally:
        _settings = saved


def fields_from_raw(**variables: "str | None") -> Dict[str, Any]:
    """Settings fields for raw variable values (``FLASHATTN_AUTOTUNE="0"``; None = unset),
    parsed as the environment would be: ``override(**fields_from_raw(...))``."""
    fields = {}
    for name, raw in variables.items():
        var = VARIABLES[name]
        fields[var.field] = var.parse(var.default if raw is None else raw)
    return fields


def reload() -> Settings:
    """Re-read the environment (``TRITON_INTERPRET`` excepted, see :data:`INTERPRET`)."""
    global _settings
    _settings = dataclasses.replace(read(os.environ), interpret=INTERPRET)
    return _settings


def hf_deterministic() -> bool:
    """Hugging Face's ``FLASH_ATTENTION_DETERMINISTIC=1`` (read per call, as transformers
    reads it for its own flash-attention path)."""
    return os.environ.get("FLASH_ATTENTION_DETERMINISTIC", "0") == "1"


def raw_values() -> Dict[str, str]:
    """The raw value of every variable in :data:`VARIABLES` as the process sees it now."""
    names = list(VARIABLES) + list(ALIASES) + ["FLASH_ATTENTION_DETERMINISTIC"]
    return {name: os.environ.get(name, "") for name in names}


def _shown(value: Any) -> str:
    if isinstance(value, bool):
        return "1" if value else "0"
    return value if value != "" else "(empty: built-in default)"


def effective_values() -> Dict[str, str]:
    """What each variable of :func:`raw_values` means now, for ``flashattn info``: the value in
    force (parsed, so an unset variable shows its default rather than an empty string), marked
    where the variable is unset or its raw spelling differs."""
    current = settings()
    out = {}
    for name, var in VARIABLES.items():
        raw = os.environ.get(name)
        value = _shown(getattr(current, var.field))
        if raw is None:
            value = "(unset: built-in default)" if var.default == "" and not \
                isinstance(getattr(current, var.field), bool) else value + " (unset: default)"
        elif raw != value:
            value += f" (set to {raw!r})"
        out[name] = value
    for old, name in ALIASES.items():
        raw = os.environ.get(old)
        out[old] = raw if raw is not None else f"(unset; former name of {name})"
    raw = os.environ.get("FLASH_ATTENTION_DETERMINISTIC")
    out["FLASH_ATTENTION_DETERMINISTIC"] = raw if raw is not None else "0 (unset: default)"
    return out


__all__ = ["ALIASES", "BACKENDS", "INTERPRET", "Settings", "VARIABLES", "effective_values",
           "fields_from_raw", "hf_deterministic", "override", "raw_values", "read", "reload",
           "settings"]
