"""Host side of the Hopper forward: TMA descriptors, tile-scheduler parameters, launch.

``flash_fwd_hopper`` has the backend signature of docs/internals.md; dispatch calls it only
for calls that ``support.unsupported`` accepts (fp16/bf16, d = d_v in {64, 96, 128, 192, 256},
no dropout / alibi / return_softmax, TMA-aligned strides, sm90).
"""
from __future__ import annotations

import functools
from dataclasses import replace
from typing import Any, Dict, List, NamedTuple, Optional, Tuple

import torch

from flashattn.backends.sm90.v_layout import (varlen_vt_positions, wgmma_ordered_vt,
                                     wgmma_ordered_vt_varlen)
from flashattn.backends.sm90.varlen_rows import clear_uncovered_rows
from flashattn.backends.sm90.config import FwdConfig, fp8_fwd_config, fp8_long_causal, fwd_config
from flashattn.params import Fp8Scales
from flashattn.backends.sm90.descriptors import LOG2E, heads_per_group, keys_major_desc, tensor_desc
from flashattn.backends.sm90.fwd_kernel import attn_fwd_kernel
from flashattn.backends.sm90.tile_order import forward_level_costs, head_group
from flashattn.runtime.device import sm_count
from flashattn.runtime.grid import cdiv
from flashattn.runtime.launch import LaunchPlans

class VarlenLayout(NamedTuple):
    """A packed call's sequences (the kernel's VARLEN mode): int32 (n_seqs + 1,) contiguous
    offsets of each sequence's query rows and keys, and the output O (total_q, h, d_v)
    contiguous (the rows a TMA store cannot take are stored through its pointer), and
    optionally the keys each sequence uses (FA3's ``seqused_k``)."""
    cu_seqlens_q: torch.Tensor
    cu_seqlens_k: torch.Tensor
    out: torch.Tensor
    seqused_k: Optional[torch.Tensor] = None  # int32 (n_seqs,): keys used per sequence


@functools.lru_cache(maxsize=64)
def _static_stride(cfg: FwdConfig) -> FwdConfig:
    """``cfg`` without the tile queue on unmasked calls: for a call of at most one tile per
    SM (one wave: every CTA takes exactly one tile), where the queue would only add its
    counter's allocation and zeroing to the call's host time."""
    return replace(cfg, queue_unmasked=False)


def _tile_counter(cfg: FwdConfig, window_right: int, lse: torch.Tensor,
                  varlen: bool = False) -> torch.Tensor:
    """The tile queue's int32 zero when the kernel uses one; else lse stands in (unused)."""
    if uses_tile_queue(cfg, window_right, varlen):
        return torch.zeros(1, dtype=torch.int32, device=lse.device)
    return lse


def uses_tile_queue(cfg: FwdConfig, window_right: int, varlen: bool = False) -> bool:
    """Whether the persistent kernel takes tiles from a global counter instead of a static
    round robin. Tiles of unequal cost (causal / masked calls, packed sequences of unequal
    lengths) need it; tiles of equal cost (unmasked calls, ``cfg.queue_unmasked``) need it as
    soon as some SMs are busy with other work when the kernel starts (an NCCL transfer of
    context parallelism): a CTA that starts late then takes fewer tiles, where the static
    stride makes the whole call wait for its full share (4x H100, 2026-11-28: the ring's
    forward 0.75 -> 0.83 of ideal at 32k tokens per GPU, 0.89 -> 0.95 at 128k; one GPU alone
    equal, benchmarks/NOTES.md). The queue's next index reaches the consumers through the
    producer warp, hence the warp-specialised condition."""
    return (cfg.dynamic and cfg.persistent and cfg.warp_specialized
            and (window_right >= 0 or varlen or cfg.queue_unmasked))


def launch_args(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, out: torch.Tensor,
                lse: torch.Tensor, cfg: FwdConfig, *, softmax_scale: float, window_left: int,
                window_right: int, softcap: float, num_sms: int,
                counter: Optional[torch.Tensor] = None, scales: Optional[Fp8Scales] = None,
                sink: Optional[torch.Tensor] = None, varlen: Optional[VarlenLayout] = None
                ) -> Tuple[List[Any], Dict[str, Any], Dict[str, Any], int]:
    """(positional args, constexpr kwargs, launch options, grid size) of attn_fwd_kernel.

    ``counter``: the tile queue's int32 zero (made here when None and the queue is used).
    ``varlen``: packed sequences; q, k, v, out are then (1, total, h, d) views and lse
    (h, total_q) (the kernel's VARLEN mode).

    Shared by the launch and the ahead-of-time compile (tools/aot_sm90.py): both build the same
    kernel variant.
    """
    batch, seqlen_q, n_heads, head_dim = q.shape
    _, seqlen_k, n_heads_k, _ = k.shape
    half_m = cfg.block_m // cfg.consumers  # rows per consumer warpgroup
    if varlen is None:
        n_m_blocks = cdiv(seqlen_q, cfg.block_m)
        n_bh = batch * n_heads
        n_tiles = n_bh * n_m_blocks
        pairs = n_bh  # (the pairs the tile order groups)
        group = heads_per_group(n_bh, 2 * seqlen_k * head_dim * q.element_size())  # K and V
        costs = (lambda: forward_level_costs(seqlen_q, seqlen_k, cfg.block_m,  # noqa: E731
                                             cfg.block_n, window_left, window_right))
    else:  # (the kernel's VARLEN scalars: n_bh the sequences, n_m_blocks the slots per head)
        n_bh = varlen.cu_seqlens_q.shape[0] - 1
        n_m_blocks = n_bh + seqlen_q // cfg.block_m
        n_tiles = n_heads * n_m_blocks
        # heads whose K / V the running tiles share, at the mean key length (the lengths
        # themselves live on the device)
        mean_k = seqlen_k // max(n_bh, 1)
        pairs = n_heads
        group = heads_per_group(n_heads, 2 * mean_k * head_dim * q.element_size())
        costs = None  # (the lengths are on the device: nothing to model)
    if cfg.max_group_heads:
        group = min(group, cfg.max_group_heads)
    if window_right >= 0:  # the longest-first order's groups (FwdConfig.head_groups)
        group = head_group(cfg.head_groups, pairs, group, costs, num_sms)
    has_softcap = softcap > 0.0
    dynamic = uses_tile_queue(cfg, window_right, varlen is not None)
    if counter is None:
        counter = _tile_counter(cfg, window_right, lse, varlen is not None)
    fp8 = scales is not None
    v_desc = keys_major_desc(v, cfg.block_n) if fp8 else tensor_desc(v, cfg.block_n)
    args = [
        tensor_desc(q, half_m), tensor_desc(k, cfg.block_n), v_desc,
        tensor_desc(out, half_m), lse,
        counter,
        seqlen_q, seqlen_k, n_heads, n_heads // n_heads_k, n_bh, n_m_blocks, n_tiles, group,
        int(window_left), int(window_right),
        float(softmax_scale * LOG2E),
        float(softmax_scale / softcap) if has_softcap else 0.0,
        float(softcap * LOG2E) if has_softcap else 0.0,
    ]
    if fp8:  # the descale tables and their geometry (None: a bf16 / fp16 variant)
        args += [scales.q_descale, scales.k_descale, scales.v_descale,
                 scales.q_descale.shape[2], scales.k_descale.shape[2],
                 min(scales.q_block_shift, 31), min(scales.kv_block_shift, 31), n_heads_k]
    else:
        args += [None] * 8
    args.append(sink)  # SINK_ARG: the learnable sinks (h,), or None
    if varlen is None:
        args += [None] * 6
    else:  # VARLEN_ARGS: the offsets and O's pointer, O's row stride and d_v, seqused_k
        d_v = varlen.out.shape[-1]
        args += [varlen.cu_seqlens_q, varlen.cu_seqlens_k, varlen.out, n_heads * d_v, d_v,
                 varlen.seqused_k]
    constexprs = dict(
        BLOCK_M=cfg.block_m, BLOCK_N=cfg.block_n, NUM_STAGES=cfg.num_stages,
        HAS_LEFT=window_left >= 0, HAS_RIGHT=window_right >= 0, HAS_SOFTCAP=has_softcap,
        LONGEST_FIRST=window_right >= 0, PINGPONG=int(cfg.pingpong),
        INTRA_OVERLAP=1 if cfg.intra_overlap else 0, SEPARATE_O=cfg.separate_o, DYNAMIC=dynamic,
        NO_WS=not cfg.warp_specialized,
        CONSUMER_REGS=cfg.consumer_regs, PRODUCER_REGS=cfg.producer_regs,
        CONSUMERS=cfg.consumers, THREAD_RELEASE=bool(cfg.thread_release),
        ROWSUM_MMA=bool(cfg.rowsum_mma),
        # (only when the shift is at least one warpgroup piece: other lengths keep the variant
        # without it, whose kernel is the one before BOTTOM_ALIGN existed)
        BOTTOM_ALIGN=(bool(cfg.bottom_align) and window_right >= 0 and varlen is None
                      and n_m_blocks * cfg.block_m - seqlen_q >= half_m),
        VARLEN=varlen is not None,
    )
    # without the producer warp the kernel has 8 warps: 240 registers each fit the file
    options = dict(num_warps=4, maxnreg=cfg.maxnreg if cfg.warp_specialized else 240)
    grid = min(num_sms, n_tiles) if cfg.persistent else n_tiles
    return args, constexprs, options, grid


def flash_fwd_hopper(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, softmax_scale: float,
                     causal: bool, window_left: int, window_right: int, softcap: float,
                     alibi_slopes: Optional[torch.Tensor] = None, dropout_p: float = 0.0,
                     philox_seed: int = 0, return_softmax: bool = False,
                     config_overrides: Optional[Dict[str, Any]] = None,
                     sink: Optional[torch.Tensor] = None):
    """Attention forward with the Gluon sm90 kernel.

    q (b, s_q, h, d), k (b, s_k, h_k, d), v (b, s_k, h_k, d_v); fp16/bf16, TMA-aligned
    strides; d, d_v in support.HEAD_DIMS. Returns out (b, s_q, h, d_v) in q's dtype, lse
    float32 (b, h, s_q) (natural log, -inf for rows that see no key), None.
    ``config_overrides``: FwdConfig fields (ablations, tuning). ``sink``: learnable sinks
    (h,) folded into the softmax denominator in the kernel's epilogue (out and lse are then
    those of attention with the sink; no extra pass).
    """
    if alibi_slopes is not None or dropout_p or return_softmax:
        raise ValueError("flash_fwd_hopper: alibi, dropout and return_softmax are not covered; "
                         "dispatch sends those calls to the portable kernels")
    batch, seqlen_q, n_heads, head_dim = q.shape
    head_dim_v = v.shape[3]
    cfg = fwd_config(head_dim, softcap > 0.0,
                     head_dim_v=head_dim_v if head_dim_v != head_dim else None,
                     masked=window_left >= 0 or window_right >= 0, **(config_overrides or {}))
    if (window_right < 0 and cfg.queue_unmasked
            and batch * n_heads * cdiv(seqlen_q, cfg.block_m) <= sm_count(q.device)):
        cfg = _static_stride(cfg)
    out = torch.empty((batch, seqlen_q, n_heads, head_dim_v), dtype=q.dtype, device=q.device)
    lse = torch.empty((batch, n_heads, seqlen_q), dtype=torch.float32, device=q.device)
    counter = _tile_counter(cfg, window_right, lse)
    # what the launch's arguments are made of apart from the tensors (out is contiguous: its
    # strides follow from q's shape)
    key = (q.shape, k.shape, v.shape, q.stride(), k.stride(), v.stride(), q.dtype, q.device,
           softmax_scale, window_left, window_right, softcap,
           tuple(sorted(config_overrides.items())) if config_overrides else None,
           None if sink is None else (sink.dtype, sink.stride()))

    def build():
        args, constexprs, options, grid = launch_args(
            q, k, v, out, lse, cfg, softmax_scale=softmax_scale, window_left=window_left,
            window_right=window_right, softcap=softcap, num_sms=sm_count(q.device),
            counter=counter, sink=sink)
        return attn_fwd_kernel, (grid,), args, {**constexprs, **options}

    if sink is None:
        _PLANS.launch(key, (q, k, v, out, lse, counter), build)
    else:
        _SINK_PLANS.launch(key, (q, k, v, out, lse, counter, sink), build)
    return out, lse, None


def flash_fwd_hopper_varlen(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                            cu_seqlens_q: torch.Tensor, cu_seqlens_k: torch.Tensor, *,
                            softmax_scale: float, causal: bool, window_left: int,
                            window_right: int, softcap: float,
                            seqused_k: Optional[torch.Tensor] = None,
                            config_overrides: Optional[Dict[str, Any]] = None,
                            sink: Optional[torch.Tensor] = None):
    """Packed variable-length attention forward with the Gluon sm90 kernel (VARLEN mode).

    q (total_q, h, d), k (total_k, h_k, d), v (total_k, h_k, d_v); fp16/bf16, TMA-aligned
    strides; d, d_v in support.HEAD_DIMS; cu_seqlens_q / cu_seqlens_k int32 (b + 1,): sequence
    i has query rows [cu_seqlens_q[i], cu_seqlens_q[i+1]) and keys [cu_seqlens_k[i],
    cu_seqlens_k[i+1]) (its first ``seqused_k[i]``, int32 (b,), when given); masks are local
    to the sequence (bottom-right aligned to the keys it uses). No device value
    is read on the host (the tile count follows from total_q and b; offsets are clamped to the
    tensors in the kernel). Returns out (total_q, h, d_v) in q's dtype (0 on rows outside
    every sequence), lse float32 (h, total_q) (-inf there and on rows that see no key), None:
    the portable varlen forward's contract, so either backward serves it. ``sink``: learnable
    sinks (h,) folded into the epilogue as in :func:`flash_fwd_hopper` (rows outside every
    sequence keep 0 / -inf).
    """
    call = PackedFwdCall(q, k, v, cu_seqlens_q.shape[0] - 1, seqused_k is not None,
                         softmax_scale=softmax_scale, window_left=window_left,
                         window_right=window_right, softcap=softcap,
                         config_overrides=config_overrides,
                         sink=None if sink is None else sink.dtype)
    out, lse = call(q, k, v, cu_seqlens_q, cu_seqlens_k, seqused_k, sink=sink)
    return out, lse, None


class PackedFp8(NamedTuple):
    """What an FP8 packed signature adds to :class:`PackedFwdCall`: the output dtype, the
    caller's bound on the key lengths (it sizes the V^T pass's grid), and the descale tables'
    shapes and block shifts (Fp8Scales)."""
    out_dtype: torch.dtype
    max_seqlen_k: int
    q_descale_shape: Tuple[int, ...]
    k_descale_shape: Tuple[int, ...]
    q_block_shift: int
    kv_block_shift: int


class PackedFwdCall:
    """A packed forward (:func:`flash_fwd_hopper_varlen`, or with ``fp8``
    :func:`flash_fwd_hopper_fp8_varlen`) for one call signature: what its launch is made of
    apart from the tensors (config, output shapes, the launch plan's key) found once, so a
    repeated signature (every layer of a packed training step, or a serving loop's, has the
    same one) costs the allocations, the clearing pass (and FP8's V^T pass) and one replayed
    launch (dispatch.VarlenRunner keeps one per signature).

    Built from a call's q (total_q, h, d), k, v, its number of sequences and whether it passes
    ``seqused_k``; called with tensors of the same shapes, strides and dtypes (and, FP8,
    descale tables of the recorded shapes; the plan checks the 16-byte alignment of the plain
    tensors itself)."""

    def __init__(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, n_seqs: int,
                 seqused: bool, *, softmax_scale: float, window_left: int, window_right: int,
                 softcap: float, config_overrides: Optional[Dict[str, Any]] = None,
                 fp8: Optional[PackedFp8] = None, sink: Optional[torch.dtype] = None) -> None:
        total_q, n_heads, head_dim = q.shape
        head_dim_v = v.shape[2]
        overrides = tuple(sorted(config_overrides.items())) if config_overrides else None
        if fp8 is None:
            self.cfg = fwd_config(head_dim, softcap > 0.0,
                                  head_dim_v=head_dim_v if head_dim_v != head_dim else None,
                                  masked=window_left >= 0 or window_right >= 0, packed=True,
                                  **(config_overrides or {}))
            self.out_dtype = q.dtype
            self.key = (q.shape, k.shape, v.shape, q.stride(), k.stride(), v.stride(), q.dtype,
                        q.device, n_seqs + 1, softmax_scale, window_left, window_right,
                        softcap, overrides, sink)
        else:
            self.cfg = fp8_fwd_config(head_dim, head_dim_v, softcap > 0.0,
                                      masked=window_left >= 0 or window_right >= 0,
                                      kv_block_keys=1 << fp8.kv_block_shift, long_causal=False,
                                      packed=True, **(config_overrides or {}))
            self.out_dtype = fp8.out_dtype
            # (V^T's shape: v_layout.wgmma_ordered_vt_varlen's view, fresh and contiguous)
            vt_shape = torch.Size((1, varlen_vt_positions(n_seqs, k.shape[0]), k.shape[1],
                                   head_dim_v))
            self.key = (q.shape, k.shape, vt_shape, q.stride(), k.stride(), fp8.out_dtype,
                        q.device, n_seqs + 1, softmax_scale, window_left, window_right,
                        softcap, fp8.q_descale_shape, fp8.k_descale_shape, fp8.q_block_shift,
                        fp8.kv_block_shift, overrides)
        self.fp8 = fp8
        self.out_shape = (total_q, n_heads, head_dim_v)
        self.lse_shape = (n_heads, total_q)
        self.device = q.device
        self.queue = uses_tile_queue(self.cfg, window_right, True)
        self.params = dict(softmax_scale=softmax_scale, window_left=window_left,
                           window_right=window_right, softcap=softcap)
        self.sink = sink
        self.plans = _PACKED_PLANS[(fp8 is not None, seqused, sink is not None)]
        self.plan = None  # the recorded launch, replayed directly on later calls

    @classmethod
    def fp8_call(cls, q8: torch.Tensor, k8: torch.Tensor, v8: torch.Tensor, n_seqs: int,
                 seqused: bool, max_seqlen_k: int, scales: Fp8Scales, out_dtype: torch.dtype,
                 **params: Any) -> "PackedFwdCall":
        """The FP8 signature's call (:func:`flash_fwd_hopper_fp8_varlen`), descale tables
        shaped as ``scales``'; ``params``: softmax_scale, window_left, window_right, softcap
        (config_overrides)."""
        fp8 = PackedFp8(out_dtype, max_seqlen_k, tuple(scales.q_descale.shape),
                        tuple(scales.k_descale.shape), scales.q_block_shift,
                        scales.kv_block_shift)
        return cls(q8, k8, v8, n_seqs, seqused, fp8=fp8, **params)

    def __call__(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                 cu_seqlens_q: torch.Tensor, cu_seqlens_k: torch.Tensor,
                 seqused_k: Optional[torch.Tensor] = None,
                 scales: Optional[Fp8Scales] = None, sink: Optional[torch.Tensor] = None
                 ) -> Tuple[torch.Tensor, torch.Tensor]:
        """(out (total_q, h, d_v), lse float32 (h, total_q)) of this call; ``scales``: the
        FP8 signature's descale tables (contiguous, of the recorded shapes); ``sink``: the
        learnable sinks (h,) of a signature made with their dtype."""
        if (sink is None) != (self.sink is None):
            raise ValueError("PackedFwdCall: sink must be given exactly when the call was made "
                             "with its dtype")
        device = self.device
        cu_seqlens_q, cu_seqlens_k = cu_seqlens_q.contiguous(), cu_seqlens_k.contiguous()
        if seqused_k is not None:
            seqused_k = seqused_k.contiguous()
        if self.fp8 is not None:  # (FP8 wgmma reads V^T: one pass, only the used keys)
            v = wgmma_ordered_vt_varlen(v, cu_seqlens_k, self.fp8.max_seqlen_k,
                                        self.cfg.block_n, seqused_k)
        out = torch.empty(self.out_shape, dtype=self.out_dtype, device=device)
        lse = torch.empty(self.lse_shape, dtype=torch.float32, device=device)
        counter = torch.empty(1, dtype=torch.int32, device=device) if self.queue else None
        # (rows of no sequence, past cu_seqlens_q[-1], are 0 / -inf: no tile writes them)
        clear_uncovered_rows(out, lse, cu_seqlens_q, counter)
        if counter is None:
            counter = lse  # (stands in: the kernel never reads it)
        # descriptor slots take the tensor they cover (only its address is read on a replay)
        tensors = (q, k, v, out, lse, counter)
        if scales is not None:
            tensors += (scales.q_descale, scales.k_descale, scales.v_descale)
        if sink is not None:
            sink = sink.contiguous()
            tensors += (sink,)
        tensors += (cu_seqlens_q, cu_seqlens_k, out)
        if seqused_k is not None:
            tensors += (seqused_k,)
        if self.plan is None or not self.plan.launch(*tensors):
            layout = VarlenLayout(cu_seqlens_q, cu_seqlens_k, out, seqused_k)
            self.plan = _launch_packed(self.plans, self.key, q, k, v, out, lse, counter,
                                       self.cfg, layout, scales, tensors, sink=sink,
                                       **self.params)
        return out, lse


def _launch_packed(plans: LaunchPlans, key: Any, q: torch.Tensor, k: torch.Tensor,
                   v: torch.Tensor, out: torch.Tensor, lse: torch.Tensor, counter: torch.Tensor,
                   cfg: FwdConfig, layout: VarlenLayout, scales: Optional[Fp8Scales],
                   tensors: Tuple[torch.Tensor, ...], sink: Optional[torch.Tensor] = None,
                   **params: Any):
    """The launch of a packed forward (16-bit, or FP8 with ``scales``) through ``plans``
    (_PACKED_PLANS[(FP8, seqused_k given)]): q (total_q, h, d), k (total_k, h_k, d), v
    (total_k, h_k, d_v) or the FP8 V^T view (1, s_total, h_k, d_v), out / lse / counter as
    PackedFwdCall makes them; ``key`` holds everything else the arguments are made of; ``tensors``
    the plans' slot tensors. ``params``: softmax_scale, window_left, window_right, softcap.
    Returns the launch plan (None: Triton's own launch path ran)."""
    q4, k4, out4 = (t.unsqueeze(0) for t in (q, k, out))
    v4 = v if v.dim() == 4 else v.unsqueeze(0)

    def build():
        args, constexprs, options, grid = launch_args(
            q4, k4, v4, out4, lse, cfg, num_sms=sm_count(q.device), counter=counter,
            scales=scales, sink=sink, varlen=layout, **params)
        return attn_fwd_kernel, (grid,), args, {**constexprs, **options}

    return plans.launch(key, tensors, build)


def flash_fwd_hopper_fp8(q8: torch.Tensor, k8: torch.Tensor, v8: torch.Tensor,
                         scales: Fp8Scales, *, softmax_scale: float, window_left: int,
                         window_right: int, softcap: float, out_dtype: torch.dtype,
                         config_overrides: Optional[Dict[str, Any]] = None,
                         v_in_wgmma_order: bool = False,
                         into: Optional[Tuple[torch.Tensor, torch.Tensor, torch.Tensor]] = None,
                         plan_out: Optional[list] = None):
    """FP8 attention forward with the Gluon sm90 kernel (e4m3 wgmma for both GEMMs).

    q8 (b, s_q, h, d), k8 (b, s_k, h_k, d) float8_e4m3fn, TMA-aligned; v8 (b, s_k, h_k, d_v)
    float8_e4m3fn in any layout (copied into V^T with its keys in wgmma order:
    sm90.v_layout.wgmma_ordered_vt, one Triton pass; FP8 wgmma needs V^T tiles), or already
    in that layout with ``v_in_wgmma_order`` (a (b, s_pad, h_k, d_v) view of it); ``scales``
    with q blocks of >= BLOCK_M / consumers rows and kv blocks of >= BLOCK_N keys
    (support.fp8_unsupported). Returns out (b, s_q, h, d_v) in ``out_dtype``, lse float32
    (b, h, s_q).

    ``into``: (out, lse, tile-queue counter) placed by the caller (:class:`Fp8FwdCall`; the
    counter an int32 zero, or any tensor when the kernel has no tile queue); ``plan_out`` gets
    the launch plan (None when Triton's own launch path ran).
    """
    batch, seqlen_q, n_heads, head_dim = q8.shape
    head_dim_v = v8.shape[3]
    cfg = fp8_fwd_config(head_dim, head_dim_v, softcap > 0.0,
                         masked=window_left >= 0 or window_right >= 0,
                         kv_block_keys=1 << scales.kv_block_shift,
                         long_causal=fp8_long_causal(window_left, window_right, k8.shape[1]),
                         **(config_overrides or {}))
    # V^T with its keys in wgmma order (sm90/v_layout.py): P's registers then serve
    # as the P·V operand without shuffles (fwd_kernel._p_operand)
    if not v_in_wgmma_order:
        v8 = wgmma_ordered_vt(v8)
    if into is None:
        out = torch.empty((batch, seqlen_q, n_heads, head_dim_v), dtype=out_dtype,
                          device=q8.device)
        lse = torch.empty((batch, n_heads, seqlen_q), dtype=torch.float32, device=q8.device)
        counter = _tile_counter(cfg, window_right, lse)
    else:
        out, lse, counter = into
    key = (q8.shape, k8.shape, v8.shape, q8.stride(), k8.stride(), v8.stride(), out_dtype,
           q8.device, softmax_scale, window_left, window_right, softcap,
           scales.q_descale.shape, scales.k_descale.shape, scales.q_block_shift,
           scales.kv_block_shift,
           tuple(sorted(config_overrides.items())) if config_overrides else None)

    def build():
        args, constexprs, options, grid = launch_args(
            q8, k8, v8, out, lse, cfg, softmax_scale=softmax_scale, window_left=window_left,
            window_right=window_right, softcap=softcap, num_sms=sm_count(q8.device),
            counter=counter, scales=scales)
        return attn_fwd_kernel, (grid,), args, {**constexprs, **options}

    plan = _FP8_PLANS.launch(key, (q8, k8, v8, out, lse, counter, scales.q_descale,
                                   scales.k_descale, scales.v_descale), build)
    if plan_out is not None:
        plan_out.append(plan)
    return out, lse


def flash_fwd_hopper_fp8_varlen(q8: torch.Tensor, k8: torch.Tensor, v8: torch.Tensor,
                                cu_seqlens_q: torch.Tensor, cu_seqlens_k: torch.Tensor,
                                max_seqlen_k: int, scales: Fp8Scales, *, softmax_scale: float,
                                window_left: int, window_right: int, softcap: float,
                                out_dtype: torch.dtype,
                                seqused_k: Optional[torch.Tensor] = None,
                                config_overrides: Optional[Dict[str, Any]] = None):
    """Packed variable-length FP8 forward with the Gluon sm90 kernel (VARLEN mode, e4m3 wgmma).

    q8 (total_q, h, d), k8 (total_k, h_k, d) float8_e4m3fn, TMA-aligned; v8 (total_k, h_k,
    d_v) float8_e4m3fn in any layout (copied into a packed V^T whose sequences start on whole
    wgmma key groups: v_layout.wgmma_ordered_vt_varlen, one pass); cu_seqlens as in
    :func:`flash_fwd_hopper_varlen` (``seqused_k`` too: the V^T pass copies only the used
    keys); ``scales`` with (b, h, 1) / (b, h_k, 1) descales, one per sequence and head (FA3's
    varlen convention, ops.fp8_varlen_fwd). Returns out (total_q, h,
    d_v) in ``out_dtype`` (0 on rows outside every sequence), lse float32 (h, total_q).
    """
    call = PackedFwdCall.fp8_call(q8, k8, v8, cu_seqlens_q.shape[0] - 1, seqused_k is not None,
                                  max_seqlen_k, scales, out_dtype, softmax_scale=softmax_scale,
                                  window_left=window_left, window_right=window_right,
                                  softcap=softcap, config_overrides=config_overrides)
    return call(q8, k8, v8, cu_seqlens_q, cu_seqlens_k, seqused_k, scales)


class Fp8FwdCall:
    """:func:`flash_fwd_hopper_fp8` over V in wgmma key order for one call signature, with its
    inputs, LSE and tile-queue counter in memory the caller places (the recorded FP8 calls,
    ``dispatch.Fp8Call`` and ``dispatch.Fp8DescaleCall``: the quantize pass's outputs, or V^T,
    live in a reused per-stream workspace). :meth:`record` launches on tensor views and keeps
    the launch plan; :meth:`replay` relaunches with addresses (no descriptor validation, no
    binder).

    Contract (the caller's key): a replayed call has inputs of the recorded shapes, strides
    and dtypes at 16-byte-aligned addresses, the same params, and a zeroed counter when
    :attr:`uses_counter`."""

    def __init__(self, head_dim: int, head_dim_v: int, *, softmax_scale: float,
                 window_left: int, window_right: int, softcap: float,
                 out_dtype: torch.dtype) -> None:
        self.kwargs = dict(softmax_scale=softmax_scale, window_left=window_left,
                           window_right=window_right, softcap=softcap, out_dtype=out_dtype)
        cfg = fp8_fwd_config(head_dim, head_dim_v, softcap > 0.0,
                             masked=window_left >= 0 or window_right >= 0)
        # whether the kernel takes its tiles from an int32 counter that starts at zero
        self.uses_counter = uses_tile_queue(cfg, window_right)
        self.plan = None

    def record(self, q8: torch.Tensor, k8: torch.Tensor, v8: torch.Tensor, scales: Fp8Scales,
               out: torch.Tensor, lse: torch.Tensor, counter: torch.Tensor) -> None:
        """Launch into out / lse (v8 in wgmma key order) and keep the plan."""
        recorded: list = []
        flash_fwd_hopper_fp8(q8, k8, v8, scales, **self.kwargs, v_in_wgmma_order=True,
                             into=(out, lse, counter), plan_out=recorded)
        self.plan = recorded[0]

    def replay(self, addresses: Tuple[int, ...]) -> bool:
        """The recorded launch with ``addresses`` = (q8, k8, v8, out, lse, counter, q_descale,
        k_descale, v_descale) (counter: any address when not :attr:`uses_counter`). False,
        with nothing launched, when there is no plan or it cannot replay now."""
        return self.plan is not None and self.plan.replay_addresses(addresses)


# Launch plans (runtime/launch.py) of earlier calls: a repeated call shape costs allocations +
# one replayed launch (launch_args' Python, descriptor validation and the binder measured 65 of
# the 124 us of a call on the H100 host, 2026-11-23). Slots: the q, k, v, out descriptors, lse
# and the tile-queue counter (lse stands in for the counter when the queue is static).
_PLANS = LaunchPlans(slots=(0, 1, 2, 3, 4, 5))
SINK_ARG = 27  # position of the sinks in launch_args' list
_SINK_PLANS = LaunchPlans(slots=(0, 1, 2, 3, 4, 5, SINK_ARG))
# FP8: the same six, then the three descale tables (after the 13 other scalar arguments)
_FP8_PLANS = LaunchPlans(slots=(0, 1, 2, 3, 4, 5, 19, 20, 21))
# packed calls (_launch_packed), by (FP8, seqused_k, sinks): the six, the descale tables
# (FP8), the sinks, the offsets and O's pointer, seqused_k (after O's row stride and d_v)
VARLEN_ARGS = SINK_ARG + 1
SEQUSED_ARG = VARLEN_ARGS + 5
_PACKED_PLANS = {
    (fp8, used, sink): LaunchPlans(slots=(0, 1, 2, 3, 4, 5) + ((19, 20, 21) if fp8 else ())
                                   + ((SINK_ARG,) if sink else ())
                                   + (VARLEN_ARGS, VARLEN_ARGS + 1, VARLEN_ARGS + 2)
                                   + ((SEQUSED_ARG,) if used else ()))
    for fp8 in (False, True) for used in (False, True) for sink in (False, True)}
