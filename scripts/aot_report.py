#!/usr/bin/env python
"""Compile the portable kernels for sm_90 without a GPU and print registers / spills / shared.

Every variant comes from a real call of the wrappers (``triton.fwd.flash_fwd``,
``triton.bwd.flash_bwd``, their varlen forms) whose launches are recorded instead of run
(``tools.aot_portable``), then compiled with ``triton.compile(..., target=GPUTarget("cuda", 90, 32))``
and measured with the bundled ``ptxas -v --gpu-name sm_90a``. By default: every candidate
config of every autotune space x head dims {64, 128, 256} x {plain, causal} in bf16, plus the
feature variants (softcap, alibi, dropout, fp32, local window, varlen, atomic dQ) with the
first config; TMA descriptors on, as on sm90.

    python scripts/aot_report.py                          # the full sweep
    python scripts/aot_report.py --kernels fwd --d 128 -j 2 --json /tmp/aot.json
    python scripts/aot_report.py --configs first --features none --strict

Exit status: 1 if a variant fails to compile; with --strict also if one spills registers
or needs more shared memory than an sm90 block can have. Runs without TRITON_INTERPRET
(re-executes itself without it when set: the interpreter compiles nothing).
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time

_REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if _REPO not in sys.path:  # tools/ (the AOT helpers) is importable from the repository root
    sys.path.insert(0, _REPO)


def _csv(text: str):
    return [t.strip() for t in text.split(",") if t.strip()]


def _parse(argv):
    from tools.aot_portable import FEATURES, HEAD_DIMS

    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--kernels", default="fwd,bwd",
                   help="comma list: fwd, bwd (all backward kernels) or preprocess, dkdv, dq "
                        "(default: fwd,bwd)")
    p.add_argument("--d", default=",".join(map(str, HEAD_DIMS)),
                   help="head dims, comma list (default: 64,128,256)")
    p.add_argument("--configs", choices=("all", "first"), default="all",
                   help="every candidate config of each autotune space, or the first only")
    p.add_argument("--masks", default="plain,causal", help="comma list of plain, causal")
    p.add_argument("--features", default=",".join(FEATURES),
                   help=f"feature variants (first config), comma list or 'none' "
                        f"(default: {','.join(FEATURES)})")
    p.add_argument("--seqlen", type=int, default=256,
                   help="seqlen_q = seqlen_k of the recorded calls (only sets the JIT's "
                        "divisibility hints; default 256)")
    p.add_argument("--no-tma", action="store_true",
                   help="record the pointer-load path (pre-Hopper GPUs) instead of TMA")
    p.add_argument("-j", "--jobs", type=int, default=1, help="parallel compile processes")
    p.add_argument("--json", metavar="PATH", help="also write the rows as JSON")
    p.add_argument("--strict", action="store_true",
                   help="exit 1 also on register spills or shared memory over the sm90 limit")
    p.add_argument("-q", "--quiet", action="store_true", help="no per-variant progress on stderr")
    args = p.parse_args(argv)
    try:
        args.d = [int(x) for x in _csv(args.d)]
    except ValueError:
        p.error(f"--d: expected comma-separated integers, got {args.d!r}")
    args.kernels = _csv(args.kernels)
    args.masks = _csv(args.masks)
    bad = [m for m in args.masks if m not in ("plain", "causal")]
    if bad:
        p.error(f"--masks: unknown {bad}; allowed plain, causal")
    args.features = [] if args.features.strip() in ("", "none") else _csv(args.features)
    bad = [f for f in args.features if f not in FEATURES]
    if bad:
        p.error(f"--features: unknown {bad}; allowed {', '.join(FEATURES)} or none")
    return args


def main(argv=None) -> int:
    if os.environ.get("TRITON_INTERPRET", "0") not in ("", "0"):
        env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
        os.execve(sys.executable, [sys.executable, os.path.abspath(__file__), *sys.argv[1:]], env)
    try:
        import flashattn  # noqa: F401
    except ImportError:  # a checkout without `pip install -e .`
        sys.path.insert(0, os.path.join(_REPO, "src"))
    from tools import aot_portable as _aot

    args = _parse(argv)
    t0 = time.perf_counter()
    jobs = _aot.portable_variants(args.kernels, args.d, configs=args.configs, masks=args.masks,
                                  features=args.features, seqlen=args.seqlen, tma=not args.no_tma)
    if not jobs:
        print("no variant selected", file=sys.stderr)
        return 2

    def progress(done, total, r):
        if not args.quiet:
            state = (f"{r.registers} regs, {r.spill_stores}/{r.spill_loads} B spilled"
                     if r.ok else "FAILED")
            print(f"[{done}/{total}] {r.kernel} [{r.variant}] {r.config}: {state} "
                  f"({r.compile_seconds:.1f} s)", file=sys.stderr, flush=True)

    reports = _aot.compile_all(jobs, workers=args.jobs, progress=progress)
    wall = time.perf_counter() - t0
    print(_aot.format_table(reports))

    failed = [r for r in reports if not r.ok]
    spilled = [r for r in reports if r.ok and r.spills]
    over = [r for r in reports if r.ok and r.shared_bytes > _aot.SM90_SHARED_LIMIT]
    print(f"\n{len(reports)} variants, {len(failed)} failed, {len(spilled)} spill, "
          f"{len(over)} over {_aot.SM90_SHARED_LIMIT // 1024} KiB shared; {wall:.0f} s wall "
          f"with {args.jobs} process(es)")
    if spilled:
        print("\nSpilling (the autotuner should not offer these):")
        for r in spilled:
            print(f"  {r.kernel} [{r.variant}] {r.config}: {r.registers} regs, "
                  f"{r.spill_stores} B spill stores, {r.spill_loads} B spill loads")
    if over:
        print(f"\nShared memory over {_aot.SM90_SHARED_LIMIT} B:")
        for r in over:
            print(f"  {r.kernel} [{r.variant}] {r.config}: {r.shared_bytes} B")
    if failed:
        print("\nFailed:")
        for r in failed:
            print(f"  {r.kernel} [{r.variant}] {r.config}:")
            print("    " + (r.error or "").replace("\n", "\n    "))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(dict(target="cuda sm_90a", seqlen=args.seqlen, tma=not args.no_tma,
                           shared_limit=_aot.SM90_SHARED_LIMIT, wall_seconds=wall,
                           rows=[r.to_json() for r in reports]), f, indent=1)
    if failed or (args.strict and (spilled or over)):
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
