"""The recorded calls' replays (the lean decode and dense paths) without a GPU:
DecodeCall passes the recorded launches exactly the addresses the first call's tensors had in
the same roles (the workspace pieces at the same offsets, the inputs' own addresses) and
returns its lse where the replayed kernels write it; FwdCall records the forward's plan and
replays it with the new tensors in the kernel's slot order. The GPU tests run the replays for
real (tests/api/test_kvcache_gpu.py::test_repeated_signature_replays_the_recorded_decode,
tests/api/test_attention.py's repeated-call test)."""
from __future__ import annotations

import pytest
import torch

from flashattn.runtime import launch
from flashattn.backends.triton import decode, fwd


class _Recorded:
    """Stands in for a recorded launch plan: keeps what each replay passes."""

    def __init__(self, tensors):
        self.first = [t.data_ptr() for t in tensors]
        self.replays = []

    def replay(self, values):
        self.replays.append(list(values))
        return True


@pytest.mark.parametrize("splits", [1, 3])
@pytest.mark.parametrize("paged", [False, True])
def test_replay_passes_the_recorded_roles(monkeypatch, splits, paged):
    recorded = []

    def fake_launch(self, key, tensors, build):
        plan = _Recorded(tensors)
        recorded.append(plan)
        return plan

    monkeypatch.setattr(launch.LaunchPlans, "launch", fake_launch)
    b, h, h_k, d = 2, 8, 2, 32
    if paged:
        k_cache = torch.randn(12, 16, h_k, d)
        block_table = torch.arange(8, dtype=torch.int32).view(b, 4)
    else:
        k_cache, block_table = torch.randn(b, 64, h_k, d), None
    v_cache = torch.randn_like(k_cache)
    seqlens = torch.tensor([40, 64], dtype=torch.int32)
    q = torch.randn(b, 1, h, d)
    call = decode.DecodeCall(q, k_cache, v_cache, seqlens, 0, softmax_scale=0.2,
                             window_left=-1, window_right=-1, softcap=0.0, alibi_slopes=None,
                             num_splits=splits, max_seqlen_k=64, block_table=block_table)
    assert call.num_splits == splits
    out1, lse1 = call(q, k_cache, v_cache, seqlens, None, None, block_table, None)
    dec = recorded[0]
    combine = recorded[1] if splits > 1 else None
    assert len(recorded) == (2 if splits > 1 else 1)
    q2 = torch.randn(b, 1, h, d)
    out2, lse2 = call(q2, k_cache, v_cache, seqlens, None, None, block_table, None)
    assert len(recorded) == len(dec.replays) + (1 if splits > 1 else 0)  # replayed, no record
    (vals,) = dec.replays
    base1, base2 = lse1.data_ptr(), lse2.data_ptr()  # lse leads the workspace

    ws_bytes, out_bytes = 4 * call.ws_numel, out1.numel() * out1.element_size()

    def role(addr, base, out):  # an address as (tensor, offset) in the call's own tensors
        for name, start, size in (("ws", base, ws_bytes), ("out", out, out_bytes)):
            if 0 <= addr - start < size:
                return name, addr - start
        return addr

    first = [role(a, base1, out1.data_ptr()) for a in dec.first]
    again = [role(a, base2, out2.data_ptr()) for a in vals]
    assert first[0] == q.data_ptr() and again[0] == q2.data_ptr()
    assert first[1:] == again[1:]  # caches, pieces of the workspace / out, lengths, dummies
    if combine is not None:
        (cvals,) = combine.replays
        assert [role(a, base1, out1.data_ptr()) for a in combine.first] == \
            [role(a, base2, out2.data_ptr()) for a in cvals]
    assert out2.shape == out1.shape and lse2.shape == lse1.shape == (b, h, 1)
    assert lse2.is_contiguous() and out2.is_contiguous()


def test_fwd_call_records_then_replays_in_slot_order(monkeypatch):
    class _Plan:
        def __init__(self):
            self.replays = []

        def replay(self, values):
            self.replays.append(list(values))
            return True

    plan = _Plan()
    launched = []

    def fake_launch(q, k, v, out, lse, p_mat, *args, **kwargs):
        launched.append((out, lse))
        return plan

    monkeypatch.setattr(fwd, "_launch_fwd", fake_launch)
    q, k, v = torch.randn(1, 8, 4, 16), torch.randn(1, 8, 2, 16), torch.randn(1, 8, 2, 32)
    call = fwd.FwdCall(q, k, v, softmax_scale=0.25, causal=True, window_left=-1,
                       window_right=0, softcap=0.0, alibi_slopes=None)
    out1, lse1 = call(q, k, v)  # records
    assert launched == [(out1, lse1)] and call.plan is plan and not plan.replays
    q2 = torch.randn_like(q)
    out2, lse2 = call(q2, k, v)
    assert len(launched) == 1  # replayed, not launched through flash_fwd
    (vals,) = plan.replays
    o, m = out2.data_ptr(), lse2.data_ptr()
    assert vals == [q2.data_ptr(), k.data_ptr(), v.data_ptr(), o, m, m, o, m, m, m]
    assert out2.shape == (1, 8, 4, 32) and lse2.shape == (1, 4, 8)
    assert out2.dtype == q.dtype and lse2.dtype == torch.float32


def test_split_counts_key_their_own_plans():
    """The launch plans' key holds the grid: two calls that differ only in their split count
    (the partials' strides are the same for any count > 1) never share a recorded launch."""
    q, k_cache = torch.randn(1, 1, 8, 32), torch.randn(1, 256, 2, 32)
    seqlens = torch.tensor([256], dtype=torch.int32)

    def call(splits):
        return decode.DecodeCall(q, k_cache, k_cache, seqlens, 0, softmax_scale=0.2,
                                 window_left=-1, window_right=-1, softcap=0.0,
                                 alibi_slopes=None, num_splits=splits, max_seqlen_k=256)

    keys = {n: call(n).key for n in (2, 3, 5)}
    assert len(set(keys.values())) == 3
    assert call(3).key == keys[3]


@pytest.mark.parametrize("features", ["plain", "fp8-qv", "fp8-query"])
def test_decode_call_fills_every_kernel_argument(features):
    """DecodeCall's pieces match the decode kernel's signature: its tensor slots (_slots,
    _N_TENSORS: ``Q ... VDescale, QV, QDescale``) are the parameters before the first stride,
    its scalars the other non-constexpr ones, its kwargs the constexprs and launch options,
    whichever optional tensors a call gives (multi-head latent attention's qv, an FP8 cache's
    descales, an FP8 query's)."""
    import inspect

    # (the Python function under the JIT or interpreter wrapper: constexprs by annotation)
    params = inspect.signature(decode._decode_kernel.fn).parameters
    names = list(params)
    n_tensors = names.index("stride_qb")
    constexprs = {n for n, p in params.items() if "constexpr" in str(p.annotation)}
    assert decode._N_TENSORS == n_tensors == len(decode._slots(*range(12)))
    assert names[n_tensors - 3:n_tensors] == ["VDescale", "QV", "QDescale"]
    b, h, h_k, d, d_v = 2, 8, 2, 32, 64
    q = torch.randn(b, 1, h, d)
    k_cache, v_cache = torch.randn(b, 64, h_k, d), torch.randn(b, 64, h_k, d_v)
    extra = {}
    if features != "plain":
        e4m3 = torch.float8_e4m3fn
        k_cache, v_cache = k_cache.to(e4m3), v_cache.to(e4m3)
        extra = dict(k_descale=torch.ones(b, h_k), v_descale=torch.ones(b, h_k))
        if features == "fp8-qv":
            extra["qv"] = torch.randn(b, 1, h, d_v)
        else:
            q, extra["q_descale"] = q.to(e4m3), torch.ones(b, h_k)
    call = decode.DecodeCall(q, k_cache, v_cache, torch.tensor([40, 64], dtype=torch.int32), 0,
                             softmax_scale=0.2, window_left=-1, window_right=-1, softcap=0.0,
                             alibi_slopes=None, num_splits=1, max_seqlen_k=64, **extra)
    assert len(call.scalars) == len(params) - n_tensors - len(constexprs)
    assert constexprs <= set(call.kwargs)
    assert call.kwargs["HAS_QV"] == (features == "fp8-qv")
    assert call.kwargs["Q_FP8"] == (features == "fp8-query")
    assert call.kwargs["KV_FP8"] == (features != "plain")
