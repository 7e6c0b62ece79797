"""Tile configurations of the Hopper forward, per head dim (data, not code).

BLOCK_M query rows per CTA (``consumers`` warpgroups of BLOCK_M // consumers rows each: two, or
three at d = 64), BLOCK_N keys
per pipeline slot, NUM_STAGES slots. Shared memory per CTA (16-bit elements):
Q 2 * BLOCK_M * d + K/V 2 * 2 * NUM_STAGES * BLOCK_N * d bytes (+ O 2 * BLOCK_M * d when
SEPARATE_O; otherwise O leaves through Q's slot), within the 227 KB an sm90 CTA may use.
Registers per consumer thread ~ fp32 O (HALF_M * d / 128) + S twice (HALF_M * BLOCK_N / 128
for block j and j+1 under intra-warpgroup overlap) + P, within CONSUMER_REGS.
"""
from __future__ import annotations

import functools
from dataclasses import dataclass, replace
from typing import Any, Dict, Optional

SMEM_LIMIT = 227 * 1024


def _box_width(head_dim: int) -> int:
    """A head dim as a TMA box holds it: rounded up to a power of two."""
    return 1 << (head_dim - 1).bit_length()


@dataclass(frozen=True)
class FwdConfig:
    block_m: int
    block_n: int
    num_stages: int
    separate_o: bool
    consumer_regs: int = 240
    producer_regs: int = 24
    maxnreg: int = 168  # kernel cap: 3 warpgroups x 128 threads x 168 <= 64K registers
    # Ping-pong between the consumer warpgroups (fwd_kernel PINGPONG): 0 off, 1 (or True) the
    # token passes through mbarriers, 2 through hardware named barriers. 1 measured slower on
    # H100 with this kernel (d=128 causal 16k: 593 vs 645 TFLOP/s; d=64: -4..-6%); 2 equal or
    # 1-3% slower at d = 128 / 256 (H200, 2026-11-23: benchmarks/NOTES.md).
    pingpong: int = 0
    intra_overlap: bool = True
    persistent: bool = True
    dynamic: bool = True  # persistent tile queue for causal / windowed calls
    # the tile queue for unmasked calls too (equal-cost tiles): a CTA that starts late, its SM
    # busy with an NCCL transfer beside the call, then takes fewer tiles instead of delaying
    # the call (4x H100, 2026-11-28, benchmarks/NOTES.md). bf16 / fp16 only: the FP8 forward
    # keeps the static stride it was measured with.
    queue_unmasked: bool = True
    # Ablation only (benchmarks/NOTES.md): False drops the producer warp; consumer warpgroup 0
    # issues the TMA loads between its own GEMMs (static tile order).
    warp_specialized: bool = True
    # consumer warpgroups of BLOCK_M // consumers rows each: 2, or 3 (BLOCK_M = 192, small head
    # dims: each K/V block loaded serves 192 query rows; registers: 3 x 128 consumer threads
    # + the producer's warp, padded to a warpgroup, share the file: 16 warps, so maxnreg <= 128
    # and consumer_regs <= 160)
    consumers: int = 2
    # True: every consumer thread releases K / V slots by itself (fwd_kernel._release), with no
    # warpgroup bar.sync. Measured slower (H100, 2026-11-24, kernel alone at 16k, TFLOP/s with /
    # without): FP8 d128 826 / 853, d256 1110 / 1174, d64 562 / 602; bf16 d128 627 / 637,
    # causal 572 / 604 (benchmarks/NOTES.md): off, kept as a tested switch.
    thread_release: bool = False
    # True: the softmax's row sum l = P · ones on the tensor core (one more wgmma of N = 8 per
    # key block, fwd_kernel ROWSUM_MMA) instead of one FADD per score: the kernel is bound by
    # instruction issue at small head dims (benchmarks/NOTES.md, 2026-11-24). l then sums the
    # same rounded P (bf16 / e4m3) that P·V multiplies.
    rowsum_mma: bool = False
    # Masked calls (causal / a right window bound): tiles aligned to the end of the query
    # sequence, in whole warpgroup pieces (fwd_kernel BOTTOM_ALIGN), so the partial tile of a
    # seqlen_q that BLOCK_M does not divide is the first one, which sees the fewest keys,
    # instead of the last, which sees them all. Kernel alone, 16k tokens, d = 64 causal
    # (192-row tiles), TFLOP/s with / without: bf16 1k 255 / 233, 2k 343 / 332, 4k 424 / 413;
    # FP8 1k 303 / 275, 2k 434 / 414, 4k 527 / 503 (H100, 2026-11-24, benchmarks/NOTES.md).
    bottom_align: bool = True
    # the longest-first tile order (causal / windowed calls) walks groups of (batch, head)
    # pairs, longest tiles first inside each group (tiles.tile_coords). 1: groups whose K / V
    # fit the L2 budget (descriptors.heads_per_group); 0: one group of every pair (a global
    # longest-first order); 2: the size within that budget whose list schedule over the SMs
    # ends first (tile_order.modelled_group; padded calls, else as 1). The model
    # (probes/tile_order_model.py) puts 1 at 0.85-0.86 of ideal at d = 256 causal 2k / 8k and
    # 0.95-0.96 at d = 128, 0 and 2 at 0.96-1.00; it has no L2, which the groups are for.
    # Measured causal (H100, benchmarks/NOTES.md, 2026-12-06): 2 against 1, d 256 +7-9 % at
    # 2k / 8k, d 64 / 128 +1-3 %; 0 loses up to a third (d 128 2k 0.67): L2 misses.
    head_groups: int = 2
    # at most this many (batch, head) pairs per group of the tile order (tiles.tile_coords),
    # 0: as many as the L2 budget holds (descriptors.heads_per_group). Nsight Compute read 578
    # MB of DRAM traffic in our dense d = 128 8k forward against FA4's 265 MB (its grid walks
    # one head's query blocks at a time; H100, 2026-12-07, docs/fa4_comparison.md); 1 is
    # DENSE_OVERRIDES' d = 128 setting.
    max_group_heads: int = 0

    def smem_bytes(self, head_dim: int, elem: int = 2, head_dim_v: Optional[int] = None) -> int:
        """Shared memory of the Q / K / V (/ O) tiles, head dims padded to powers of two
        (TMA boxes); ``head_dim_v``: of V and O when it differs from Q and K's."""
        d = _box_width(head_dim)
        d_v = _box_width(head_dim_v or head_dim)
        q = self.block_m * d * elem
        kv = self.num_stages * self.block_n * (d + d_v) * elem
        o = self.block_m * d_v * elem if self.separate_o else 0
        return q + kv + o + 1024


# d = 64: three consumer warpgroups (BLOCK_M = 192) against two (128), H100 2026-11-23, TFLOP/s
# at 2k / 8k / 16k: dense 455 / 518 / 515 vs 418 / 474 / 461, causal 342 / 468 / 481 vs
# 353 / 438 / 447 (benchmarks/NOTES.md).
FWD_CONFIGS: Dict[int, FwdConfig] = {
    64: FwdConfig(block_m=192, block_n=128, num_stages=3, separate_o=True, consumers=3,
                  consumer_regs=160, maxnreg=128),
    96: FwdConfig(block_m=128, block_n=128, num_stages=2, separate_o=True),
    128: FwdConfig(block_m=128, block_n=128, num_stages=2, separate_o=True),
    192: FwdConfig(block_m=128, block_n=64, num_stages=2, separate_o=False),
    256: FwdConfig(block_m=128, block_n=64, num_stages=2, separate_o=False),
}


# Softcap's tanh needs registers: at d = 96/128 the 64 x 128 score tile spills, 64 x 64 fits;
# at d = 64 the three 160-register consumers spill (56 bytes), so softcap keeps two.
SOFTCAP_CONFIGS: Dict[int, FwdConfig] = {
    64: FwdConfig(block_m=128, block_n=128, num_stages=3, separate_o=True),
    96: FwdConfig(block_m=128, block_n=64, num_stages=3, separate_o=True),
    128: FwdConfig(block_m=128, block_n=64, num_stages=3, separate_o=True),
}


# FP8 (e4m3 Q, K, V^T, bf16 O): tiles of half the bytes. O has its own slot (Q's is fp8).
# H100, 16k tokens (benchmarks/NOTES.md, 2026-11-24), TFLOP/s non-causal / causal:
# d = 256 BLOCK_N 128: 1040 / 944 against 831-852 / 789-804 with 64 (it spills 120 / 24 bytes:
# O is 128 registers and two S tiles 128 more; without the intra-warpgroup overlap 24 / 0
# bytes but 1013 / 889); d = 128: 2 / 3 / 4 stages, ping-pong 1 / 2 and no overlap all
# measured equal or slower than this (706-726 non-causal); d = 64: two consumers 377 / 400
# against three 443 / 422.
# rowsum_mma (l = P · ones on the tensor core) at d <= 192. Kernel alone, 16k tokens, min of 3
# interleaved rounds, TFLOP/s with / without (H100, 2026-11-24; benchmarks/NOTES.md):
# d = 64 651 / 602 (causal 644 / 589), d = 96 684 / 649 (647 / 641), d = 128 893 / 851
# (841 / 848), d = 192 794 / 793 (755 / 734). d = 256 is slower with it (1124 / 1203, causal
# 1072 / 1118): there the GEMMs, not instruction issue, bound the kernel.
FP8_CONFIGS: Dict[int, FwdConfig] = {
    64: FwdConfig(block_m=192, block_n=128, num_stages=3, separate_o=True, consumers=3,
                  consumer_regs=160, maxnreg=128, rowsum_mma=True),
    96: FwdConfig(block_m=128, block_n=128, num_stages=3, separate_o=True, rowsum_mma=True),
    128: FwdConfig(block_m=128, block_n=128, num_stages=3, separate_o=True, rowsum_mma=True),
    # d = 192: 128-key blocks, 2 stages (226.5 KiB of shared memory; 184 / 112 bytes of
    # spills) against 64 x 3 stages, kernel alone, 16k tokens, min of 3 interleaved rounds,
    # TFLOP/s (H100, 2026-11-25): non-causal 16k 906 / 824, 4k 883 / 788; causal 16k 861 / 753,
    # 4k 734 / 681. Without the intra-warpgroup overlap: 892 / 839 / 799 / 706.
    192: FwdConfig(block_m=128, block_n=128, num_stages=2, separate_o=True, rowsum_mma=True),
    256: FwdConfig(block_m=128, block_n=128, num_stages=2, separate_o=True),
}
# (the static stride on unmasked calls, as measured: FwdConfig.queue_unmasked)
# head_groups=1: the modelled group sizes (FwdConfig.head_groups=2) were measured on the
# 16-bit forward only (2026-12-06); FP8's K / V take half the L2 budget's bytes per head
FP8_CONFIGS = {d: replace(cfg, queue_unmasked=False, head_groups=1)
               for d, cfg in FP8_CONFIGS.items()}

# Key blocks of 256 without the intra-warpgroup overlap (352 bytes of spills) for causal calls
# over >= FP8_LONG_CAUSAL_MIN_KEYS keys at d = 128, where the K / V descales cover >= 256 keys
# (a key block must not straddle two descales: FlashAttention-3's API, one descale per head,
# or fp8.quantize(block_n=256)). Kernel alone, min of 3 interleaved rounds, TFLOP/s with / the
# table's config (H100, 2026-11-25, two runs): causal 16k 941 / 843 and 933 / 837, 8k 848 /
# 791, 4k 750 / 734 and 750 / 737, 2k 593 / 628; non-causal 16k 861 / 913, 4k 787 / 841 (so
# dense calls keep 128-key blocks). With the overlap, 256-key blocks spill 432 bytes: 670 / 843.
FP8_LONG_CAUSAL: Dict[int, Dict[str, Any]] = {
    128: dict(block_n=256, num_stages=2, intra_overlap=False)}
FP8_LONG_CAUSAL_MIN_KEYS = 4096
# When the K / V descale blocks are shorter than a config's key block, the key block shrinks
# to theirs (never below FP8_MIN_BLOCK_N: support.fp8_unsupported) with this many stages.
FP8_MIN_BLOCK_N = 64
FP8_NARROW_STAGES = 3


# Unmasked calls (no causal mask, no window) at d = 256: without the intra-warpgroup overlap
# (one S tile live instead of two: 72 bytes of spills instead of 176). Kernel alone, 16k
# tokens, min of interleaved rounds, TFLOP/s without / with: 1104 / 1036 (2026-11-24), 1177 /
# 1144 (2026-11-24), 1165 / 1135 at 16k and 1110 / 1094 at 4k (2026-11-24). Masked calls keep
# the overlap, which hides the masked blocks' extra softmax work: causal 986 / 1011, 1047 /
# 1110, 1058 / 1092 (benchmarks/NOTES.md). d = 128 and 64 measured equal or slower without it.
FP8_UNMASKED_OVERRIDES: Dict[int, Dict[str, Any]] = {256: dict(intra_overlap=False)}
# Masked padded calls (causal or a window, not packed, no softcap) at d = 192 / 256: one CTA
# per tile instead of the persistent kernel, as for bf16 (MASKED_OVERRIDES). Tree A/Bs on the
# H100 (fp8_ab.py, 16k tokens, A / B / A / B): d = 256 (2026-12-06) causal 1.022 / 1.047 ms ->
# 0.945 / 0.969 (1.08-1.10x), the unmasked control 0.96 / 1.00x (noise: unchanged calls);
# d = 192 (2026-12-06, later) causal 1.243 / 1.247 -> 1.163 / 1.172 ms (1.06-1.07x), the
# unmasked control 1.03-1.04x (so ~+3 % beyond the run's drift).
FP8_MASKED_OVERRIDES: Dict[int, Dict[str, Any]] = {192: dict(persistent=False),
                                                   256: dict(persistent=False)}


@functools.lru_cache(maxsize=256)
def fp8_fwd_config(head_dim: int, head_dim_v: Optional[int] = None, softcap: bool = False,
                   masked: bool = False, *, kv_block_keys: Optional[int] = None,
                   long_causal: bool = False, packed: bool = False, **overrides) -> FwdConfig:
    """The FP8 forward's config, with overrides.

    Cached (FwdConfig is frozen): a packed FP8 call asks for it twice, in the coverage check
    and in the launch, and each answer costs up to three dataclass ``replace`` calls.

    FP8_CONFIGS by the larger head dim; softcap's tanh needs the registers of a 64-key block,
    as in bf16. ``masked``: a causal mask or a window, else FP8_UNMASKED_OVERRIDES apply (the
    tile sizes do not depend on it). ``kv_block_keys``: keys per K / V descale (None: any);
    a key block longer than that shrinks to it (>= FP8_MIN_BLOCK_N), and FP8_LONG_CAUSAL
    applies only where it covers the longer block. ``long_causal``: a causal mask (no left
    window) over >= FP8_LONG_CAUSAL_MIN_KEYS keys (:func:`fp8_long_causal`). ``packed``: a
    varlen call (FP8_MASKED_OVERRIDES apply to padded masked calls only)."""
    key = max(head_dim, head_dim_v or head_dim)
    cfg = FP8_CONFIGS[key]
    if softcap and key in SOFTCAP_CONFIGS and cfg.consumers == 3:
        cfg = replace(SOFTCAP_CONFIGS[key], separate_o=True, queue_unmasked=False,
                      head_groups=1)
    elif softcap:  # tanh's registers: 64-key blocks (d = 256 with 128 spills 112 bytes)
        cfg = replace(cfg, block_n=64)
    elif not masked and key in FP8_UNMASKED_OVERRIDES:
        cfg = replace(cfg, **FP8_UNMASKED_OVERRIDES[key])
    elif (masked and long_causal and key in FP8_LONG_CAUSAL and kv_block_keys is not None
          and kv_block_keys >= FP8_LONG_CAUSAL[key]["block_n"]):
        cfg = replace(cfg, **FP8_LONG_CAUSAL[key])
    if masked and not softcap and not packed and key in FP8_MASKED_OVERRIDES:
        cfg = replace(cfg, **FP8_MASKED_OVERRIDES[key])
    if kv_block_keys is not None and FP8_MIN_BLOCK_N <= kv_block_keys < cfg.block_n:
        cfg = replace(cfg, block_n=kv_block_keys, num_stages=FP8_NARROW_STAGES)
    if overrides:
        cfg = replace(cfg, **overrides)
        _check_max_group_heads(cfg, overrides)
        _check_head_groups(cfg, overrides)
    if not cfg.separate_o:
        raise ValueError("FP8 forward configs need separate_o=True")
    return cfg


def fp8_smem_bytes(cfg: FwdConfig, head_dim: int, head_dim_v: int, out_bytes: int) -> int:
    """Shared memory of the FP8 forward with ``cfg``: e4m3 Q and K / V^T tiles (head dims
    padded to powers of two), O's slot of ``out_bytes`` per element (2 for bf16 / fp16, 4 for
    out_dtype=float32), the row-sum GEMM's ones, barriers and the tile slot."""
    d, d_v = _box_width(head_dim), _box_width(head_dim_v)
    ones = cfg.consumers * 8 * cfg.block_n if cfg.rowsum_mma else 0
    return (cfg.block_m * d + cfg.num_stages * cfg.block_n * (d + d_v)
            + cfg.block_m * d_v * out_bytes + ones + 1024)


def fp8_long_causal(window_left: int, window_right: int, seqlen_k: int) -> bool:
    """Whether an FP8 call is FP8_LONG_CAUSAL's case: a causal mask (a right bound, no left
    one) over at least FP8_LONG_CAUSAL_MIN_KEYS keys."""
    return window_right >= 0 and window_left < 0 and seqlen_k >= FP8_LONG_CAUSAL_MIN_KEYS


# Masked calls (a causal mask or a window; padded tensors, not packed ones) at d = 192 / 256,
# 16-bit without softcap: one CTA per tile (the hardware's block scheduler hands out the tiles,
# longest first, as the queue would) instead of the persistent kernel. Same arithmetic (bitwise
# equal). Kernel alone, 16k tokens per call, min of 5 interleaved rounds, TFLOP/s persistent ->
# one CTA per tile (H100, 2026-12-06, benchmarks/NOTES.md): d = 256 causal 2k 484 -> 488, 4k
# 521 -> 549, 8k 546-553 -> 574-579, 16k 575-584 -> 658-664; d = 192 causal 4k 461 -> 468, 8k
# 460 -> 484, 16k 484 -> 507. Not taken where it measured slower or equal: unmasked d = 256
# (0.95-1.00x), causal d = 64 / 128 (0.95-1.00x).
MASKED_OVERRIDES: Dict[int, Dict[str, Any]] = {192: dict(persistent=False),
                                               256: dict(persistent=False)}

# Unmasked padded calls at d = 128, 16-bit without softcap: the tile order walks one (batch,
# head) pair's query blocks at a time (FwdConfig.max_group_heads 1, FA4's grid order) instead
# of groups of the L2 budget's size. Same arithmetic (bitwise equal). fwd_config_ab.py, 16k
# tokens, hidden 2048, variant / default TFLOP/s (H100, 2026-12-07, benchmarks/NOTES.md): d 128
# 2k / 8k / 16k 1.013 / 1.031 / 1.022 (3 rounds), 1.014 / 1.019 / 1.014 (5 rounds). Not taken:
# d 64 (0.996-1.038, mixed), d 256 (0.964-1.000), causal d 64 / 128 (0.948-0.985: the modelled
# longest-first groups).
DENSE_OVERRIDES: Dict[int, Dict[str, Any]] = {128: dict(max_group_heads=1)}


def fwd_config(head_dim: int, softcap: bool = False, head_dim_v: Optional[int] = None,
               masked: bool = False, packed: bool = False, **overrides) -> FwdConfig:
    """The config for ``head_dim`` (a key of FWD_CONFIGS), with overrides (ablations, tuning).

    ``head_dim_v`` (V / O) other than ``head_dim`` (Q / K), both keys of FWD_CONFIGS: the larger
    one's config, O in its own shared-memory slot when the padded widths differ (Q's slot has
    the other width). ``masked``: the call has a causal mask or a window; ``packed``: a varlen
    call (fwd_kernel's VARLEN mode). MASKED_OVERRIDES apply to masked padded calls,
    DENSE_OVERRIDES to unmasked ones (both before ``overrides``, without softcap), as
    fp8_fwd_config reads the same two flags."""
    key = max(head_dim, head_dim_v or head_dim)
    cfg = SOFTCAP_CONFIGS.get(key, FWD_CONFIGS[key]) if softcap else FWD_CONFIGS[key]
    if masked and not softcap and not packed and key in MASKED_OVERRIDES:
        cfg = replace(cfg, **MASKED_OVERRIDES[key])
    if not masked and not softcap and not packed and key in DENSE_OVERRIDES:
        cfg = replace(cfg, **DENSE_OVERRIDES[key])
    if (head_dim_v is not None and _box_width(head_dim_v) != _box_width(head_dim)
            and not cfg.separate_o):
        cfg = replace(cfg, separate_o=True)
    if not overrides:
        return cfg
    cfg = replace(cfg, **overrides)
    if cfg.consumers == 3 and (cfg.pingpong or not cfg.warp_specialized):
        raise ValueError(f"FwdConfig {overrides}: pingpong and warp_specialized=False need two "
                         "consumer warpgroups (pass consumers=2, block_m=128, consumer_regs=240, "
                         "maxnreg=168)")
    if cfg.consumers not in (2, 3) or cfg.block_m % cfg.consumers:
        raise ValueError(f"FwdConfig {overrides}: consumers must be 2 or 3 and divide block_m")
    _check_max_group_heads(cfg, overrides)
    _check_head_groups(cfg, overrides)
    return cfg


def _check_head_groups(cfg: Any, overrides) -> None:
    """FwdConfig / BwdConfig.head_groups: 0, 1 or 2 (see FwdConfig)."""
    if cfg.head_groups not in (0, 1, 2):
        raise ValueError(f"{type(cfg).__name__} {overrides}: head_groups must be 0 (one "
                         "group), 1 (the L2 budget) or 2 (the modelled size within it)")


def _check_max_group_heads(cfg: FwdConfig, overrides) -> None:
    """FwdConfig.max_group_heads: a cap (>= 1) or 0 (none)."""
    if cfg.max_group_heads < 0:
        raise ValueError(f"FwdConfig {overrides}: max_group_heads must be >= 0 (0: no cap)")


# ---------------------------------------------------------------------------------------------
# Backward (bwd_kernel.py): one CTA per BLOCK_N keys; two consumer warpgroups of BLOCK_N // 2
# keys each keep fp32 dK and dV (2 * (BLOCK_N // 2) * d / 128 registers per thread), so the
# head dims whose dK + dV + S^T + dP^T + dQ half fit in 240 registers: d <= 128. d = 192 / 256
# run bwd_wide_kernel.py (BLOCK_N = 64, the consumers split dK / dV by head-dim columns).
# Shared memory: K, V (2 * BLOCK_N * d) + Q, dO rings (2 * NUM_STAGES * BLOCK_M * d) + dS^T
# (2 slots * BLOCK_N * BLOCK_M), 16-bit elements, + fp32 dQ staging (BLOCK_M * d): 193.5 KiB
# at d = 128.
# ---------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class BwdConfig:
    block_m: int = 64
    block_n: int = 128
    num_stages: int = 2
    consumer_regs: int = 240
    producer_regs: int = 24
    maxnreg: int = 168
    # dQ into the fp32 workspace by TMA reduce-add (staged through shared memory) instead of
    # fp32 atomics from registers
    dq_tma: bool = True
    # dq_tma only: stage dQ in a per-consumer shared buffer and let the reduce run
    # asynchronously (waited for at the next block) instead of waiting for it at once
    dq_async: bool = True
    # issue the next query block's S^T / dP^T GEMMs before this block's dQ reduction
    pipeline: bool = False
    # program order: key blocks ascending across groups of KV heads sized to keep their Q / dO
    # in L2 (tiles.key_block_coords), instead of one head's key blocks after another. Off:
    # measured equal or slower (H100, 2026-11-23: -4% at d = 128 causal 16k, -8% dense 2k).
    longest_first: bool = False
    # longest_first only: the size of its groups of (batch, KV head) pairs, as
    # FwdConfig.head_groups (1: Q / dO within the L2 budget; 0: one group, key block 0 of
    # every head first, then key block 1, ...; 2: the modelled size within the budget)
    head_groups: int = 1
    # a grid of at most one CTA per SM taking key tiles in turn: the next tile's K / V (and its
    # first Q / dO blocks) load while the consumers still write the previous dK / dV. Needs
    # pipeline=False. bwd_config turns it on for unmasked calls at d = 64 / 128 (measured there).
    persistent: bool = False
    # persistent only: CTAs take tiles from a global atomic queue (the producer warp draws a
    # ticket and publishes the index) instead of a static stride, for tiles of unequal cost
    # (causal). Off: measured slower than one CTA per tile on causal calls (H200, 2026-11-23,
    # d = 128 2k / 8k / 16k: 368 / 462 / 492 vs 386 / 488 / 530 TFLOP/s; d = 64 -2..-4%);
    # bwd_config turns it on for unmasked persistent calls (equal-cost tiles: no loss there,
    # and robust to SMs held by other work, e.g. NCCL beside a context-parallel ring).
    dynamic: bool = False
    # dQ added in descending key-block order, tiles handed out key-block major (bitwise
    # repeatable: deterministic=True). Needs persistent, dq_tma + dq_async, no pipeline, and
    # no left window (the host checks); bwd_config turns on persistent (and dynamic for
    # masked calls) with it.
    deterministic: bool = False
    # deterministic only: the tile order (tiles.key_block_coords DESCENDING): 1 key-block
    # major across heads, 2 head major (bwd_config picks per mask)
    det_order: int = 1
    # d <= 128 with block_m >= 128 (bwd_kernel.py), dq_tma + dq_async, not deterministic, no
    # pipeline: each consumer computes dQ for its half of the query rows over every column
    # (m64 n d_pad, A = its rows of dS from shared memory, B = all of K), FA4's split, instead
    # of half the columns over every row (twice the wgmmas at n d_pad / 2, each consumer
    # reading all of dS). Exact: the same products, summed in the same key order. bwd_config
    # turns it on for padded d = 64 calls (with 128-row blocks; measured 1.02-1.10x).
    dq_rows: bool = False
    # d <= 128 (bwd_kernel.py): the K / V views of the wgmmas rebuilt every query block through
    # a run-time index that is always 0, as bwd_wide_kernel always does (d = 192 / 256), so that
    # the compiler does not hoist every K-step descriptor of K and V out of the block loop
    # into vector registers (where they spill and come back through LDL -> R2UR before each
    # GEMM: Nsight Compute, H100 2026-12-07). Exact: the same GEMMs on the same addresses.
    # sm_90 AOT (Triton 3.6): spills d 64 128 -> 72 bytes, d 128 causal 40 -> 0, dense
    # 88 -> 0; R2UR 72 -> 25 (d 64). Measured (H100, 2026-12-07, bwd_config_ab.py) 0.99-1.07x
    # at d = 64, on there (BWD_CONFIGS); 0.97-1.03x at d = 128, left off.
    kv_views_per_block: bool = False
    # longest_first, one CTA per tile (not persistent, not deterministic), padded calls with
    # a GQA group (d <= 128, bwd_kernel.py): the first key blocks of every (batch, KV
    # head), as many as tile_order.split_key_blocks models worth it, run as two tiles over
    # half the group's query heads each (an odd group: ceil / floor halves); their fp32 partial dK / dV go to a workspace that
    # the host adds in a fixed order (bwd_postprocess.add_split_parts). Under a causal mask
    # those are the longest tiles: with GQA a KV head's tile visits every query head's
    # blocks, and the last long tiles end the call alone (model: d 128 4:1 causal 8k 0.81 of
    # ideal, cut 0.97).
    # bwd_config turns it on with the longest-first order of causal GQA calls
    # (GQA_LONGEST_FIRST; measured 1.03-1.31x where the model cuts).
    tile_split: bool = False

    def smem_bytes(self, head_dim: int, elem: int = 2) -> int:
        head_dim = _box_width(head_dim)
        kv = 2 * self.block_n * head_dim * elem
        ring = 2 * self.num_stages * self.block_m * head_dim * elem
        ds = 2 * self.block_n * self.block_m * elem
        dq = self.block_m * head_dim * 4 if self.dq_tma else 0  # 2 consumers x fp32 half
        return kv + ring + ds + dq + 1024


# Measured on H100 (hopper_probe --mode bwd, 16k tokens per call): d = 64 with BLOCK_M = 128 was
# +8% at s = 2k..8k dense, -4% at 16k and equal causal, and spills 112 bytes: kept at 64. On the
# H200 with the persistent tile queue (2026-11-28, bwd_config_ab.py, 3 interleaved rounds): +2.6-
# 3.0 % unmasked at 2k / 8k / 16k, 0.995-1.011 causal, 152 bytes spilled (464 with softcap):
# taken for unmasked calls. With the dQ GEMM split by rows (dq_rows, H100, 2026-12-06, 3
# rounds, 2k / 8k / 16k): unmasked 1.015-1.041 (MHA) and 1.063-1.091 (GQA 4:1) over 128 rows
# without it; causal 1.063-1.101 (MHA) and 1.047-1.069 (GQA) over the 64-row blocks. bwd_config
# takes both for d = 64 calls without softcap, masked or not (not deterministic; packed calls
# of short sequences keep 64 rows: PACKED_D64_MIN_MEAN_ROWS).
BWD_CONFIGS: Dict[int, BwdConfig] = {
    # K / V views rebuilt per query block at d = 64 (kv_views_per_block: 0.99-1.07x, H100
    # 2026-12-07; d = 128 0.97-1.03x, left off there)
    64: BwdConfig(num_stages=2, kv_views_per_block=True),
    96: BwdConfig(num_stages=2),
    128: BwdConfig(num_stages=2),
    # bwd_wide_kernel.py: 64 keys per CTA, the consumers split dK / dV by columns; pipelining
    # the next block's S^T / dP^T under the dQ^T staging measured +1-4% at d = 256 (2k-16k)
    192: BwdConfig(block_m=64, block_n=64, num_stages=2, pipeline=True),
    256: BwdConfig(block_m=64, block_n=64, num_stages=2, pipeline=True),
}


# Head dims whose unmasked backward runs persistent (measured at both; d = 96 spills 328 bytes
# with the loop, d = 192 / 256 run bwd_wide_kernel, which has no persistent schedule)
PERSISTENT_BWD_HEAD_DIMS = (64, 128)


def ordered_dq_unsupported(head_dim: int, window_left: int, softcap: float) -> Optional[str]:
    """Why a deterministic=True backward cannot take the ordered dQ (None when it can); the
    one rule for dispatch (support.backward_unsupported) and the launch (bwd.launch_args).

    The turn waits need the persistent schedule (PERSISTENT_BWD_HEAD_DIMS) and every key tile
    from 0 up to the last one that reaches a query block visiting it (no left window);
    softcap's tanh on top of the turn logic spilled 368 bytes at d = 128 (2026-11-23)."""
    if head_dim not in PERSISTENT_BWD_HEAD_DIMS:
        return f"head dim {head_dim} (ordered dQ: {PERSISTENT_BWD_HEAD_DIMS})"
    if window_left >= 0:
        return "a left window (ordered dQ)"
    if softcap > 0.0:
        return "softcap (ordered dQ)"
    return None


def bwd_config(head_dim: int, masked: bool = True, deterministic: bool = False,
               softcap: bool = False, short_seqs: bool = False, gqa_causal: bool = False,
               **overrides) -> BwdConfig:
    """The backward config for ``head_dim`` (a key of BWD_CONFIGS), with overrides.

    ``deterministic``: dQ in descending key-block order (``BwdConfig.deterministic``), on the
    persistent schedule, static (unmasked) or the ticket queue (masked), both of which hand
    out tiles in order (the turn waits are deadlock-free only so). Head dims in
    PERSISTENT_BWD_HEAD_DIMS only; head-major tiles unmasked, key-block major masked.

    ``gqa_causal``: a padded causal call (a right window, no left one) with fewer KV heads
    than query heads (GQA_LONGEST_FIRST: the longest-first order in modelled groups).

    ``masked``: the call has a causal or sliding-window mask. Unmasked calls at d = 64 / 128
    run the persistent schedule, where every key tile costs the same. d = 64 calls without
    ``softcap`` run 128-row query blocks with the dQ GEMM split by rows (D64_BLOCK_M,
    ``BwdConfig.dq_rows``), except ``short_seqs``: a packed call (bwd_kernel's VARLEN mode)
    whose sequences average fewer than PACKED_D64_MIN_MEAN_ROWS query rows
    (:func:`short_packed_seqs`), which keeps 64-row blocks. Measured on H100
    (hopper_probe --mode bwd, 2026-11-23), persistent / one CTA per tile: dense 2k d = 128
    490 / 475, d = 64 387 / 370; 8k and 16k within +-1%. Causal: 284 / 361 at 2k and
    329 / 541 at 16k (d = 128): the static tile stride lets CTAs drift apart in work, so
    concurrent CTAs no longer share one head's Q / dO in L2.
    """
    if not overrides:  # the per-call path: no dict to sort, no dataclass to rebuild
        cfg = _BWD_DEFAULTS.get((head_dim, bool(masked), bool(deterministic), bool(softcap),
                                 bool(short_seqs), bool(gqa_causal)))
        if cfg is not None:
            return cfg
    if deterministic:
        overrides = {"deterministic": True, **overrides}
    return _bwd_config(head_dim, masked, overrides, softcap, short_seqs, gqa_causal)


# Causal padded GQA backwards at these head dims walk the longest-first order (key block 0 of
# a group of KV heads first) in the group size whose modelled schedule ends first
# (BwdConfig.longest_first, head_groups=2) instead of head-major. A KV head's tile visits the
# query blocks of all its query heads, so with GQA there are few, long tiles and head-major
# leaves a tail (model: d 64 4:1 causal 2k / 8k 0.88 / 0.90 of ideal, modelled groups 0.97 /
# 1.00). H100, 2026-12-06 (bwd_config_ab.py, 16k tokens, hidden 2048, GQA 4:1, two runs of
# 3 and 5 interleaved rounds, dK / dV bitwise equal): d 64 causal 2k / 8k / 16k 1.08-1.09 /
# 1.10 / 0.99-1.02, d 128 1.06 / 0.99-1.00 / 1.00-1.02. MHA stays head-major: 0.99-1.03
# there (the model's +3-6 % at d 128 did not show; presumably L2, which head-major favours).
# With a GQA group the longest key tiles are cut in two by query heads where
# tile_order.split_key_blocks models a gain (BwdConfig.tile_split). H100, 2026-12-07
# (bwd_config_ab.py, 3 interleaved rounds, causal 2k / 4k / 8k), cut / whole: d 128 8:1
# 1.31 / 1.31 / 1.31, 4:1 (no cut at 2k) 1.03 / 1.10; d 64 8:1 1.09 / 1.16 / 1.16, 4:1 no cut;
# odd groups (hidden 3584) d 128 7:1 2k / 8k 1.17 / 1.09, d 64 7:1 8k 1.04.
GQA_LONGEST_FIRST = (64, 128)


# query rows per block of the d = 64 backward without softcap, with the dQ GEMM split by rows
# (see BWD_CONFIGS; deterministic calls and packed calls of short sequences keep 64 rows)
D64_BLOCK_M = 128

# Packed d = 64 calls take D64_BLOCK_M rows (with the row split) when their sequences average
# at least this many query rows. H100, 2026-12-06 (varlen_ab.py --mode bwd --d 64: 16k
# tokens, h 32, lengths uniform in [mean / 4, 7 mean / 4]; 3 interleaved rounds; dK / dV
# bitwise equal), 128 rows + row split / 64 rows, non-causal and causal: mean 512 0.97 /
# 0.93, 1024 1.01 / 0.98, 2048 1.05 / 1.05, 4096 1.06 / 1.06, 8192 1.07 / 1.07. Short
# sequences lose on their last, partly empty query block (a 300-row sequence computes 384
# rows in 128-row blocks, 320 in 64-row ones) and, causal, on the diagonal.
PACKED_D64_MIN_MEAN_ROWS = 1536


def short_packed_seqs(total_q: int, n_seqs: int) -> bool:
    """Whether a packed call of ``total_q`` query rows in ``n_seqs`` sequences has sequences
    shorter than PACKED_D64_MIN_MEAN_ROWS on average (bwd_config's ``short_seqs``; host
    values only, so the config is a function of the call's signature)."""
    return total_q < PACKED_D64_MIN_MEAN_ROWS * max(n_seqs, 1)


def _bwd_config(head_dim: int, masked: bool, overrides: Dict[str, Any],
                softcap: bool = False, short_seqs: bool = False,
                gqa_causal: bool = False) -> BwdConfig:
    cfg = replace(BWD_CONFIGS[head_dim], **overrides) if overrides else BWD_CONFIGS[head_dim]
    if (gqa_causal and masked and head_dim in GQA_LONGEST_FIRST and not cfg.deterministic
            and not cfg.persistent and "longest_first" not in overrides):
        cfg = replace(cfg, longest_first=True,
                      head_groups=cfg.head_groups if "head_groups" in overrides else 2,
                      tile_split=cfg.tile_split if "tile_split" in overrides else True)
    _check_head_groups(cfg, overrides)
    if (head_dim == 64 and not softcap and not short_seqs and not cfg.deterministic
            and "block_m" not in overrides):
        # the row split where the config can take it (the async TMA reduce, no pipeline);
        # without it masked calls keep 64 rows and unmasked ones 128, as measured before it
        rows = (cfg.dq_rows if "dq_rows" in overrides
                else cfg.dq_tma and cfg.dq_async and not cfg.pipeline)
        if rows or not masked:
            cfg = replace(cfg, block_m=D64_BLOCK_M, dq_rows=rows)
    if (not masked and "persistent" not in overrides and head_dim in PERSISTENT_BWD_HEAD_DIMS
            and not cfg.pipeline):
        # with the tile queue: equal-cost tiles too, so that CTAs which start late (SMs held by
        # an NCCL transfer beside the call) take fewer tiles instead of delaying the call
        # (4x H100, 2026-11-28: unmasked 128k x 64k blocks 485 -> 549 TFLOP/s, and the ring's
        # backward with them, benchmarks/NOTES.md)
        cfg = replace(cfg, persistent=True,
                      dynamic=cfg.dynamic if "dynamic" in overrides else True)
    if cfg.deterministic:
        if head_dim not in PERSISTENT_BWD_HEAD_DIMS:
            raise ValueError(f"bwd_config: deterministic=True covers head dims "
                             f"{PERSISTENT_BWD_HEAD_DIMS}, not {head_dim}")
        # head-major on unmasked calls (each head's key tiles start together and pass their
        # turns down the chain one block apart), key-block major across heads on masked ones
        # (H100, 2026-11-23: dense 16k 498 vs 474 TFLOP/s, 2k 364 vs 245; causal 16k 96 vs
        # 303: one head's 128 key tiles at once serialise on the diagonal's counters)
        cfg = replace(cfg, persistent=True, pipeline=False,
                      dynamic=cfg.dynamic if "dynamic" in overrides else masked,
                      det_order=(cfg.det_order if "det_order" in overrides
                                 else 1 if masked else 2))
    return cfg


# bwd_config without overrides, built once (dataclasses.replace costs ~4 us per call)
_BWD_DEFAULTS = {(d, m, False, c, short, g): _bwd_config(d, m, {}, c, short, g)
                 for d in BWD_CONFIGS for m in (False, True) for c in (False, True)
                 for short in (False, True) for g in (False, True)}
_BWD_DEFAULTS.update({(d, m, True, c, False, g): _bwd_config(d, m, {"deterministic": True}, c)
                      for d in PERSISTENT_BWD_HEAD_DIMS for m in (False, True)
                      for c in (False, True) for g in (False, True)})
