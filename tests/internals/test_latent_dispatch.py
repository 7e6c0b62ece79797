"""The Hopper MLA decode kernel's place in dispatch, checked on the CPU (the kernel itself is
Gluon: GPU tests in tests/api/test_kvcache_mla_hopper_gpu.py, its sm_90 compile in
tests/backends/sm90/test_hopper_aot.py):

- ``latent_unsupported`` covers exactly the calls the kernel handles, and names what it
  refuses;
- ``dispatch.latent.latent_kernel`` hands the kernel to the portable decode call only when the
  device starts from the Hopper family;
- the portable DecodeCall runs a ``partials`` launcher instead of its decode kernel and merges
  its splits: with a torch stand-in for the kernel that writes each split's partial output
  and LSE through the strides the kernel is given, the full API call (append, paging, splits,
  causal) matches the float64 oracle.
"""
from __future__ import annotations

import math
from dataclasses import replace

import pytest
import torch

from tests.api.test_kvcache_mla import MLACase, check_mla
from flashattn.params import AttnParams

DEEPSEEK_SMALL = MLACase(b=3, h=16, h_k=1, d=64, d_v=512, page=64, s_cache=200, s_new=1,
                         num_splits=3, dtype=torch.bfloat16)


def _params(**kw) -> AttnParams:
    base = dict(softmax_scale=0.1, causal=False, window_left=-1, window_right=-1, softcap=0.0,
                alibi_slopes=None, dropout_p=0.0, philox_seed=0)
    base.update(kw)
    return AttnParams(**base)


def _call(**over):
    """A call the kernel covers (paged, pages of 64), with ``over`` replacing its pieces."""
    x = dict(q=torch.zeros(2, 1, 128, 64, dtype=torch.bfloat16),
             k_cache=torch.zeros(8, 64, 1, 64, dtype=torch.bfloat16),
             v_cache=torch.zeros(8, 64, 1, 512, dtype=torch.bfloat16),
             qv=torch.zeros(2, 1, 128, 512, dtype=torch.bfloat16),
             block_table=torch.zeros(2, 4, dtype=torch.int32))
    kw = dict(p=_params(), leftpad=None, batch_idx=None)
    for k, v in over.items():
        (x if k in x else kw)[k] = v
    return x, kw


@pytest.fixture
def on_sm90(monkeypatch):
    """The device check passes for CPU tensors (the rest of latent_unsupported is shape and
    feature logic)."""
    from flashattn.backends.sm90 import latent

    monkeypatch.setattr(latent, "device_unavailable", lambda device: None)


def _unsupported(x, kw):
    from flashattn.backends.sm90.backend import latent_unsupported

    return latent_unsupported(x["q"], x["k_cache"], x["v_cache"], x["qv"], x["block_table"],
                              **kw)


def test_covered_call(on_sm90):
    fp8 = dict(k_cache=torch.zeros(8, 64, 1, 64, dtype=torch.float8_e4m3fn),
               v_cache=torch.zeros(8, 64, 1, 512, dtype=torch.float8_e4m3fn),
               k_descale=torch.ones(2, 1), v_descale=torch.ones(2, 1))
    assert _unsupported(*_call(**fp8)) is None  # e4m3 caches, widened on chip
    assert _unsupported(*_call()) is None
    assert _unsupported(*_call(block_table=None)) is None  # contiguous cache
    assert _unsupported(*_call(block_table=None, p=_params(window_right=0))) is None  # causal
    assert _unsupported(*_call(k_cache=torch.zeros(4, 128, 1, 64, dtype=torch.bfloat16),
                               v_cache=torch.zeros(4, 128, 1, 512, dtype=torch.bfloat16))) is None


_BF = torch.bfloat16
REFUSED = {
    "no qv": dict(qv=None),
    "page size 48": dict(k_cache=torch.zeros(8, 48, 1, 64, dtype=_BF),
                         v_cache=torch.zeros(8, 48, 1, 512, dtype=_BF)),
    "FP8 caches without both descales": dict(
        k_cache=torch.zeros(8, 64, 1, 64, dtype=torch.float8_e4m3fn),
        v_cache=torch.zeros(8, 64, 1, 512, dtype=torch.float8_e4m3fn),
        k_descale=torch.ones(2, 1)),
    "descales over 16-bit caches": dict(k_descale=torch.ones(2, 1), v_descale=torch.ones(2, 1)),
    "head dims 128 / 512": dict(q=torch.zeros(2, 1, 128, 128, dtype=_BF)),
    "one KV head": dict(k_cache=torch.zeros(8, 64, 2, 64, dtype=_BF),
                        v_cache=torch.zeros(8, 64, 2, 512, dtype=_BF)),
    "window": dict(p=_params(window_left=100)),
    "softcap": dict(p=_params(softcap=5.0)),
    "alibi": dict(p=_params(alibi_slopes=torch.ones(2, 128))),
    "cache_leftpad": dict(leftpad=torch.zeros(2, dtype=torch.int32)),
    "packed (varlen)": dict(varlen=True),
    "dtypes": dict(qv=torch.zeros(2, 1, 128, 512, dtype=torch.float16)),
    "TMA": dict(qv=torch.zeros(2, 1, 128, 516, dtype=_BF)[..., :512]),
}


@pytest.mark.parametrize("what", list(REFUSED), ids=list(REFUSED))
def test_refused_calls_say_why(what, on_sm90):
    reason = _unsupported(*_call(**REFUSED[what]))
    assert reason is not None
    assert any(word in reason for word in what.split()), reason


def test_cpu_tensors_are_refused_by_the_device_check():
    assert "cpu" in _unsupported(*_call())


def test_dispatch_hands_the_kernel_over_only_on_the_hopper_family(monkeypatch, on_sm90):
    from flashattn.backends.sm90.latent import Partials
    from flashattn.dispatch import latent as dispatch_latent

    x, kw = _call()
    args = (x["q"], x["k_cache"], x["v_cache"], x["qv"], x["block_table"], kw["p"], None, None,
            256, {})
    assert dispatch_latent.latent_kernel(*args) == {}  # CPU tensors: not the Hopper family
    monkeypatch.setattr(dispatch_latent._select, "family_for", lambda q: "hopper")
    got = dispatch_latent.latent_kernel(*args)
    assert isinstance(got["partials"], Partials)
    assert (got["partials"].softmax_scale, got["partials"].causal,
            got["partials"].capacity) == (0.1, False, 256)
    assert dispatch_latent.latent_kernel(*args[:3], None, *args[4:]) == {}  # no qv
    fp8 = dict(k_descale=torch.ones(2, 1), v_descale=torch.ones(2, 1))
    assert dispatch_latent.latent_kernel(*args[:-1], fp8) == {}


def _split_partials(q, qv, k_cache, v_cache, seqlens, seqlen_k_add, block_table, out, lse,
                    o_strides, l_strides, num_splits, *, softmax_scale, causal, cache_cap,
                    k_descale=None, v_descale=None):
    """A torch stand-in for ``latent.latent_decode``: the kernel's split rule (whole 64-key
    blocks, equal shares), each split's normalised output and natural-log LSE (0 / -inf
    where a row sees no key of it), written through the given strides as the kernel does."""
    b, s_q, h, _ = q.shape
    d_v = v_cache.shape[-1]
    o = torch.as_strided(out, (num_splits, b, s_q, h, d_v), tuple(o_strides) + (1,))
    ls = torch.as_strided(lse, (num_splits, b, h, s_q), tuple(l_strides))
    for bi in range(b):
        n = min(max(int(seqlens[bi]) + seqlen_k_add, 0), cache_cap)
        pos = torch.arange(n)
        if block_table is not None:
            page = k_cache.shape[1]
            rows = block_table[bi].long()[pos // page], pos % page
        else:
            rows = torch.full_like(pos, bi), pos
        k = k_cache[rows[0], rows[1], 0].double()
        v = v_cache[rows[0], rows[1], 0].double()
        if k_descale is not None:  # (an e4m3 cache: real value = fp8 x descale)
            k, v = k * float(k_descale[bi, 0]), v * float(v_descale[bi, 0])
        per = math.ceil(math.ceil(n / 64) / num_splits)
        for s in range(num_splits):
            lo, hi = min(s * per * 64, n), min((s + 1) * per * 64, n)
            sc = (torch.einsum("qhd,kd->qhk", q[bi].double(), k[lo:hi])
                  + torch.einsum("qhd,kd->qhk", qv[bi].double(), v[lo:hi])) * softmax_scale
            if causal:
                i = torch.arange(s_q).view(-1, 1, 1)
                sc = sc.masked_fill(torch.arange(lo, hi).view(1, 1, -1) > i + n - s_q,
                                    float("-inf"))
            lse_s = torch.logsumexp(sc, dim=-1) if hi > lo else torch.full((s_q, h),
                                                                           float("-inf"))
            p = torch.exp(sc - torch.where(torch.isinf(lse_s), 0.0, lse_s)[..., None])
            o[s, bi] = torch.einsum("qhk,kd->qhd", p, v[lo:hi]).to(out.dtype)
            ls[s, bi] = lse_s.t().float()


@pytest.mark.parametrize("case", [
    DEEPSEEK_SMALL,
    replace(DEEPSEEK_SMALL, num_splits=1),
    replace(DEEPSEEK_SMALL, s_q=2, s_new=2, causal=True, num_splits=2),
    replace(DEEPSEEK_SMALL, page=None, s_new=0, empty_row=True),
    replace(DEEPSEEK_SMALL, page=16),
    replace(DEEPSEEK_SMALL, fp8=True),
    replace(DEEPSEEK_SMALL, fp8=True, page=16),
], ids=["page64-splits3", "one-split", "sq2-causal", "contiguous-empty-row", "page16", "fp8",
        "fp8-page16"])
def test_decode_call_runs_the_partials_and_combines_them(case, monkeypatch, on_sm90):
    """The full API call with the kernel stood in for: what comes out is the oracle's."""
    from flashattn.backends.sm90 import latent
    from flashattn.dispatch import latent as dispatch_latent

    calls = []
    monkeypatch.setattr(dispatch_latent._select, "family_for", lambda q: "hopper")
    monkeypatch.setattr(latent, "latent_decode",
                        lambda *a, **kw: calls.append(1) or _split_partials(*a, **kw))
    check_mla(case, "cpu")
    assert calls, "the partials launcher did not run"


@pytest.fixture
def scheduler_waves(monkeypatch):
    """(replay.kvcache.decode_splits as on an sm90 GPU, the list of ``waves`` it passes on to
    the portable split rule, which answers 7)."""
    from flashattn.dispatch import latent as dispatch_latent
    from flashattn.replay import kvcache as replay_kvcache

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    monkeypatch.setattr(replay_kvcache._select, "triton_available", lambda: True)
    monkeypatch.setattr(dispatch_latent._select, "family_for", lambda device: "hopper")
    seen = []
    portable = dispatch_latent._select.backend("portable")
    monkeypatch.setattr(portable, "decode_splits", lambda *a: seen.append(a[-1]) or 7)
    return replay_kvcache.decode_splits, seen


@pytest.mark.parametrize("shapes, waves", [
    (dict(nheads_k=1, headdim=64, headdim_v=512, page_size=64), 1.0),
    (dict(nheads_k=1, headdim=64, headdim_v=512, page_size=None), 1.0),
    (dict(nheads_k=1, headdim=64, headdim_v=512, page_size=64, window_right=0), 1.0),
    (dict(nheads_k=1, headdim=64, headdim_v=512, page_size=16), 1.0),
    (dict(nheads_k=1, headdim=64, headdim_v=512, page_size=12), None),
    (dict(nheads_k=1, headdim=64, headdim_v=512, page_size=64, softcap=1.0), None),
    (dict(nheads_k=8, headdim=128, headdim_v=128, page_size=64), None),
], ids=["mla-page64", "mla-contiguous", "mla-causal", "mla-page16", "mla-page12", "mla-softcap",
         "gqa-d128"])
def test_scheduler_splits_follow_the_kernel_that_runs(shapes, waves, scheduler_waves):
    """FA3's get_scheduler_metadata on sm90: MLA's shapes get the Hopper kernel's one-wave
    split count, every other shape the portable decode kernel's rule."""
    decode_splits, seen = scheduler_waves
    window = dict(window_left=-1, window_right=shapes.pop("window_right", -1),
                  softcap=shapes.pop("softcap", 0.0))
    splits = decode_splits(4, 1, 8192, 128, shapes["nheads_k"], shapes["headdim"],
                           shapes["headdim_v"], torch.bfloat16, shapes["page_size"], 0, **window)
    assert splits == 7 and seen == [waves]


def test_qv_on_the_cpu_backend_never_asks_for_the_portable_backend(monkeypatch):
    """The torch path (a laptop without Triton) runs qv calls without the portable backend,
    which imports Triton: dispatch's MLA kernel choice must not ask for it by module."""
    import flashattn
    from flashattn.dispatch import select

    backend = select.backend

    def no_portable(name):
        if name == "portable":
            raise ImportError("the portable backend needs Triton")
        return backend(name)

    monkeypatch.setattr(select, "backend", no_portable)
    with flashattn.use_backend("cpu"):
        check_mla(replace(DEEPSEEK_SMALL, num_splits=0), "cpu")


def test_scheduler_splits_for_an_fp8_latent_cache(scheduler_waves):
    """An e4m3 latent cache (FA3's qkv_dtype float8_e4m3fn) runs on the Hopper MLA kernel too:
    get_scheduler_metadata gives it the kernel's one-wave split count."""
    decode_splits, seen = scheduler_waves
    decode_splits(4, 1, 8192, 128, 1, 64, 512, torch.float8_e4m3fn, 64, 0)
    decode_splits(4, 1, 8192, 128, 1, 64, 512, torch.float32, 64, 0)
    assert seen == [1.0, None]
