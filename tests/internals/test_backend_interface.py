"""Every backend module implements the interface it promises (flashattn/backends/interface.py):
the required functions with the declared parameters (names, kinds, defaults; trailing extras
only with defaults), the optional ones with their declared signature, nothing undeclared."""
import importlib
import inspect

import pytest

from flashattn.backends import interface


def _protocol_functions(proto) -> dict:
    """The functions a Protocol class declares (own and inherited), by name."""
    names = {}
    for cls in reversed(proto.__mro__):
        if cls in (object,) or not getattr(cls, "_is_protocol", False):
            continue
        for name, value in vars(cls).items():
            if inspect.isfunction(value) and not name.startswith("_"):
                names[name] = value
    return names


def _params(fn, drop_self: bool):
    params = list(inspect.signature(fn).parameters.values())
    return params[1:] if drop_self else params


def _shape(p: inspect.Parameter):
    return (p.name, p.kind, p.default)


def _check(name: str, declared, implemented, allow_extras: bool) -> None:
    want = [_shape(p) for p in _params(declared, True)]
    got = _params(implemented, False)
    assert [_shape(p) for p in got[:len(want)]] == want, (
        f"{name}: declared {want}, implemented {[_shape(p) for p in got]}")
    extras = got[len(want):]
    if not allow_extras:
        assert not extras, f"{name}: undeclared parameters {[p.name for p in extras]}"
    for p in extras:  # (a caller that knows only the interface must still be able to call it)
        assert p.default is not inspect.Parameter.empty, f"{name}: extra {p.name} needs a default"


@pytest.mark.parametrize("backend", sorted(interface.MODULES))
def test_backend_implements_its_interface(backend):
    module = importlib.import_module(interface.MODULES[backend])
    required = _protocol_functions(interface.REQUIRED[backend])
    optional = _protocol_functions(interface._Optional)
    assert set(optional) == set(interface.OPTIONAL)  # (each optional one says why)
    for name, declared in required.items():
        assert callable(getattr(module, name, None)), f"{backend} lacks {name}"
        _check(f"{backend}.{name}", declared, getattr(module, name), allow_extras=True)
    every = _protocol_functions(interface.DeviceBackend)
    for name in module.__all__:
        fn = getattr(module, name)
        if name in optional:
            _check(f"{backend}.{name}", optional[name], fn, allow_extras=False)
        else:
            assert name in every, f"{backend}.{name} is in no interface (declare it)"
            if name not in required:  # a device-backend function on a family backend
                _check(f"{backend}.{name}", every[name], fn, allow_extras=True)
    assert not [n for n, f in vars(module).items() if inspect.isfunction(f)
                and f.__module__ == module.__name__ and not n.startswith("_")
                and n not in module.__all__], "public functions missing from __all__"


def test_protocols_are_checkable_against_the_modules():
    """runtime_checkable: isinstance sees the module as the protocol it promises."""
    for backend, proto in interface.REQUIRED.items():
        assert isinstance(importlib.import_module(interface.MODULES[backend]), proto)
    assert not isinstance(importlib.import_module(interface.MODULES["hopper"]),
                          interface.DeviceBackend)
