"""Backend choice: FLASHATTN_BACKEND, TRITON_INTERPRET, devices, lazy kernel imports."""
from __future__ import annotations

import subprocess
import sys
import textwrap
import types

import pytest
import torch

from flashattn import flash_attn_func
from flashattn.dispatch import select as dispatch_select
from tests.settings import set_env


@pytest.fixture
def env(monkeypatch):
    """Set FLASHATTN_BACKEND / TRITON_INTERPRET for one test (None = unset)."""

    def _set(backend=None, interpret=None):
        set_env(monkeypatch, FLASHATTN_BACKEND=backend, TRITON_INTERPRET=interpret)

    return _set


def _recorder(tag, calls):
    """A stand-in backend interface (dispatch's ``backend(name)``) recording each call's
    parameters as the kernels' keyword arguments."""

    def fwd(q, k, v, p, return_softmax):
        calls.append((f"{tag}.fwd", {**p.kernel_kwargs(), "return_softmax": return_softmax}))
        b, s_q, h, _ = q.shape
        return torch.zeros(b, s_q, h, v.shape[-1]), torch.zeros(b, h, s_q), None

    def bwd(dout, q, k, v, out, lse, p):
        calls.append((f"{tag}.bwd", {**p.kernel_kwargs(), "deterministic": p.deterministic}))
        return tuple(torch.zeros_like(x) for x in (q, k, v))

    def kvcache_attention(q, k, v, seqlens, s_new, *, p, **kw):
        calls.append((f"{tag}.small_query", {**p.kernel_kwargs(), **kw}))
        b, s_q, h, _ = q.shape
        return torch.zeros(b, s_q, h, v.shape[-1]), torch.zeros(b, h, s_q)

    def kvcache_call(q, k, v, seqlens, s_new, *, p, **kw):  # made once per call signature
        calls.append((f"{tag}.small_query", {**p.kernel_kwargs(), **kw}))

        def call(q, k, v, *tensors, need_lse=True):
            b, s_q, h, _ = q.shape
            return torch.zeros(b, s_q, h, v.shape[-1]), torch.zeros(b, h, s_q)
        return call

    return types.SimpleNamespace(fwd=fwd, bwd=bwd, kvcache_attention=kvcache_attention,
                                 kvcache_call=kvcache_call)


@pytest.fixture
def fake_backends(monkeypatch):
    """Replace the portable and cpu backends with recorders; returns the list of calls."""
    calls = []
    for name in ("cpu", "portable"):
        monkeypatch.setitem(dispatch_select._LOADED, name, _recorder(name, calls))
    # the prefill kernels take every call here unless a test asks for the small-query path
    set_env(monkeypatch, FLASHATTN_SMALL_QUERY="0")
    return calls


@pytest.mark.parametrize(
    "backend,interpret,device,expected",
    [
        (None, None, "cpu", "cpu"),
        (None, "1", "cpu", "portable"),
        (None, "true", "cpu", "portable"),
        (None, "0", "cpu", "cpu"),
        ("auto", None, "cpu", "cpu"),
        ("", "1", "cpu", "portable"),
        ("cpu", "1", "cpu", "cpu"),
        ("CPU", None, "cuda", "cpu"),
        ("portable", "1", "cpu", "portable"),
        ("hopper", "1", "cpu", "portable"),  # the Triton family; family_for refines it
        (None, None, "cuda", "portable"),
        ("portable", None, "cuda", "portable"),
        ("hopper", None, "cuda", "portable"),
        (None, "1", "meta", "cpu"),  # torch devices Triton cannot run on use chunked torch
    ],
)
def test_backend_for(env, backend, interpret, device, expected):
    env(backend, interpret)
    assert dispatch_select.backend_for(torch.device(device)) == expected
    if device != "cuda":
        assert dispatch_select.backend_for(torch.empty(0, device=device)) == expected


@pytest.mark.parametrize("backend", ["portable", "hopper"])
def test_forced_portable_on_cpu_without_interpreter(env, backend):
    env(backend, None)
    with pytest.raises(RuntimeError, match="FLASHATTN_BACKEND.*TRITON_INTERPRET=1"):
        dispatch_select.backend_for(torch.device("cpu"))


def test_invalid_backend_name(env):
    env("cuda-please", None)
    with pytest.raises(ValueError, match="FLASHATTN_BACKEND='cuda-please'.*auto, portable, cpu, hopper"):
        dispatch_select.backend_for(torch.device("cpu"))


@pytest.mark.parametrize("backend,interpret,expected", [("cpu", "1", "cpu"), (None, "1", "portable"),
                                                        (None, None, "cpu")])
def test_forward_backward_route(env, fake_backends, backend, interpret, expected):
    env(backend, interpret)
    q = torch.randn(1, 3, 2, 8, requires_grad=True)
    k = torch.randn(1, 4, 2, 8, requires_grad=True)
    v = torch.randn(1, 4, 2, 8, requires_grad=True)
    flash_attn_func(q, k, v, causal=True).sum().backward()
    assert [c[0] for c in fake_backends] == [f"{expected}.fwd", f"{expected}.bwd"]
    fwd_kw, bwd_kw = fake_backends[0][1], fake_backends[1][1]
    assert fwd_kw == dict(softmax_scale=8**-0.5, causal=True, window_left=-1, window_right=0,
                          softcap=0.0, alibi_slopes=None, dropout_p=0.0, philox_seed=0,
                          return_softmax=False)
    assert bwd_kw == dict(softmax_scale=8**-0.5, causal=True, window_left=-1, window_right=0,
                          softcap=0.0, alibi_slopes=None, dropout_p=0.0, philox_seed=0,
                          deterministic=False)


def test_small_query_calls_take_the_decode_kernel(env, fake_backends, monkeypatch):
    """seqlen_q <= 16 on the Triton backend, measured faster: the decode kernel (same out /
    lse contract; the backward is the prefill one); off with FLASHATTN_SMALL_QUERY=0, with
    dropout, with more query rows, or when the Hopper kernels are forced."""
    env(None, "1")
    set_env(monkeypatch, FLASHATTN_SMALL_QUERY="1")
    q = torch.randn(2, 3, 4, 8, requires_grad=True)
    k, v = torch.randn(2, 40, 2, 8, requires_grad=True), torch.randn(2, 40, 2, 8, requires_grad=True)
    flash_attn_func(q, k, v, causal=True).sum().backward()
    # (the signature's recorded call makes its decode call once more: the same route)
    assert list(dict.fromkeys(c[0] for c in fake_backends)) == ["portable.small_query",
                                                                 "portable.bwd"]
    call = fake_backends[0][1]
    assert (call["window_left"], call["window_right"], call["num_splits"], call["capacity"]) == \
        (-1, 0, 0, 40)
    fake_backends.clear()
    flash_attn_func(q[:, :1], k, v, causal=True)  # one row: the right edge hides nothing
    assert fake_backends[0][0] == "portable.small_query" and fake_backends[0][1]["window_right"] == -1
    for kw, qq in ((dict(dropout_p=0.1), q), (dict(), torch.randn(2, 17, 4, 8))):
        fake_backends.clear()
        flash_attn_func(qq, k, v, **kw)
        assert fake_backends[0][0] == "portable.fwd"
    fake_backends.clear()
    set_env(monkeypatch, FLASHATTN_SMALL_QUERY="0")
    flash_attn_func(q, k, v)
    assert fake_backends[0][0] == "portable.fwd"


@pytest.mark.parametrize("shape_q,shape_k", [((0, 3, 2, 8), (0, 4, 2, 8)),
                                             ((1, 0, 2, 8), (1, 4, 2, 8)),
                                             ((2, 3, 2, 8), (2, 0, 2, 8))])
def test_degenerate_shapes_skip_backends(env, fake_backends, shape_q, shape_k):
    env("cpu", None)
    q = torch.randn(shape_q, requires_grad=True)
    k = torch.randn(shape_k, requires_grad=True)
    v = torch.randn(shape_k[:3] + (5,), requires_grad=True)
    out, lse, _ = flash_attn_func(q, k, v, return_attn_probs=True)
    assert out.shape == shape_q[:3] + (5,) and lse.shape == (shape_q[0], 2, shape_q[1])
    assert (out == 0).all() and (lse == float("-inf")).all()
    out.sum().backward()
    assert not fake_backends
    for x in (q, k, v):
        assert x.grad.shape == x.shape and (x.grad == 0).all()


def test_import_without_triton():
    """`import flashattn` and the CPU path work where triton cannot be imported."""
    code = textwrap.dedent(
        """
        import os, sys
        sys.modules["triton"] = None          # any `import triton` now raises ImportError
        os.environ.pop("FLASHATTN_BACKEND", None)
        os.environ["TRITON_INTERPRET"] = "1"  # even so, no triton -> chunked torch
        import torch, flashattn
        from flashattn.dispatch import select as dispatch_select
        assert not dispatch_select.triton_available()
        assert dispatch_select.backend_for(torch.device("cpu")) == "cpu"
        assert "flashattn.backends.triton.fwd" not in sys.modules
        try:
            import flashattn.backends.cpu
        except ModuleNotFoundError:
            print("no-cpu-module")
            raise SystemExit(0)
        q = torch.randn(1, 5, 2, 16)
        out = flashattn.flash_attn_func(q, q, q, causal=True)
        assert out.shape == (1, 5, 2, 16) and torch.isfinite(out).all()
        assert "triton" not in {m.split(".")[0] for m, v in sys.modules.items() if v is not None}
        print("ok")
        """
    )
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() in ("ok", "no-cpu-module")


# ---------------------------------------------------------------------------------------------
# Hopper family: family_for / forward_family with the device check faked (no GPU here)
# ---------------------------------------------------------------------------------------------
@pytest.fixture
def fake_sm90(monkeypatch):
    """Pretend CUDA devices are sm90 with a usable Gluon (or not: set state['reason'])."""
    state = {"reason": None}
    monkeypatch.setattr(dispatch_select, "_hopper_device_reason",
                        lambda device: state["reason"] if device.type == "cuda" else "not cuda")
    return state


@pytest.mark.parametrize("backend,interpret,device,expected", [
    (None, None, "cuda", "hopper"),
    ("auto", None, "cuda", "hopper"),
    ("hopper", None, "cuda", "hopper"),
    ("portable", None, "cuda", "portable"),
    ("cpu", None, "cuda", "cpu"),
    (None, None, "cpu", "cpu"),
    ("hopper", "1", "cpu", "portable"),
    (None, "1", "cuda", "portable"),  # Gluon cannot be interpreted
])
def test_family_for(env, fake_sm90, backend, interpret, device, expected):
    env(backend, interpret)
    assert dispatch_select.family_for(torch.device(device)) == expected
    # backend_for keeps answering the device backend (varlen and others rely on it)
    assert dispatch_select.backend_for(torch.device(device)) in ("portable", "cpu")
    assert (dispatch_select.hopper_reason(torch.device(device)) is None) == (expected == "hopper")


def test_family_for_not_sm90(env, fake_sm90):
    env("hopper", None)
    fake_sm90["reason"] = "device cuda:0 is sm_80, not sm_90"
    assert dispatch_select.family_for(torch.device("cuda")) == "portable"
    assert "sm_80" in dispatch_select.hopper_reason(torch.device("cuda"))


def _meta(shape, dtype=torch.bfloat16):
    return torch.empty(shape, dtype=dtype, device="meta")


def _params(**kw):
    p = dict(softmax_scale=0.125, causal=True, window_left=-1, window_right=0, softcap=0.0,
             alibi_slopes=None, dropout_p=0.0, philox_seed=0, return_softmax=False)
    p.update(kw)
    return p


def test_call_coverage_rules():
    from flashattn.backends.sm90.support import call_unsupported

    q, k, v = _meta((2, 300, 8, 128)), _meta((2, 500, 2, 128)), _meta((2, 500, 2, 128))
    assert call_unsupported(q, k, v, _params()) is None
    assert call_unsupported(q, k, v, _params(softcap=30.0, window_left=64)) is None
    for d in (64, 96, 192, 256):
        assert call_unsupported(_meta((1, 5, 2, d)), _meta((1, 7, 1, d)), _meta((1, 7, 1, d)),
                                _params()) is None
    uncovered = {
        "dropout": (q, k, v, _params(dropout_p=0.1)),
        "alibi": (q, k, v, _params(alibi_slopes=torch.ones(8))),
        "return_softmax": (q, k, v, _params(return_softmax=True)),
        "dtype": (_meta((2, 3, 8, 128), torch.float32),) * 3 + (_params(),),
        "head dims": (_meta((1, 3, 2, 80)), _meta((1, 3, 2, 80)), _meta((1, 3, 2, 80)), _params()),
        "head dims ": (q, k, _meta((2, 500, 2, 80)), _params()),
        "softmax_scale": (q, k, v, _params(softmax_scale=-1.0)),
        "16-byte": (_meta((2, 300, 8, 130))[..., :128], k, v, _params()),
    }
    for what, (qq, kk, vv, pp) in uncovered.items():
        reason = call_unsupported(qq, kk, vv, pp)
        assert reason is not None and what.strip().split()[0] in reason, (what, reason)


def test_mixed_head_dims_take_the_hopper_forward_only():
    """d != d_v (e.g. 192 / 128) is covered by the Hopper forward when both are Hopper head
    dims; the Hopper backward never takes it (the portable backward runs it)."""
    from flashattn.backends.sm90.support import backward_unsupported, call_unsupported

    q, k, v = _meta((2, 300, 8, 192)), _meta((2, 500, 2, 192)), _meta((2, 500, 2, 128))
    assert call_unsupported(q, k, v, _params()) is None
    odd = _meta((2, 500, 2, 80))
    assert "head dims" in call_unsupported(q, k, odd, _params())
    p = _params(deterministic=False)
    del p["return_softmax"]
    assert "head dims 192/128" in backward_unsupported(q, k, v, p)


@pytest.fixture
def fake_hopper(monkeypatch, fake_backends):
    """A recorder standing in for the sm90 backend (the real one needs an sm90 GPU)."""
    monkeypatch.setitem(dispatch_select._LOADED, "hopper", _recorder("hopper", fake_backends))
    return fake_backends


@pytest.mark.parametrize("backend,kw,expected,expected_bwd", [
    ("hopper", {}, "hopper.fwd", "hopper.bwd"),
    (None, {}, "hopper.fwd", "hopper.bwd"),
    ("hopper", dict(dropout_p=0.1), "portable.fwd", "portable.bwd"),
    ("hopper", dict(softcap=5.0, window_size=(8, 8)), "hopper.fwd", "hopper.bwd"),
    ("hopper", dict(deterministic=True), "hopper.fwd", "portable.bwd"),  # masked (support.py)
    ("portable", {}, "portable.fwd", "portable.bwd"),
])
def test_forward_routes_hopper_and_falls_back(env, fake_sm90, fake_hopper, monkeypatch, backend,
                                             kw, expected, expected_bwd):
    """On (fake) sm90: covered calls go to the Hopper forward and backward; uncovered ones
    (dropout; deterministic=True under a mask for the backward) fall back to the
    portable kernels."""
    env(backend, None)
    # CPU tensors posing as CUDA for routing: the device check is faked, the call check is real
    monkeypatch.setattr(dispatch_select, "family_for", lambda t: "hopper" if backend != "portable"
                        else "portable")
    monkeypatch.setattr(dispatch_select, "backend_for", lambda t: "portable")
    from flashattn.backends.sm90 import support
    monkeypatch.setattr(support, "MIN_SEQLEN_K_DENSE", 0)  # tiny shapes: skip auto's speed rule
    monkeypatch.setattr(support, "MIN_SEQLEN_K_MASKED", 0)
    monkeypatch.setattr(support, "MIN_SEQLEN_K_BWD_MASKED", 0)
    q = torch.randn(1, 5, 2, 64, dtype=torch.bfloat16, requires_grad=True)
    k = torch.randn(1, 6, 1, 64, dtype=torch.bfloat16, requires_grad=True)
    v = torch.randn(1, 6, 1, 64, dtype=torch.bfloat16, requires_grad=True)
    flash_attn_func(q, k, v, causal=True, **kw).float().sum().backward()
    assert [c[0] for c in fake_hopper] == [expected, expected_bwd]


@pytest.mark.parametrize("d,kw,expected_bwd", [
    (128, dict(deterministic=True), "hopper.bwd"),
    (64, dict(deterministic=True), "portable.bwd"),  # measured slower at d = 64
    (128, dict(deterministic=True, causal=True), "portable.bwd"),  # masked: measured slower
    (128, dict(deterministic=True, window_size=(3, 3)), "portable.bwd"),
    (128, dict(deterministic=True, softcap=5.0), "portable.bwd")])
def test_deterministic_backward_routes(env, fake_sm90, fake_hopper, monkeypatch, d, kw,
                                       expected_bwd):
    """deterministic=True at d = 128 takes the Hopper backward's ordered dQ when unmasked and
    without softcap; masked calls and d = 64 keep the portable backward (faster there)."""
    env("hopper", None)
    monkeypatch.setattr(dispatch_select, "family_for", lambda t: "hopper")
    monkeypatch.setattr(dispatch_select, "backend_for", lambda t: "portable")
    q = torch.randn(1, 5, 2, d, dtype=torch.bfloat16, requires_grad=True)
    k = torch.randn(1, 6, 1, d, dtype=torch.bfloat16, requires_grad=True)
    v = torch.randn(1, 6, 1, d, dtype=torch.bfloat16, requires_grad=True)
    flash_attn_func(q, k, v, **kw).float().sum().backward()
    assert [c[0] for c in fake_hopper] == ["hopper.fwd", expected_bwd]


def test_hopper_backward_env_switch_and_rules(env, monkeypatch):
    """FLASHATTN_HOPPER_BWD=0 keeps the backward portable; head dims outside 64/96/128/192/256,
    and deterministic=True outside d = 128, masked or with softcap, are not covered by the
    Hopper backward (reason strings name them)."""
    from flashattn.backends.sm90.support import backward_unsupported

    env("hopper", None)
    monkeypatch.setattr(dispatch_select, "family_for", lambda t: "hopper")  # (fake) sm90 device
    monkeypatch.setattr(dispatch_select, "backend_for", lambda t: "portable")
    q, k, v = _meta((2, 300, 8, 128)), _meta((2, 500, 2, 128)), _meta((2, 500, 2, 128))
    p = _params(deterministic=False)
    del p["return_softmax"]
    assert backward_unsupported(q, k, v, p) is None
    assert dispatch_select.backward_family(q, k, v, **p) == "hopper"
    set_env(monkeypatch, FLASHATTN_HOPPER_BWD="0")
    assert "FLASHATTN_HOPPER_BWD" in backward_unsupported(q, k, v, p)
    assert dispatch_select.backward_family(q, k, v, **p) == "portable"
    set_env(monkeypatch, FLASHATTN_HOPPER_BWD=None)
    dense = {**p, "causal": False, "window_right": -1, "deterministic": True}
    assert backward_unsupported(q, k, v, dense) is None
    assert "causal or window" in backward_unsupported(q, k, v, {**p, "deterministic": True})
    assert "causal or window" in backward_unsupported(q, k, v, {**dense, "window_left": 64})
    assert "softcap" in backward_unsupported(q, k, v, {**dense, "softcap": 30.0})
    for d in (96, 192, 256):
        x = _meta((1, 5, 2, d))
        assert "deterministic" in backward_unsupported(x, x, x, {**p, "deterministic": True})
    for d in (64, 96, 192, 256):  # 192 / 256: bwd_wide_kernel.py
        x = _meta((1, 5, 2, d))
        assert backward_unsupported(x, x, x, p) is None
    odd = _meta((1, 5, 2, 80))
    assert "head dim" in backward_unsupported(odd, odd, odd, p)
    assert "dropout" in backward_unsupported(q, k, v, {**p, "dropout_p": 0.1})


@pytest.mark.parametrize("backend,causal,seqlen_k,d,expected", [
    ("auto", False, 512, 128, "portable"),   # short dense keys: portable measured faster
    ("auto", False, 1024, 128, "hopper"),
    ("auto", False, 1024, 256, "portable"),  # d = 256 pays off from 2k
    ("auto", False, 2048, 256, "hopper"),
    ("auto", True, 1024, 128, "portable"),   # masked calls need longer keys to pay off
    ("auto", True, 2048, 128, "hopper"),
    ("hopper", True, 512, 128, "hopper"),    # forcing ignores the speed rule
])
def test_auto_keeps_short_keys_on_portable(env, monkeypatch, backend, causal, seqlen_k, d,
                                           expected):
    env(backend, None)
    monkeypatch.setattr(dispatch_select, "family_for", lambda t: "hopper")  # (fake) sm90 device
    q = torch.empty((1, 256, 8, d), dtype=torch.bfloat16, device="meta")
    k = v = torch.empty((1, seqlen_k, 8, d), dtype=torch.bfloat16, device="meta")
    params = _params(causal=causal, window_right=0 if causal else -1)
    family = dispatch_select.forward_family(q, k, v, **params)
    assert family == expected


@pytest.mark.parametrize("backend,causal,seqlen_k,d,expected", [
    ("auto", False, 512, 128, "portable"),
    ("auto", False, 1024, 128, "hopper"),
    ("auto", True, 1024, 128, "portable"),
    ("auto", True, 2048, 128, "hopper"),
    ("auto", False, 256, 256, "portable"),  # d = 192 / 256 (wide kernel): from 512 dense,
    ("auto", False, 512, 256, "hopper"),
    ("auto", True, 512, 192, "portable"),   # from 1k masked
    ("auto", True, 1024, 192, "hopper"),
    ("hopper", True, 512, 128, "hopper"),     # forcing ignores the speed rule
])
def test_auto_backward_keeps_short_keys_on_portable(env, monkeypatch, backend, causal,
                                                    seqlen_k, d, expected):
    env(backend, None)
    monkeypatch.setattr(dispatch_select, "family_for", lambda t: "hopper")  # (fake) sm90 device
    monkeypatch.setattr(dispatch_select, "backend_for", lambda t: "portable")
    q = _meta((1, 256, 8, d))
    k = v = _meta((1, seqlen_k, 8, d))
    params = _params(causal=causal, window_right=0 if causal else -1, deterministic=False)
    del params["return_softmax"]
    assert dispatch_select.backward_family(q, k, v, **params) == expected


# Packed (varlen) forwards: the Hopper kernel's varlen mode where it covers the call
def _attn_params(**kw):
    from flashattn.params import AttnParams

    p = dict(softmax_scale=0.125, causal=False, window_left=-1, window_right=-1, softcap=0.0,
             alibi_slopes=None, dropout_p=0.0, philox_seed=0, deterministic=False)
    p.update(kw)
    return AttnParams(**p)


@pytest.mark.parametrize("backend,n_seqs,kw,used,expected", [
    ("auto", 4, {}, False, "hopper"),             # mean 1024 keys
    ("auto", 8, {}, False, "hopper"),             # mean 512: the measured crossover
    ("auto", 16, {}, False, "portable"),          # mean 256
    ("hopper", 16, {}, False, "hopper"),          # forcing ignores the speed rule
    ("auto", 4, dict(causal=True, window_right=0), False, "hopper"),
    ("auto", 4, dict(softcap=30.0, window_left=64), False, "hopper"),
    ("auto", 4, {}, True, "hopper"),              # seqused_k: read by the producer warp
    ("hopper", 4, dict(dropout_p=0.1), False, "portable"),
    ("hopper", 4, dict(alibi_slopes=torch.ones(8)), False, "portable"),
    ("portable", 4, {}, False, "portable"),
    ("hopper", 0, {}, False, "portable"),         # no sequence: the portable early exit
])
def test_varlen_forward_family(env, monkeypatch, backend, n_seqs, kw, used, expected):
    env(backend, None)
    monkeypatch.setattr(dispatch_select, "family_for",
                        lambda t: "portable" if backend == "portable" else "hopper")
    q = _meta((4096, 8, 128))
    k = v = _meta((4096, 2, 128))
    seqused = _meta((n_seqs,), torch.int32) if used else None
    assert dispatch_select.varlen_forward_family(q, k, v, n_seqs, seqused, _attn_params(**kw)) \
        == expected
    # return_softmax (dropout's S_dmask) is never covered
    assert dispatch_select.varlen_forward_family(q, k, v, n_seqs, None, _attn_params(**kw),
                                          return_softmax=True) == "portable"


@pytest.mark.parametrize("kw,expected_bwd", [
    ({}, "hopper.varlen_bwd"),
    (dict(deterministic=True), "portable.varlen_bwd"),  # no ordered dQ in the varlen kernel
])
def test_varlen_reaches_the_hopper_backend(env, monkeypatch, fake_backends, kw, expected_bwd):
    """flash_attn_varlen_func on a (fake) sm90 device: the forward runs the Hopper backend's
    varlen_fwd with the offsets as given; the backward its varlen_bwd where covered, else the
    portable one."""
    calls = fake_backends

    def varlen_fwd(q, k, v, cu_q, cu_k, seqused_k, max_q, max_k, p, return_softmax):
        calls.append(("hopper.varlen_fwd", cu_q.tolist(), cu_k.tolist(), p.window_right,
                      seqused_k))
        return (torch.zeros(q.shape[0], q.shape[1], v.shape[-1], dtype=q.dtype),
                torch.zeros(q.shape[1], q.shape[0]), None)

    def recorder(tag):
        def varlen_bwd(dout, q, k, v, out, lse, cu_q, cu_k, *rest):
            calls.append((tag, cu_q.tolist(), cu_k.tolist()))
            return tuple(torch.zeros_like(x) for x in (q, k, v))
        return varlen_bwd

    monkeypatch.setitem(dispatch_select._LOADED, "hopper", types.SimpleNamespace(
        varlen_fwd=varlen_fwd, varlen_bwd=recorder("hopper.varlen_bwd")))
    monkeypatch.setitem(dispatch_select._LOADED, "portable", types.SimpleNamespace(
        varlen_bwd=recorder("portable.varlen_bwd")))
    env("hopper", None)
    monkeypatch.setattr(dispatch_select, "family_for", lambda t: "hopper")
    monkeypatch.setattr(dispatch_select, "backend_for", lambda t: "portable")
    from flashattn import flash_attn_varlen_func

    q = torch.randn(10, 2, 64, dtype=torch.bfloat16, requires_grad=True)
    k = torch.randn(12, 1, 64, dtype=torch.bfloat16, requires_grad=True)
    cu_q = torch.tensor([0, 4, 10], dtype=torch.int32)
    cu_k = torch.tensor([0, 5, 12], dtype=torch.int32)
    out = flash_attn_varlen_func(q, k, k, cu_q, cu_k, 6, 7, causal=True, **kw)
    out.float().sum().backward()
    assert calls == [("hopper.varlen_fwd", [0, 4, 10], [0, 5, 12], 0, None),
                     (expected_bwd, [0, 4, 10], [0, 5, 12])]


@pytest.mark.parametrize("d,kw,used,expected", [
    (128, {}, False, None),
    (64, dict(causal=True, window_right=0), False, None),
    (192, {}, False, None),  # bwd_wide_kernel's varlen mode
    (256, dict(causal=True, window_right=0), False, None),
    (80, {}, False, "head dims 80/80"),
    (128, dict(deterministic=True), False, "deterministic"),
    (128, {}, True, None),  # seqused_k: the producer and consumers read it
    (128, dict(dropout_p=0.1), False, "dropout"),
])
def test_varlen_backward_coverage(d, kw, used, expected):
    from flashattn.backends.sm90.support import varlen_backward_unsupported

    q = _meta((300, 8, d))
    k = _meta((500, 2, d))
    p = _params(causal=False, window_right=-1, deterministic=False)
    del p["return_softmax"]
    p.update(kw)
    why = varlen_backward_unsupported(q, k, k, p, _meta((3,), torch.int32) if used else None)
    assert (why is None) if expected is None else (expected in why), why


@pytest.mark.parametrize("backend,n_seqs,d,expected", [
    ("auto", 8, 128, "hopper"),       # mean 512
    ("auto", 16, 128, "hopper"),      # mean 256: the backward's measured crossover
    ("auto", 32, 128, "portable"),    # mean 128: not measured
    ("hopper", 32, 128, "hopper"),    # forcing ignores the speed rule
    ("auto", 32, 256, "hopper"),      # mean 128 at d = 256 (bwd_wide_kernel): 2.2x measured
    ("auto", 64, 192, "portable"),    # mean 64: below the lowest wide point measured
])
def test_varlen_backward_family(env, monkeypatch, backend, n_seqs, d, expected):
    env(backend, None)
    monkeypatch.setattr(dispatch_select, "family_for", lambda t: "hopper")
    monkeypatch.setattr(dispatch_select, "backend_for", lambda t: "portable")
    q = _meta((4096, 8, d))
    k = v = _meta((4096, 2, d))
    assert dispatch_select.varlen_backward_family(q, k, v, n_seqs, None, _attn_params()) == expected
