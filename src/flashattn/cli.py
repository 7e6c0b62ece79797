"""``python -m flashattn bench|check|info`` (also the ``flashattn`` console script).

- ``info``: versions, the device, and which backend dispatch picks.
- ``check``: a per-feature correctness self-test on this machine's device against the float64
  reference; a pass/fail table, exit status 1 on any failure.
- ``bench``: on a CUDA machine, the benchmark grid of ``benchmarks/bench.py`` (our kernels
  beside SDPA flash / cuDNN, Flex and FlashAttention-4 where ``flash_attn.cute`` imports);
  without a GPU, a CPU demo (exactness on a few shapes, then peak memory of our path vs naive
  attention as the sequence grows).

Heavy imports (torch, triton, matplotlib) happen inside the commands, so ``--help`` is quick.
"""
from __future__ import annotations

import argparse
import os
import platform
import sys
import time
from pathlib import Path
from types import ModuleType
from typing import Any, List, Optional, Sequence

from flashattn.report import format_table

# ---------------------------------------------------------------------------------------------
# Helpers
# ---------------------------------------------------------------------------------------------
def load_bench() -> ModuleType:
    """The benchmark grid (:mod:`flashattn.bench`, part of the installed package)."""
    from flashattn import bench

    return bench


def _csv(item: Any) -> Any:
    def parse(text: str) -> List[Any]:
        try:
            return [item(p.strip()) for p in text.split(",") if p.strip()]
        except ValueError as exc:
            raise argparse.ArgumentTypeError(str(exc)) from None
    return parse


def _seqlen(text: str) -> int:
    """'512' -> 512, '2k' -> 2048, '1m' -> 1048576 (k = 1024). The same rule as
    benchmarks/bench.py:parse_seqlen, kept here so parsing works without the benchmarks folder."""
    t = text.strip().lower()
    mult = 1
    if t.endswith("k"):
        mult, t = 1024, t[:-1]
    elif t.endswith("m"):
        mult, t = 1024 * 1024, t[:-1]
    try:
        value = float(t) * mult
    except ValueError:
        raise ValueError(f"not a sequence length: {text!r} (examples: 512, 2k, 16k)") from None
    if value != int(value) or value < 1:
        raise ValueError(f"not a sequence length: {text!r} (examples: 512, 2k, 16k)")
    return int(value)


def _dtype_name(text: str) -> str:
    aliases = {"fp16": "fp16", "float16": "fp16", "half": "fp16", "bf16": "bf16",
               "bfloat16": "bf16", "fp32": "fp32", "float32": "fp32", "float": "fp32",
               "fp8": "fp8", "e4m3": "fp8", "float8_e4m3fn": "fp8"}
    if text.lower() not in aliases:
        raise ValueError(f"unknown dtype {text!r}; allowed: fp16, bf16, fp32, fp8")
    return aliases[text.lower()]


def _mode(text: str) -> str:
    if text not in ("fwd", "bwd", "decode", "mem", "quant"):
        raise ValueError(f"unknown mode {text!r}; allowed: fwd, bwd, decode, mem, quant")
    return text


def _rounds(text: str) -> int:
    """A --rounds count: an integer >= 1, checked while parsing (before any GPU work)."""
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be an integer >= 1, got {text!r}")
    return value


def _impl(text: str) -> str:
    """An --impl name, checked while parsing so a typo stops the run on any machine."""
    return load_bench().check_impl(text)


def _say(*parts: Any) -> None:
    print(*parts, file=sys.stderr, flush=True)


# ---------------------------------------------------------------------------------------------
# Parser
# ---------------------------------------------------------------------------------------------
def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(
        prog="flashattn",
        description="flashattn: exact FlashAttention for PyTorch in Triton (flash-attn 2 API).")
    sub = ap.add_subparsers(dest="command", metavar="{bench,check,info}")
    sub.required = True

    b = sub.add_parser(
        "bench", help="benchmark grid on a GPU (CPU demo without one)",
        description="TFLOP/s of flashattn beside the anchors (SDPA flash / cuDNN, Flex, "
                    "FlashAttention-4) on the grid of shared/ANCHORS.md: 16k tokens "
                    "(b = 16384 / s), hidden 2048 (h = 2048 / d), bf16. Without a CUDA GPU: "
                    "exactness and memory demo on CPU.")
    b.add_argument("--d", type=_csv(int), default=None, metavar="D[,D]",
                   help="head dims (default 128,64,256; --quick: 128; CPU demo: 64)")
    b.add_argument("--causal", action=argparse.BooleanOptionalAction, default=None,
                   help="only causal (--causal) or only non-causal (--no-causal); default both "
                        "(CPU demo: causal)")
    b.add_argument("--seqlens", type=_csv(_seqlen), default=None, metavar="S[,S]",
                   help="sequence lengths, e.g. 512,2k,16k (default 512..16k; --quick: 2k,16k; "
                        "CPU demo: 1k..8k memory, 1k,4k speed)")
    b.add_argument("--mode", type=_csv(_mode), default=None, metavar="M[,M]",
                   help="fwd, bwd, decode, mem, quant (the FP8 quantize pass) (default fwd,bwd; "
                        "--dtype fp8: fwd,quant)")
    b.add_argument("--impl", type=_csv(_impl), default=None, metavar="I[,I]",
                   help="flashattn, flashattn-portable, sdpa-flash, sdpa-cudnn, sdpa-math, flex, "
                        "fa4 (FlashAttention-4: flash_attn.cute.flash_attn_func of the "
                        "flash-attn-4 package; skipped with one line where it does not import) "
                        "(default flashattn,sdpa-flash,sdpa-cudnn,flex,fa4; GPU only)")
    b.add_argument("--dtype", choices=("bf16", "fp8"), default="bf16",
                   help="fp8: FP8 forward rows (flashattn-fp8 on pre-quantized inputs, "
                        "flashattn-fp8-e2e = flash_attn_fp8_func, flashattn-fp8-fa3 = "
                        "FA3's API on e4m3 tensors with per-head descales, the quantize pass "
                        "alone) "
                        "beside our bf16 forward and cuDNN's in the same run (default bf16; "
                        "fp8: GPU only)")
    b.add_argument("--flex-all-d", action="store_true",
                   help="run flex at every head dim (default: d=128 only; GPU only)")
    b.add_argument("--json", metavar="PATH", default=None,
                   help="merge rows into this file (default benchmarks/results/<gpu>.json; "
                        "CPU demo: write its tables to this file, none by default)")
    b.add_argument("--no-save", action="store_true", help="do not write any result file")
    b.add_argument("--plot", metavar="PATH.png", default=None,
                   help="TFLOP/s vs seqlen per impl (CPU demo: its speed and memory tables); "
                        "needs matplotlib")
    b.add_argument("--quick", action="store_true",
                   help="small grid (d=128, s=2k,16k) and short timing (CPU demo: s=1k,2k "
                        "memory, 1k fp32 speed)")
    b.add_argument("--warmup", type=int, default=None, metavar="MS",
                   help="do_bench warm-up in ms (default 25; --quick 10; GPU only)")
    b.add_argument("--rep", type=int, default=None, metavar="MS",
                   help="do_bench repetition time in ms (default 100; --quick 30; GPU only)")
    b.add_argument("--rounds", type=_rounds, default=1, metavar="N",
                   help="measure each point N times, its implementations interleaved (the "
                        "order reversed every other round); a row keeps its best round and "
                        "every round's value (default 1; GPU only)")
    b.add_argument("--time-budget", type=float, default=None, metavar="SECONDS",
                   help="start no new point after this many seconds (results so far are kept)")
    b.add_argument("--report-only", action="store_true",
                   help="measure nothing: print tables (and --plot) of the rows in --json")
    b.add_argument("--cpu", action="store_true", help="run the CPU demo even if a GPU is present")

    c = sub.add_parser(
        "check", help="per-feature correctness self-test against the float64 reference",
        description="Each feature (causal, windows, softcap, ALiBi, GQA/MQA, dropout, dtypes, odd "
                    "head dims, d_v != d_qk, strided inputs), forward and backward, against the "
                    "float64 reference with flash-attn's accuracy rule; fp8: the FP8 forward's "
                    "entry points against the FP8 oracle with FA3's numerics. Exit status 1 on "
                    "failure.")
    c.add_argument("--device", choices=("cuda", "cpu"), default=None,
                   help="default: cuda if available, else cpu")
    c.add_argument("--dtype", type=_csv(_dtype_name), default=None, metavar="T[,T]",
                   help="fp16,bf16,fp32,fp8 (default all; --quick: bf16)")
    c.add_argument("--backend", choices=("auto", "portable", "cpu", "hopper"), default=None,
                   help="force FLASHATTN_BACKEND for the check")
    c.add_argument("--quick", action="store_true", help="fewer head dims, bf16 only")
    c.add_argument("-k", dest="only", default=None, metavar="TEXT",
                   help="only the cases whose name contains TEXT")
    c.add_argument("--time-budget", type=float, default=None, metavar="SECONDS",
                   help="report cases past this many seconds as SKIP")
    c.add_argument("-v", "--verbose", action="store_true", help="print each case as it finishes")

    sub.add_parser("info", help="versions, device, and the backend dispatch picks")
    return ap


# ---------------------------------------------------------------------------------------------
# info
# ---------------------------------------------------------------------------------------------
# torch / triton pairs this release was tested with, and which kernels each one gets (README:
# Install). The Hopper path's per-version status comes from flashattn.backends.sm90.support.
TESTED_PAIRS = (
    ("2.11.0+cu130", "3.6.0", "H100: GPU tests + benchmark grid; Gluon (Hopper) kernels on sm90"),
    ("2.11.0+cu130", "3.9.0", "H100: GPU tests + 16k grid; Gluon kernels on sm90"),
    ("2.13.0 (CPU)", "3.6.0", "CI: the full CPU suite (interpreter) + sm_90 AOT of every kernel"),
    ("2.13.0 (CPU)", "3.9.0", "CI: sm_90 AOT of every Gluon variant"),
    ("2.13.0 (CPU)", "3.7.1 / 3.8.0",
     "CI: sm_90 AOT of the default Gluon configs (Gluon kernels on; not run on a GPU)"),
)


def _print_tested_versions() -> None:
    print("\ntested torch / triton pairs:")
    print(format_table(["torch", "triton", "what ran"], [list(p) for p in TESTED_PAIRS]))
    try:
        from flashattn.backends.sm90 import support

        print("Gluon (Hopper) kernels by triton version (on by default with each):")
        for minor, how in support.GLUON_TRITON.items():
            kind = "GPU-verified" if minor in support.GPU_VERIFIED_TRITON else "compile-verified"
            print(f"  triton {minor}: {kind}; {how}")
        print("  other releases: the portable kernels, with one warning")
        why = support.gluon_unavailable()
        print(f"  this triton ({support.triton_version()}): "
              + ("Hopper kernels on (sm90)" if why is None else why))
    except Exception as exc:  # pragma: no cover - triton missing or broken
        print(f"  (Gluon status unavailable: {type(exc).__name__}: {exc})")
    print()


def cmd_info(args: argparse.Namespace) -> int:
    import torch

    import flashattn

    print(f"flashattn {getattr(flashattn, '__version__', '?')}  ({Path(flashattn.__file__).parent})")
    print(f"python    {platform.python_version()} ({platform.platform()})")
    print(f"torch     {torch.__version__}  cuda {torch.version.cuda}  "
          f"cudnn {torch.backends.cudnn.version() if torch.backends.cudnn.is_available() else None}")
    try:
        import triton

        print(f"triton    {triton.__version__}")
    except Exception as exc:  # no triton: the CPU path still works
        print(f"triton    not importable ({type(exc).__name__}: {exc})")
    try:
        import numpy

        print(f"numpy     {numpy.__version__}")
    except ImportError:
        print("numpy     not installed")
    _print_tested_versions()
    from flashattn.runtime import env

    print("\nenvironment variables flashattn reads (README: Environment variables):")
    for var, value in env.effective_values().items():
        print(f"  {var}={value}")
    cuda_visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    print("  CUDA_VISIBLE_DEVICES=" + (f"{cuda_visible!r}" if cuda_visible is not None
                                       else "(unset: every device)"))
    devices = ["cpu"]
    if torch.cuda.is_available():
        for i in range(torch.cuda.device_count()):
            p = torch.cuda.get_device_properties(i)
            print(f"cuda:{i}    {p.name}  sm_{p.major}{p.minor}  {p.multi_processor_count} SMs  "
                  f"{p.total_memory / 2**30:.1f} GiB")
        devices.append("cuda")
    else:
        print("cuda      no CUDA device visible (CPU only)")
    try:
        from flashattn.dispatch import select as dispatch
    except Exception as exc:
        print(f"dispatch  not importable: {type(exc).__name__}: {exc}")
        return 1
    print("\nbackend dispatch picks (FLASHATTN_BACKEND value -> backend, per device):")
    requests = ("auto", "portable", "cpu", "hopper")
    lines = []
    old = env.settings().backend
    for dev in devices:
        line = [dev]
        for req in requests:
            with flashattn.use_backend(req):
                try:
                    line.append(dispatch.backend_for(torch.device(dev)))
                except Exception as exc:
                    line.append(f"refused ({type(exc).__name__})")
        lines.append(line)
    print(format_table(["device"] + list(requests), lines))
    try:
        current = dispatch.backend_for(torch.device(devices[-1]))
        print(f"\nnow (FLASHATTN_BACKEND={old or 'auto'}): {devices[-1]} tensors -> {current}")
    except Exception as exc:
        print(f"\nnow: {devices[-1]} tensors -> refused: {exc}")
    # Kernel family of dense forward calls: 'hopper' (Gluon, sm90) refines 'portable'.
    if hasattr(dispatch, "family_for"):
        for dev in devices:
            try:
                family = dispatch.family_for(torch.device(dev))
                why = dispatch.hopper_reason(torch.device(dev))
                print(f"family    {dev} -> {family}" + (f"  (no hopper: {why})" if why else
                      "  (uncovered calls fall back to portable)"))
            except Exception as exc:
                print(f"family    {dev} -> refused ({type(exc).__name__})")
    return 0


# ---------------------------------------------------------------------------------------------
# check
# ---------------------------------------------------------------------------------------------
def cmd_check(args: argparse.Namespace) -> int:
    import torch

    from flashattn import check as sc

    device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    if device == "cuda" and not torch.cuda.is_available():
        _say("check: --device cuda but no CUDA device is visible")
        return 2
    dtypes = args.dtype or (["bf16"] if args.quick else ["fp16", "bf16", "fp32", "fp8"])
    with sc.forced_backend(args.backend):
        from flashattn.dispatch import select as dispatch

        try:
            backend = dispatch.backend_for(torch.device(device))
        except Exception as exc:
            _say(f"check: backend refused on {device}: {exc}")
            return 2
        name = torch.cuda.get_device_name() if device == "cuda" else platform.processor() or "cpu"
        family = dispatch.family_for(torch.device(device))
        if family != backend:  # (sm90: the Gluon kernels where they cover a call, else portable)
            backend = f"{backend} ({family} kernels where they cover the call)"
        print(f"flashattn check on {device} ({name}), backend {backend}, dtypes {','.join(dtypes)}")

        def progress(r: Any) -> None:
            if args.verbose:
                _say(f"{r.status:<5} {r.case.name} [{r.dtype}] {r.seconds:.1f}s {r.note}")

        t0 = time.perf_counter()
        results = sc.run_check(device, dtypes, quick=args.quick, time_budget_s=args.time_budget,
                               only=args.only, progress=progress)
    headers, lines = sc.result_lines(results)
    print(format_table(headers, lines))
    failed = [r for r in results if r.failed]
    passed = sum(r.status == "PASS" for r in results)
    skipped = sum(r.status == "SKIP" for r in results)
    print(f"\n{passed} passed, {len(failed)} failed" + (f", {skipped} skipped" if skipped else "")
          + f" in {time.perf_counter() - t0:.1f} s")
    return 1 if failed or not results else 0


# ---------------------------------------------------------------------------------------------
# bench
# ---------------------------------------------------------------------------------------------
# Flags of the GPU grid the CPU demo has no counterpart for (it times flash_attn_func beside
# SDPA, not a grid of impls and modes with do_bench): given to the demo they stop the run with
# a message instead of being silently ignored.
_GPU_ONLY_FLAGS = (("impl", "--impl"), ("mode", "--mode"), ("warmup", "--warmup"),
                   ("rep", "--rep"), ("flex_all_d", "--flex-all-d"))


def _cpu_refusal(args: argparse.Namespace) -> Optional[str]:
    """Why the CPU demo cannot honour these arguments (None when it can)."""
    given = [flag for attr, flag in _GPU_ONLY_FLAGS if getattr(args, attr) not in (None, False)]
    if args.dtype == "fp8":
        given.append("--dtype fp8")
    if not given:
        return None
    return (f"{', '.join(given)} {'needs' if len(given) == 1 else 'need'} a CUDA GPU (the "
            "benchmark grid); without one, bench runs the CPU demo, which takes --quick, --d, "
            "--causal / --no-causal, --seqlens, --time-budget, --json, --no-save and --plot")


def _cpu_route(s: int, d: int, causal: bool, dtype: Any) -> str:
    """Which CPU route a dense (1, s, h, d) call of the demo runs (the rule of cpu/backend.py):
    PyTorch's CPU flash kernel where it computes the call exactly, else our chunked path."""
    import torch

    from flashattn.backends.cpu import aten_flash
    from flashattn.params import AttnParams

    x = torch.empty(1, s, 1, d, dtype=dtype)
    p = AttnParams(softmax_scale=d ** -0.5, causal=causal, window_left=-1,
                   window_right=0 if causal else -1, softcap=0.0, alibi_slopes=None,
                   dropout_p=0.0, philox_seed=0)
    return "PyTorch's CPU flash kernel" if aten_flash.covers(x, x, x, p) else "chunked torch"


def _cpu_demo(args: argparse.Namespace) -> int:
    import torch

    from flashattn import check as sc
    from flashattn.dispatch import select as dispatch

    refusal = _cpu_refusal(args)
    if refusal:
        _say(f"bench: {refusal}")
        return 2
    try:
        backend = dispatch.backend_for(torch.device("cpu"))
    except Exception as exc:
        _say(f"bench: no backend for CPU tensors: {exc}")
        return 2
    causal = True if args.causal is None else args.causal
    head_dims = args.d or [64]
    deadline = None if args.time_budget is None else time.perf_counter() + args.time_budget
    skipped = 0

    def in_budget() -> bool:
        nonlocal skipped
        if deadline is not None and time.perf_counter() > deadline:
            skipped += 1
            return False
        return True

    print("No CUDA GPU here: running the CPU demo (the benchmark grid needs a GPU).")
    # The cpu backend sends each call to PyTorch's own CPU flash kernel where that kernel
    # computes it exactly, and to our chunked torch path otherwise: say so, and name the route
    # of the timed sections below.
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads, backend '{backend}'"
          + (" (Triton interpreter: slow; memory and speed below: the cpu backend)"
             if backend == "portable" else
             " (PyTorch's CPU flash kernel where it computes a call exactly, else chunked torch)"))

    print("\n1) Exactness vs the float64 reference (max|ours - ref| <= 2x torch's own "
          "low-precision error + atol; grads 3x)")
    results = [sc.run_case(case, dtype, "cpu") for case, dtype in sc.demo_cases()]
    headers, lines = sc.result_lines(results)
    print(format_table(headers, lines))
    exact = all(r.status == "PASS" for r in results)
    print("exactness:", "PASS" if exact else "FAIL")

    seqlens = args.seqlens or ([1024, 2048] if args.quick else [1024, 2048, 4096, 8192])
    kind = "causal" if causal else "non-causal"
    memory: List[dict] = []
    for d in head_dims:
        print(f"\n2) Peak extra memory of one forward + backward, fp32, b=1, h=2, d={d}, {kind} "
              f"(resident set growth); route: {_cpu_route(seqlens[0], d, causal, torch.float32)}")
        # The Triton interpreter's memory says nothing about the kernels: measure the torch path.
        rows = []
        with sc.forced_backend("cpu" if backend == "portable" else None):
            for s in seqlens:
                if in_budget():
                    rows += sc.memory_rows([s], d=d, causal=causal,
                                           progress=lambda r: _say(f"  s={r.s} done"))
        mem_lines = []
        for r in rows:
            ratio = (f"{r.naive_mib / r.ours_mib:.1f}x" if r.ours_mib and r.naive_mib is not None
                     else "-")
            mem_lines.append([
                str(r.s),
                "n/a" if r.ours_mib is None else f"{r.ours_mib:.1f}",
                "-" if r.naive_mib is None else f"{r.naive_mib:.1f}",
                ratio, f"{r.ours_s:.2f}", f"{r.naive_s:.2f}" if r.naive_mib is not None else "-",
                r.note])
            memory.append(dict(s=r.s, d=d, causal=causal, ours_mib=r.ours_mib,
                               naive_mib=r.naive_mib, ours_s=r.ours_s, naive_s=r.naive_s,
                               note=r.note))
        print(format_table(["seqlen", "flashattn MiB", "naive MiB", "naive/ours", "ours s",
                            "naive s", "note"], mem_lines))
        if rows and rows[0].ours_mib is None:
            print("(peak memory needs Linux /proc; times only)")

    # (16k: `--seqlens 1k,4k,16k`, ~2 min)
    speed_seqlens = args.seqlens or ([1024] if args.quick else [1024, 4096])
    dtypes = [torch.float32] if args.quick else [torch.float32, torch.bfloat16]
    bench = load_bench()
    speed: List[dict] = []
    for d in head_dims:
        routes = sorted({_cpu_route(s, d, causal, dt) for s in speed_seqlens for dt in dtypes})
        print(f"\n3) Speed: fwd + bwd, {kind}, b=1, h=8, d={d}, ms (fastest call of 3 rounds of "
              f"blocks), beside PyTorch SDPA on the same tensors ({torch.get_num_threads()} "
              f"threads); route: {' / '.join(routes)}")
        rows = []
        with sc.forced_backend("cpu" if backend == "portable" else None):
            for dt in dtypes:
                for s in speed_seqlens:
                    if in_budget():
                        rows += bench.cpu_speed_rows([s], dtypes=[dt], head_dim=d, causal=causal)
        speed += rows
        print(format_table(["dtype", "seqlen", "flashattn ms", "sdpa ms", "speed vs sdpa"],
                           [[r["dtype"], str(r["s"]), f"{r['ours_ms']:.1f}", f"{r['sdpa_ms']:.1f}",
                             f"{r['speed']:.2f}x"] for r in rows]))
    if skipped:
        print(f"\n{skipped} measurements not run (--time-budget {args.time_budget:g} s)")
    if args.json and not args.no_save:
        import json

        out = Path(args.json)
        out.parent.mkdir(parents=True, exist_ok=True)
        doc = dict(device="cpu", backend=backend, torch=torch.__version__,
                   threads=torch.get_num_threads(),
                   exactness=[dict(case=r.case.name, dtype=r.dtype, status=r.status, note=r.note)
                              for r in results],
                   memory=memory, speed=speed)
        out.write_text(json.dumps(doc, indent=1) + "\n")
        print(f"results: {out}")
    if args.plot and not (speed or memory):
        _say("bench: --plot: nothing measured to plot (every point was past --time-budget)")
        return 1
    if args.plot:
        out = bench.plot_cpu(speed, memory, args.plot,
                             title=f"flashattn CPU demo, torch {torch.__version__}, "
                                   f"{torch.get_num_threads()} threads")
        print(f"plot: {out}")
    print("\nThe GPU grid: python -m flashattn bench on a CUDA machine (see README).")
    return 0 if exact else 1


def _bench_config(args: argparse.Namespace, bench: ModuleType) -> dict:
    quick = args.quick
    fp8 = getattr(args, "dtype", "bf16") == "fp8"
    return dict(
        head_dims=args.d or ([128] if quick else list(bench.HEAD_DIMS)),
        causals=[args.causal] if args.causal is not None else [False, True],
        seqlens=args.seqlens or ([2048, 16384] if quick else list(bench.SEQLENS)),
        modes=args.mode or (["fwd", "quant"] if fp8 else ["fwd", "bwd"]),
        impls=args.impl or list(bench.FP8_DEFAULT_IMPLS if fp8 else bench.DEFAULT_IMPLS),
        timing=bench.Timing(
            warmup_ms=args.warmup if args.warmup is not None else (10 if quick else 25),
            rep_ms=args.rep if args.rep is not None else (30 if quick else 100)),
    )


def _matplotlib_missing() -> bool:
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        return True
    return False


def cmd_bench(args: argparse.Namespace) -> int:
    bench = load_bench()
    if args.plot and _matplotlib_missing():
        # Said before measuring anything: a run that cannot draw what was asked for stops here
        # rather than after minutes of timing.
        _say("bench: --plot needs matplotlib, which is not installed in this environment: "
             "pip install matplotlib (in a checkout: pip install -e '.[bench]'; "
             "scripts/setup.sh installs it)")
        return 2
    if args.report_only:
        if not args.json:
            _say("bench: --report-only needs --json PATH")
            return 2
        rows = bench.load_rows(args.json)
        print(bench.render_tables(rows) or "(no rows)")
        if args.plot and rows:
            _plot(bench, rows, args.plot)
        return 0

    import torch

    if args.cpu or not torch.cuda.is_available():
        return _cpu_demo(args)

    cfg = _bench_config(args, bench)
    try:
        for impl in cfg["impls"]:
            bench.check_impl(impl)
    except ValueError as exc:
        _say(f"bench: {exc}")
        return 2
    import flashattn

    pairs = bench.plan(modes=cfg["modes"], head_dims=cfg["head_dims"], causals=cfg["causals"],
                       seqlens=cfg["seqlens"], impls=cfg["impls"], flex_all_d=args.flex_all_d)
    pairs = bench.drop_unavailable(pairs, say=_say)  # fa4 without flash_attn.cute: one line
    if not hasattr(flashattn, "flash_attn_with_kvcache"):
        # our decode row comes with flash_attn_with_kvcache; until then anchors only
        pairs = [(p, i) for p, i in pairs if not (p.mode == "decode" and bench.is_ours(i))]
    env = bench.environment()
    json_path = None if args.no_save else Path(args.json or bench.default_results_path(env["gpu"]))
    _say(f"bench: {len(pairs)} measurements x {args.rounds} round(s) on {env['gpu']}, torch "
         f"{env['torch']}, triton {env['triton']}; do_bench warmup {cfg['timing'].warmup_ms} "
         f"ms, rep {cfg['timing'].rep_ms} ms" + (f"; results -> {json_path}" if json_path
                                                  else ""))

    def save(row: dict) -> None:
        if json_path is not None:
            bench.save_rows(json_path, [row])

    rows, skipped = bench.run(pairs, timing=cfg["timing"], time_budget_s=args.time_budget,
                              on_row=save, rounds=args.rounds)
    print(bench.render_tables(rows) or "(no rows)")
    if skipped:
        print(f"\n{skipped} measurements not run (time budget or interrupt)")
    if args.plot and rows:
        _plot(bench, rows, args.plot)
    ours_failed = [r for r in rows if bench.is_ours(r["impl"]) and r.get("error")]
    if ours_failed:
        _say(f"bench: {len(ours_failed)} flashattn measurements failed")
        return 1
    return 0


def _plot(bench: ModuleType, rows: List[dict], path: str) -> None:
    try:
        out = bench.plot(rows, path)
    except ImportError:
        _say("bench: --plot needs matplotlib (pip install matplotlib); skipped")
        return
    print(f"plot: {out}")


# ---------------------------------------------------------------------------------------------
def main(argv: Optional[Sequence[str]] = None) -> int:
    args = build_parser().parse_args(argv)
    handler = {"bench": cmd_bench, "check": cmd_check, "info": cmd_info}[args.command]
    try:
        return handler(args)
    except KeyboardInterrupt:
        _say("interrupted")
        return 130
    except BrokenPipeError:  # `... | head`
        return 0


if __name__ == "__main__":
    sys.exit(main())
