"""The compute side of an N-rank context-parallel step, on one GPU.

Each rank's zigzag ring (forward + backward, bf16, causal, b = 1, d = 128) runs alone on this
GPU as rank r of N: every exchange returns the block in hand (no transfer; the kernels and the
elementwise work of rank r's steps, on blocks of the right shapes), and a CUDA event at each
K / V exchange marks the step boundaries, where the real ring's ranks wait for each other.
The modelled CP time is the sum over steps of the slowest rank's step (``cp_model_s``); a
hidden transfer would give that time, and the efficiency against the one-GPU call of the whole
sequence on the same GPU (``efficiency_model``) bounds the real ring's from above. A
``--profile`` adds each rank's GPU time by kernel (the top names), to split attention kernels
from the ring's elementwise work.

    PYTHONPATH=src python benchmarks/probes/cp_ranks_one_gpu.py --world 4 \
        --modes ring,varlen --per-gpu 32768 --varlen-per-gpu 131072 [--profile] [--out F]
    PYTHONPATH=src python benchmarks/probes/cp_ranks_one_gpu.py --world 4 --per-gpu 262144 \
        --heads 32 --kv-heads 8 --memory 0,3    # peak memory of ranks 0 and 3, no timing

Runs on any flashattn tree on PYTHONPATH that has the ring's seams (``comm.exchange``,
``ring.resolve``, ``ring_varlen.resolve``; 2026-11-28 and later), so two trees compare on one
machine (run it once per tree, alternating).
"""
from __future__ import annotations

import argparse
import json
import statistics
import time
from typing import Callable, Dict, List

import torch

import flashattn
import flashattn.parallel as fp
from flashattn import bench_cp as _bench
from flashattn.parallel import checks as _checks
from flashattn.parallel import comm as _comm
from flashattn.parallel import ring as _ring
from flashattn.parallel import ring_varlen as _ring_varlen


class _Loopback:
    """Stands in for torch.distributed for one rank: resolve gives (None, rank, world), the
    cross-rank checks pass, each exchange returns the tensors sent (or the receiver's own
    buffers, where it gives them: the dK / dV partials sent home) and, for K / V blocks (not
    dK / dV sums or partials), records an event (a step boundary)."""

    def __init__(self, rank: int, world: int):
        self.rank, self.world, self.marks = rank, world, []
        self.saved = []

    def __enter__(self):
        def exchange(tensors, group, rank, world, distance=1, into=None):
            if into is not None:
                return _comm.Exchange([], list(into))
            if tensors and tensors[0].dtype != torch.float32 and distance == 1:
                ev = torch.cuda.Event(enable_timing=True)
                ev.record()
                self.marks.append(ev)
            return _comm.Exchange([], list(tensors))

        resolve = (lambda group=None, name="group": (None, self.rank, self.world))
        for m, name, value in ((_comm, "exchange", exchange), (_ring, "resolve", resolve),
                               (_ring_varlen, "resolve", resolve),
                               (_ring, "check_device", lambda *a, **k: None),
                               (_ring_varlen, "check_device", lambda *a, **k: None),
                               (_checks, "same_on_every_rank", lambda *a, **k: None)):
            self.saved.append((m, name, getattr(m, name)))
            setattr(m, name, value)
        return self

    def __exit__(self, *exc):
        for m, name, value in reversed(self.saved):
            setattr(m, name, value)


def _segments(step: Callable[[], None], rank: int, world: int) -> List[float]:
    """Rank ``rank``'s step, in seconds between its step boundaries."""
    with _Loopback(rank, world) as lb:
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        step()
        end.record()
        torch.cuda.synchronize()
    marks = [start] + lb.marks + [end]
    return [a.elapsed_time(b) / 1e3 for a, b in zip(marks[:-1], marks[1:])]


def _event_time(fn: Callable[[], None], iters: int) -> float:
    fn()
    times = []
    for _ in range(iters):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end) / 1e3)
    return statistics.median(times)


def _kernel_times(step: Callable[[], None], rank: int, world: int, top: int) -> List:
    from torch.profiler import ProfilerActivity, profile
    with _Loopback(rank, world), profile(activities=[ProfilerActivity.CUDA]) as prof:
        step()
        torch.cuda.synchronize()
    rows = sorted(((e.key, e.device_time_total / 1e3, e.count)
                   for e in prof.key_averages() if e.device_time_total > 0),
                  key=lambda r: -r[1])
    return [dict(kernel=k[:90], ms=round(ms, 3), calls=n) for k, ms, n in rows[:top]]


def _ranks(steps: List[Callable[[], None]], world: int, iters: int, profile: bool) -> Dict:
    """Every rank's segments (medians over ``iters`` rounds, the ranks interleaved, each round
    starting at the next rank) and the modelled CP time."""
    for r, s in enumerate(steps):  # compile and warm every shape first
        _segments(s, r, world)
    rounds: List[List[List[float]]] = [[] for _ in range(world)]
    for i in range(iters):
        # each round starts at another rank: no rank is always the first after a pause
        for r in [(i + j) % world for j in range(world)]:
            rounds[r].append(_segments(steps[r], r, world))
    seg = [[statistics.median(x) for x in zip(*rounds[r])] for r in range(world)]
    row = dict(rank_total_s=[sum(s) for s in seg], segments_s=seg)
    if len({len(s) for s in seg}) == 1:
        row["cp_model_s"] = sum(max(s[t] for s in seg) for t in range(len(seg[0])))
    else:  # (the ranks' step counts differ: the slowest rank's total is the bound)
        row["cp_model_s"] = max(row["rank_total_s"])
    if profile:
        row["kernels"] = [_kernel_times(s, r, world, 14) for r, s in enumerate(steps)]
    return row


def _dense(per_gpu: int, world: int, h: int, d: int, iters: int, profile: bool) -> Dict:
    s = per_gpu * world
    gen = torch.Generator(device="cuda").manual_seed(0)
    q, k, v, dout = (torch.randn(1, s, h, d, device="cuda", dtype=torch.bfloat16,
                                 generator=gen) for _ in range(4))
    single = _event_time(_bench._step(lambda a, b, c: flashattn.flash_attn_func(
        a, b, c, causal=True), q, k, v, dout), iters)
    one_doc = torch.tensor([0, s], dtype=torch.int32, device="cuda")
    steps = []
    for r in range(world):
        idx = fp.zigzag_varlen_index(one_doc, r, world)[0]  # (one document: the dense layout)
        local = [x.index_select(1, idx) for x in (q, k, v, dout)]
        steps.append(_bench._step(lambda a, b, c: fp.ring_flash_attn_func(a, b, c, causal=True),
                                  *local))
    del q, k, v, dout
    row = dict(mode="ring", per_gpu=per_gpu, world=world, single_s=single,
               **_ranks(steps, world, iters, profile))
    row["efficiency_model"] = single / world / row["cp_model_s"]
    return row


def _varlen(per_gpu: int, world: int, h: int, d: int, iters: int, profile: bool) -> Dict:
    lengths, cu, (q, k, v, dout) = _bench._packed_documents(per_gpu, world, h, h, d)
    longest = max(lengths)
    single = _event_time(_bench._step(lambda a, b, c: flashattn.flash_attn_varlen_func(
        a, b, c, cu, cu, longest, longest, causal=True), q, k, v, dout), iters)
    steps = []
    for r in range(world):
        idx = fp.zigzag_varlen_index(cu, r, world)[0]
        local = [x.index_select(0, idx) for x in (q, k, v, dout)]
        steps.append(_bench._step(lambda a, b, c: fp.ring_flash_attn_varlen_func(
            a, b, c, cu, longest, causal=True), *local))
    del q, k, v, dout
    row = dict(mode="varlen", per_gpu=per_gpu, world=world, n_docs=len(lengths),
               single_s=single, **_ranks(steps, world, iters, profile))
    row["efficiency_model"] = single / world / row["cp_model_s"]
    return row


def _memory(per_gpu: int, world: int, h: int, hk: int, d: int, ranks: List[int]) -> Dict:
    """The peak memory of rank r's dense causal ring step (fwd + bwd) alone, for r in
    ``ranks``: its shard's q / dout (h heads) and k / v (hk heads) allocated first, then the
    peak above nothing else (the transfers' buffers are included: every exchange hands back
    tensors of the received shapes)."""
    rows = []
    for r in ranks:
        s = per_gpu
        gen = torch.Generator(device="cuda").manual_seed(r)
        q, dout = (torch.randn(1, s, h, d, device="cuda", dtype=torch.bfloat16,
                               generator=gen) for _ in range(2))
        k, v = (torch.randn(1, s, hk, d, device="cuda", dtype=torch.bfloat16, generator=gen)
                for _ in range(2))
        step = _bench._step(lambda a, b, c: fp.ring_flash_attn_func(a, b, c, causal=True),
                            q, k, v, dout)
        with _Loopback(r, world):
            step()  # compile and warm
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
            start = torch.cuda.memory_allocated()
            step()
            torch.cuda.synchronize()
        rows.append(dict(rank=r, inputs_gib=start / 2 ** 30,
                         peak_gib=torch.cuda.max_memory_allocated() / 2 ** 30))
        del q, k, v, dout, step
        torch.cuda.empty_cache()
    return dict(mode="memory", per_gpu=per_gpu, world=world, h=h, hk=hk, d=d, ranks=rows)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--world", type=int, default=4)
    ap.add_argument("--modes", default="ring,varlen")
    ap.add_argument("--per-gpu", default="32768")
    ap.add_argument("--varlen-per-gpu", type=int, default=131072)
    ap.add_argument("--heads", type=int, default=32)
    ap.add_argument("--iters", type=int, default=3)
    ap.add_argument("--profile", action="store_true")
    ap.add_argument("--memory", default="",
                    help="instead of timing: peak memory of these ranks' dense steps (comma "
                         "list), at --per-gpu tokens with --kv-heads K / V heads")
    ap.add_argument("--kv-heads", type=int, default=0, help="K / V heads (default: --heads)")
    ap.add_argument("--tag", default="", help="a label for this tree in the rows")
    ap.add_argument("--out", default="")
    args = ap.parse_args()
    res = dict(gpu=torch.cuda.get_device_name(), torch=torch.__version__,
               date=time.strftime("%Y-%m-%d"), tag=args.tag, rows=[])
    if args.memory:
        row = _memory(int(args.per_gpu), args.world, args.heads, args.kv_heads or args.heads,
                      128, [int(x) for x in args.memory.split(",")])
        for r in row["ranks"]:
            print(args.tag, "memory", args.per_gpu, "rank %d inputs %.2f GiB peak %.2f GiB" % (
                r["rank"], r["inputs_gib"], r["peak_gib"]), flush=True)
        res["rows"].append(row)
        if args.out:
            with open(args.out, "w") as f:
                json.dump(res, f, indent=1)
        return
    modes = args.modes.split(",")
    for per in ([int(x) for x in args.per_gpu.split(",")] if "ring" in modes else []):
        res["rows"].append(_dense(per, args.world, args.heads, 128, args.iters, args.profile))
    if "varlen" in modes:
        res["rows"].append(_varlen(args.varlen_per_gpu, args.world, args.heads, 128,
                                   args.iters, args.profile))
    for r in res["rows"]:
        print(args.tag, r["mode"], r["per_gpu"], "single %.4f model %.4f eff %.3f ranks %s" % (
            r["single_s"], r["cp_model_s"], r["efficiency_model"],
            " ".join("%.4f" % t for t in r["rank_total_s"])), flush=True)
    if args.out:
        with open(args.out, "w") as f:
            json.dump(res, f, indent=1)


if __name__ == "__main__":
    main()
