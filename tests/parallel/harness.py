"""Multi-process test harness: ``run(world, cases)`` spawns ``world`` processes joined by a
gloo group on CPU (or NCCL, one GPU each) (torch.multiprocessing, a file rendezvous), runs every case in each of them and
returns the failures that any rank reported, so one spawn serves many cases (process start
and imports dominate the time of these tests).

A case is a picklable ``(function, kwargs)``; the function runs on every rank as
``function(rank, world, **kwargs)`` with the default group initialised and raises on failure.
"""
from __future__ import annotations

import datetime
import os
import tempfile
import traceback
from typing import Callable, Dict, List, Sequence, Tuple

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

import flashattn

Case = Tuple[str, Callable, Dict]


def _worker(rank: int, world: int, init_file: str, cases: Sequence[Case], result_dir: str,
            seed: int, backend: str) -> None:
    if backend == "nccl":
        torch.cuda.set_device(rank)
    else:
        os.environ.setdefault("TRITON_INTERPRET", "1")
        torch.set_num_threads(1)
    # a bounded timeout: a collective that a failing rank never joins raises instead of hanging
    dist.init_process_group(backend, init_method=f"file://{init_file}", rank=rank,
                            world_size=world, timeout=datetime.timedelta(seconds=120))
    failures: List[str] = []
    try:
        for name, fn, kwargs in cases:
            torch.manual_seed(seed)  # the same full inputs on every rank
            try:
                if backend == "gloo":  # the cpu attention path (not the interpreted kernels)
                    with flashattn.use_backend("cpu"):
                        fn(rank, world, **kwargs)
                else:
                    fn(rank, world, **kwargs)
            except Exception:  # noqa: BLE001 - reported per case
                failures.append(f"[rank {rank}] {name}:\n{traceback.format_exc()}")
            dist.barrier()
    finally:
        with open(os.path.join(result_dir, f"rank{rank}.txt"), "w") as f:
            f.write("\n".join(failures))
        dist.destroy_process_group()
    # The results are on disk: end now. A normal interpreter exit after transformers was
    # imported sometimes aborted in a C++ thread's destructor ("terminate called without an
    # active exception"), which mp.spawn reports as a failed process.
    os._exit(0)


def run(world: int, cases: Sequence[Case], seed: int = 0, backend: str = "gloo") -> List[str]:
    """Run ``cases`` on ``world`` processes (gloo on CPU, or NCCL with one GPU each); the
    failures of every rank."""
    with tempfile.TemporaryDirectory() as tmp:
        init_file = os.path.join(tmp, "rendezvous")
        mp.spawn(_worker, args=(world, init_file, list(cases), tmp, seed, backend), nprocs=world,
                 join=True)
        out = []
        for r in range(world):
            text = open(os.path.join(tmp, f"rank{r}.txt")).read()
            if text:
                out.append(text)
        return out
