#!/usr/bin/env python
"""PTX fingerprints of every shipped flashattn Triton / Gluon kernel variant, for sm_90, no GPU.

Compiles the full AOT variant list with the repo's own machinery and writes, per variant, the
PTX with debug info stripped, so that two trees (before / after a behaviour-preserving
restructuring) can be compared instruction for instruction (ptx_compare.py).

Families (keys never contain module paths, so they survive modules moving):

  portable/...        scripts/aot_report.py's full sweep: _aot.portable_variants() (every
                      candidate config of every autotune space x d 64/128/256 x plain/causal,
                      plus the feature variants), TMA on, as on sm90
  portable-notma/...  the same sweep with TMA off (the pointer path sm90 takes for unaligned
                      tensors; aot_report.py --no-tma)
  sm90/fwd|bwd/...    every Hopper (Gluon) variant of the *VARIANTS lists in
                      tests/test_hopper_aot.py, compiled by hopper/aot.py's
                      compile_fwd_variant / compile_bwd_variant
  sm90/row_stats|dq_convert/...
                      the Triton pre/post-processing kernels of the Hopper backward
                      (bwd_preprocess.py / bwd_postprocess.py), recorded from
                      flash_bwd_hopper calls for every backward variant above
  decode/...          every variant of benchmarks/decode_aot.py --all --configs 128,8,3
                      (128,8,3 is launch_config's long-unsplit contiguous choice, which the
                      script's default shapes never reach), incl. its combine / rotary rows
  extra/...           shipped specialisations the lists above miss: rotary (dense / contiguous /
                      batch-indexed / paged destination x none / NeoX / GPT-J x dtypes / dims),
                      combine (d_v x split counts x out dtype), portable GQA, fp16, d 96,
                      d != d_v, return_softmax, varlen with seqused_k (first config)

Each compile runs in its own forked process (_aot.compile_all), so a compiler crash fails
one row. TRITON_INTERPRET and FLASHATTN_* are removed from the environment, the Triton cache
is a fresh private directory and TRITON_ALWAYS_COMPILE=1 (every PTX is a real compile).

    python ptx_fingerprint.py --layout old --src /tmp/fa_old/src --repo /tmp/fa_old \
        --out <dir>/old -j 2 [--only SUBSTRING] [--families portable,sm90,...]

Writes OUT/ptx/<key>.ptx (stripped) and OUT/fingerprint.json:
  {"meta": {...}, "variants": {key: {"sha256", "lines", "kernel", ...}},
   "failures": {key: error}}
Exit status 1 if any variant failed to compile (or to be recorded).
"""
from __future__ import annotations

# --------------------------------------------------------------------------------------------
# Layouts: the ONLY place that knows where things live. Each entry: candidates tried in order;
# "file:PATH" is a file relative to --repo, anything else a module imported with --src first
# on sys.path (and --repo second, so that the package `tools` of the new layout imports).

LAYOUTS = {
    "old": {  # the tree at de32c98
        "aot_portable": ["flashattn._aot"],
        "aot_sm90": ["flashattn.hopper.aot"],
        "aot_decode": ["file:benchmarks/decode_aot.py"],
        "sm90_variants": ["file:tests/test_hopper_aot.py"],
        "sm90_bwd": ["flashattn.hopper.bwd"],
        "portable_fwd": ["flashattn.kernels.fwd"],
        "portable_bwd": ["flashattn.kernels.bwd"],
        "rotary": ["flashattn.kernels.rotary"],
        "combine": ["flashattn.kernels.combine"],
    },
    "new": {  # the restructured tree
        "aot_portable": ["tools.aot_portable", "file:tools/aot_portable.py"],
        "aot_sm90": ["tools.aot_sm90", "file:tools/aot_sm90.py"],
        "aot_decode": ["tools.aot_decode", "file:tools/aot_decode.py"],
        "sm90_variants": ["file:tests/backends/sm90/test_hopper_aot.py",
                          "file:tests/sm90/test_hopper_aot.py", "file:tests/test_hopper_aot.py"],
        # (the backends under flashattn/backends/ since 2026-11-28; before, at the top level)
        "sm90_bwd": ["flashattn.backends.sm90.bwd", "flashattn.sm90.bwd"],
        "portable_fwd": ["flashattn.backends.triton.fwd", "flashattn.triton.fwd"],
        "portable_bwd": ["flashattn.backends.triton.bwd", "flashattn.triton.bwd"],
        "rotary": ["flashattn.backends.triton.rotary", "flashattn.triton.rotary"],
        "combine": ["flashattn.backends.triton.combine", "flashattn.triton.combine"],
    },
}

# Module-path spellings that could reach PTX symbol names (a noinline function's mangled name
# is module.qualname; NVPTX writes '.' as '_$_'): rewritten to the old spelling before hashing.
# Longest first. (None appear in the stripped PTX of de32c98: every helper is inlined.)
MODULE_ALIASES = {
    "old": [],
    "new": [("flashattn.backends.triton.mask.", "flashattn.kernels.masks."),
            ("flashattn.backends.triton.", "flashattn.kernels."),
            ("flashattn.runtime.", "flashattn.kernels."),
            ("flashattn.backends.sm90.", "flashattn.hopper."),
            ("tools.aot_portable.", "flashattn._aot."),
            ("tools.aot_sm90.", "flashattn.hopper.aot.")],
}

FAMILIES = ("portable", "portable-notma", "sm90", "sm90-aux", "decode", "extra")
DECODE_ARGV = ["--all", "--configs", "128,8,3"]
SM90_DTYPES = {"bfloat16": "bf16", "float16": "fp16", "float8_e4m3fn": "fp8"}

# --------------------------------------------------------------------------------------------

import argparse
import ast
import contextlib
import hashlib
import importlib
import importlib.util
import io
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
import traceback
from typing import Any, Callable, Dict, List, Optional, Tuple


# ------------------------------------------------------------------------------ PTX stripping

_DEBUG_LABEL = re.compile(r"^\$L__(tmp|func_begin|func_end|info_string|debug)\w*:$")
_PY_PATH = re.compile(r"(/[^\s\"']+?\.py)\b")


def strip_ptx(ptx: str, path_prefixes: Tuple[str, ...] = (),
              aliases: Tuple[Tuple[str, str], ...] = ()) -> str:
    """PTX minus debug info: .loc / .file lines, .section .debug_* blocks (their bodies too),
    @@DWARF lines, comment lines and trailing // comments, debug-only labels ($L__tmpN,
    $L__func_beginN, ...), ', debug' on .target, blank lines; trailing blanks trimmed. Then
    source paths -> <SRC>/<REPO>/<path>, module spellings -> the old layout's."""
    out: List[str] = []
    depth = 0          # brace depth inside a .section .debug_* block
    in_debug = False   # inside one (or waiting for its opening brace)
    for raw in ptx.splitlines():
        s = raw.strip()
        if in_debug:
            depth += s.count("{") - s.count("}")
            if depth <= 0 and ("}" in s):
                in_debug = False
            continue
        if s.startswith(".section") and ".debug" in s:
            depth = s.count("{") - s.count("}")
            # a one-line "{ }" closes at once; otherwise wait for the brace and its close
            in_debug = not ("{" in s and depth <= 0)
            continue
        if not s or s.startswith("//") or s.startswith("@@DWARF"):
            continue
        if s.startswith(".loc") or s.startswith(".file"):
            continue
        line = raw.rstrip()
        if "//" in line:
            line = line[:line.index("//")].rstrip()
            if not line.strip():
                continue
        if _DEBUG_LABEL.match(line.strip()):
            continue
        if line.lstrip().startswith(".target"):
            line = re.sub(r"\s*,\s*debug\b", "", line)
        out.append(line)
    text = "\n".join(out) + "\n"
    for prefix, tag in path_prefixes:
        if prefix:
            text = text.replace(prefix, tag)
    text = _PY_PATH.sub("<path>", text)
    for new, old in aliases:
        text = text.replace(new, old)
        text = text.replace(new.replace(".", "_$_"), old.replace(".", "_$_"))
    return text


# --------------------------------------------------------------------------------- the layout


class Layout:
    """Resolves the names of LAYOUTS[name] against --src / --repo."""

    def __init__(self, name: str, src: str, repo: str):
        self.name, self.src, self.repo = name, src, repo
        self.table = LAYOUTS[name]
        self._cache: Dict[str, Any] = {}
        self.resolved: Dict[str, str] = {}

    def path(self, what: str) -> str:
        """The first existing file among the 'file:' candidates of ``what``."""
        for cand in self.table[what]:
            if cand.startswith("file:"):
                p = os.path.join(self.repo, cand[5:])
                if os.path.exists(p):
                    self.resolved[what] = p
                    return p
        raise FileNotFoundError(f"{what}: none of {self.table[what]} under {self.repo}")

    def get(self, what: str):
        if what in self._cache:
            return self._cache[what]
        errors = []
        for cand in self.table[what]:
            try:
                if cand.startswith("file:"):
                    p = os.path.join(self.repo, cand[5:])
                    if not os.path.exists(p):
                        errors.append(f"{p}: missing")
                        continue
                    modname = "_fp_" + re.sub(r"\W", "_", cand[5:-3])
                    spec = importlib.util.spec_from_file_location(modname, p)
                    mod = importlib.util.module_from_spec(spec)
                    sys.modules[modname] = mod
                    spec.loader.exec_module(mod)
                    self.resolved[what] = p
                else:
                    mod = importlib.import_module(cand)
                    self.resolved[what] = f"{cand} ({getattr(mod, '__file__', '?')})"
                self._cache[what] = mod
                return mod
            except Exception as exc:  # try the next candidate, report all if none works
                errors.append(f"{cand}: {type(exc).__name__}: {exc}")
        raise ImportError(f"{what}: " + "; ".join(errors))


# ------------------------------------------------------------------------------------- jobs


class Job:
    """key: the stable variant key; thunk: compiles in the child (returns the repo's report or
    a compiled kernel); error: set when enumeration already failed."""

    def __init__(self, key: str, family: str, thunk: Optional[Callable[[], Any]],
                 error: Optional[str] = None):
        self.key, self.family, self.thunk, self.error = key, family, thunk, error


def _short(exc: BaseException) -> str:
    text = f"{type(exc).__name__}: {exc}".strip()
    lines = [ln for ln in text.splitlines() if ln.strip() and not ln.startswith("Repro command")]
    return "\n".join(lines[:12])[:1500]


def _uniq(key: str, used: Dict[str, int]) -> str:
    """key, or key#2, key#3... when an enumeration yields the same label twice."""
    n = used.get(key, 0) + 1
    used[key] = n
    return key if n == 1 else f"{key}#{n}"


def _cfg_part(label: str) -> str:
    """_aot.config_label 'M128 N64 w8 s3 ws' -> 'BLOCK_M=128,BLOCK_N=64,w8,s3,WARP_SPEC'."""
    parts = []
    for tok in label.split():
        if re.fullmatch(r"M\d+", tok):
            tok = "BLOCK_M=" + tok[1:]
        elif re.fullmatch(r"N\d+", tok):
            tok = "BLOCK_N=" + tok[1:]
        elif tok == "ws":
            tok = "WARP_SPEC"
        parts.append(tok)
    return ",".join(parts) or "-"


def portable_jobs(lay: Layout, family: str, tma: bool) -> List[Job]:
    """scripts/aot_report.py's default sweep (portable_variants with its defaults)."""
    aot = lay.get("aot_portable")
    jobs, used = [], {}
    for cj in aot.portable_variants(tma=tma):
        variant = "/".join(cj.variant.split())          # "d128 causal" -> "d128/causal"
        key = _uniq(f"{family}/{cj.kernel}/{variant}/{_cfg_part(cj.config)}", used)
        jobs.append(Job(key, family, cj.run))
    return jobs


def _ast_lists(path: str) -> Dict[str, list]:
    """Top-level NAME = ... assignments of a test file whose NAME ends in VARIANTS, evaluated
    without importing the file (it imports pytest and the package under test)."""
    tree = ast.parse(open(path).read(), path)
    ns: Dict[str, Any] = {}
    lists = {}
    for node in tree.body:
        if isinstance(node, ast.Assign) and len(node.targets) == 1 \
                and isinstance(node.targets[0], ast.Name) \
                and node.targets[0].id.endswith("VARIANTS"):
            name = node.targets[0].id
            ns[name] = eval(compile(ast.Expression(node.value), path, "eval"),
                            {"__builtins__": __builtins__}, ns)
            lists[name] = list(ns[name])
    return lists


def _sm90_parts(v) -> Tuple[str, Any, str, bool, tuple, float, Optional[dict]]:
    kind, rest = (v[0], v[1:]) if isinstance(v[0], str) else ("fwd", v)
    d, dt, causal, window, softcap, ov = rest
    return kind, d, dt, causal, tuple(window), softcap, ov


def sm90_key(v) -> str:
    kind, d, dt, causal, window, softcap, ov = _sm90_parts(v)
    dims = "x".join(str(x) for x in d) if isinstance(d, (tuple, list)) else str(d)
    parts = ["sm90", kind, f"d{dims}", SM90_DTYPES.get(dt, dt), "causal" if causal else "plain"]
    if window != (-1, -1):
        parts.append(f"win{window[0]}_{window[1]}")
    if softcap:
        parts.append(f"softcap{softcap:g}")
    if ov:
        parts.append(",".join(f"{k}={int(x) if isinstance(x, bool) else x}" for k, x in ov.items()))
    return "/".join(parts)


def sm90_variant_list(lay: Layout) -> List[tuple]:
    lists = _ast_lists(lay.path("sm90_variants"))
    if not lists:
        raise ValueError(f"no *VARIANTS list in {lay.path('sm90_variants')}")
    seen, out = set(), []
    for name, items in lists.items():
        for v in items:
            k = sm90_key(v)
            if k not in seen:
                seen.add(k)
                out.append(v)
    return out


def sm90_jobs(lay: Layout) -> List[Job]:
    import torch

    aot = lay.get("aot_sm90")
    dtypes = {"bfloat16": torch.bfloat16, "float16": torch.float16,
              "float8_e4m3fn": torch.float8_e4m3fn}
    jobs = []
    for v in sm90_variant_list(lay):
        kind, d, dt, causal, window, softcap, ov = _sm90_parts(v)
        fn = {"fwd": aot.compile_fwd_variant, "bwd": aot.compile_bwd_variant,
              "latent": getattr(aot, "compile_latent_variant", None)}.get(kind)
        if fn is None:
            jobs.append(Job(sm90_key(v), "sm90", None, f"unknown variant kind {kind!r}"))
            continue
        d = tuple(d) if isinstance(d, list) else d

        def thunk(fn=fn, d=d, dt=dtypes[dt], causal=causal, window=window, softcap=softcap,
                  ov=ov):
            return fn(d, dt, causal=causal, window=window, softcap=softcap, overrides=ov)
        jobs.append(Job(sm90_key(v), "sm90", thunk))
    return jobs


def _compile_key(aot, rec) -> tuple:
    """What the compiler sees of a recorded launch (as _aot.portable_variants dedups)."""
    signature, constexprs, attrs, options = aot.launch_compile_args(rec)
    return (rec.kernel_name, json.dumps(signature, sort_keys=True),
            repr(sorted(constexprs.items())), repr(sorted(attrs.items())),
            repr(sorted(options.items())))


def _record_jobs(aot, family: str, calls, *, key_of, used, seen, tma: bool = True,
                 skip_gluon: bool = False, env: Optional[Dict[str, str]] = None) -> List[Job]:
    """calls: [(label, callable)]; each call's Triton launches are recorded (the repo's
    record_launches, sm90_launch_setup) and turned into compile jobs (compile_launch), one per
    distinct compile. key_of(label, rec) -> key."""
    jobs = []
    for label, call in calls:
        saved = {k: os.environ.get(k) for k in (env or {})}
        try:
            os.environ.update(env or {})
            # the new layout reads its variables once (flashattn.runtime.env): re-read them
            _env_mod = sys.modules.get("flashattn.runtime.env")
            if _env_mod is not None:
                _env_mod.reload()
            with aot.sm90_launch_setup(tma), aot.record_launches() as records:
                call()
        except Exception as exc:
            jobs.append(Job(_uniq(f"{family}/{label}/*", used), family, None,
                            "recording the launch failed: " + _short(exc)))
            continue
        finally:
            for k, v in saved.items():
                if v is None:
                    os.environ.pop(k, None)
                else:
                    os.environ[k] = v
            if sys.modules.get("flashattn.runtime.env") is not None:
                sys.modules["flashattn.runtime.env"].reload()
        for rec in records:
            if skip_gluon and getattr(rec.fn, "is_gluon", lambda: False)():
                continue
            try:
                ck = _compile_key(aot, rec)
            except Exception as exc:
                jobs.append(Job(_uniq(f"{family}/{label}/{rec.kernel_name}", used), family, None,
                                "launch_compile_args failed: " + _short(exc)))
                continue
            if ck in seen:
                continue
            seen.add(ck)
            key = _uniq(key_of(label, rec), used)
            jobs.append(Job(key, family, lambda rec=rec: aot.compile_launch(rec)))
    return jobs


def _dt(dtype) -> str:
    return {"torch.bfloat16": "bf16", "torch.float16": "fp16", "torch.float32": "fp32"}.get(
        str(dtype), str(dtype).replace("torch.", ""))


def sm90_aux_jobs(lay: Layout) -> List[Job]:
    """The Triton kernels flash_bwd_hopper launches around the Gluon kernel (row_stats,
    dq_convert), recorded from a call per backward variant of the lists; the Gluon launch is
    skipped (compiled by the sm90 family)."""
    import torch

    aot = lay.get("aot_portable")
    bwd = lay.get("sm90_bwd")
    dtypes = {"bfloat16": torch.bfloat16, "float16": torch.float16}
    calls = []
    for v in sm90_variant_list(lay):
        kind, d, dt, causal, window, softcap, ov = _sm90_parts(v)
        if kind != "bwd":
            continue
        if ov and {"varlen", "seqused"} & set(dict(ov)):
            # packed variants: their row statistics and dQ conversion are the packed kernels
            # flash_bwd_hopper_varlen launches, not flash_bwd_hopper's (which has no varlen
            # override: passing it failed every such recording)
            continue
        wl, wr = window
        if causal:
            wr = 0

        def call(d=d, dt=dtypes[dt], wl=wl, wr=wr, causal=causal, softcap=softcap, ov=ov):
            b, s, h = 2, 1000, 4  # hopper/aot.py's shapes
            q = torch.empty((b, s, h, d), dtype=dt)
            lse = torch.empty((b, h, s), dtype=torch.float32)
            bwd.flash_bwd_hopper(q, q, q, q, q, lse, softmax_scale=d ** -0.5, causal=causal,
                                 window_left=wl, window_right=wr, softcap=softcap,
                                 config_overrides=dict(ov) if ov else None)
        calls.append((sm90_key(v), call))

    def key_of(label, rec):
        names = list(rec.fn.arg_names)
        consts = [f"{n}={rec.kwargs[n]}" for n, p in zip(names, rec.fn.params)
                  if p.is_constexpr and n in rec.kwargs]
        dts = []  # the distinct dtypes of the tensor arguments, in argument order
        for a in rec.args:
            if hasattr(a, "dtype") and _dt(a.dtype) not in dts:
                dts.append(_dt(a.dtype))
        return f"sm90/{rec.kernel_name}/{'-'.join(dts)}/" + ",".join(consts)
    return _record_jobs(aot, "sm90-aux", calls, key_of=key_of, used={}, seen=set(),
                        skip_gluon=True)


def decode_jobs(lay: Layout) -> List[Job]:
    """benchmarks/decode_aot.py's variants: its main() runs with compile_captured / _report
    swapped for recorders, so the variant list and each launch's arguments are exactly the
    script's; each compile job then calls the script's own compile_captured."""
    mod = lay.get("aot_decode")
    compile_captured, report = mod.compile_captured, mod._report
    pending: List[tuple] = []
    tags: List[Tuple[str, Any]] = []

    def record_compile(fn, args, kwargs, force=None):
        token = ("captured", len(pending))
        pending.append((fn, args, dict(kwargs), dict(force or {})))
        return token

    def record_report(tag, kernel, ptx_dir=None):
        tags.append((tag, kernel))

    saved_argv = sys.argv
    out = io.StringIO()
    mod.compile_captured, mod._report = record_compile, record_report
    sys.argv = [getattr(mod, "__file__", "decode_aot.py"), *DECODE_ARGV]
    jobs: List[Job] = []
    try:
        with contextlib.redirect_stdout(out):
            mod.main()
    except BaseException as exc:  # noqa: BLE001 - the whole family fails, the rest goes on
        jobs.append(Job("decode/*", "decode", None, "decode_aot main() failed: " + _short(exc)))
    finally:
        sys.argv = saved_argv
        mod.compile_captured = compile_captured
        mod._report = report
    # rows the script itself reported as errors (printed JSON with "error")
    for line in out.getvalue().splitlines():
        if line.startswith("{"):
            row = json.loads(line)
            if row.get("error"):
                jobs.append(Job(_decode_key(row.get("key", "?")), "decode", None, row["error"]))
    used: Dict[str, int] = {}
    for tag, token in tags:
        key = _uniq(_decode_key(tag), used)
        if not (isinstance(token, tuple) and token[0] == "captured"):
            jobs.append(Job(key, "decode", None, f"unexpected report object {token!r}"))
            continue
        fn, args, kwargs, force = pending[token[1]]
        jobs.append(Job(key, "decode", lambda fn=fn, args=args, kwargs=kwargs, force=force:
                        compile_captured(fn, args, kwargs, force=force)))
    return jobs


def _decode_key(tag: str) -> str:
    return "decode/" + (tag[len("decode_"):] if tag.startswith("decode_") else tag)


def extra_jobs(lay: Layout) -> List[Job]:
    import torch

    aot = lay.get("aot_portable")
    rot = lay.get("rotary")
    comb = lay.get("combine")
    pfwd = lay.get("portable_fwd")
    pbwd = lay.get("portable_bwd")
    bf, fp16, f32 = torch.bfloat16, torch.float16, torch.float32
    calls = []

    # rotary_store: every destination x rotation mode, as kvcache._append calls it
    for dt, d, s in ([(bf, 64, 1), (bf, 128, 1), (bf, 128, 4), (bf, 256, 1), (fp16, 128, 1),
                      (f32, 128, 1)]):
        b, h, h_k = 2, 32, 8
        for mode in ("none", "neox", "gptj"):
            def rk(mode=mode, dt=dt, d=d):
                if mode == "none":
                    return {}
                return dict(cos=torch.empty(1024, d // 2, dtype=dt),
                            sin=torch.empty(1024, d // 2, dtype=dt), interleaved=mode == "gptj")
            tag = f"{_dt(dt)}/d{d}/s{s}"

            def contig(rk=rk, dt=dt, d=d, s=s, b=b, h_k=h_k):
                rot.rotary_store(torch.empty(b, s, h_k, d, dtype=dt),
                                 torch.empty(b + 1, 512, h_k, d, dtype=dt),
                                 torch.zeros(b, dtype=torch.int32), **rk())

            def contig_bidx(rk=rk, dt=dt, d=d, s=s, b=b, h_k=h_k):
                rot.rotary_store(torch.empty(b, s, h_k, d, dtype=dt),
                                 torch.empty(b + 1, 512, h_k, d, dtype=dt),
                                 torch.zeros(b, dtype=torch.int32),
                                 batch_idx=torch.arange(b, dtype=torch.int32), **rk())

            def paged(rk=rk, dt=dt, d=d, s=s, b=b, h_k=h_k):
                rot.rotary_store(torch.empty(b, s, h_k, d, dtype=dt),
                                 torch.empty(64, 16, h_k, d, dtype=dt),
                                 torch.zeros(b, dtype=torch.int32),
                                 block_table=torch.zeros(b, 8, dtype=torch.int32), **rk())
            calls += [(f"rotary/contig/{mode}/{tag}", contig),
                      (f"rotary/contig_bidx/{mode}/{tag}", contig_bidx),
                      (f"rotary/paged/{mode}/{tag}", paged)]
            if mode != "none":
                for step in (0, 1):
                    def dense(rk=rk, dt=dt, d=d, s=s, b=b, h=h, step=step):
                        q = torch.empty(b, s, h, d, dtype=dt)
                        rot.rotary_store(q, torch.empty_like(q), torch.zeros(b, dtype=torch.int32),
                                         pos_step=step, to_cache=False, **rk())
                    calls.append((f"rotary/dense/{mode}/{tag}/step{step}", dense))

    # combine_splits: d_v x splits (BLOCK_S / SPLIT_CHUNK / warps) x out dtype x s_q
    for d_v, n_splits, out_dt, s_q in ([(dv, n, bf, 1) for dv in (64, 128, 256)
                                        for n in (2, 8, 40)]
                                       + [(128, 8, fp16, 1), (128, 8, f32, 1), (128, 8, bf, 4)]):
        def combine(d_v=d_v, n=n_splits, out_dt=out_dt, s_q=s_q):
            b, h = 2, 32
            comb.combine_splits(torch.empty(n, b, s_q, h, d_v), torch.empty(n, b, h, s_q),
                                torch.empty(b, s_q, h, d_v, dtype=out_dt),
                                torch.empty(b, h, s_q))
        calls.append((f"combine/dv{d_v}/splits{n_splits}/{_dt(out_dt)}/sq{s_q}", combine))

    # portable wrappers outside the sweep, first config (FLASHATTN_AUTOTUNE=0)
    def portable(kind, d, d_v=None, dt=bf, h=4, h_k=4, causal=False, return_p=False,
                 seqused=False, s=256, b=2):
        d_v = d_v or d

        def call():
            params = dict(softmax_scale=d ** -0.5, causal=causal, window_left=-1,
                          window_right=0 if causal else -1, softcap=0.0, alibi_slopes=None,
                          dropout_p=0.0, philox_seed=0)
            q = torch.randn(b, s, h, d, dtype=dt)
            k = torch.randn(b, s, h_k, d, dtype=dt)
            v = torch.randn(b, s, h_k, d_v, dtype=dt)
            o = torch.randn(b, s, h, d_v, dtype=dt)
            lse = torch.randn(b, h, s, dtype=torch.float32)
            if seqused:
                cu = torch.arange(0, (b + 1) * s, s, dtype=torch.int32)
                used = torch.full((b,), s - 3, dtype=torch.int32)
                flat = [x.reshape(b * s, *x.shape[2:]) for x in (q, k, v, o)]
                if kind == "fwd":
                    pfwd.flash_varlen_fwd(*flat[:3], cu, cu, used, s, s,
                                          return_softmax=return_p, **params)
                else:
                    pbwd.flash_varlen_bwd(flat[3], *flat[:3], flat[3],
                                          torch.randn(h, b * s, dtype=torch.float32), cu, cu,
                                          used, s, s, deterministic=True, **params)
            elif kind == "fwd":
                pfwd.flash_fwd(q, k, v, return_softmax=return_p, **params)
            else:
                pbwd.flash_bwd(o, q, k, v, o, lse, deterministic=True, **params)
        return call

    pcalls = []
    for d in (64, 128, 256):
        for kind in ("fwd", "bwd"):
            for causal in (False, True):
                m = "causal" if causal else "plain"
                pcalls.append((f"portable/gqa2/d{d}/{m}", portable(kind, d, h=4, h_k=2,
                                                                    causal=causal)))
            pcalls.append((f"portable/fp16/d{d}/plain", portable(kind, d, dt=fp16)))
        pcalls.append((f"portable/return_p/d{d}/plain", portable("fwd", d, return_p=True)))
    for kind in ("fwd", "bwd"):
        pcalls += [("portable/d96/plain", portable(kind, 96)),
                   ("portable/d192_dv128/plain", portable(kind, 192, d_v=128)),
                   ("portable/varlen_seqused/d128/plain", portable(kind, 128, seqused=True))]

    def key_plain(label, rec):
        return f"extra/{label}" + ("" if label.startswith(("rotary", "combine"))
                                   else f"/{rec.kernel_name}")

    def key_portable(label, rec):
        return f"extra/{label}/{rec.kernel_name}/{_cfg_part(aot.config_label(rec))}"

    used: Dict[str, int] = {}
    jobs = _record_jobs(aot, "extra", calls, key_of=key_plain, used=used, seen=set())
    jobs += _record_jobs(aot, "extra", pcalls, key_of=key_portable, used=used, seen=set(),
                         env={"FLASHATTN_AUTOTUNE": "0", "FLASHATTN_ATOMIC_DQ": "0"})
    return jobs


# ------------------------------------------------------------------------------ the compiles


def _capture_compiles():
    """Wrap triton.compile (every repo compile path calls it as triton.compile) so the child
    sees the kernels it compiled; returns (list, restore)."""
    import triton
    import triton.compiler
    import triton.compiler.compiler as cc

    captured: List[Any] = []
    orig = cc.compile

    def wrapped(*a, **k):
        kern = orig(*a, **k)
        captured.append(kern)
        return kern
    saved = (triton.compile, triton.compiler.compile, cc.compile)
    triton.compile = triton.compiler.compile = cc.compile = wrapped

    def restore():
        triton.compile, triton.compiler.compile, cc.compile = saved
    return captured, restore


def make_child_run(aot, job: Job, outdir: str, normalise: Callable[[str], str], raw: bool):
    """The CompileJob.run of one variant: runs in the forked child, writes the stripped PTX and
    returns a KernelReport (the repo's) carrying a .fingerprint dict."""

    def run():
        t0 = time.perf_counter()
        captured, restore = _capture_compiles()
        try:
            result = job.thunk()
        except Exception as exc:
            return aot.KernelReport(job.key, None, None, None, None, time.perf_counter() - t0,
                                    False, _short(exc) + "\n" + traceback.format_exc()[-800:])
        finally:
            restore()
        if getattr(result, "ok", True) is False:  # the repo's report of a failed compile
            return result
        if not captured:
            return aot.KernelReport(job.key, None, None, None, None, time.perf_counter() - t0,
                                    False, "no triton.compile call was seen")
        kern = captured[-1]
        ptx = kern.asm["ptx"]
        stripped = normalise(ptx)
        path = os.path.join(outdir, "ptx", job.key + ".ptx")
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "w") as f:
            f.write(stripped)
        if raw:
            rpath = os.path.join(outdir, "raw", job.key + ".ptx")
            os.makedirs(os.path.dirname(rpath), exist_ok=True)
            with open(rpath, "w") as f:
                f.write(ptx)
        md = kern.metadata
        rep = aot.KernelReport(job.key, None, None, None, int(md.shared),
                               time.perf_counter() - t0, True, None, num_warps=md.num_warps,
                               num_stages=getattr(md, "num_stages", None))
        rep.fingerprint = dict(sha256=hashlib.sha256(stripped.encode()).hexdigest(),
                               lines=stripped.count("\n"), kernel=md.name,
                               num_warps=md.num_warps, shared=int(md.shared),
                               compiles=len(captured))
        return rep
    return run


# ------------------------------------------------------------------------------------- main


def _prepare_env() -> Dict[str, str]:
    """Before triton is imported: no interpreter, no flashattn knobs, a private cache."""
    dropped = {k: os.environ.pop(k) for k in list(os.environ)
               if k == "TRITON_INTERPRET" or k.startswith("FLASHATTN_")}
    cache = tempfile.mkdtemp(prefix="ptx_fp_triton_cache_")
    os.environ["TRITON_CACHE_DIR"] = cache
    os.environ["TRITON_ALWAYS_COMPILE"] = "1"
    return dict(dropped=dropped, cache=cache)


def _git_head(repo: str) -> str:
    try:
        head = subprocess.run(["git", "-C", repo, "rev-parse", "HEAD"], capture_output=True,
                              text=True).stdout.strip()
        dirty = subprocess.run(["git", "-C", repo, "status", "--porcelain"], capture_output=True,
                               text=True).stdout.strip()
        return head + (" (dirty)" if dirty else "")
    except OSError:
        return "?"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--layout", choices=sorted(LAYOUTS), required=True)
    ap.add_argument("--src", required=True, help="the tree's src/ (first on sys.path)")
    ap.add_argument("--repo", required=True, help="the repo root (tools/, benchmarks/, tests/)")
    ap.add_argument("--out", required=True)
    ap.add_argument("-j", "--jobs", type=int, default=2)
    ap.add_argument("--only", action="append", default=[],
                    help="keep variants whose key contains SUBSTRING (repeatable: any)")
    ap.add_argument("--families", default=",".join(FAMILIES))
    ap.add_argument("--raw", action="store_true", help="also keep the unstripped PTX (OUT/raw)")
    ap.add_argument("--list", action="store_true", help="print the keys and exit")
    ap.add_argument("-q", "--quiet", action="store_true")
    args = ap.parse_args(argv)
    families = [f.strip() for f in args.families.split(",") if f.strip()]
    bad = [f for f in families if f not in FAMILIES]
    if bad:
        ap.error(f"--families: unknown {bad}; allowed {FAMILIES}")

    envinfo = _prepare_env()
    src, repo = os.path.realpath(args.src), os.path.realpath(args.repo)
    out = os.path.realpath(args.out)
    sys.path[:0] = [src, repo]
    t_start = time.perf_counter()
    try:
        import flashattn
        import torch
        import triton
        if not os.path.realpath(flashattn.__file__).startswith(src + os.sep):
            print(f"flashattn imported from {flashattn.__file__}, not under {src}", file=sys.stderr)
            return 2
        lay = Layout(args.layout, src, repo)
        aot = lay.get("aot_portable")
        builders = {"portable": lambda: portable_jobs(lay, "portable", True),
                    "portable-notma": lambda: portable_jobs(lay, "portable-notma", False),
                    "sm90": lambda: sm90_jobs(lay), "sm90-aux": lambda: sm90_aux_jobs(lay),
                    "decode": lambda: decode_jobs(lay), "extra": lambda: extra_jobs(lay)}
        jobs: List[Job] = []
        for fam in families:
            t0 = time.perf_counter()
            try:
                got = builders[fam]()
            except Exception as exc:  # a family that cannot be enumerated fails as one row
                got = [Job(f"{fam}/*", fam, None, "enumeration failed: " + _short(exc) + "\n"
                           + traceback.format_exc()[-1500:])]
            jobs += got
            if not args.quiet:
                print(f"[enumerate] {fam}: {len(got)} variants ({time.perf_counter() - t0:.1f} s)",
                      file=sys.stderr, flush=True)
        if args.only:
            jobs = [j for j in jobs if any(s in j.key for s in args.only)]
        keys = [j.key for j in jobs]
        dup = {k for k in keys if keys.count(k) > 1}
        if dup:
            print(f"duplicate keys: {sorted(dup)}", file=sys.stderr)
            return 2
        if args.list:
            print("\n".join(keys))
            return 0

        # outputs: a fresh ptx/ under OUT
        if os.path.isdir(os.path.join(out, "ptx")):
            shutil.rmtree(os.path.join(out, "ptx"))
        if args.raw and os.path.isdir(os.path.join(out, "raw")):
            shutil.rmtree(os.path.join(out, "raw"))
        os.makedirs(os.path.join(out, "ptx"), exist_ok=True)

        prefixes = tuple(p for p in ((src, "<SRC>"), (repo, "<REPO>")))
        aliases = tuple(MODULE_ALIASES[args.layout])

        def normalise(ptx: str) -> str:
            return strip_ptx(ptx, prefixes, aliases)

        failures: Dict[str, str] = {}
        todo = []
        for j in jobs:
            if j.thunk is None:
                failures[j.key] = j.error or "no compile"
            else:
                todo.append(aot.CompileJob(j.key, j.family, "",
                                           make_child_run(aot, j, out, normalise, args.raw)))

        def progress(done, total, r):
            if not args.quiet:
                fp = getattr(r, "fingerprint", None)
                state = f"{fp['sha256'][:12]} {fp['lines']} lines" if (r.ok and fp) else "FAILED"
                print(f"[{done}/{total}] {r.kernel}: {state} ({r.compile_seconds:.1f} s)",
                      file=sys.stderr, flush=True)

        t_comp = time.perf_counter()
        reports = aot.compile_all(todo, workers=args.jobs, progress=progress)
        compile_wall = time.perf_counter() - t_comp
        variants: Dict[str, Dict[str, Any]] = {}
        per_family: Dict[str, Dict[str, int]] = {}
        fam_of = {j.key: j.family for j in jobs}
        for cj, r in zip(todo, reports):
            fp = getattr(r, "fingerprint", None)
            if r.ok and fp:
                variants[cj.kernel] = dict(fp, family=cj.variant,
                                           compile_s=round(r.compile_seconds, 2))
            else:
                failures[cj.kernel] = r.error or "failed"
        for k in keys:
            c = per_family.setdefault(fam_of[k], dict(ok=0, failed=0))
            c["ok" if k in variants else "failed"] += 1

        # every flashattn module came from --src
        strays = sorted(f"{n}: {getattr(m, '__file__', None)}" for n, m in list(sys.modules.items())
                        if n.split(".")[0] == "flashattn" and getattr(m, "__file__", None)
                        and not os.path.realpath(m.__file__).startswith(src + os.sep))
        wall = time.perf_counter() - t_start
        ptxas = subprocess.run([aot.ptxas_path(), "--version"], capture_output=True,
                               text=True).stdout.strip().splitlines()[-1:]
        meta = dict(layout=args.layout, src=src, repo=repo, git=_git_head(repo),
                    flashattn_file=flashattn.__file__, resolved=lay.resolved,
                    triton=triton.__version__, torch=torch.__version__, ptxas=ptxas,
                    target="cuda sm_90 (GPUTarget('cuda', 90, 32), ptxas sm_90a)",
                    families=families, only=args.only, decode_argv=DECODE_ARGV,
                    env_dropped=sorted(envinfo["dropped"]), jobs=args.jobs,
                    wall_seconds=round(wall, 1), compile_wall_seconds=round(compile_wall, 1),
                    counts=per_family, stray_modules=strays, argv=sys.argv)
        with open(os.path.join(out, "fingerprint.json"), "w") as f:
            json.dump(dict(meta=meta, variants=dict(sorted(variants.items())),
                           failures=dict(sorted(failures.items()))), f, indent=1)
        print(f"{len(variants)} variants fingerprinted, {len(failures)} failed; "
              f"{wall:.0f} s wall ({compile_wall:.0f} s compiling, -j {args.jobs})")
        for fam, c in per_family.items():
            print(f"  {fam}: {c['ok']} ok, {c['failed']} failed")
        if strays:
            print("WARNING: flashattn modules imported from outside --src:\n  " + "\n  ".join(strays))
        for k, e in sorted(failures.items()):
            print(f"FAILED {k}:\n    " + "\n    ".join(e.splitlines()[:6]))
        print(f"outputs: {out}/fingerprint.json, {out}/ptx/")
        return 1 if failures or strays else 0
    finally:
        shutil.rmtree(envinfo["cache"], ignore_errors=True)


if __name__ == "__main__":
    raise SystemExit(main())
