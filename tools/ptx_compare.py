#!/usr/bin/env python
"""Compare two ptx_fingerprint.py outputs: ptx_compare.py OLD_DIR NEW_DIR [--only SUBSTRING]

Prints counts (same, differ, missing on either side, failed) and, for each differing variant,
the first 40 lines of a unified diff of its stripped PTX. Exit status 1 on any difference,
any variant missing on either side, or a variant that failed on one side only (a variant
that failed on both sides is listed but does not by itself fail the comparison).
"""
from __future__ import annotations

import argparse
import difflib
import json
import os
import sys


def _load(d: str):
    """A fingerprint directory, or a fingerprint JSON file alone (e.g. the committed baseline
    benchmarks/results/ptx_fingerprint_sm90_de32c98.json: hashes only, no PTX to diff)."""
    with open(d if os.path.isfile(d) else os.path.join(d, "fingerprint.json")) as f:
        data = json.load(f)
    return data.get("meta", {}), data.get("variants", {}), data.get("failures", {})


def _ptx(d: str, key: str):
    path = os.path.join(d, "ptx", key + ".ptx")
    if not os.path.exists(path):  # a JSON baseline carries no PTX
        return [f"(no PTX stored for {key} in {d})\n"]
    with open(path) as f:
        return f.read().splitlines(keepends=True)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("old")
    ap.add_argument("new")
    ap.add_argument("--only", action="append", default=[],
                    help="compare only keys containing SUBSTRING (repeatable: any)")
    ap.add_argument("--diff-lines", type=int, default=40)
    args = ap.parse_args(argv)
    meta_a, var_a, fail_a = _load(args.old)
    meta_b, var_b, fail_b = _load(args.new)

    def keep(k):
        return not args.only or any(s in k for s in args.only)
    keys = sorted(k for k in set(var_a) | set(fail_a) | set(var_b) | set(fail_b) if keep(k))

    same, differ, miss_new, miss_old = [], [], [], []
    failed_both, failed_old_only, failed_new_only = [], [], []
    for k in keys:
        in_a, in_b = k in var_a or k in fail_a, k in var_b or k in fail_b
        if not in_b:
            miss_new.append(k)
        elif not in_a:
            miss_old.append(k)
        elif k in fail_a and k in fail_b:
            failed_both.append(k)
        elif k in fail_a:
            failed_old_only.append(k)
        elif k in fail_b:
            failed_new_only.append(k)
        elif var_a[k]["sha256"] == var_b[k]["sha256"]:
            same.append(k)
        else:
            differ.append(k)

    print(f"old: {args.old} ({meta_a.get('layout')}, {meta_a.get('git')})")
    print(f"new: {args.new} ({meta_b.get('layout')}, {meta_b.get('git')})")
    for name in ("triton", "ptxas"):
        if meta_a.get(name) != meta_b.get(name):
            print(f"WARNING: {name} differs: {meta_a.get(name)} vs {meta_b.get(name)}")

    for k in differ:
        a, b = var_a[k], var_b[k]
        print(f"\n=== DIFFERS {k}  ({a['kernel']} {a['lines']} lines -> {b['kernel']} "
              f"{b['lines']} lines)")
        try:
            diff = list(difflib.unified_diff(_ptx(args.old, k), _ptx(args.new, k),
                                             f"old/{k}.ptx", f"new/{k}.ptx", n=2))
            sys.stdout.writelines(ln if ln.endswith("\n") else ln + "\n"
                                  for ln in diff[:args.diff_lines])
            if len(diff) > args.diff_lines:
                print(f"... ({len(diff) - args.diff_lines} more diff lines)")
        except OSError as exc:
            print(f"  (cannot read PTX: {exc})")
    for title, ks in (("MISSING in new", miss_new), ("MISSING in old", miss_old)):
        for k in ks:
            print(f"{title}: {k}")
    for title, ks, src in (("FAILED in new only", failed_new_only, fail_b),
                           ("FAILED in old only", failed_old_only, fail_a),
                           ("FAILED in both", failed_both, fail_b)):
        for k in ks:
            first = (src.get(k) or "").splitlines()[:3]
            print(f"{title}: {k}\n    " + "\n    ".join(first))

    print(f"\n{len(keys)} variants: {len(same)} same, {len(differ)} differ, "
          f"{len(miss_new)} missing in new, {len(miss_old)} missing in old, "
          f"failed: {len(failed_new_only)} new only / {len(failed_old_only)} old only / "
          f"{len(failed_both)} both")
    bad = differ or miss_new or miss_old or failed_new_only or failed_old_only
    print("RESULT: " + ("DIFFERENT" if bad else "IDENTICAL"))
    return 1 if bad else 0


if __name__ == "__main__":
    raise SystemExit(main())
