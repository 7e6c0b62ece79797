"""The Hopper forward's tile configurations as data (CPU): every shipped config fits an sm90
SM (shared memory, register file), and fwd_config rejects combinations the kernel cannot build
with a message that names them."""
from __future__ import annotations

import pytest
import torch

from flashattn.backends.sm90.config import FWD_CONFIGS, SMEM_LIMIT, SOFTCAP_CONFIGS, fp8_fwd_config, fwd_config
from flashattn.backends.sm90.support import HEAD_DIMS

REGISTER_FILE = 65536  # 32-bit registers per SM (sm90)


@pytest.mark.parametrize("head_dim,softcap", [(d, False) for d in FWD_CONFIGS]
                         + [(d, True) for d in SOFTCAP_CONFIGS])
def test_shipped_configs_fit_an_sm(head_dim, softcap):
    cfg = fwd_config(head_dim, softcap)
    assert cfg.consumers in (2, 3) and cfg.block_m % cfg.consumers == 0
    assert cfg.block_m // cfg.consumers == 64  # one wgmma M-tile of rows per warpgroup
    assert cfg.smem_bytes(head_dim) <= SMEM_LIMIT
    # warps are allocated per warpgroup: the producer's one warp occupies a whole one
    threads = 128 * (cfg.consumers + 1)
    assert cfg.maxnreg * threads <= REGISTER_FILE  # the launch itself must fit
    # after setmaxnreg: consumers up, the producer's warpgroup down
    assert 128 * (cfg.consumers * cfg.consumer_regs + cfg.producer_regs) <= REGISTER_FILE


@pytest.mark.parametrize("head_dim_v", HEAD_DIMS)
@pytest.mark.parametrize("head_dim", HEAD_DIMS)
def test_mixed_head_dim_configs_fit_an_sm(head_dim, head_dim_v):
    """d != d_v takes the larger dim's config with O in its own slot; it fits shared memory."""
    cfg = fwd_config(head_dim, head_dim_v=head_dim_v)
    assert cfg.smem_bytes(head_dim, head_dim_v=head_dim_v) <= SMEM_LIMIT
    if (head_dim_v - 1).bit_length() != (head_dim - 1).bit_length():  # other padded width
        assert cfg.separate_o


def test_three_consumers_reject_two_way_schedules():
    assert fwd_config(64).consumers == 3
    for bad in (dict(pingpong=True), dict(warp_specialized=False)):
        with pytest.raises(ValueError, match="two consumer warpgroups"):
            fwd_config(64, **bad)
    two = dict(consumers=2, block_m=128, consumer_regs=240, maxnreg=168)
    assert fwd_config(64, pingpong=True, **two).pingpong
    with pytest.raises(ValueError, match="divide block_m"):
        fwd_config(128, consumers=3)  # block_m 128 is not three warpgroups of rows
    with pytest.raises(ValueError, match="consumers must be 2 or 3"):
        fwd_config(128, consumers=4)


def test_tile_queue_for_every_persistent_warp_specialised_call():
    """Masked and unmasked calls alike: a CTA that starts late (its SM busy with an NCCL
    transfer beside the call) must take fewer tiles, not delay the call."""
    pytest.importorskip("triton.experimental.gluon")
    from flashattn.backends.sm90.fwd import uses_tile_queue

    cfg = fwd_config(128)
    assert uses_tile_queue(cfg, window_right=0)  # causal
    assert uses_tile_queue(cfg, window_right=-1)  # dense: equal tiles, still the queue
    assert uses_tile_queue(cfg, window_right=-1, varlen=True)
    # the FP8 forward keeps the static stride on unmasked calls (measured so), not on masked
    fp8 = fp8_fwd_config(128)
    assert not uses_tile_queue(fp8, window_right=-1)
    assert uses_tile_queue(fp8, window_right=0)
    assert uses_tile_queue(fp8, window_right=-1, varlen=True)
    assert not uses_tile_queue(fwd_config(128, dynamic=False), 0)
    assert not uses_tile_queue(fwd_config(128, persistent=False), 0)
    assert not uses_tile_queue(fwd_config(128, warp_specialized=False), 0)


def test_backward_runs_persistent_only_where_key_tiles_cost_the_same():
    """Unmasked calls at d = 64 / 128 take the persistent backward schedule (measured faster
    there); causal / windowed calls, d = 96 (spills), the wide kernel and explicit overrides
    do not."""
    from flashattn.backends.sm90.config import bwd_config

    assert bwd_config(128, masked=False).persistent
    assert bwd_config(64, masked=False).persistent
    # with the tile queue (late CTAs take fewer tiles), but not the deterministic schedule,
    # whose head-major static order the dQ turns need
    assert bwd_config(128, masked=False).dynamic and bwd_config(64, masked=False).dynamic
    assert not bwd_config(128, masked=False, dynamic=False).dynamic
    assert not bwd_config(128, masked=False, deterministic=True).dynamic
    assert not bwd_config(128, masked=True).dynamic
    assert not bwd_config(128, masked=True).persistent
    assert not bwd_config(96, masked=False).persistent
    assert not bwd_config(256, masked=False).persistent  # bwd_wide_kernel: no such schedule
    assert not bwd_config(128, masked=False, persistent=False).persistent
    assert not bwd_config(128, masked=False, pipeline=True).persistent  # needs pipeline=False


def test_backward_tile_queue_needs_the_persistent_schedule():
    """BwdConfig.dynamic (persistent CTAs drawing tiles from a global queue) without
    persistent=True is refused before any compile, naming the field."""
    import torch

    from tools import aot_sm90 as aot

    with pytest.raises(ValueError, match="dynamic=True"):
        aot.compile_bwd_variant(128, torch.bfloat16, causal=True, overrides={"dynamic": True})


def test_deterministic_backward_runs_the_ordered_persistent_schedule():
    """deterministic=True: persistent CTAs (static stride unmasked, the ticket queue masked:
    tiles wait only on tiles handed out earlier, which are running or done), d = 64 / 128."""
    from flashattn.backends.sm90.config import bwd_config

    for d in (64, 128):
        for masked in (False, True):
            cfg = bwd_config(d, masked=masked, deterministic=True)
            assert cfg.deterministic and cfg.persistent and not cfg.pipeline
            assert cfg.dynamic == masked
            assert bwd_config(d, masked, True) is cfg  # prebuilt: no per-call dataclass
        assert bwd_config(d, masked=True, deterministic=True, num_stages=3).num_stages == 3
    assert not bwd_config(128, masked=True).deterministic
    for d in (96, 192, 256):
        with pytest.raises(ValueError, match="deterministic"):
            bwd_config(d, deterministic=True)


def test_deterministic_backward_refuses_a_left_window():
    """The ordered dQ relies on every key tile from 0 to the last one reaching a query block
    visiting it: true without a left window. With one, the launch is refused, naming the rule."""
    import torch

    from tools import aot_sm90 as aot

    with pytest.raises(ValueError, match="left window"):
        aot.compile_bwd_variant(128, torch.bfloat16, window=(300, 0),
                                overrides={"deterministic": True})


def test_fp8_unmasked_overrides_change_only_the_schedule():
    """FP8_UNMASKED_OVERRIDES (d = 256 without the intra-warpgroup overlap, measured faster on
    unmasked calls only) leave the tiles alone, so the scale-block checks of
    support.fp8_unsupported hold either way; masked calls, softcap and explicit overrides keep
    what they ask for. FP8_MASKED_OVERRIDES (d = 192 / 256: one CTA per tile) apply to masked padded
    calls without softcap only, and change the launch alone."""
    from dataclasses import replace

    from flashattn.backends.sm90.config import (FP8_CONFIGS, FP8_MASKED_OVERRIDES,
                                                FP8_UNMASKED_OVERRIDES, fp8_fwd_config)

    for d in FP8_CONFIGS:
        masked, unmasked = fp8_fwd_config(d, masked=True), fp8_fwd_config(d, masked=False)
        assert masked == replace(FP8_CONFIGS[d], **FP8_MASKED_OVERRIDES.get(d, {}))
        assert fp8_fwd_config(d, masked=True, packed=True) == FP8_CONFIGS[d]
        tiles = lambda c: (c.block_m, c.block_n, c.consumers, c.num_stages)  # noqa: E731
        assert tiles(masked) == tiles(unmasked)
        assert unmasked.intra_overlap == (d not in FP8_UNMASKED_OVERRIDES)
        assert unmasked.smem_bytes(d, elem=1) <= SMEM_LIMIT
    assert fp8_fwd_config(256, softcap=True).intra_overlap  # softcap: its own tiles
    assert not fp8_fwd_config(256, masked=True).persistent
    assert not fp8_fwd_config(192, masked=True).persistent
    assert fp8_fwd_config(256, masked=True, softcap=True).persistent
    assert fp8_fwd_config(256, masked=False, intra_overlap=True).intra_overlap


def test_fp8_key_tiles_follow_the_descale_blocks():
    """A K / V descale covers whole key tiles: tiles longer than the descale blocks shrink to
    them (down to FP8_MIN_BLOCK_N, below which support.fp8_unsupported refuses the call), and
    FP8_LONG_CAUSAL's longer tiles apply only to long causal calls whose blocks cover them."""
    import torch

    from flashattn.params import AttnParams, Fp8Scales
    from flashattn.backends.sm90 import support
    from flashattn.backends.sm90.config import (FP8_CONFIGS, FP8_LONG_CAUSAL, FP8_LONG_CAUSAL_MIN_KEYS,
                                       FP8_MIN_BLOCK_N, FP8_NARROW_STAGES, fp8_fwd_config,
                                       fp8_long_causal)

    one_per_head = 1 << 31
    assert fp8_long_causal(-1, 0, FP8_LONG_CAUSAL_MIN_KEYS)
    assert not fp8_long_causal(-1, 0, FP8_LONG_CAUSAL_MIN_KEYS - 1)
    assert not fp8_long_causal(256, 0, 16384)  # a left window: not the measured case
    assert not fp8_long_causal(-1, -1, 16384)  # no mask
    long = fp8_fwd_config(128, masked=True, kv_block_keys=one_per_head, long_causal=True)
    assert (long.block_n, long.num_stages, long.intra_overlap) == (256, 2, False)
    assert long == fp8_fwd_config(128, masked=True, kv_block_keys=256, long_causal=True)
    assert long.smem_bytes(128, elem=1) <= SMEM_LIMIT
    assert set(FP8_LONG_CAUSAL) <= set(FP8_CONFIGS)
    # 128-key descales, a dense call, softcap or a short call: the table's tiles
    for kw in (dict(kv_block_keys=128, long_causal=True, masked=True),
               dict(kv_block_keys=one_per_head, long_causal=True, masked=False),
               dict(kv_block_keys=one_per_head, long_causal=False, masked=True)):
        assert fp8_fwd_config(128, **kw).block_n == FP8_CONFIGS[128].block_n, kw
    assert fp8_fwd_config(128, softcap=True, masked=True, kv_block_keys=one_per_head,
                          long_causal=True).block_n == 64
    # shorter descale blocks: shorter tiles, every head dim
    for d in FP8_CONFIGS:
        cfg = fp8_fwd_config(d, kv_block_keys=FP8_MIN_BLOCK_N)
        assert cfg.block_n == FP8_MIN_BLOCK_N
        assert cfg.num_stages == (FP8_NARROW_STAGES if FP8_CONFIGS[d].block_n > FP8_MIN_BLOCK_N
                                  else FP8_CONFIGS[d].num_stages)
        assert cfg.smem_bytes(d, elem=1) <= SMEM_LIMIT
    # support: 64-key descales at d = 192 (128-key tiles) run shorter tiles; 32 are refused
    q = torch.empty((1, 256, 2, 192), dtype=torch.float8_e4m3fn, device="meta")
    params = AttnParams(192 ** -0.5, False, -1, -1, 0.0, None, 0.0, 0)
    table = torch.empty((1, 2, 8), device="meta")
    for shift, ok in ((6, True), (7, True), (31, True), (5, False)):
        why = support.fp8_unsupported(q, q, q, params, Fp8Scales(table, table, table, 7, shift))
        assert (why is None) == ok, (shift, why)


def test_fp8_float32_output_only_where_its_o_slot_fits():
    """out_dtype=float32 doubles the FP8 forward's O slot: every config the launch may pick
    (masks, softcap, narrow and long causal key tiles) fits an SM at d <= 128 and with a
    128-wide V at d = 192; d = 192 / 256 with their own V width and 128-key tiles do not, and
    support.fp8_unsupported sends those to the portable kernel with a reason. The 16-bit
    outputs of the shipped configs fit by the same count (fp8_smem_bytes)."""
    import torch

    from flashattn.params import AttnParams, Fp8Scales
    from flashattn.backends.sm90 import support
    from flashattn.backends.sm90.config import FP8_CONFIGS, fp8_fwd_config, fp8_smem_bytes

    for d in FP8_CONFIGS:
        assert fp8_smem_bytes(fp8_fwd_config(d), d, d, 2) <= SMEM_LIMIT
    table = torch.empty((1, 2, 8), device="meta")
    for (d, d_v), fits in (((64, 64), True), ((96, 96), True), ((128, 128), True),
                           ((192, 128), True), ((192, 192), False), ((256, 256), False)):
        q = torch.empty((1, 8192, 2, d), dtype=torch.float8_e4m3fn, device="meta")
        v = torch.empty((1, 8192, 2, d_v), dtype=torch.float8_e4m3fn, device="meta")
        for causal in (False, True):
            for softcap in (0.0, 20.0):
                for shift in (6, 7, 31):
                    params = AttnParams(d ** -0.5, causal, -1, 0 if causal else -1, softcap,
                                        None, 0.0, 0)
                    scales = Fp8Scales(table, table, table, 7, shift)
                    assert support.fp8_unsupported(q, q, v, params, scales) is None
                    why = support.fp8_unsupported(q, q, v, params, scales, torch.float32)
                    cfg = fp8_fwd_config(d, d_v, softcap > 0, causal, kv_block_keys=1 << shift,
                                         long_causal=causal)
                    if fits:
                        assert why is None, (d, d_v, causal, softcap, shift, why)
                    elif softcap == 0.0 and shift >= 7:  # the 128-key tiles: refused
                        assert "out_dtype float32" in why, (d, causal, shift, why)
                    # (64-key tiles, softcap's or narrow descales', fit at d = 192)
                    assert (why is None) == (fp8_smem_bytes(cfg, d, d_v, 4) <= SMEM_LIMIT)


def test_masked_wide_heads_launch_one_cta_per_tile():
    """Masked padded calls at d = 192 / 256 (16-bit, no softcap) launch one CTA per tile, with
    no tile queue (measured faster than the persistent kernel there); unmasked calls, softcap,
    other head dims and an explicit override keep the persistent kernel."""
    pytest.importorskip("triton.experimental.gluon")
    import torch

    from flashattn.backends.sm90.config import MASKED_OVERRIDES
    from flashattn.backends.sm90.fwd import launch_args, uses_tile_queue

    assert set(MASKED_OVERRIDES) == {192, 256}
    for d in (64, 96, 128, 192, 256):
        wide = d in MASKED_OVERRIDES
        assert fwd_config(d, masked=True).persistent is not wide
        assert fwd_config(d, masked=False).persistent
        assert fwd_config(d, masked=True, packed=True).persistent  # packed calls: unchanged
    assert fwd_config(256, True, masked=True).persistent  # softcap: not measured, unchanged
    assert fwd_config(256, masked=True, persistent=True).persistent  # overrides come last
    b, s, h, d = 2, 1000, 4, 256
    q = torch.empty((b, s, h, d), dtype=torch.bfloat16)
    lse = torch.empty((b, h, s), dtype=torch.float32)
    cfg = fwd_config(d, masked=True)
    n_tiles = b * h * -(-s // cfg.block_m)
    assert not uses_tile_queue(cfg, window_right=0)
    _, constexprs, _, grid = launch_args(q, q, q, q, lse, cfg, softmax_scale=d ** -0.5,
                                         window_left=-1, window_right=0, softcap=0.0,
                                         num_sms=132)
    assert grid == n_tiles and not constexprs["DYNAMIC"] and constexprs["LONGEST_FIRST"]


def test_one_wave_calls_keep_the_static_stride():
    """A call of at most one tile per SM takes no tile queue (each CTA takes one tile either
    way; the queue would only add its counter to the host time); larger unmasked calls do."""
    pytest.importorskip("triton.experimental.gluon")
    from flashattn.backends.sm90 import bwd as _bwd
    from flashattn.backends.sm90 import fwd as _fwd
    from flashattn.backends.sm90.config import bwd_config

    cfg = fwd_config(128)
    static = _fwd._static_stride(cfg)
    assert static is _fwd._static_stride(cfg)  # cached: no dataclass copy per call
    assert not _fwd.uses_tile_queue(static, window_right=-1)
    assert _fwd.uses_tile_queue(static, window_right=0)  # masked calls keep the queue
    bcfg = bwd_config(128, masked=False)
    assert bcfg.dynamic and not _bwd._static_stride(bcfg).dynamic
    assert _bwd._static_stride(bcfg).persistent


def test_backward_dq_rows_reaches_the_kernel_through_the_dq_box():
    """BwdConfig.dq_rows (each consumer computes dQ for its half of the query rows, FA4's
    split) reaches the kernel as the dQ descriptor's box, [block_m / 2, d_pad] instead of
    [block_m, d_pad / 2], and is refused, naming the field, where a consumer's half would be
    under one wgmma's 64 rows, with the ordered (deterministic) dQ writer, or on the wide
    kernel."""
    import torch

    from flashattn.backends.sm90.bwd import dq_workspace, launch_args
    from flashattn.backends.sm90.config import BWD_CONFIGS, bwd_config
    from tools import aot_sm90 as aot

    q = torch.empty((1, 256, 2, 64), dtype=torch.bfloat16)
    lse = torch.empty((1, 2, 256), dtype=torch.float32)
    for flag, box in ((False, [128, 32]), (True, [64, 64])):
        cfg = bwd_config(64, masked=False, dq_rows=flag)
        assert cfg.block_m == 128
        args, _, _, _ = launch_args(q, q, q, q, lse, lse, dq_workspace(q, 256), q, q, cfg,
                                    softmax_scale=0.125, window_left=-1, window_right=-1,
                                    softcap=0.0)
        assert list(args[4].block_shape) == box
    for overrides in ({"dq_rows": True, "block_m": 64},
                      {"dq_rows": True, "deterministic": True}):
        with pytest.raises(ValueError, match="dq_rows"):
            aot.compile_bwd_variant(64, torch.bfloat16, overrides=overrides)
    with pytest.raises(ValueError, match="dq_rows"):
        aot.compile_bwd_variant(256, torch.bfloat16, overrides={"dq_rows": True, "block_m": 128})
    for d in BWD_CONFIGS:
        for masked in (False, True):
            assert bwd_config(d, masked=masked).dq_rows is (d == 64)


def test_backward_kv_views_per_block_is_on_at_d64_and_reaches_the_kernel():
    """BwdConfig.kv_views_per_block (K / V views rebuilt every query block) is on in every
    d = 64 config, whatever the mask, softcap, packing or determinism (measured 0.99-1.07x
    there, H100 2026-12-07), off at d = 96 / 128 (0.97-1.03x at d = 128), an explicit
    override wins, and it reaches bwd_kernel as the KV_PER_BLOCK constexpr (the wide kernel
    always rebuilds its views and takes no such flag)."""
    import torch

    from flashattn.backends.sm90 import bwd
    from flashattn.backends.sm90.config import BWD_CONFIGS, bwd_config

    for d in BWD_CONFIGS:
        for masked in (False, True):
            for extra in ({}, {"softcap": True}, {"short_seqs": True},
                          {"deterministic": True} if d in (64, 128) else {}):
                assert bwd_config(d, masked=masked, **extra).kv_views_per_block == (d == 64)
    assert not bwd_config(64, masked=True, kv_views_per_block=False).kv_views_per_block
    lse = torch.empty((1, 2, 256), dtype=torch.float32)
    for d, masked, overrides in ((128, False, {}), (128, True, {}), (64, False, {}),
                                 (128, True, {"deterministic": True})):
        q = torch.empty((1, 256, 2, d), dtype=torch.bfloat16)
        for flag in (False, True):
            cfg = bwd_config(d, masked=masked, kv_views_per_block=flag, **overrides)
            _, constexprs, _, _ = bwd.launch_args(
                q, q, q, q, lse, lse, bwd.dq_workspace(q, 256), q, q, cfg,
                softmax_scale=0.125, window_left=-1, window_right=0 if masked else -1,
                softcap=0.0)
            assert constexprs["KV_PER_BLOCK"] is flag
    wide = torch.empty((1, 256, 2, 256), dtype=torch.bfloat16)
    _, constexprs, _, _ = bwd.launch_args(
        wide, wide, wide, wide, lse, lse, bwd.dq_workspace(wide, 256), wide, wide,
        bwd_config(256, kv_views_per_block=True), softmax_scale=0.0625, window_left=-1,
        window_right=-1, softcap=0.0)
    assert "KV_PER_BLOCK" not in constexprs


def test_d64_backward_takes_128_query_rows_and_the_row_split_dq():
    """d = 64 calls without softcap (not deterministic), masked or not, run 128-row query
    blocks with the dQ GEMM split by rows (measured faster on the H100 there; with softcap
    128 rows spill 464 bytes); packed calls of short sequences, deterministic calls and other
    head dims keep 64 rows, and an explicit block_m or dq_rows wins."""
    from flashattn.backends.sm90.config import D64_BLOCK_M, bwd_config

    for masked in (False, True):
        cfg = bwd_config(64, masked=masked)
        assert cfg.block_m == D64_BLOCK_M == 128 and cfg.dq_rows
        assert cfg is bwd_config(64, masked=masked)  # prebuilt
        for other in (bwd_config(64, masked=masked, softcap=True),
                      bwd_config(64, masked=masked, short_seqs=True),
                      bwd_config(128, masked=masked)):
            assert other.block_m == 64 and not other.dq_rows
    assert bwd_config(64, short_seqs=True) is bwd_config(64, short_seqs=True)
    assert bwd_config(64, masked=False, deterministic=True).block_m == 64
    assert bwd_config(64, masked=False, block_m=64).block_m == 64
    assert not bwd_config(64, masked=False, block_m=64).dq_rows
    # without the row split (asked for, or a config that cannot take it) the sizes measured
    # before it: masked 64 rows, unmasked 128
    for overrides in ({"dq_rows": False}, {"pipeline": True}, {"dq_async": False}):
        for masked, rows in ((True, 64), (False, 128)):
            cfg = bwd_config(64, masked=masked, **overrides)
            assert cfg.block_m == rows and not cfg.dq_rows
    assert bwd_config(64, masked=False, kv_views_per_block=False).block_m == 128


def test_packed_backward_rows_follow_the_mean_sequence_length():
    """A packed call's config is a function of host values alone (total rows, sequence count):
    sequences averaging PACKED_D64_MIN_MEAN_ROWS rows or more take the 128-row d = 64 blocks;
    shorter ones (and empty batches) keep 64 rows; PackedBwdCall asks for that config, with
    softcap passed on (softcap keeps 64 rows)."""
    from flashattn.backends.sm90.bwd import PackedBwdCall
    from flashattn.backends.sm90.config import PACKED_D64_MIN_MEAN_ROWS as MEAN
    from flashattn.backends.sm90.config import short_packed_seqs

    assert short_packed_seqs(MEAN - 1, 1) and not short_packed_seqs(MEAN, 1)
    assert short_packed_seqs(4 * MEAN - 1, 4) and not short_packed_seqs(4 * MEAN, 4)
    assert short_packed_seqs(0, 0) and not short_packed_seqs(MEAN, 0)

    def call(total, n_seqs, softcap=0.0):
        q = torch.empty((total, 4, 64), dtype=torch.bfloat16)
        return PackedBwdCall(q, q, q, q, n_seqs, False, softmax_scale=0.125, window_left=-1,
                             window_right=0, softcap=softcap).cfg

    assert call(4 * MEAN, 4).block_m == 128 and call(4 * MEAN, 4).dq_rows
    assert call(4 * MEAN, 5).block_m == 64 and not call(4 * MEAN, 5).dq_rows
    assert call(4 * MEAN, 4, softcap=30.0).block_m == 64


def test_head_groups_switch_sets_the_tile_orders_group():
    """FwdConfig / BwdConfig.head_groups: 1, the longest-first orders walk groups of (batch,
    head) pairs sized by the L2 budget (descriptors.heads_per_group); 0, one group of every
    pair (a global longest-first order); 2 (the forward's default), the size within the budget
    that tile_order.modelled_group picks. The group size is a runtime argument of the kernels (the
    one after n_tiles in the forward, after n_bh_k in the backward), so the switch compiles no
    new variant; other values are refused."""
    from flashattn.backends.sm90 import bwd, fwd
    from flashattn.backends.sm90.config import bwd_config
    from flashattn.backends.sm90.descriptors import heads_per_group
    from flashattn.backends.sm90.tile_order import forward_level_costs, modelled_group

    b, s, h, d = 2, 8192, 8, 256
    q = torch.empty((b, s, h, d), dtype=torch.bfloat16)
    lse = torch.empty((b, h, s), dtype=torch.float32)
    budget = heads_per_group(b * h, 2 * s * d * 2)
    assert budget == 3  # this shape splits into groups by default
    cfg = fwd_config(d, masked=True)
    modelled = modelled_group(forward_level_costs(s, s, cfg.block_m, cfg.block_n, -1, 0),
                              b * h, budget, 132)
    assert modelled == 2  # d = 256 causal 8k: groups of 3 leave a tail, groups of 2 do not
    for mode, want in ((1, budget), (0, b * h), (2, modelled)):
        args, _, _, _ = fwd.launch_args(q, q, q, q, lse, fwd_config(d, masked=True,
                                                                    head_groups=mode),
                                        softmax_scale=0.0625, window_left=-1, window_right=0,
                                        softcap=0.0, num_sms=132)
        assert args[10] == b * h and args[13] == want  # n_bh, then the group size
    s = 32768  # Q and dO of 2 heads per group (storage never touched: torch.empty)
    q = torch.empty((b, s, h, 64), dtype=torch.bfloat16)
    lse = torch.empty((b, h, s), dtype=torch.float32)
    sizes = []
    for mode in (1, 0, 2):
        cfg = bwd_config(64, masked=True, longest_first=True, head_groups=mode)
        args, constexprs, _, _ = bwd.launch_args(
            q, q, q, q, lse, lse, bwd.dq_workspace(q, s), q, q, cfg, softmax_scale=0.125,
            window_left=-1, window_right=0, softcap=0.0)
        assert constexprs["LONGEST_FIRST"] and args[18] == b * h  # n_bh_k
        sizes.append(args[19])
    budget = heads_per_group(b * h, 2 * s * 64 * 2)
    assert sizes[:2] == [budget, b * h] and budget < b * h and 1 <= sizes[2] <= budget
    for bad in (-1, 3):
        with pytest.raises(ValueError, match="head_groups"):
            fwd_config(128, head_groups=bad)
        with pytest.raises(ValueError, match="head_groups"):
            bwd_config(128, head_groups=bad)


def test_max_group_heads_caps_the_tile_orders_group():
    """FwdConfig.max_group_heads: the forward's groups of (batch, head) pairs hold at most
    that many (a runtime argument: no new variant), dense and causal; 0 leaves the L2
    budget's size; negative values are refused."""
    from flashattn.backends.sm90 import fwd
    from flashattn.backends.sm90.descriptors import heads_per_group

    b, s, h, d = 2, 8192, 16, 128
    q = torch.empty((b, s, h, d), dtype=torch.bfloat16)
    lse = torch.empty((b, h, s), dtype=torch.float32)
    budget = heads_per_group(b * h, 2 * s * d * 2)
    assert budget == 6
    for right, cap, want in ((-1, 0, budget), (-1, 1, 1), (-1, 2, 2), (-1, 64, budget),
                             (0, 1, 1)):
        cfg = fwd_config(d, masked=right >= 0, max_group_heads=cap)
        args, _, _, _ = fwd.launch_args(q, q, q, q, lse, cfg, softmax_scale=0.0884,
                                        window_left=-1, window_right=right, softcap=0.0,
                                        num_sms=132)
        assert args[10] == b * h and args[13] == want, (right, cap)
    with pytest.raises(ValueError, match="max_group_heads"):
        fwd_config(d, max_group_heads=-1)
    # the default: one pair at a time for unmasked padded d = 128 calls only
    assert fwd_config(128).max_group_heads == 1
    assert fwd_config(128, masked=True).max_group_heads == 0
    assert fwd_config(128, packed=True).max_group_heads == 0
    assert fwd_config(128, softcap=True).max_group_heads == 0
    assert fwd_config(64).max_group_heads == fwd_config(256).max_group_heads == 0


def test_gqa_backward_walks_modelled_longest_first_groups():
    """Causal padded GQA backwards at d = 64 / 128 (config.GQA_LONGEST_FIRST) take the
    longest-first order in modelled groups (measured +6-10 % over head-major at 2k / 8k, GQA
    4:1, H100 2026-12-06); MHA, left windows, unmasked, deterministic and other head dims
    keep their order;
    an explicit longest_first / head_groups override wins. The launch tells GQA from the
    K / V heads."""
    from flashattn.backends.sm90 import bwd
    from flashattn.backends.sm90.config import GQA_LONGEST_FIRST, bwd_config

    for d in GQA_LONGEST_FIRST:
        cfg = bwd_config(d, masked=True, gqa_causal=True)
        assert cfg.longest_first and cfg.head_groups == 2
        assert not bwd_config(d, masked=True).longest_first
        assert not bwd_config(d, masked=False, gqa_causal=True).longest_first
        assert not bwd_config(d, masked=True, gqa_causal=True, deterministic=True).longest_first
        assert not bwd_config(d, masked=True, gqa_causal=True, longest_first=False).longest_first
        assert bwd_config(d, masked=True, gqa_causal=True, head_groups=1).head_groups == 1
    assert not bwd_config(256, masked=True, gqa_causal=True).longest_first

    q = torch.empty((2, 2048, 8, 64), dtype=torch.bfloat16)
    k = torch.empty((2, 2048, 2, 64), dtype=torch.bfloat16)
    assert bwd.padded_config(q, k, -1, 0, 0.0, False, {}).longest_first  # GQA 4:1, causal
    assert bwd.padded_config(q, k, -1, 64, 0.0, False, {}).longest_first  # right window only
    assert not bwd.padded_config(q, k, 128, 0, 0.0, False, {}).longest_first  # left window
    assert not bwd.padded_config(q, q, -1, 0, 0.0, False, {}).longest_first  # MHA
    assert not bwd.padded_config(q, k, -1, 0, 0.0, True, {}).longest_first  # deterministic


def test_tile_split_plan_and_the_host_sum():
    """BwdConfig.tile_split (on for causal GQA calls): bwd.split_blocks cuts key blocks only
    for a GQA group, even or odd, in the longest-first order of one CTA per tile (host values:
    on CPU the model sees 16 SMs);
    split_workspace's shape; add_split_parts writes part 0 + part 1, cast, into the cut keys'
    rows of dk / dv and nothing else."""
    from flashattn.backends.sm90 import bwd, bwd_postprocess
    from flashattn.backends.sm90.config import bwd_config

    # one KV head of a 4:1 group at 2k: 16 key tiles on 16 SMs, the first ones as long as
    # all the work of an SM's share (the model cuts all 16); at 4k (32 tiles) none
    q = torch.empty((1, 2048, 4, 128), dtype=torch.bfloat16)
    k4, k3 = (torch.empty((1, 2048, n, 128), dtype=torch.bfloat16) for n in (1, 1))
    long_q, long_k = torch.empty((1, 4096, 4, 128)), torch.empty((1, 4096, 1, 128))
    on = bwd.padded_config(q, k4, -1, 0, 0.0, False, {"tile_split": True})
    assert on.longest_first and on.tile_split
    split = bwd.split_blocks(on, q, k4, -1, 0)
    assert 0 < split <= 2048 // on.block_n
    assert bwd.split_blocks(on, long_q, long_k, -1, 0) == 0
    # on by default with the causal GQA rule's longest-first order; off when asked
    assert bwd.padded_config(q, k4, -1, 0, 0.0, False, {}) == on
    off = bwd.padded_config(q, k4, -1, 0, 0.0, False, {"tile_split": False})
    assert off.longest_first and bwd.split_blocks(off, q, k4, -1, 0) == 0
    assert not bwd.padded_config(q, k4, 100, 0, 0.0, False, {}).tile_split  # a left window
    assert bwd.split_blocks(on, q, q, -1, 0) == 0  # MHA: no group to cut
    # an odd group (3:1) cuts too, in parts of two heads and one
    assert 0 < bwd.split_blocks(on, q[:, :, :3], k3, -1, 0) <= 2048 // on.block_n
    persistent = bwd_config(128, masked=True, tile_split=True, longest_first=True,
                            persistent=True)
    assert bwd.split_blocks(persistent, q, k4, -1, 0) == 0
    assert tuple(bwd.split_workspace(k4, on, 3).shape) == (2, 2, 1, 3 * on.block_n, 1, 128)

    torch.manual_seed(0)
    ws = torch.randn((2, 2, 2, 256, 3, 64))
    # fewer keys than the cut rows (a partial last block), more
    for s_k, dtype in ((200, torch.bfloat16), (300, torch.bfloat16), (300, torch.float16)):
        dk, dv = (torch.full((2, s_k, 3, 64), 7.0, dtype=dtype) for _ in range(2))
        bwd_postprocess.add_split_parts(ws, dk, dv)
        rows = min(s_k, 256)
        # fp16 exactly; bf16 within one unit in the last place: the interpreter's float32 ->
        # bfloat16 cast may round differently from torch's (the GPU's cvt.rn matches torch)
        ulp = 2.0 ** -7 if dtype == torch.bfloat16 else 0.0
        for i, grad in enumerate((dk, dv)):
            want = (ws[i, 0, :, :rows] + ws[i, 1, :, :rows]).to(dtype)
            torch.testing.assert_close(grad[:, :rows], want, rtol=ulp, atol=0.0)
            assert bool((grad[:, rows:] == 7.0).all())
