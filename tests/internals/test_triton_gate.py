"""Which Triton releases run the Gluon (Hopper) kernels: every release they compile
on (3.6-3.9) by default; any other release falls back to the portable kernels with one warning
that names it and what was verified; FLASHATTN_BACKEND=hopper tries the Gluon kernels anyway."""
from __future__ import annotations

import warnings

import pytest

from flashattn.backends.sm90 import support


@pytest.fixture
def release(monkeypatch):
    def use(version):
        monkeypatch.setattr(support, "triton_version", lambda: version)
        support.gluon_unavailable.cache_clear()
        support._device_unavailable.cache_clear()
    yield use
    support.gluon_unavailable.cache_clear()
    support._device_unavailable.cache_clear()


@pytest.mark.parametrize("version", ["3.6.0", "3.7.1", "3.8.0", "3.9.0"])
def test_known_releases_run_the_gluon_kernels(release, version):
    release(version)
    assert support.gluon_unavailable() is None


def test_unknown_release_falls_back_with_one_warning(release, monkeypatch):
    release("3.10.0")
    reason = support.gluon_unavailable()
    assert "3.10.0" in reason and "GPU-verified on triton 3.6, 3.9" in reason
    assert "compile-verified (sm_90 AOT in CI) on 3.7, 3.8" in reason
    monkeypatch.setattr(support.torch.cuda, "get_device_capability", lambda index: (9, 0))
    with pytest.warns(UserWarning, match="portable Triton kernels run instead") as caught:
        assert support._device_unavailable(0, False) is not None
        assert support._device_unavailable(0, False) is not None  # cached: said once
    assert len(caught) == 1
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert support._device_unavailable(0, True) is None  # FLASHATTN_BACKEND=hopper
