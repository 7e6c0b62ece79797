"""Compile the Gluon (Hopper) kernels for sm_90 on several Triton releases (CI, no GPU).

    python -m tools.aot_versions 3.7.1 3.8.0 3.9.0

Each release is pip-installed without dependencies into ``.aot-triton/<version>`` and put in
front of the running environment's triton with PYTHONPATH (torch stays the environment's);
``tools.aot_sm90`` then compiles slices of the variants in subprocesses, one per core at a
time, each printing one JSON report per variant. The
newest release compiles every variant of tests/backends/sm90/test_hopper_aot.py's lists, the older ones
the default configuration of every head dim (bf16 and FP8, plain and causal, forward and
backward), to keep CI within its time (cold Triton cache, 2 cores, 2026-12-06: 41 + 41 + 138
variants in 544 s, 15.5 min of CPU).
Prints a register / spill table per release. Exit status 1 if any variant fails to compile;
spills are reported, not judged (each release allocates registers its own way).
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from typing import List, NamedTuple

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
_SLICE = 40  # variants per compile process (each process pays ~10 s of imports)


def variant_list(scope: str) -> List[list]:
    from tools.ptx_fingerprint import _ast_lists

    lists = _ast_lists(os.path.join(ROOT, "tests", "backends", "sm90", "test_hopper_aot.py"))
    variants = lists["VARIANTS"] + lists["BWD_VARIANTS"] + lists.get("LATENT_VARIANTS", [])
    if scope == "shipped":
        # the default configuration of every head dim, bf16 and FP8, plain and causal, forward
        # and backward (the mask / softcap / fp16 / d != d_v extras compile from the same code
        # paths; the newest release compiles them all)
        def plain(v):
            if v[0] == "latent":  # (the MLA decode kernel: every variant is shipped)
                return True
            d, dt, _causal, window, softcap, overrides = v[-6:]
            return (not overrides and tuple(window) == (-1, -1) and not softcap
                    and not isinstance(d, (list, tuple)) and dt in ("bfloat16", "float8_e4m3fn"))
        variants = [v for v in variants if plain(v)]
    return variants


def install(version: str) -> str:
    dest = os.path.join(ROOT, ".aot-triton", version)
    if not os.path.exists(os.path.join(dest, "triton", "__init__.py")):
        subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "--no-deps",
                        "--target", dest, f"triton=={version}"], check=True)
    return dest


class _Slice(NamedTuple):
    """One compile subprocess: ``variants`` on Triton ``version`` (installed at ``path``)."""

    version: str
    path: str
    variants: List[list]


class _SliceResult(NamedTuple):
    """What one compile subprocess printed: its report rows, the lines that did not parse,
    and its stderr's tail when it failed or reported fewer variants than it was given."""

    rows: List[dict]
    unreadable: List[str]
    error: str


def _compile_slice(job: _Slice) -> _SliceResult:
    """Compile one slice in a subprocess on its Triton release."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["PYTHONPATH"] = os.pathsep.join([job.path, os.path.join(ROOT, "src"), ROOT])
    proc = subprocess.run([sys.executable, "-m", "tools.aot_sm90", json.dumps(job.variants)],
                          capture_output=True, text=True, env=env, cwd=ROOT)
    rows, unreadable = [], []
    for line in proc.stdout.splitlines():
        if line.startswith("{"):
            try:
                rows.append(json.loads(line))
            except json.JSONDecodeError:  # (a compile that died mid-line: e.g. a full disk)
                unreadable.append(line)
    failed = proc.returncode != 0 or len(rows) != len(job.variants)
    return _SliceResult(rows, unreadable, proc.stderr[-3000:] if failed else "")


def _report(version: str, scope: str, n: int, results: List[_SliceResult]) -> int:
    """Prints one release's table; 1 if anything failed to compile or to report."""
    rows = [r for res in results for r in res.rows]
    unreadable = [line for res in results for line in res.unreadable]
    print(f"== triton {version}: sm_90 AOT of {n} Gluon variants ({scope})", flush=True)
    for line in unreadable:
        print(f"  UNREADABLE report line: {line[:300]}")
    bad = [r for r in rows if r.get("error")]
    for r in rows:
        if r.get("error"):
            print(f"  FAIL {r['key']}: {r['error'][-400:]}")
        else:
            print(f"  {r['key']:<60} {r['registers']:>4} regs {r['spills']:>5} spill bytes "
                  f"{r['shared'] / 1024:7.1f} KiB shared")
    spilled = sum(1 for r in rows if not r.get("error") and r["spills"])
    print(f"  {len(rows) - len(bad)} compiled, {len(bad)} failed, {spilled} with spills",
          flush=True)
    errors = [res.error for res in results if res.error]
    for err in errors:
        print(err)
    return 1 if bad or errors or unreadable or len(rows) != n else 0


def main(argv=None) -> int:
    """Every release's variants in slices of about ``_SLICE`` variants, run as concurrent
    compile processes (one per core): one process per release left the newest release's ~150
    variants on one core for ~7 minutes of CI while the other idled."""
    versions = (argv if argv is not None else sys.argv[1:]) or ["3.7.1", "3.8.0", "3.9.0"]
    newest = max(versions, key=lambda v: tuple(int(x) for x in v.split(".")))
    paths = {v: install(v) for v in versions}  # (pip, one at a time, before the compiles)
    scopes = {v: "all" if v == newest else "shipped" for v in versions}
    jobs: List[_Slice] = []
    for v in versions:
        variants = variant_list(scopes[v])
        jobs += [_Slice(v, paths[v], variants[i:i + _SLICE])
                 for i in range(0, len(variants), _SLICE)]
    t0 = time.time()
    with ThreadPoolExecutor(max_workers=max(1, os.cpu_count() or 1)) as pool:
        results = list(pool.map(_compile_slice, jobs))
    print(f"== sm_90 AOT: {len(jobs)} compile processes in {time.time() - t0:.0f} s", flush=True)
    status = 0
    for v in versions:
        mine = [res for job, res in zip(jobs, results) if job.version == v]
        n = sum(len(job.variants) for job in jobs if job.version == v)
        status |= _report(v, scopes[v], n, mine)
    return status


if __name__ == "__main__":
    raise SystemExit(main())
