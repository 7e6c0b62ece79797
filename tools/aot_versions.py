"""Compile the Gluon (Hopper) kernels for sm_90 on several Triton releases (CI, no GPU).

    python -m tools.aot_versions 3.7.1 3.8.0 3.9.0

Each release is pip-installed without dependencies into ``.aot-triton/<version>`` and put in
front of the running environment's triton with PYTHONPATH (torch stays the environment's);
``tools.aot_sm90`` then compiles in a subprocess and prints one JSON report per variant. The
newest release compiles every variant of tests/backends/sm90/test_hopper_aot.py's lists, the older ones
the default configuration of every head dim (bf16 and FP8, plain and causal, forward and
backward), to keep CI within its time (cold Triton cache: ~70 s for 53 variants on 2 cores).
Prints a register / spill table per release. Exit status 1 if any variant fails to compile;
spills are reported, not judged (each release allocates registers its own way).
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from typing import List

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


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


def compile_all(version: str, scope: str) -> int:
    dest = install(version)
    variants = variant_list(scope)
    print(f"== triton {version}: sm_90 AOT of {len(variants)} Gluon variants ({scope})",
          flush=True)
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["PYTHONPATH"] = os.pathsep.join([dest, os.path.join(ROOT, "src"), ROOT])
    t0 = time.time()
    proc = subprocess.run([sys.executable, "-m", "tools.aot_sm90", json.dumps(variants)],
                          capture_output=True, text=True, env=env, cwd=ROOT)
    rows, unreadable = [], []
    for line in proc.stdout.splitlines():
        if line.startswith("{"):
            try:
                rows.append(json.loads(line))
            except json.JSONDecodeError:  # (a compile that died mid-line: e.g. a full disk)
                unreadable.append(line)
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
    print(f"  {len(rows) - len(bad)} compiled, {len(bad)} failed, {spilled} with spills "
          f"({time.time() - t0:.0f} s)", flush=True)
    if proc.returncode != 0 or len(rows) != len(variants) or unreadable:
        print(proc.stderr[-3000:])
        return 1
    return 1 if bad else 0


def main(argv=None) -> int:
    versions = (argv if argv is not None else sys.argv[1:]) or ["3.7.1", "3.8.0", "3.9.0"]
    newest = max(versions, key=lambda v: tuple(int(x) for x in v.split(".")))
    status = 0
    for v in versions:
        status |= compile_all(v, "all" if v == newest else "shipped")
    return status


if __name__ == "__main__":
    raise SystemExit(main())
