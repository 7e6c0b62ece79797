"""Context-parallel benchmark: ``torchrun --nproc-per-node N -m flashattn.bench_cp``.

bf16, b = 1, h = 32 (``--kv-heads``), d = 128, forward + backward, on every GPU of one host.
Efficiency = (the one-GPU time of the whole sequence / N) / (the CP time), each with the
same (our) kernels; the one-GPU call runs on every GPU at once, as PyTorch's own anchor
(../shared/tools/cp/torch_cp_anchor.py) measures it, so both sides share the machine's state.
FLOPs count the visible (query, key) pairs: ``4 b h d * pairs * 3.5`` for forward + backward.

Modes (``--modes``, comma-separated):
- ring: zigzag ring attention, causal, at each ``--per-gpu`` tokens per GPU;
- ulysses: Ulysses, causal;
- uspUxR (e.g. usp4x2): Ulysses over U ranks (consecutive ranks: inside a node) and the zigzag
  ring over R = N / U, at each ``--per-gpu``;
- varlen: the varlen zigzag ring on packed documents of lengths drawn in [1k, 64k]
  (``--varlen-per-gpu`` tokens per GPU), against the one-GPU varlen call; causal, or with
  each ``--varlen-window`` (a causal sliding window of that many keys; 0: none);
- scale: one long sequence (``--scale-per-gpu`` per GPU, GQA ``--kv-heads``): time, TFLOP/s
  per GPU and peak memory, no one-GPU baseline (it would not fit);
- nocomm: the ring with every exchange replaced by the block in hand (its kernels alone);
- trace: profiler traces of one ring step, of one forward alone and of three forwards back
  to back (as ``cp_fwd_s`` times them; host runtime calls that can stall the launch queue
  too), rank 0's summary: the share of each where an NCCL kernel runs with no compute kernel
  beside it (communication not hidden), the time with no kernel at all, and the attention
  kernels' durations in order;
- trace_varlen: the same for the varlen ring on the varlen row's documents.
``--schedule static`` (an ablation of the Hopper kernels' tile schedule): unmasked forward and
backward calls take the static persistent stride they had before 2026-11-28 instead of the
global tile queue. A persistent CTA whose SM is held by an NCCL kernel starts late; with the
static stride its share of tiles then finishes late, with the queue the others take it.
``--nccl-priority normal,high`` (ring, varlen): the same calls over process groups whose NCCL
streams have normal or high priority (``ProcessGroupNCCL.Options.is_high_priority_stream``),
interleaved over ``--rounds`` rounds on the same inputs; each variant's times are the minimum
over its rounds. A high-priority stream's pending kernel is dispatched before a normal one's,
so a transfer that becomes ready together with the next step's persistent attention kernel
takes its SMs first instead of waiting for that whole kernel.
``--local-block split,whole`` (ring, varlen, trace): the backward's local block in two parts
(the library's schedule) or whole (first, with the other ranks' dK / dV sent home after the
ring, uncovered), interleaved the same way.
"""
from __future__ import annotations

import argparse
import contextlib
import json
import random
import time
from typing import Callable, Dict, Iterator, List, Tuple

import torch
import torch.distributed as dist

import flashattn
from flashattn import parallel as fp


def _apply_schedule(name: str) -> None:
    """Switch the Hopper kernels' tile schedule for unmasked calls (``--schedule``)."""
    if name == "default":
        return
    if name != "static":
        raise SystemExit(f"--schedule: expected default or static, got {name!r}")
    from dataclasses import replace

    from flashattn.backends.sm90 import config as _cfg
    from flashattn.backends.sm90 import fwd as _fwd

    _fwd.uses_tile_queue = lambda cfg, window_right, varlen=False: bool(
        cfg.dynamic and cfg.persistent and cfg.warp_specialized
        and (window_right >= 0 or varlen))
    for key, cfg in list(_cfg._BWD_DEFAULTS.items()):
        if cfg.persistent and not cfg.deterministic and not key[1]:  # unmasked
            _cfg._BWD_DEFAULTS[key] = replace(cfg, dynamic=False)


def _nccl_groups(priorities: str) -> Dict[str, object]:
    """One process group over every rank per name in ``priorities`` ("normal": the default
    group; "high": a group whose NCCL streams are high-priority)."""
    groups: Dict[str, object] = {}
    for name in priorities.split(","):
        if name == "normal":
            groups[name] = None
        elif name == "high":
            opts = dist.ProcessGroupNCCL.Options()
            opts.is_high_priority_stream = True
            groups[name] = dist.new_group(backend="nccl", pg_options=opts)
        else:
            raise SystemExit(f"--nccl-priority: expected normal or high, got {name!r}")
    return groups


LOCAL_BLOCKS = ("split", "whole")


@contextlib.contextmanager
def _local_block(name: str) -> Iterator[None]:
    """The ring backward's local block (``--local-block``): "split" (the library's schedule:
    one part first, one last, the home transfer under the second) or "whole" (the ablation:
    the local block first in one part, the other ranks' dK / dV sent home after the ring)."""
    if name not in LOCAL_BLOCKS:
        raise SystemExit(f"--local-block: expected one of {LOCAL_BLOCKS}, got {name!r}")
    if name == "split":
        yield
        return
    from flashattn.parallel import blocks as _blocks

    real = _blocks.own_parts
    _blocks.own_parts = lambda *a: (_blocks.ring_plan(*a)[0], ())
    try:
        yield
    finally:
        _blocks.own_parts = real


def _variants(priorities: str, local_blocks: str) -> Dict[str, Tuple[object, str]]:
    """{name: (process group, local block)}: every NCCL priority with every local-block
    schedule; a name lists the options given more than one value."""
    groups = _nccl_groups(priorities)
    blocks = local_blocks.split(",")
    out: Dict[str, Tuple[object, str]] = {}
    for p, group in groups.items():
        for b in blocks:
            name = "+".join(x for x, many in ((p, len(groups) > 1), (b, len(blocks) > 1))
                            if many) or p
            out[name] = (group, b)
    return out


def _variant_times(make_attn: Callable, local, groups: Dict[str, Tuple[object, str]],
                   iters: int, rounds: int, forward_alone: bool
                   ) -> Dict[str, Dict[str, float]]:
    """{variant: {"cp_s", ["cp_fwd_s"]}}: minimum over ``rounds`` interleaved rounds of the
    fwd + bwd step (and the forward alone) with ``make_attn(group)`` under each variant's
    local-block schedule."""
    out: Dict[str, Dict[str, List[float]]] = {name: {} for name in groups}
    for _ in range(rounds):
        for name, (group, local_block) in groups.items():
            attn = make_attn(group)
            with _local_block(local_block):
                out[name].setdefault("cp_s", []).append(_timed(_step(attn, *local), iters))
            if forward_alone:
                with torch.no_grad():
                    out[name].setdefault("cp_fwd_s", []).append(
                        _timed(lambda: attn(*local[:3]), iters))
    return {name: dict({k: min(v) for k, v in times.items()},
                       **{k + "_rounds": v for k, v in times.items()})
            for name, times in out.items()}


def _timed(fn: Callable[[], None], iters: int) -> float:
    fn()
    torch.cuda.synchronize()
    dist.barrier()
    start = time.perf_counter()
    for _ in range(iters):
        fn()
    torch.cuda.synchronize()
    dist.barrier()
    return (time.perf_counter() - start) / iters


def _causal_pairs(n: int) -> int:
    return n * (n + 1) // 2


def _window_pairs(n: int, left: int) -> int:
    """Visible (query, key) pairs of a causal sequence of ``n`` tokens whose queries see at
    most ``left`` keys before their own (``left < 0``: unbounded)."""
    if left < 0 or n <= left + 1:
        return _causal_pairs(n)
    return _causal_pairs(left + 1) + (n - left - 1) * (left + 1)


def _step(attn: Callable, q, k, v, dout) -> Callable[[], None]:
    def run() -> None:
        qq, kk, vv = (t.detach().requires_grad_() for t in (q, k, v))
        out = attn(qq, kk, vv)
        out.backward(dout)
    return run


def _dense_row(mode: str, per_gpu: int, world: int, h: int, hk: int, d: int,
               iters: int, groups: Dict[str, object], rounds: int = 1) -> Dict:
    seq = per_gpu * world
    gen = torch.Generator(device="cuda").manual_seed(0)
    mk = lambda heads: torch.randn(1, seq, heads, d, device="cuda", dtype=torch.bfloat16,
                                   generator=gen)
    q, k, v, dout = mk(h), mk(hk), mk(hk), mk(h)
    row = dict(mode=mode, per_gpu=per_gpu, total=seq, h=h, hk=hk, d=d)
    one = _step(lambda a, b, c: flashattn.flash_attn_func(a, b, c, causal=True), q, k, v, dout)
    row["single_s"] = _timed(one, 1 if seq > 200_000 else iters)
    if mode == "ring":  # the forward alone too (where a loss sits: forward or backward)
        with torch.no_grad():
            row["single_fwd_s"] = _timed(
                lambda: flashattn.flash_attn_func(q, k, v, causal=True), iters)
    if mode == "ring":
        shard = fp.zigzag_shard
        attn = lambda a, b, c: fp.ring_flash_attn_func(a, b, c, causal=True)
    elif mode.startswith("usp"):  # "usp4x2": Ulysses over 4 ranks inside, the ring over 2
        from torch.distributed.device_mesh import init_device_mesh

        u = int(mode[3:].split("x")[0])
        mesh = init_device_mesh("cuda", (world // u, u), mesh_dim_names=("ring", "ulysses"))
        shard = lambda x: fp.usp_shard(x, mesh)
        attn = lambda a, b, c: fp.usp_flash_attn_func(a, b, c, mesh=mesh, causal=True)
    else:
        shard = fp.contiguous_shard
        attn = lambda a, b, c: fp.ulysses_flash_attn_func(a, b, c, causal=True)
    local = [shard(t) for t in (q, k, v, dout)]
    del q, k, v, dout
    torch.cuda.empty_cache()
    flops = 4 * h * d * _causal_pairs(seq) * 3.5
    row["single_tflops"] = flops / row["single_s"] / 1e12
    if mode == "ring" and len(groups) > 1:  # an A/B (NCCL priority, local block), interleaved
        row["variants"] = _variant_times(
            lambda g: (lambda a, b, c: fp.ring_flash_attn_func(a, b, c, causal=True, group=g)),
            local, groups, iters, rounds, forward_alone=True)
        for times in row["variants"].values():
            times["efficiency"] = row["single_s"] / world / times["cp_s"]
            times["fwd_efficiency"] = row["single_fwd_s"] / world / times["cp_fwd_s"]
            times["cp_tflops_per_gpu"] = flops / world / times["cp_s"] / 1e12
        return row
    local_block = "split"
    if mode == "ring":
        group, local_block = next(iter(groups.values()))
        attn = lambda a, b, c: fp.ring_flash_attn_func(a, b, c, causal=True, group=group)
    with _local_block(local_block):
        row["cp_s"] = _timed(_step(attn, *local), iters)
    if mode == "ring":
        with torch.no_grad():
            row["cp_fwd_s"] = _timed(lambda: attn(*local[:3]), iters)
        row["fwd_efficiency"] = row["single_fwd_s"] / world / row["cp_fwd_s"]
    row["efficiency"] = row["single_s"] / world / row["cp_s"]
    row["cp_tflops_per_gpu"] = flops / world / row["cp_s"] / 1e12
    return row


def _ring_without_comm(per_gpu: int, world: int, h: int, d: int, iters: int) -> Dict:
    """The ring's kernels alone: every exchange returns the block in hand instead of sending
    it, or the receiver's own buffers where it gives them (the dK / dV partials sent home:
    same calls, same shapes, no NCCL): the CP time a perfectly hidden transfer would give."""
    from flashattn.parallel import comm as _comm

    real = _comm.exchange

    def in_hand(tensors, *args, into=None, **kwargs):
        return _comm.Exchange([], list(tensors if into is None else into))

    _comm.exchange = in_hand
    try:
        gen = torch.Generator(device="cuda").manual_seed(0)
        local = [torch.randn(1, per_gpu, h, d, device="cuda", dtype=torch.bfloat16,
                             generator=gen) for _ in range(4)]
        attn = lambda a, b, c: fp.ring_flash_attn_func(a, b, c, causal=True)
        t = _timed(_step(attn, *local), iters)
    finally:
        _comm.exchange = real
    seq = per_gpu * world
    return dict(mode="ring_no_comm", per_gpu=per_gpu, total=seq, cp_s=t,
                cp_tflops_per_gpu=4 * h * d * _causal_pairs(seq) * 3.5 / world / t / 1e12)


def _doc_lengths(total: int, world: int, seed: int = 0) -> List[int]:
    """Document lengths drawn uniformly in [1k, 64k], multiples of 2 * world, summing to
    ``total`` (the last one trimmed)."""
    rng = random.Random(seed)
    unit = 2 * world
    out: List[int] = []
    left = total
    while left > 0:
        n = min(left, rng.randint(1024, 65536) // unit * unit)
        out.append(n)
        left -= n
    return out


def _packed_documents(per_gpu: int, world: int, h: int, hk: int, d: int
                      ) -> Tuple[List[int], torch.Tensor, List[torch.Tensor]]:
    """The varlen rows' inputs: document lengths, global cu_seqlens (int32) and packed q, k,
    v, dout (total, heads, d) bf16."""
    lengths = _doc_lengths(per_gpu * world, world)
    cu = torch.tensor([0] + lengths, device="cuda").cumsum(0).to(torch.int32)
    total = int(cu[-1])
    gen = torch.Generator(device="cuda").manual_seed(0)
    mk = lambda heads: torch.randn(total, heads, d, device="cuda", dtype=torch.bfloat16,
                                   generator=gen)
    return lengths, cu, [mk(h), mk(hk), mk(hk), mk(h)]


def _varlen_row(per_gpu: int, world: int, h: int, hk: int, d: int, iters: int,
                groups: Dict[str, object], rounds: int = 1, window: int = 0) -> Dict:
    """``window`` > 0: a causal sliding window of that many keys (the query's own included:
    window_size (window - 1, 0)), the ring's per-length calls (parallel/doc_blocks.py)."""
    lengths, cu, (q, k, v, dout) = _packed_documents(per_gpu, world, h, hk, d)
    total, longest = int(cu[-1]), max(lengths)
    left = window - 1 if window > 0 else -1
    row = dict(mode="varlen", per_gpu=per_gpu, total=total, h=h, hk=hk, d=d,
               n_docs=len(lengths), longest=longest, window=window)
    one = _step(lambda a, b, c: flashattn.flash_attn_varlen_func(
        a, b, c, cu, cu, longest, longest, causal=True, window_size=(left, 0)), q, k, v, dout)
    row["single_s"] = _timed(one, iters)
    with torch.no_grad():  # the forward alone too (where a loss sits: forward or backward)
        row["single_fwd_s"] = _timed(lambda: flashattn.flash_attn_varlen_func(
            q, k, v, cu, cu, longest, longest, causal=True, window_size=(left, 0)), iters)
    local = [fp.zigzag_varlen_shard(t, cu) for t in (q, k, v, dout)]
    flops = 4 * h * d * sum(_window_pairs(n, left) for n in lengths) * 3.5
    variants = _variant_times(
        lambda g: (lambda a, b, c: fp.ring_flash_attn_varlen_func(
            a, b, c, cu, longest, causal=True, window_size=(left, 0), group=g)),
        local, groups, iters, rounds, forward_alone=True)
    for times in variants.values():
        times["efficiency"] = row["single_s"] / world / times["cp_s"]
        times["fwd_efficiency"] = row["single_fwd_s"] / world / times["cp_fwd_s"]
        times["cp_tflops_per_gpu"] = flops / world / times["cp_s"] / 1e12
    if len(variants) > 1:
        row["variants"] = variants
    else:
        row.update(next(iter(variants.values())))
    return row


def _scale_row(per_gpu: int, world: int, h: int, hk: int, d: int) -> Dict:
    seq = per_gpu * world
    torch.cuda.reset_peak_memory_stats()
    base = torch.cuda.memory_allocated()
    gen = torch.Generator(device="cuda").manual_seed(0)
    mk = lambda heads: torch.randn(1, per_gpu, heads, d, device="cuda", dtype=torch.bfloat16,
                                   generator=gen)
    local = [mk(h), mk(hk), mk(hk), mk(h)]  # this rank's shards (random: no full tensor)
    attn = lambda a, b, c: fp.ring_flash_attn_func(a, b, c, causal=True)
    row = dict(mode="scale", per_gpu=per_gpu, total=seq, h=h, hk=hk, d=d)
    row["cp_s"] = _timed(_step(attn, *local), 1)
    flops = 4 * h * d * _causal_pairs(seq) * 3.5
    row["cp_tflops_per_gpu"] = flops / world / row["cp_s"] / 1e12
    row["peak_mem_gib"] = torch.cuda.max_memory_allocated() / 2**30
    row["peak_extra_gib"] = (torch.cuda.max_memory_allocated() - base) / 2**30
    return row


def _exposed_comm(per_gpu: int, world: int, h: int, d: int, group=None,
                  trace_dir: str = "", local_block: str = "split") -> Dict:
    """Profile one ring fwd + bwd, then one forward alone (no grad, as ``cp_fwd_s`` times it):
    for each, the share of its span where NCCL runs alone, the time with no kernel at all
    (``idle_ms``: the GPU waiting on the host or on a peer) and the attention kernels'
    durations in launch order. With ``trace_dir``, every rank also writes its Chrome traces
    there (``ring_<per_gpu>_<local_block>[_fwd]_rank<r>.json``: each kernel's start, duration
    and stream, to read where a step waits)."""
    gen = torch.Generator(device="cuda").manual_seed(0)
    local = [torch.randn(1, per_gpu, h, d, device="cuda", dtype=torch.bfloat16, generator=gen)
             for _ in range(4)]

    def attn(a, b, c):
        return fp.ring_flash_attn_func(a, b, c, causal=True, group=group)

    with _local_block(local_block):
        row = _step_and_forward(attn, local, trace_dir, f"ring_{per_gpu}_{local_block}")
    return dict(mode="trace", per_gpu=per_gpu, **row)


def _varlen_trace(per_gpu: int, world: int, h: int, d: int, group=None,
                  trace_dir: str = "") -> Dict:
    """:func:`_exposed_comm` for the varlen zigzag ring on the varlen row's packed documents."""
    lengths, cu, tensors = _packed_documents(per_gpu, world, h, h, d)
    local = [fp.zigzag_varlen_shard(t, cu) for t in tensors]
    longest = max(lengths)

    def attn(a, b, c):
        return fp.ring_flash_attn_varlen_func(a, b, c, cu, longest, causal=True, group=group)

    row = _step_and_forward(attn, local, trace_dir, f"varlen_{per_gpu}")
    return dict(mode="trace_varlen", per_gpu=per_gpu, n_docs=len(lengths), **row)


def _step_and_forward(attn: Callable, local, trace_dir: str, name: str) -> Dict:
    """:func:`_profiled` of one fwd + bwd step of ``attn`` on ``local`` (q, k, v, dout), then
    of its forward alone (no grad), the latter's keys prefixed ``fwd_`` (top kernels left out)."""
    def forward_alone() -> None:
        with torch.no_grad():
            attn(*local[:3])

    def forward_loop() -> None:  # as ``cp_fwd_s`` times it: calls back to back, no sync
        for _ in range(_LOOP_CALLS):
            forward_alone()

    row = _profiled(_step(attn, *local), trace_dir, name)
    fwd = _profiled(forward_alone, trace_dir, name + "_fwd")
    row.update({"fwd_" + k: v for k, v in fwd.items() if k != "top_kernels_ms"})
    loop = _profiled(forward_loop, trace_dir, name + "_fwdloop", host=True)
    row.update({"fwdloop_" + k: v for k, v in loop.items() if k != "top_kernels_ms"})
    row["fwdloop_calls"] = _LOOP_CALLS
    row["fwd_timed_ms"] = _timed(forward_alone, _LOOP_CALLS) * 1e3
    return row


_LOOP_CALLS = 3
# host-side runtime calls that can stall the launch queue (a sync, an allocation, a free)
_HOST_STALLS = ("Synchronize", "cudaMalloc", "cudaFree", "cudaHostAlloc", "Query")


def _profiled(fn: Callable[[], None], trace_dir: str, name: str, host: bool = False) -> Dict:
    """One warm call of ``fn`` under the profiler (ranks aligned by a barrier first): span,
    NCCL time, NCCL time with no other kernel beside it, time with no kernel at all, the
    attention kernels' durations in order and the top kernels by total time. ``host``: the
    host's runtime calls too (``host_stalls``: total ms and count of each call that can hold
    the launch queue: syncs, allocations, frees, event queries)."""
    from torch.profiler import ProfilerActivity, profile

    fn()
    torch.cuda.synchronize()
    dist.barrier()
    activities = [ProfilerActivity.CUDA] + ([ProfilerActivity.CPU] if host else [])
    with profile(activities=activities) as prof:
        fn()
        torch.cuda.synchronize()
    if trace_dir:
        import os

        prof.export_chrome_trace(os.path.join(trace_dir, f"{name}_rank{dist.get_rank()}.json"))
    stalls: Dict[str, List[float]] = {}
    for e in prof.events() if host else ():
        if (e.device_type == torch.autograd.DeviceType.CPU
                and any(k in e.name for k in _HOST_STALLS)):
            slot = stalls.setdefault(e.name[:60], [0.0, 0])
            slot[0] += (e.time_range.end - e.time_range.start) / 1e3
            slot[1] += 1
    events = [e for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA
              and e.time_range.end > e.time_range.start]
    if not events:
        return dict(error="no kernel events")
    kernels = [(e.time_range.start, e.time_range.end, "nccl" in e.name.lower())
               for e in events]
    span0 = min(s for s, _, _ in kernels)
    span1 = max(e for _, e, _ in kernels)
    by_name: Dict[str, List[float]] = {}
    for e in events:
        slot = by_name.setdefault(e.name[:80], [0.0, 0])
        slot[0] += (e.time_range.end - e.time_range.start) / 1e3
        slot[1] += 1
    top = sorted(by_name.items(), key=lambda kv: -kv[1][0])[:12]
    comm = _union([(s, e) for s, e, nc in kernels if nc])
    compute = _union([(s, e) for s, e, nc in kernels if not nc])
    busy = _union([(s, e) for s, e, _ in kernels])
    exposed = 0.0
    for s, e in comm:
        covered = sum(max(0.0, min(e, ce) - max(s, cs)) for cs, ce in compute)
        exposed += (e - s) - covered
    attention = [round((e.time_range.end - e.time_range.start) / 1e3, 3)
                 for e in sorted(events, key=lambda e: e.time_range.start)
                 if e.name.startswith("attn_")]
    return dict(span_ms=(span1 - span0) / 1e3, nccl_ms=sum(e - s for s, e in comm) / 1e3,
                exposed_nccl_ms=exposed / 1e3, exposed_fraction=exposed / (span1 - span0),
                idle_ms=((span1 - span0) - sum(e - s for s, e in busy)) / 1e3,
                attention_kernels_ms=attention,
                top_kernels_ms=[(n, round(t, 3), c) for n, (t, c) in top],
                **({"host_stalls": {n: (round(t, 3), c) for n, (t, c) in stalls.items()}}
                   if host else {}))


def _union(intervals: List[Tuple[float, float]]) -> List[List[float]]:
    """Overlapping intervals merged (sorted by start)."""
    merged: List[List[float]] = []
    for s, e in sorted(intervals):
        if merged and s <= merged[-1][1]:
            merged[-1][1] = max(merged[-1][1], e)
        else:
            merged.append([s, e])
    return merged


def _block_rates(per_gpu: int, world: int, h: int, d: int) -> Dict:
    """TFLOP/s of the one-GPU kernel on the block shapes of a zigzag causal ring (chunk
    L = per_gpu / 2): the diagonal (2L x 2L causal), the early-key (2L x L) and late-query
    (L x 2L) full blocks, and the whole sequence causal; forward and backward alone."""
    from triton.testing import do_bench

    half = per_gpu // 2
    rows = {}
    shapes = {"diag_causal": (2 * half, 2 * half, True), "q2L_kL": (2 * half, half, False),
              "qL_k2L": (half, 2 * half, False), "whole_causal": (per_gpu * world,
                                                               per_gpu * world, True)}
    for name, (sq, sk, causal) in shapes.items():
        gen = torch.Generator(device="cuda").manual_seed(0)
        q = torch.randn(1, sq, h, d, device="cuda", dtype=torch.bfloat16, generator=gen)
        k, v = (torch.randn(1, sk, h, d, device="cuda", dtype=torch.bfloat16, generator=gen)
                for _ in range(2))
        pairs = (sq * (sq + 1) // 2 + sq * (sk - sq)) if causal else sq * sk
        fwd_flops = 4 * h * d * pairs
        qq, kk, vv = (t.requires_grad_() for t in (q, k, v))
        out = flashattn.flash_attn_func(qq, kk, vv, causal=causal)
        dout = torch.randn_like(out)
        t_f = do_bench(lambda: flashattn.flash_attn_func(q, k, v, causal=causal), rep=300)
        t_b = do_bench(lambda: torch.autograd.grad(out, (qq, kk, vv), dout, retain_graph=True),
                       rep=300)
        rows[name] = dict(fwd_tflops=fwd_flops / t_f / 1e9, bwd_tflops=2.5 * fwd_flops / t_b / 1e9,
                          fwd_ms=t_f, bwd_ms=t_b)
        del q, k, v, qq, kk, vv, out, dout
        torch.cuda.empty_cache()
    return dict(mode="blocks", per_gpu=per_gpu, **rows)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--modes", default="ring,ulysses,varlen,scale,trace")
    ap.add_argument("--per-gpu", default="32768,131072")
    ap.add_argument("--ulysses-per-gpu", default="32768")
    ap.add_argument("--varlen-per-gpu", type=int, default=131072)
    ap.add_argument("--varlen-window", default="0",
                    help="varlen rows' causal sliding windows in keys, comma-separated "
                         "(0: none)")
    ap.add_argument("--scale-per-gpu", type=int, default=262144)
    ap.add_argument("--trace-per-gpu", default="32768", help="tokens per GPU, comma-separated")
    ap.add_argument("--trace-dir", default="", help="write each rank's Chrome trace here")
    ap.add_argument("--heads", type=int, default=32)
    ap.add_argument("--kv-heads", type=int, default=8, help="KV heads of the scale run")
    ap.add_argument("--iters", type=int, default=3)
    ap.add_argument("--schedule", default="default", help="default or static (see above)")
    ap.add_argument("--nccl-priority", default="normal",
                    help="normal, high, or normal,high for an interleaved A/B (see above)")
    ap.add_argument("--local-block", default="split",
                    help="split, whole, or split,whole for an interleaved A/B (see above)")
    ap.add_argument("--rounds", type=int, default=1, help="rounds of an A/B (see above)")
    ap.add_argument("--out", default="cp_bench.json")
    args = ap.parse_args()
    _apply_schedule(args.schedule)
    dist.init_process_group("nccl")
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.cuda.set_device(rank % torch.cuda.device_count())  # one host: local rank
    groups = _variants(args.nccl_priority, args.local_block)
    modes = args.modes.split(",")
    h, d = args.heads, 128
    res = dict(world=world, schedule=args.schedule, nccl_priority=args.nccl_priority,
               local_block=args.local_block, gpu=torch.cuda.get_device_name(), torch=torch.__version__,
               date=time.strftime("%Y-%m-%d"), rows=[],
               nccl=".".join(str(x) for x in torch.cuda.nccl.version()))

    def emit(row: Dict) -> None:
        row = dict(row, schedule=args.schedule)
        if rank == 0:
            print(json.dumps(row), flush=True)
            res["rows"].append(row)
        torch.cuda.empty_cache()

    def guarded(fn: Callable[[], Dict], what: Dict) -> None:
        try:
            emit(fn())
        except Exception as e:  # noqa: BLE001 - an OOM or a failure is a row of its own
            emit(dict(what, error=repr(e)[:300]))

    for per in ([int(x) for x in args.per_gpu.split(",")] if "ring" in modes else []):
        guarded(lambda: _dense_row("ring", per, world, h, h, d, args.iters, groups, args.rounds),
                dict(mode="ring", per_gpu=per))
    for per in ([int(x) for x in args.ulysses_per_gpu.split(",")] if "ulysses" in modes else []):
        guarded(lambda: _dense_row("ulysses", per, world, h, h, d, args.iters, groups),
                dict(mode="ulysses", per_gpu=per))
    for usp in (m for m in modes if m.startswith("usp")):
        for per in [int(x) for x in args.per_gpu.split(",")]:
            guarded(lambda: _dense_row(usp, per, world, h, h, d, args.iters, groups),
                    dict(mode=usp, per_gpu=per))
    for window in ([int(x) for x in args.varlen_window.split(",")] if "varlen" in modes else []):
        guarded(lambda: _varlen_row(args.varlen_per_gpu, world, h, h, d, args.iters, groups,
                                    args.rounds, window),
                dict(mode="varlen", per_gpu=args.varlen_per_gpu, window=window))
    if "scale" in modes:
        guarded(lambda: _scale_row(args.scale_per_gpu, world, h, args.kv_heads, d),
                dict(mode="scale", per_gpu=args.scale_per_gpu))
    for per in ([int(x) for x in args.per_gpu.split(",")] if "nocomm" in modes else []):
        guarded(lambda: _ring_without_comm(per, world, h, d, args.iters),
                dict(mode="ring_no_comm", per_gpu=per))
    if "trace" in modes:
        for per in [int(x) for x in args.trace_per_gpu.split(",")]:
            for name, (group, local_block) in groups.items():
                guarded(lambda: dict(_exposed_comm(per, world, h, d, group, args.trace_dir,
                                                   local_block), variant=name),
                        dict(mode="trace", per_gpu=per, variant=name))
    if "trace_varlen" in modes:
        guarded(lambda: _varlen_trace(args.varlen_per_gpu, world, h, d, None, args.trace_dir),
                dict(mode="trace_varlen", per_gpu=args.varlen_per_gpu))
    for per in ([int(x) for x in args.per_gpu.split(",")] if "blocks" in modes else []):
        guarded(lambda: _block_rates(per, world, h, d), dict(mode="blocks", per_gpu=per))
    if rank == 0:
        with open(args.out, "w") as f:
            json.dump(res, f, indent=1)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
