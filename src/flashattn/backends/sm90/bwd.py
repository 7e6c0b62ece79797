"""Host side of the Hopper backward: delta preprocess, TMA descriptors, launch of
bwd_kernel.py (d <= 128) or bwd_wide_kernel.py (d = 192 / 256), dQ out of the workspace.

``flash_bwd_hopper`` has the backend signature of docs/internals.md; dispatch calls it only
for calls that ``support.backward_unsupported`` accepts (fp16/bf16, d = d_v in BWD head dims,
no dropout / alibi, TMA-aligned strides, sm90; ``deterministic=True`` at d = 128 without a
mask or softcap). The kernel itself runs deterministic=True at d = 64 / 128 without a left
window or softcap (tests and benchmarks call it so).
"""
from __future__ import annotations

import functools
from dataclasses import replace
from typing import Any, Dict, List, Optional, Tuple

import torch
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.nvidia.hopper import TensorDescriptor

from flashattn.backends.sm90.bwd_postprocess import (DQT_SEQ_ALIGN, add_split_parts,
                                            dq_from_packed_workspace, dq_from_workspace,
                                            packed_dq_t_columns)
from flashattn.backends.sm90.bwd_preprocess import row_stats
from flashattn.backends.sm90.config import (BwdConfig, bwd_config, ordered_dq_unsupported,
                                            short_packed_seqs)
from flashattn.backends.sm90.descriptors import (LOG2E, heads_per_group, nvmma_layout, padded_head_dim,
                                       tensor_desc)
from flashattn.backends.sm90.support import tma_ok
from flashattn.backends.sm90.tile_order import backward_level_costs, head_group, split_key_blocks
from flashattn.backends.sm90.varlen_rows import clear_uncovered_keys
from flashattn.runtime.device import sm_count
from flashattn.runtime.grid import cdiv
from flashattn.runtime.launch import LaunchPlans

# dQ accumulates by TMA reduce-add in no fixed order. deterministic=True fixes the order
# (BwdConfig.deterministic: key tiles take turns per query block, through a dQ writer warp) at
# d = 64 / 128 without a left window or softcap; dispatch uses it where it measured faster than
# the portable backward (support.py).


def _tma_ready(t: torch.Tensor) -> torch.Tensor:
    """t itself when TMA can read it (16-byte aligned base and strides, unit last stride),
    else a contiguous copy (dout from autograd can be an expanded, stride-0 view; a fresh
    copy, not ``contiguous()``, which returns a contiguous but misaligned view as it is)."""
    return t if tma_ok(t) else t.clone(memory_format=torch.contiguous_format)


def _tma_ready_strides(t: torch.Tensor) -> Tuple[int, ...]:
    """The strides of ``_tma_ready(t)``, without copying: t's own, or a contiguous tensor's."""
    if tma_ok(t):
        return t.stride()
    strides, step = [], 1
    for n in reversed(t.shape):
        strides.append(step)
        step *= n
    return tuple(reversed(strides))


def is_wide(head_dim: int) -> bool:
    """Head dims whose backward runs bwd_wide_kernel (D_PAD = 256: dK / dV split by columns)."""
    return padded_head_dim(head_dim) > 128


def dq_workspace(q: torch.Tensor, seqlen_q_pad: int) -> torch.Tensor:
    """The fp32 buffer the kernel adds dQ into, uninitialised (``row_stats`` zeroes it):
    (b, h, s_q_pad, d_pad), or transposed (b, h, d_pad, s_q_pad) for the wide kernel."""
    batch, _, n_heads, head_dim = q.shape
    d_pad = padded_head_dim(head_dim)
    shape = ((batch, n_heads, d_pad, seqlen_q_pad) if is_wide(head_dim)
             else (batch, n_heads, seqlen_q_pad, d_pad))
    return torch.empty(shape, dtype=torch.float32, device=q.device)


def _dq_desc(dq_acc: torch.Tensor, block_m: int, wide: bool,
             rows_split: bool = False) -> TensorDescriptor:
    """2-D descriptor over the fp32 dQ workspace seen as rows of its last dim:
    (b * h * s_q_pad, d_pad) with box [block_m, d_pad // 2] (one consumer's column half of a
    query block), or [block_m // 2, d_pad] with ``rows_split`` (``BwdConfig.dq_rows``: one
    consumer's row half), or for the wide kernel (b * h * d_pad, s_q_pad) with box
    [64, block_m // 2] (one dQ^T piece). The kernel reads which split it runs off the box."""
    rows = dq_acc.shape[0] * dq_acc.shape[1] * dq_acc.shape[2]
    flat = dq_acc.view(rows, dq_acc.shape[3])
    if wide:
        block = [64, block_m // 2]
    elif rows_split:
        block = [block_m // 2, dq_acc.shape[3]]
    else:
        block = [block_m, dq_acc.shape[3] // 2]
    layout = nvmma_layout(tuple(block), gl.float32)
    return TensorDescriptor(flat, list(flat.shape), list(flat.stride()), block, layout)


def bwd_kernel_for(head_dim: int):
    """The Gluon backward kernel that runs ``head_dim``."""
    if is_wide(head_dim):
        from flashattn.backends.sm90.bwd_wide_kernel import attn_bwd_wide_kernel
        return attn_bwd_wide_kernel
    from flashattn.backends.sm90.bwd_kernel import attn_bwd_kernel
    return attn_bwd_kernel


def _l2_group_budget(n_bh_k: int, seqlen_q: int, head_dim: int, elem: int,
                     group_size: int) -> int:
    """The longest-first order's group bound: KV heads whose Q and dO (all query heads of the
    GQA group, ``seqlen_q`` rows of ``elem`` bytes) fit L2 together."""
    return heads_per_group(n_bh_k, 2 * seqlen_q * padded_head_dim(head_dim) * elem * group_size)


def split_blocks(cfg: BwdConfig, q: torch.Tensor, k: torch.Tensor, window_left: int,
                 window_right: int) -> int:
    """Key blocks per (batch, KV head) that a padded call cuts in two (BwdConfig.tile_split:
    tile_order.split_key_blocks' model), 0 when it cuts none: only the longest-first order
    of one CTA per tile, at d <= 128, with a GQA group the model cuts.
    Host values only (shapes and the SM count), cached per call shape: this runs on every
    call."""
    if not cfg.tile_split:
        return 0
    return _split_plan(cfg, tuple(q.shape), tuple(k.shape), q.element_size(), window_left,
                       window_right, sm_count(k.device))[0]


@functools.lru_cache(maxsize=256)
def _split_plan(cfg: BwdConfig, q_shape: Tuple[int, ...], k_shape: Tuple[int, ...],
                elem: int, window_left: int, window_right: int, n_sms: int
                ) -> Tuple[int, int]:
    """(key blocks cut, longest-first group size) of one call shape (q / k shapes, q's
    element size): :func:`split_blocks`' count, and the group the launch walks with it."""
    batch, seqlen_q, n_heads, head_dim = q_shape
    _, seqlen_k, n_heads_k, _ = k_shape
    group_size = n_heads // n_heads_k
    n_bh_k = batch * n_heads_k
    if (not cfg.longest_first or cfg.persistent or cfg.deterministic or cfg.pipeline
            or is_wide(head_dim)):
        return 0, 0
    budget = _l2_group_budget(n_bh_k, seqlen_q, head_dim, elem, group_size)
    return split_key_blocks(
        backward_level_costs(seqlen_q, seqlen_k, cfg.block_m, cfg.block_n, window_left,
                             window_right),
        group_size, n_bh_k, budget, n_sms, padded_head_dim(head_dim) / 64)


def split_workspace(k: torch.Tensor, cfg: BwdConfig, split: int) -> torch.Tensor:
    """The fp32 partial dK / dV of the cut key blocks, uninitialised (the kernel writes every
    element): (2, 2, b, split * block_n, h_k, d), [0, part] dK * softmax_scale, [1, part] dV."""
    batch, _, n_heads_k, head_dim = k.shape
    return torch.empty((2, 2, batch, split * cfg.block_n, n_heads_k, head_dim),
                       dtype=torch.float32, device=k.device)


def _n_tiles(cfg: BwdConfig, k: torch.Tensor) -> int:
    """Key tiles of the call: (batch, KV head, key block)."""
    batch, seqlen_k, n_heads_k, _ = k.shape
    return cdiv(seqlen_k, cfg.block_n) * batch * n_heads_k


def _grid_size(cfg: BwdConfig, k: torch.Tensor) -> int:
    """CTAs of the 1-D backward grid (b * h_k on a second axis would stop at its 65535 limit):
    one per key tile, or with ``cfg.persistent`` at most one per SM."""
    n_tiles = _n_tiles(cfg, k)
    return min(n_tiles, sm_count(k.device)) if cfg.persistent else n_tiles


@functools.lru_cache(maxsize=64)
def _static_stride(cfg: BwdConfig) -> BwdConfig:
    """``cfg`` without the tile queue, for an unmasked call of at most one key tile per SM (one
    wave: the queue would only add its counter's allocation to the call's host time)."""
    return replace(cfg, dynamic=False)


def dq_turn_starts(seqlen_q_pad: int, seqlen_q: int, seqlen_k: int, window_right: int,
                   block_m: int, block_n: int, device=None) -> torch.Tensor:
    """Where each query block's dQ turn counter starts (deterministic backward): int64
    (seqlen_q_pad // block_m,), -(the highest key block whose tile visits the query block).

    The key tiles add in descending order and tile n's turn comes when the counter reads -n,
    so the start must count exactly the tiles that visit the block: a miscount hangs the
    kernel. It follows bwd_kernel.query_block_range (block-granular: the query block's last
    row unclipped by s_q): with a right window the tile at n_start reaches query block j iff
    n_start <= j * block_m + block_m - 1 + (s_k - s_q) + window_right, and without a left
    window every lower key block visits it too. Blocks no tile visits get any value.
    """
    last = cdiv(seqlen_k, block_n) - 1
    n_blocks = seqlen_q_pad // block_m
    if window_right < 0:
        return torch.full((n_blocks,), -last, dtype=torch.int64, device=device)
    reach = (torch.arange(n_blocks, device=device) * block_m
             + (block_m - 1 + seqlen_k - seqlen_q + window_right))
    return -torch.clamp(torch.div(reach, block_n, rounding_mode="floor"), max=last)


def _tile_counter(cfg: BwdConfig, lse2: torch.Tensor, k: torch.Tensor, seqlen_q: int,
                  window_right: int) -> torch.Tensor:
    """The tile queue when the kernel uses one (persistent + dynamic): int32 zeros (1 + grid,),
    the queue's ticket counter, then each CTA's current tile (the producer warp's message to
    its consumers); with ``cfg.deterministic`` followed by the dQ turn counters, one per
    (batch, head, query block) (lse2 is (b, h, s_q_pad)), each at dq_turn_starts. Else lse2
    stands in (the kernel never reads it). Built on the device (no host copy: the call stays
    capturable in a CUDA graph)."""
    if not (cfg.persistent and cfg.dynamic) and not cfg.deterministic:
        return lse2
    head = 1 + _grid_size(cfg, k)
    if not cfg.deterministic:
        return torch.zeros(head, dtype=torch.int32, device=lse2.device)
    n_bh, seqlen_q_pad = lse2.shape[0] * lse2.shape[1], lse2.shape[2]
    counter = torch.empty(head + n_bh * (seqlen_q_pad // cfg.block_m), dtype=torch.int32,
                          device=lse2.device)
    counter[:head].zero_()
    counter[head:].view(n_bh, -1).copy_(  # (b * h, query block)
        dq_turn_starts(seqlen_q_pad, seqlen_q, k.shape[1], window_right, cfg.block_m,
                       cfg.block_n, device=lse2.device).view(1, -1))
    return counter


def launch_args(dout: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                lse2: torch.Tensor, delta: torch.Tensor, dq_acc: torch.Tensor, dk: torch.Tensor,
                dv: torch.Tensor, cfg: BwdConfig, *, softmax_scale: float, window_left: int,
                window_right: int, softcap: float, counter: Optional[torch.Tensor] = None,
                cu_seqlens: Optional[Tuple[torch.Tensor, ...]] = None,
                split_ws: Optional[torch.Tensor] = None
                ) -> Tuple[List[Any], Dict[str, Any], Dict[str, Any], Tuple[int, int]]:
    """(positional args, constexpr kwargs, launch options, grid) of bwd_kernel_for(d).

    Shared by the launch and the ahead-of-time compile (tools/aot_sm90.py). lse2 / delta float32
    (b, h, s_q_pad) (bwd_preprocess.row_stats); dq_acc: dq_workspace, zeroed by row_stats;
    dk, dv (b, s_k, h_k, d) contiguous; counter: _tile_counter(cfg, lse2, k, s_q,
    window_right) (made here if None). ``cu_seqlens``: (cu_seqlens_q, cu_seqlens_k[,
    seqused_k]) int32 of a packed call (the kernels' VARLEN mode, one CTA per key-block slot):
    q, k, v, dout, dk, dv are then (1, total, h, d) views. ``split_ws``: split_workspace
    of a call that cuts key blocks (split_blocks > 0; its rows give how many), else None.
    """
    batch, seqlen_q, n_heads, head_dim = q.shape
    _, seqlen_k, n_heads_k, _ = k.shape
    has_softcap = softcap > 0.0
    wide = is_wide(head_dim)
    group_size = n_heads // n_heads_k
    if cu_seqlens is None:
        n_key_blocks = cdiv(seqlen_k, cfg.block_n)
        n_bh_k = batch * n_heads_k
        grid = (_grid_size(cfg, k),)
        l2_seqlen_q = seqlen_q
        varlen_args = [None, None, 0, None]
    else:  # key-block slots per KV head (tiles.varlen_slot), one CTA each
        n_seqs = cu_seqlens[0].shape[0] - 1
        n_key_blocks = n_seqs + seqlen_k // cfg.block_n
        n_bh_k = n_heads_k
        grid = (n_key_blocks * n_heads_k,)
        l2_seqlen_q = seqlen_q // max(n_seqs, 1)  # (the mean sequence's Q / dO)
        varlen_args = [cu_seqlens[0], cu_seqlens[1], n_seqs,
                       cu_seqlens[2] if len(cu_seqlens) > 2 else None]
    if counter is None:
        counter = _tile_counter(cfg, lse2, k, seqlen_q, window_right)
    split = 0 if split_ws is None else split_ws.shape[3] // cfg.block_n
    budget = _l2_group_budget(n_bh_k, l2_seqlen_q, head_dim, q.element_size(), group_size)
    if split:
        if (wide or cu_seqlens is not None or cfg.persistent or cfg.deterministic
                or cfg.pipeline or not cfg.longest_first or group_size < 2):
            raise ValueError("a split backward (BwdConfig.tile_split) runs padded calls at "
                             "d <= 128 with a GQA group, one CTA per tile in the "
                             "longest-first order")
        grid = ((n_key_blocks + split) * n_bh_k,)
        # the group size modelled with the cut tiles (split_blocks' cached plan)
        group = _split_plan(cfg, tuple(q.shape), tuple(k.shape), q.element_size(),
                            window_left, window_right, sm_count(k.device))[1]
    else:
        group = head_group(cfg.head_groups, n_bh_k, budget,
                           None if cu_seqlens is not None else lambda: backward_level_costs(
                               seqlen_q, seqlen_k, cfg.block_m, cfg.block_n, window_left,
                               window_right),
                           sm_count(k.device))
    args = [
        tensor_desc(q, cfg.block_m), tensor_desc(k, cfg.block_n), tensor_desc(v, cfg.block_n),
        tensor_desc(dout, cfg.block_m), _dq_desc(dq_acc, cfg.block_m, wide, cfg.dq_rows),
        lse2, delta, dq_acc,
        dk, dv, counter, seqlen_q, seqlen_k, n_heads, n_heads_k, group_size,
        dq_acc.shape[3] if wide else dq_acc.shape[2],
        n_key_blocks, n_bh_k, group,
        int(window_left), int(window_right),
        float(softmax_scale * LOG2E), float(softmax_scale),
        float(softmax_scale / softcap) if has_softcap else 0.0,
        float(softcap * LOG2E) if has_softcap else 0.0,
    ] + varlen_args
    if not wide:  # the cut key blocks and their workspace (any tensor when none: unread)
        args += [split, counter if split_ws is None else split_ws]
    constexprs = dict(
        BLOCK_M=cfg.block_m, NUM_STAGES=cfg.num_stages, HEAD_DIM=head_dim,
        HAS_LEFT=window_left >= 0, HAS_RIGHT=window_right >= 0, HAS_SOFTCAP=has_softcap,
        CONSUMER_REGS=cfg.consumer_regs, PRODUCER_REGS=cfg.producer_regs,
        LONGEST_FIRST=cfg.longest_first,
    )
    if cfg.dynamic and not cfg.persistent:
        raise ValueError("BwdConfig: dynamic=True (the tile queue) needs persistent=True")
    if cfg.deterministic:
        why = ordered_dq_unsupported(head_dim, window_left, softcap)
        if why is None and (cfg.pipeline or not (cfg.persistent and cfg.dq_tma and cfg.dq_async)):
            why = "pipeline=True, or persistent / dq_tma / dq_async off"
        if why is not None:
            raise ValueError(f"BwdConfig: deterministic=True with {why}")
    if wide:
        if cfg.dq_rows:
            raise ValueError("bwd_wide_kernel has one dQ split (dq_rows=False)")
        if cfg.persistent:
            raise ValueError("bwd_wide_kernel has no persistent schedule (persistent=False)")
        if not (cfg.dq_tma and cfg.dq_async):
            raise ValueError("bwd_wide_kernel adds dQ one way: dq_tma=True, dq_async=True")
        constexprs.update(PIPELINE=cfg.pipeline, VARLEN=cu_seqlens is not None,
                          DQ_SEQ_ALIGN=DQT_SEQ_ALIGN)
    else:
        if cfg.persistent and cfg.pipeline:
            raise ValueError("BwdConfig: persistent=True needs pipeline=False")
        if cfg.dq_rows and (cfg.block_m < 128 or cfg.pipeline or cfg.deterministic
                            or not (cfg.dq_tma and cfg.dq_async)):
            raise ValueError("BwdConfig: dq_rows=True needs block_m >= 128 (a wgmma is 64 rows "
                             "per consumer), dq_tma + dq_async, no pipeline, not deterministic")
        constexprs.update(DQ_TMA=cfg.dq_tma, PIPELINE=cfg.pipeline,
                          DQ_ASYNC=cfg.dq_tma and cfg.dq_async, PERSISTENT=cfg.persistent,
                          DYNAMIC=cfg.dynamic,
                          DETERMINISTIC=cfg.det_order if cfg.deterministic else 0,
                          VARLEN=cu_seqlens is not None, SPLIT=split > 0,
                          KV_PER_BLOCK=cfg.kv_views_per_block)
    # (bwd_wide_kernel's pipeline guards an empty tile; bwd_kernel's issues its first block
    # unconditionally)
    if cu_seqlens is not None and (cfg.persistent or cfg.deterministic
                                   or (cfg.pipeline and not wide)):
        raise ValueError("the varlen backward runs one CTA per tile (persistent and "
                         "deterministic off; pipeline off at d <= 128)")
    options = dict(num_warps=4, maxnreg=cfg.maxnreg)
    return args, constexprs, options, grid


def padded_config(q: torch.Tensor, k: torch.Tensor, window_left: int, window_right: int,
                  softcap: float, deterministic: bool, overrides: Dict[str, Any]) -> BwdConfig:
    """The BwdConfig of a padded call: q (b, s_q, h, d), k (b, s_k, h_k, d), any dtype, on
    any device (nothing is read but shapes, and the SM count for unmasked calls):
    config.bwd_config with the call's mask, softcap and GQA (h_k < h: gqa_causal without a
    left window, the measured case), then the static tile
    stride where a dynamic queue would have no more tiles than SMs."""
    masked = window_left >= 0 or window_right >= 0
    cfg = bwd_config(q.shape[3], masked=masked, deterministic=deterministic,
                     softcap=softcap > 0.0,
                     gqa_causal=k.shape[2] < q.shape[2] and window_left < 0, **overrides)
    if (cfg.dynamic and not masked and not cfg.deterministic and "dynamic" not in overrides
            and _n_tiles(cfg, k) <= sm_count(k.device)):
        cfg = _static_stride(cfg)
    return cfg


def flash_bwd_hopper(dout: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                     out: torch.Tensor, lse: torch.Tensor, *, softmax_scale: float, causal: bool,
                     window_left: int, window_right: int, softcap: float,
                     alibi_slopes: Optional[torch.Tensor] = None, dropout_p: float = 0.0,
                     philox_seed: int = 0, deterministic: bool = False,
                     config_overrides: Optional[Dict[str, Any]] = None):
    """Attention backward with the Gluon sm90 kernel.

    dout/out (b, s_q, h, d), q (b, s_q, h, d), k/v (b, s_k, h_k, d); fp16/bf16, TMA-aligned
    q/k/v; lse float32 (b, h, s_q) natural log (-inf: row sees no key). Returns dq, dk, dv with
    the shapes and dtype of q, k, v (dk/dv summed over the query heads of a GQA group).
    ``config_overrides``: BwdConfig fields (ablations, tuning). ``deterministic``: dq bitwise
    repeatable (d = 64 / 128, no left window, no softcap).
    """
    if alibi_slopes is not None or dropout_p:
        raise ValueError("flash_bwd_hopper: alibi and dropout are not covered; dispatch sends "
                         "those calls to the portable kernels")
    batch, seqlen_q, n_heads, head_dim = q.shape
    overrides = dict(config_overrides or {})
    deterministic = bool(overrides.pop("deterministic", False)) or deterministic
    cfg = padded_config(q, k, window_left, window_right, softcap, deterministic, overrides)
    dout = _tma_ready(dout)
    if out.stride(-1) != 1:
        out = out.contiguous()
    seqlen_q_pad = cdiv(seqlen_q, cfg.block_m) * cfg.block_m
    dq_acc = dq_workspace(q, seqlen_q_pad)
    lse2, delta = row_stats(out, dout, lse.contiguous(), seqlen_q_pad, dq_acc,
                            transposed=is_wide(head_dim))
    dk = torch.empty(k.shape, dtype=k.dtype, device=k.device)
    dv = torch.empty(v.shape, dtype=v.dtype, device=v.device)
    counter = _tile_counter(cfg, lse2, k, seqlen_q, window_right)
    split = split_blocks(cfg, q, k, window_left, window_right)
    split_ws = split_workspace(k, cfg, split) if split else None
    # what the launch's arguments are made of apart from the tensors (lse2, delta, dq_acc, dk,
    # dv are made here: their strides follow from the shapes)
    key = (q.shape, k.shape, q.stride(), k.stride(), v.stride(), dout.stride(), q.dtype,
           q.device, softmax_scale, window_left, window_right, softcap, deterministic,
           tuple(sorted(config_overrides.items())) if config_overrides else None, split)

    def build():
        args, constexprs, options, grid = launch_args(
            dout, q, k, v, lse2, delta, dq_acc, dk, dv, cfg, softmax_scale=softmax_scale,
            window_left=window_left, window_right=window_right, softcap=softcap, counter=counter,
            split_ws=split_ws)
        return bwd_kernel_for(head_dim), grid, args, {**constexprs, **options}

    tensors = (q, k, v, dout, dq_acc, lse2, delta, dq_acc, dk, dv, counter)
    if split:
        _SPLIT_PLANS.launch(key, tensors + (split_ws,), build)
        add_split_parts(split_ws, dk, dv)
    else:
        _PLANS.launch(key, tensors, build)
    dq = dq_from_workspace(dq_acc, q, transposed=is_wide(head_dim))
    return dq, dk, dv


def flash_bwd_hopper_varlen(dout: torch.Tensor, q: torch.Tensor, k: torch.Tensor,
                            v: torch.Tensor, out: torch.Tensor, lse: torch.Tensor,
                            cu_seqlens_q: torch.Tensor, cu_seqlens_k: torch.Tensor, *,
                            softmax_scale: float, causal: bool, window_left: int,
                            window_right: int, softcap: float,
                            seqused_k: Optional[torch.Tensor] = None,
                            config_overrides: Optional[Dict[str, Any]] = None):
    """Packed variable-length backward with the Gluon sm90 kernels' VARLEN mode (bwd_kernel.py,
    or bwd_wide_kernel.py at d = 192 / 256; fp16/bf16, TMA-aligned q/k/v). ``seqused_k``:
    int32 (b,), as in fwd.flash_fwd_hopper_varlen (dk / dv of the keys past it are 0).

    dout/out (total_q, h, d), q (total_q, h, d), k/v (total_k, h_k, d); lse float32
    (h, total_q); cu_seqlens as in fwd.flash_fwd_hopper_varlen. One CTA per (KV head, key-block
    slot) of tiles.varlen_slot; no device value read on the host. Returns dq, dk, dv shaped
    like q, k, v: 0 on rows and keys of no sequence (the portable varlen backward's contract).
    """
    call = PackedBwdCall(q, k, v, dout, cu_seqlens_q.shape[0] - 1,
                         seqused_k is not None, softmax_scale=softmax_scale,
                         window_left=window_left, window_right=window_right, softcap=softcap,
                         config_overrides=config_overrides)
    return call(dout, q, k, v, out, lse, cu_seqlens_q, cu_seqlens_k, seqused_k)


class PackedBwdCall:
    """:func:`flash_bwd_hopper_varlen` for one call signature: config, workspace geometry and
    the launch plan's key found once (see fwd.PackedFwdCall: dispatch.VarlenRunner keeps one
    per signature). Built from a call's q, k, v, dout, its number of sequences and
    whether it passes ``seqused_k``; called with tensors of the same shapes, strides and
    dtypes. A dout of other strides (autograd may hand an expanded view) runs through a call
    object of its own."""

    def __init__(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, dout: torch.Tensor,
                 n_seqs: int, seqused: bool, *, softmax_scale: float, window_left: int,
                 window_right: int, softcap: float,
                 config_overrides: Optional[Dict[str, Any]] = None) -> None:
        total_q, _, head_dim = q.shape
        self.wide = is_wide(head_dim)
        # one CTA per key tile (the masked configs): slots of unequal cost need no queue then
        self.cfg = bwd_config(head_dim, masked=True, softcap=softcap > 0.0,
                              short_seqs=short_packed_seqs(total_q, n_seqs),
                              **(config_overrides or {}))
        block_m = self.cfg.block_m
        # a query block of the last sequence reads up to BLOCK_M statistics rows past total_q;
        # the wide kernel's dQ^T columns start each sequence on a 16-byte boundary
        # (bwd_postprocess)
        if self.wide:
            self.seqlen_q_pad = packed_dq_t_columns(total_q, n_seqs, block_m)
        else:
            self.seqlen_q_pad = cdiv(total_q, block_m) * block_m + block_m
        self.head_dim = head_dim
        self.dout_stride = _tma_ready_strides(dout)
        self.params = dict(softmax_scale=softmax_scale, window_left=window_left,
                           window_right=window_right, softcap=softcap)
        self.n_seqs, self.seqused, self.overrides = n_seqs, seqused, config_overrides
        self.key = (q.shape, k.shape, q.stride(), k.stride(), v.stride(), self.dout_stride,
                    q.dtype, q.device, n_seqs + 1, softmax_scale, window_left, window_right,
                    softcap,
                    tuple(sorted(config_overrides.items())) if config_overrides else None)
        self.plans = _VARLEN_PLANS[seqused]
        self.plan = None  # the recorded launch, replayed directly on later calls

    def __call__(self, dout: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                 out: torch.Tensor, lse: torch.Tensor, cu_seqlens_q: torch.Tensor,
                 cu_seqlens_k: torch.Tensor, seqused_k: Optional[torch.Tensor] = None
                 ) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(dq, dk, dv) of this call."""
        dout = _tma_ready(dout)
        call = self
        if dout.stride() != self.dout_stride:  # (the key and the plan hold dout's strides)
            call = PackedBwdCall(q, k, v, dout, self.n_seqs, self.seqused, **self.params,
                                 config_overrides=self.overrides)
        return call._run(dout, q, k, v, out, lse, cu_seqlens_q, cu_seqlens_k, seqused_k)

    def _run(self, dout: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
             out: torch.Tensor, lse: torch.Tensor, cu_seqlens_q: torch.Tensor,
             cu_seqlens_k: torch.Tensor, seqused_k: Optional[torch.Tensor]
             ) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """:meth:`__call__` with dout TMA-ready, of this call object's strides."""
        if out.stride(-1) != 1:
            out = out.contiguous()
        cu_seqlens_q, cu_seqlens_k = cu_seqlens_q.contiguous(), cu_seqlens_k.contiguous()
        q4, dout4 = q.unsqueeze(0), dout.unsqueeze(0)
        dq_acc = dq_workspace(q4, self.seqlen_q_pad)
        dk = torch.empty(k.shape, dtype=k.dtype, device=k.device)
        dv = torch.empty(v.shape, dtype=v.dtype, device=v.device)
        lse2, delta = row_stats(out.unsqueeze(0), dout4, lse.contiguous().unsqueeze(0),
                                self.seqlen_q_pad, dq_acc, transposed=self.wide)
        if seqused_k is not None:
            seqused_k = seqused_k.contiguous()
        # keys of no sequence (or past seqused_k) get no tile: 0, written here and only there
        clear_uncovered_keys(dk, dv, cu_seqlens_k, seqused_k)
        offsets = (cu_seqlens_q, cu_seqlens_k)
        if seqused_k is not None:
            offsets += (seqused_k,)
        # descriptor slots take the tensor they cover (only its address is read on a replay)
        tensors = (q, k, v, dout, dq_acc, lse2, delta, dq_acc, dk, dv, lse2) + offsets
        if self.plan is None or not self.plan.launch(*tensors):
            self.plan = self._launch(q4, k, v, dout4, dq_acc, lse2, delta, dk, dv, offsets,
                                     tensors)
        if self.wide:
            return dq_from_packed_workspace(dq_acc, q, cu_seqlens_q), dk, dv
        return dq_from_workspace(dq_acc, q4, transposed=False)[0], dk, dv

    def _launch(self, q4, k, v, dout4, dq_acc, lse2, delta, dk, dv, offsets, tensors):
        """The first launch of this signature (or one that cannot replay): through the
        plans, recording one. Returns the plan (None: Triton's own launch path ran)."""
        k4, v4, dk4, dv4 = (t.unsqueeze(0) for t in (k, v, dk, dv))

        def build():
            args, constexprs, options, grid = launch_args(
                dout4, q4, k4, v4, lse2, delta, dq_acc, dk4, dv4, self.cfg, counter=lse2,
                cu_seqlens=offsets, **self.params)
            return bwd_kernel_for(self.head_dim), grid, args, {**constexprs, **options}

        return self.plans.launch(self.key, tensors, build)


# Launch plans of earlier calls (runtime/launch.py; see sm90/fwd.py). Slots: the q, k, v,
# dout and dQ-workspace descriptors, lse2, delta, the workspace, dk, dv, the tile counter.
_PLANS = LaunchPlans(slots=tuple(range(11)))
VARLEN_ARGS = 26  # cu_seqlens_q, cu_seqlens_k, n_seqs, seqused_k (after the 15 scalars)
# calls that cut key blocks (BwdConfig.tile_split): the split workspace too (after the varlen
# arguments and the number of cut key blocks). A non-split call's workspace argument is a
# stand-in the kernel never reads, fixed in its plan.
_SPLIT_PLANS = LaunchPlans(slots=tuple(range(11)) + (VARLEN_ARGS + 5,))
# by whether seqused_k is given (its slot follows n_seqs)
_VARLEN_PLANS = {used: LaunchPlans(slots=tuple(range(11)) + (VARLEN_ARGS, VARLEN_ARGS + 1)
                                   + ((VARLEN_ARGS + 3,) if used else ()))
                 for used in (False, True)}
