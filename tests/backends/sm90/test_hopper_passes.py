"""The Hopper backward's plain-Triton passes (row statistics in, dQ out) under the Triton
interpreter: they need no sm90, so CI checks them on CPU."""
from __future__ import annotations

import pytest
import torch

from flashattn.backends.sm90.bwd_postprocess import (DQT_SEQ_ALIGN, dq_from_packed_workspace,
                                            dq_from_workspace, packed_dq_t_columns)
from flashattn.backends.sm90.bwd_preprocess import row_stats


@pytest.mark.parametrize("transposed", [False, True])
@pytest.mark.parametrize("b,s,h,d", [(2, 37, 3, 64), (1, 130, 2, 96), (1, 5, 1, 192)])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_dq_from_workspace(transposed, b, s, h, d, dtype):
    """dq (b, s, h, d) equals the workspace's first s rows / d columns, cast: both layouts,
    lengths and head dims that are not multiples of the tiles."""
    s_pad, d_pad = -(-s // 64) * 64, 1 << (d - 1).bit_length()
    shape = (b, h, d_pad, s_pad) if transposed else (b, h, s_pad, d_pad)
    acc = torch.randn(shape, dtype=torch.float32)
    q = torch.empty((b, s, h, d), dtype=dtype)
    dq = dq_from_workspace(acc, q, transposed)
    view = acc.permute(0, 3, 1, 2) if transposed else acc.transpose(1, 2)
    want = view[:, :s, :, :d].to(dtype)
    assert dq.shape == q.shape and dq.dtype == dtype and dq.is_contiguous()
    # one unit in the last place: the interpreter's float32 -> bfloat16 cast may round
    # differently from torch's round-to-nearest-even (the GPU's cvt.rn matches torch)
    ulp = 2.0 ** -7 if dtype == torch.bfloat16 else 2.0 ** -10
    torch.testing.assert_close(dq, want, rtol=ulp, atol=1e-6)


@pytest.mark.parametrize("lens,lead,tail", [
    ((5, 0, 1, 37, 3, 0, 2, 70), 0, 0),  # empty and 1-row sequences, starts off the boundary
    ((3,), 2, 9),                         # rows before the first and after the last sequence
    ((64, 64, 1), 0, 0),
])
def test_dq_from_packed_workspace(lens, lead, tail):
    """The wide backward's packed dQ^T workspace: sequence i's token t at column
    DQT_SEQ_ALIGN * (i + cu[i] // DQT_SEQ_ALIGN) + t - cu[i], every start 16-byte aligned and
    past the previous sequence's end; dq rows of no sequence are 0."""
    h, d, block_m = 3, 192, 64
    cu = torch.tensor([lead] + [lead + sum(lens[:i + 1]) for i in range(len(lens))],
                      dtype=torch.int32)
    total = lead + sum(lens) + tail
    cols = packed_dq_t_columns(total, len(lens), block_m)
    acc = torch.randn((1, h, 256, cols), dtype=torch.float32)
    q = torch.empty((total, h, d), dtype=torch.float32)
    dq = dq_from_packed_workspace(acc, q, cu)
    want = torch.zeros(total, h, d)
    prev_end = 0
    for i, n in enumerate(lens):
        start = DQT_SEQ_ALIGN * (i + int(cu[i]) // DQT_SEQ_ALIGN)
        assert start % DQT_SEQ_ALIGN == 0 and start >= prev_end
        # (a query block of the sequence may run one block past its end)
        assert start + n + block_m <= cols
        prev_end = start + n
        want[int(cu[i]):int(cu[i + 1])] = acc[0, :, :d, start:start + n].permute(2, 0, 1)
    assert dq.shape == q.shape and dq.is_contiguous()
    torch.testing.assert_close(dq, want, rtol=0, atol=0)


@pytest.mark.parametrize("d,transposed", [(64, False), (96, False), (192, True)])
def test_row_stats(d, transposed):
    """lse2 = lse * log2(e) (+inf where lse = -inf and on padding rows), delta = rowsum(dO * O)
    (0 where lse = -inf, even over a NaN dO row: a packed call's padding rows, and on padding
    rows), and the dQ workspace zeroed in either layout."""
    b, s, h, s_pad = 2, 70, 3, 128
    d_pad = 1 << (d - 1).bit_length()
    out = torch.randn(b, s, h, d, dtype=torch.bfloat16)
    dout = torch.randn(b, s, h, d, dtype=torch.bfloat16)
    lse = torch.randn(b, h, s, dtype=torch.float32)
    lse[0, 1, 5] = float("-inf")
    dout[0, 5, 1] = float("nan")
    shape = (b, h, d_pad, s_pad) if transposed else (b, h, s_pad, d_pad)
    dq_acc = torch.full(shape, float("nan"))
    lse2, delta = row_stats(out, dout, lse, s_pad, dq_acc, transposed)
    assert lse2.shape == delta.shape == (b, h, s_pad)
    assert lse2.is_contiguous() and delta.is_contiguous()
    want_delta = (out.float() * dout.float()).sum(-1).transpose(1, 2)
    want_delta[0, 1, 5] = 0.0
    torch.testing.assert_close(delta[:, :, :s], want_delta, rtol=1e-5, atol=1e-4)
    assert torch.all(delta[:, :, s:] == 0)
    want_lse2 = lse * 1.4426950408889634
    want_lse2[0, 1, 5] = float("inf")
    torch.testing.assert_close(lse2[:, :, :s], want_lse2)
    assert torch.all(lse2[:, :, s:] == float("inf"))
    assert torch.all(dq_acc == 0)


@pytest.mark.parametrize("d,causal,overrides", [
    (128, True, None), (128, False, None), (256, True, None),
    (128, True, {"persistent": True, "dynamic": True})])
def test_backward_host_path_fills_the_launch_slots(monkeypatch, d, causal, overrides):
    """flash_bwd_hopper's host side on CPU (passes interpreted, the Gluon launch recorded):
    the tensors a launch plan swaps per call sit at the argument positions of its slots, the
    tile queue is (1 + grid,) int32 zeros only for persistent + dynamic, and the grid is what
    the config asks for. A wrong position would run the kernel on another call's buffers."""
    from flashattn.backends.sm90 import bwd
    from flashattn.backends.triton.config import sm_count

    seen = {}

    def record(key, tensors, build):
        fn, grid, args, kwargs = build()
        seen.update(tensors=tensors, grid=grid, args=args, kwargs=kwargs, fn=fn)

    monkeypatch.setattr(bwd._PLANS, "launch", record)
    b, s, h, h_k = 2, 300, 4, 2
    q = torch.randn(b, s, h, d, dtype=torch.bfloat16)
    k, v = (torch.randn(b, s, h_k, d, dtype=torch.bfloat16) for _ in "kv")
    out, dout = torch.randn_like(q), torch.randn_like(q)
    lse = torch.randn(b, h, s, dtype=torch.float32)
    bwd.flash_bwd_hopper(dout, q, k, v, out, lse, softmax_scale=d ** -0.5, causal=causal,
                         window_left=-1, window_right=0 if causal else -1, softcap=0.0,
                         config_overrides=overrides)
    tensors, args = seen["tensors"], seen["args"]
    assert len(tensors) == len(bwd._PLANS.slots)
    for slot, t in zip(bwd._PLANS.slots, tensors):
        a = args[slot]
        held = a if isinstance(a, torch.Tensor) else a.base  # tensor descriptors hold .base
        # (the dQ descriptor is over a 2-D view of the workspace: same storage)
        assert held.data_ptr() == t.data_ptr(), f"argument {slot} is not the plan's tensor"
    assert all(a.base is t for a, t in zip(args[:4], (q, k, v, dout)))
    cfg = bwd.bwd_config(d, masked=causal, **(overrides or {}))
    counter = tensors[-1]
    n_tiles = -(-s // cfg.block_n) * b * h_k
    one_wave = not causal and not overrides and n_tiles <= sm_count(q.device)
    if cfg.persistent and cfg.dynamic and not one_wave:  # (one wave: the static stride)
        assert counter.dtype == torch.int32 and counter.shape == (1 + seen["grid"][0],)
        assert not counter.any()
        assert seen["kwargs"]["DYNAMIC"]
    else:
        assert counter is tensors[5]  # lse2 stands in
    assert seen["grid"] == ((min(n_tiles, sm_count(q.device)) if cfg.persistent else n_tiles),)


@pytest.mark.parametrize("cu, used", [
    ([0, 100, 300], None),                    # every key covered
    ([5, 100, 290], None),                    # keys before the first and after the last offset
    ([0, 100, 300], [50, 200]),               # seqused_k: each sequence's tail
    ([0, 0, 64, 64, 300], [7, 9, 0, 1000]),   # empty sequences, 0 used, used past the length
    ([10, 500, 700], [30, -4]),               # offsets past total_k (clamped), negative used
])
def test_clear_uncovered_keys(cu, used):
    """The packed backward's dK / dV keys that no tile covers become 0 and no other key is
    touched: before cu_seqlens_k[0], from cu_seqlens_k[-1] on and, with seqused_k, past each
    sequence's used keys, with the offsets clamped to [0, total_k] as the kernels clamp them
    (sequence i covers [c_i, c_i + min(max(used_i, 0), max(c_{i+1} - c_i, 0))), c = clamp(cu))."""
    from flashattn.backends.sm90.varlen_rows import clear_uncovered_keys

    total, h_k, d = 300, 3, 40
    dk = torch.full((total, h_k, d), 7.0, dtype=torch.bfloat16)
    dv = torch.full((total, h_k, d), 5.0, dtype=torch.bfloat16)
    cu_t = torch.tensor(cu, dtype=torch.int32)
    used_t = None if used is None else torch.tensor(used, dtype=torch.int32)
    clear_uncovered_keys(dk, dv, cu_t, used_t)
    c = [min(max(x, 0), total) for x in cu]
    covered = torch.zeros(total, dtype=torch.bool)
    for i in range(len(cu) - 1):
        n = max(c[i + 1] - c[i], 0)
        if used is not None:
            n = min(max(used[i], 0), n)
        covered[c[i]:c[i] + n] = True
    for t, fill in ((dk, 7.0), (dv, 5.0)):
        assert torch.all(t[covered] == fill)
        assert torch.all(t[~covered] == 0)
