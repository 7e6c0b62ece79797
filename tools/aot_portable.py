"""Ahead-of-time compile report for sm_90 on a machine without a GPU.

Triton 3.6 lowers a kernel to PTX and runs its bundled ``ptxas`` for ``sm_90a`` with no device
present, so CI can check what matters before a GPU sees the code: every kernel variant we ship
compiles, keeps its values in registers (no spills) and fits in shared memory.

Three layers, each usable alone:

- :func:`compile_sm90` compiles one kernel (``@triton.jit`` or Gluon) for
  ``GPUTarget("cuda", 90, 32)`` and returns a :class:`KernelReport`: registers and spill bytes
  from ``ptxas -v --gpu-name sm_90a`` run on the compiled PTX, shared memory from the compiled
  metadata. Failures (a Triton pass that does not apply, a ptxas crash) are caught and reported
  per kernel, never raised.
- :func:`record_launches` runs real launch code (the public wrappers) with CPU tensors and
  records each ``kernel[grid](...)`` call (kernel, arguments, autotune config, num_warps,
  num_stages) instead of running it, so the report follows the code as it changes;
  :func:`compile_launch` turns a record into a compile with the JIT's own specialisation.
- :func:`portable_variants` enumerates what the portable kernels (``triton/fwd.py``,
  ``triton/bwd.py``) compile to on sm90: every candidate config of every autotune space, head
  dims and masks, plus feature variants; :func:`compile_all` compiles a list in parallel worker
  processes (a compiler crash takes down its worker only). ``scripts/aot_report.py`` is the CLI.

Must run in a process without ``TRITON_INTERPRET=1``: under the interpreter ``@triton.jit``
builds interpreted functions (nothing to compile) and Triton patches its language functions.
"""
from __future__ import annotations

import contextlib
import dataclasses
import io
import json
import multiprocessing
import multiprocessing.connection
import os
import re
import subprocess
import tempfile
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, Iterable, Iterator, List, Optional, Sequence, Tuple

SM90_CAPABILITY = 90
SM90_ARCH = "sm_90a"  # what Triton hands ptxas for capability 90 (wgmma / setmaxnreg need "a")
# Shared memory one H100 block may use (the opt-in maximum, 227 KiB); Triton refuses to
# launch a kernel that needs more, so the report flags it.
SM90_SHARED_LIMIT = 227 * 1024


# --------------------------------------------------------------------------------------------
# one compile


@dataclass
class KernelReport:
    """Resources of one compiled kernel variant (None where the compile failed).

    registers: per thread (ptxas "Used N registers"); spill_stores / spill_loads: bytes
    (ptxas "N bytes spill stores/loads"); shared_bytes: static + dynamic shared memory the
    launch needs (Triton metadata ``shared``); compile_seconds: wall time of triton.compile
    (ptxas included). stack_bytes: ptxas "N bytes stack frame" (spills live there, and so do
    local arrays). kernel / variant / config label a row of the report.
    """
    name: str
    registers: Optional[int]
    spill_stores: Optional[int]
    spill_loads: Optional[int]
    shared_bytes: Optional[int]
    compile_seconds: float
    ok: bool
    error: Optional[str] = None
    stack_bytes: Optional[int] = None
    num_warps: Optional[int] = None
    num_stages: Optional[int] = None
    kernel: str = ""
    variant: str = ""
    config: str = ""
    constexprs: Dict[str, Any] = field(default_factory=dict)

    @property
    def spills(self) -> bool:
        return bool(self.spill_stores or self.spill_loads)

    def to_json(self) -> Dict[str, Any]:
        return dataclasses.asdict(self)


def ptxas_path() -> str:
    """The ptxas Triton itself uses for sm_90 (bundled with the wheel, TRITON_PTXAS_PATH wins)."""
    from triton.backends.nvidia.compiler import get_ptxas

    return get_ptxas(SM90_CAPABILITY).path


_USED_REGS = re.compile(r"Used (\d+) registers")
_SPILLS = re.compile(r"(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads")


def parse_ptxas_verbose(log: str) -> Dict[str, int]:
    """Registers, stack frame and spill bytes from ``ptxas -v`` output for one entry function.

    ptxas prints, per function: "Function properties for NAME / N bytes stack frame, N bytes
    spill stores, N bytes spill loads" and "Used N registers, ...". Triton's PTX holds one
    entry; with more, the maxima are taken (the worst function is what the report is about).
    """
    regs = [int(m) for m in _USED_REGS.findall(log)]
    spills = [tuple(map(int, m)) for m in _SPILLS.findall(log)]
    if not regs:
        raise ValueError(f"no 'Used N registers' line in ptxas output:\n{log[-2000:]}")
    return dict(registers=max(regs),
                stack_bytes=max((s[0] for s in spills), default=0),
                spill_stores=max((s[1] for s in spills), default=0),
                spill_loads=max((s[2] for s in spills), default=0))


def ptxas_usage(ptx: str, arch: str = SM90_ARCH, extra_args: Sequence[str] = ()) -> Dict[str, int]:
    """Run the bundled ptxas with ``-v --gpu-name ARCH`` on PTX text and parse its report."""
    with tempfile.TemporaryDirectory(prefix="flashattn_aot_") as tmp:
        src = os.path.join(tmp, "kernel.ptx")
        with open(src, "w") as f:
            f.write(ptx)
        cmd = [ptxas_path(), "-v", "--gpu-name", arch, *extra_args, src,
               "-o", os.path.join(tmp, "kernel.cubin")]
        res = subprocess.run(cmd, capture_output=True, text=True)
        if res.returncode != 0:
            raise RuntimeError(f"ptxas exited {res.returncode}: {res.stderr[-2000:]}")
        return parse_ptxas_verbose(res.stdout + res.stderr)


def _is_gluon(fn) -> bool:
    return bool(getattr(fn, "is_gluon", lambda: False)())


def _arg_index(fn, name: str) -> int:
    try:
        return list(fn.arg_names).index(name)
    except ValueError:
        raise ValueError(f"constexprs: {fn.__name__} has no argument {name!r}; "
                         f"its arguments are {list(fn.arg_names)}") from None


def _by_path(fn, table: Optional[Dict]) -> Dict[Tuple[int, ...], Any]:
    """{name or (index, ...) path: value} -> {path: value}, the form ASTSource wants."""
    out = {}
    for key, value in (table or {}).items():
        path = key if isinstance(key, tuple) else (_arg_index(fn, key),)
        out[path] = value
    return out


def _short_error(exc: BaseException, limit: int = 1500) -> str:
    """First lines of a compiler error: PTXASError carries the whole ptxas log and a repro
    command with temporary paths, which would drown the table."""
    text = f"{type(exc).__name__}: {exc}".strip()
    lines = [ln for ln in text.splitlines() if ln.strip() and not ln.startswith("Repro command")]
    text = "\n".join(lines[:12])
    return text if len(text) <= limit else text[:limit] + " ..."


def compile_sm90(fn, signature: Dict[str, str], constexprs: Optional[Dict] = None, *,
                 num_warps: int = 4, num_stages: int = 3, gluon: bool = False,
                 attrs: Optional[Dict] = None, options: Optional[Dict[str, Any]] = None,
                 name: Optional[str] = None, fresh: bool = True) -> KernelReport:
    """Compile ``fn`` for sm_90 (no GPU needed) and report registers, spills, shared memory.

    fn: a ``@triton.jit`` function, or a Gluon one (``triton.experimental.gluon.jit``; pass
    ``gluon=True``, or it is detected). signature: {argument name: Triton type}, e.g.
    ``{"X": "*bf16", "n": "i32", "scale": "fp32", "BLOCK": "constexpr"}``; constexprs:
    {argument name (or Triton path tuple): value}; names given here are typed "constexpr"
    in the signature when absent there. attrs: Triton attributes by name or path, e.g.
    ``{"X": [["tt.divisibility", 16]]}`` (what the JIT adds for 16-aligned pointers).
    options: further backend options (maxnreg, enable_fp_fusion, ...). fresh: bypass
    Triton's on-disk cache so compile_seconds is a real compile time.

    Never raises for a kernel that does not compile: returns ``ok=False`` with the error.
    """
    import triton
    from triton import knobs
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    name = name or getattr(fn, "__name__", str(fn))
    opts = dict(options or {})
    opts.update(num_warps=num_warps, num_stages=num_stages)
    start = time.perf_counter()
    try:
        consts = _by_path(fn, constexprs)
        sig = dict(signature)
        for path in consts:
            if len(path) == 1:
                sig.setdefault(fn.arg_names[path[0]], "constexpr")
        if gluon or _is_gluon(fn):
            from triton.experimental.gluon._runtime import GluonASTSource
            src = GluonASTSource(fn, sig, consts, _by_path(fn, attrs))
        else:
            src = ASTSource(fn, sig, consts, _by_path(fn, attrs))
        # a ptxas failure prints the whole PTX to stdout before raising: keep it out of the report
        with contextlib.redirect_stdout(io.StringIO()), knobs.compilation.scope():
            knobs.compilation.always_compile = fresh
            target = GPUTarget("cuda", SM90_CAPABILITY, 32)
            kernel = triton.compile(src, target=target, options=opts)
        seconds = time.perf_counter() - start
        extra = [] if kernel.metadata.enable_fp_fusion else ["--fmad=false"]
        usage = ptxas_usage(kernel.asm["ptx"], extra_args=extra)
    except Exception as exc:  # reported per variant: one bad config must not hide the others
        return KernelReport(name, None, None, None, None, time.perf_counter() - start, False,
                            _short_error(exc), num_warps=num_warps, num_stages=num_stages)
    return KernelReport(name, usage["registers"], usage["spill_stores"], usage["spill_loads"],
                        int(kernel.metadata.shared), seconds, True, None,
                        stack_bytes=usage["stack_bytes"], num_warps=kernel.metadata.num_warps,
                        num_stages=kernel.metadata.num_stages)


# --------------------------------------------------------------------------------------------
# recording real launches


@dataclass
class LaunchRecord:
    """One ``kernel[grid](*args, **kwargs)`` call as the launch code made it.

    kwargs holds constexpr arguments and launch options (num_warps, num_stages, ...), merged
    with the autotune config the call would have run (``config``, None for a plain launch).
    """
    fn: Any
    args: Tuple[Any, ...]
    kwargs: Dict[str, Any]
    config: Any = None

    @property
    def kernel_name(self) -> str:
        """``_bwd_dq_kernel`` -> ``bwd_dq``: the name used in the report."""
        n = self.fn.__name__.lstrip("_")
        return n[:-len("_kernel")] if n.endswith("_kernel") else n


@contextlib.contextmanager
def record_launches() -> Iterator[List[LaunchRecord]]:
    """Record every Triton launch made inside the block instead of running it.

    Patches ``JITFunction.run`` (every ``kernel[grid](...)`` ends there) and
    ``Autotuner.run``: an autotuned launch is recorded once per candidate config the
    autotuner would time for this call (its own ``prune_configs``, so FLASHATTN_AUTOTUNE=0
    gives the first candidate only), without benchmarking. Nothing runs, so the outputs of
    the launch code are garbage; CPU tensors are fine. Yields the list of records.
    """
    from triton import knobs
    from triton.runtime.autotuner import Autotuner
    from triton.runtime.jit import JITFunction

    if knobs.runtime.interpret:
        raise RuntimeError("record_launches needs a process without TRITON_INTERPRET=1: the "
                           "interpreter builds no compilable kernels (run scripts/aot_report.py "
                           "or a subprocess with TRITON_INTERPRET unset)")
    records: List[LaunchRecord] = []
    current_config: List[Any] = [None]
    jit_run, tune_run = JITFunction.run, Autotuner.run

    def record_jit(self, *args, grid, warmup, **kwargs):
        records.append(LaunchRecord(self, tuple(args), dict(kwargs), current_config[0]))

    def record_tuned(self, *args, **kwargs):
        self.nargs = dict(zip(self.arg_names, args))
        try:
            configs = self.prune_configs(kwargs) if len(self.configs) > 1 else list(self.configs)
            for cfg in configs:
                current_config[0] = cfg
                self.fn.run(*args, **kwargs, **cfg.all_kwargs())
        finally:
            current_config[0] = None
            self.nargs = None

    JITFunction.run, Autotuner.run = record_jit, record_tuned
    try:
        yield records
    finally:
        JITFunction.run, Autotuner.run = jit_run, tune_run


def _sm90_backend():
    from triton.backends.compiler import GPUTarget
    from triton.compiler import make_backend

    return make_backend(GPUTarget("cuda", SM90_CAPABILITY, 32))


def _plain_type(value) -> str:
    """Fallback typing of a launch argument (the JIT's rule without specialisation)."""
    if value is None:
        return "constexpr"
    if hasattr(value, "data_ptr") and hasattr(value, "dtype"):
        from triton.runtime.jit import mangle_type
        return mangle_type(value)
    if isinstance(value, bool):
        return "i1"
    if isinstance(value, int):
        return "i32" if -2**31 <= value < 2**31 else "i64"
    if isinstance(value, float):
        return "fp32"
    raise TypeError(f"cannot type launch argument {value!r} ({type(value).__name__})")


def launch_compile_args(record: LaunchRecord):
    """(signature, constexprs by path, attrs by path, options dict) of a recorded launch.

    Uses the JIT's own binder for an sm90 backend, so the result is exactly what the launch
    would compile on an H100: tensors -> ``*bf16`` / ``*fp16`` / ``*fp32``, ints -> i32 / i64 by
    value (== 1 -> constexpr, multiples of 16 -> divisibility hint), floats -> fp32, None ->
    constexpr None, constexpr parameters by value, per-parameter ``do_not_specialize``
    honoured. Falls back to plain typing (no hints) if that private API moved.
    """
    fn = record.fn
    kwargs = dict(record.kwargs)
    backend = _sm90_backend()
    try:
        from triton.runtime.jit import create_function_from_signature

        binder = create_function_from_signature(fn.signature, fn.params, backend)
        bound, specialization, _ = binder(*record.args, **kwargs)
        options, signature, constexprs, attrs = fn._pack_args(backend, kwargs, bound,
                                                              specialization, None)
        return signature, constexprs, attrs, dict(options.__dict__)
    except (ImportError, AttributeError, TypeError):
        pass
    names = list(fn.arg_names)
    bound = dict(zip(names, record.args))
    bound.update({k: v for k, v in kwargs.items() if k in names})
    signature, constexprs = {}, {}
    for i, (name, param) in enumerate(zip(names, fn.params)):
        value = bound.get(name, param.default if param.has_default else None)
        signature[name] = "constexpr" if param.is_constexpr else _plain_type(value)
        if signature[name] == "constexpr":
            constexprs[(i,)] = value
    options = {k: v for k, v in kwargs.items() if k not in names}
    return signature, constexprs, {}, dict(backend.parse_options(options).__dict__)


def _jsonable(value):
    if isinstance(value, (bool, int, float, str)) or value is None:
        return value
    return repr(value)


def compile_launch(record: LaunchRecord, name: Optional[str] = None) -> KernelReport:
    """Compile a recorded launch for sm_90 exactly as the JIT would specialise it."""
    try:
        signature, constexprs, attrs, options = launch_compile_args(record)
    except Exception as exc:
        return KernelReport(name or record.kernel_name, None, None, None, None, 0.0, False,
                            _short_error(exc))
    num_warps, num_stages = options.pop("num_warps"), options.pop("num_stages")
    report = compile_sm90(record.fn, signature, constexprs, num_warps=num_warps,
                          num_stages=num_stages, attrs=attrs, options=options,
                          name=name or record.kernel_name)
    names = list(record.fn.arg_names)
    report.constexprs = {names[p[0]]: _jsonable(v) for p, v in constexprs.items() if len(p) == 1}
    report.num_warps, report.num_stages = num_warps, num_stages
    return report


# --------------------------------------------------------------------------------------------
# parallel compiles, one worker process per job


@dataclass
class CompileJob:
    """A labelled compile: ``run()`` returns its KernelReport (the labels are copied in)."""
    kernel: str
    variant: str
    config: str
    run: Callable[[], KernelReport]

    def label(self) -> str:
        return f"{self.kernel} [{self.variant}] {self.config}"


def _run_job_in_child(job: CompileJob, conn, log_path: str) -> None:
    # C++ diagnostics (MLIR "PassManager::run failed" details) go to fd 2: keep them in a
    # file the parent reads when the compile fails, not interleaved on the terminal.
    fd = os.open(log_path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    try:
        report = job.run()
    except BaseException as exc:  # compile_sm90 catches compile errors; this is a bug guard
        report = KernelReport(job.kernel, None, None, None, None, 0.0, False, _short_error(exc))
    conn.send(report)
    conn.close()


def _log_tail(path: str, limit: int = 800) -> str:
    """What a failed compile said on fds 1 / 2: MLIR's "error:" / "note:" lines when there are
    any (the rest is a pass-pipeline reproducer), else the last lines."""
    try:
        with open(path, errors="replace") as f:
            lines = [ln.strip() for ln in f if ln.strip()]
    except OSError:
        return ""
    flagged = [ln for ln in lines if "error:" in ln or "note:" in ln]
    return "\n".join(flagged or lines)[-limit:]


def _labelled(job: CompileJob, report: KernelReport) -> KernelReport:
    report.kernel, report.variant, report.config = job.kernel, job.variant, job.config
    return report


def compile_all(jobs: Sequence[CompileJob], workers: int = 1, *, timeout_s: float = 900.0,
                progress: Optional[Callable[[int, int, KernelReport], None]] = None
                ) -> List[KernelReport]:
    """Run the jobs in forked worker processes, at most ``workers`` at a time.

    One process per job: a compiler crash (a signal in MLIR or LLVM) or a hang past
    ``timeout_s`` fails that job's report only. Reports come back in job order.
    ``progress(done, total, report)`` is called as each finishes.
    """
    ctx = multiprocessing.get_context("fork")
    results: List[Optional[KernelReport]] = [None] * len(jobs)
    pending = list(range(len(jobs)))
    running: Dict[Any, Tuple[int, Any, Any, str, float]] = {}
    done = 0
    with tempfile.TemporaryDirectory(prefix="flashattn_aot_logs_") as logs:
        while pending or running:
            while pending and len(running) < max(1, workers):
                i = pending.pop(0)
                recv, send = ctx.Pipe(duplex=False)
                log_path = os.path.join(logs, f"{i}.log")
                proc = ctx.Process(target=_run_job_in_child, args=(jobs[i], send, log_path))
                proc.start()
                send.close()
                running[recv] = (i, proc, recv, log_path, time.monotonic())
            ready = multiprocessing.connection.wait(list(running), timeout=1.0)
            now = time.monotonic()
            for conn in list(running):
                i, proc, recv, log_path, t0 = running[conn]
                report = None
                if conn in ready:
                    try:
                        report = recv.recv()
                    except EOFError:  # the child died before sending: crashed compiler
                        proc.join()
                        report = KernelReport(jobs[i].kernel, None, None, None, None, now - t0,
                                              False, f"compiler process died (exit code "
                                              f"{proc.exitcode}): {_log_tail(log_path)}")
                elif now - t0 > timeout_s:
                    proc.kill()
                    report = KernelReport(jobs[i].kernel, None, None, None, None, now - t0,
                                          False, f"compile timed out after {timeout_s:.0f} s")
                if report is None:
                    continue
                proc.join()
                recv.close()
                if not report.ok and report.error and "log:" not in report.error:
                    tail = _log_tail(log_path)
                    if tail:
                        report.error += f"\nlog: {tail}"
                results[i] = _labelled(jobs[i], report)
                del running[conn]
                done += 1
                if progress:
                    progress(done, len(jobs), results[i])
    return results  # type: ignore[return-value]


# --------------------------------------------------------------------------------------------
# the portable kernels' variants


HEAD_DIMS = (64, 128, 256)
# feature variants, compiled with the first config of their space (plain mask unless named)
FEATURES = ("softcap", "alibi", "dropout", "fp32", "local", "varlen", "atomic_dq")


@contextlib.contextmanager
def _env(**values: Optional[str]) -> Iterator[None]:
    """flashattn's settings as if these environment variables had these raw values (None =
    unset) inside the block: flashattn reads the environment once (runtime/env.py)."""
    from flashattn.runtime import env

    with env.override(**env.fields_from_raw(**values)):
        yield


@contextlib.contextmanager
def sm90_launch_setup(tma: bool = True) -> Iterator[None]:
    """Make the portable wrappers launch, on CPU tensors, what they launch on an H100.

    The only device-dependent choice in ``triton/`` is ``config.use_tma`` (TMA descriptors
    on sm90+, 16-byte aligned tensors): its CPU answer is False, so it is patched to answer
    with its alignment rule alone (its interpreter branch, taken by flipping
    ``config.INTERPRET`` for the duration of the call), or False with ``tma=False``. Every
    other constexpr (UPCAST=False, DOT_PREC, the preprocess block) already takes its GPU
    value because this process does not run the interpreter.
    """
    from flashattn.backends.triton import config

    original = config.use_tma

    def use_tma_as_sm90(*tensors):
        if not tma:
            return False
        saved, config.INTERPRET = config.INTERPRET, True
        try:
            return original(*tensors)
        finally:
            config.INTERPRET = saved

    config.use_tma = use_tma_as_sm90
    try:
        yield
    finally:
        config.use_tma = original


def config_label(record: LaunchRecord, options: Optional[Dict[str, Any]] = None) -> str:
    """``M128 N64 w8 s3 ws`` for an autotune config; ``fixed w4 s3`` for a plain launch."""
    cfg = record.config
    if cfg is None:
        opts = options or {}
        w = record.kwargs.get("num_warps", opts.get("num_warps", 4))
        s = record.kwargs.get("num_stages", opts.get("num_stages", 3))
        return f"fixed w{w} s{s}"
    kw = dict(cfg.kwargs)
    parts = []
    for key, short in (("BLOCK_M", "M"), ("BLOCK_N", "N")):
        if key in kw:
            parts.append(f"{short}{kw.pop(key)}")
    parts.append(f"w{cfg.num_warps} s{cfg.num_stages}")
    if kw.pop("WARP_SPEC", False):
        parts.append("ws")
    parts += [f"{k}={v}" for k, v in kw.items()]
    return " ".join(parts)


def _selected(kernel: str, wanted: Iterable[str]) -> bool:
    """``fwd`` / ``bwd`` pick a wrapper's kernels; ``dq``, ``bwd_dq``, ``preprocess``... one."""
    for w in wanted:
        if w == kernel or (w == "bwd" and kernel.startswith("bwd_")) or kernel == f"bwd_{w}":
            return True
    return False


def _inputs(d: int, dtype, seqlen: int, batch: int = 2, heads: int = 4):
    import torch

    def t(*shape, dt=dtype):
        return torch.randn(*shape, dtype=dt)
    q, k, v = (t(batch, seqlen, heads, d) for _ in range(3))
    out, dout = t(batch, seqlen, heads, d), t(batch, seqlen, heads, d)
    lse = t(batch, heads, seqlen, dt=torch.float32)
    return q, k, v, out, dout, lse


def _call_wrappers(kind: str, d: int, *, causal: bool, feature: Optional[str], seqlen: int) -> None:
    """Run the public wrapper (flash_fwd or flash_bwd) once; the launches are recorded."""
    import torch
    from flashattn.backends.triton import bwd, fwd

    dtype = torch.float32 if feature == "fp32" else torch.bfloat16
    q, k, v, out, dout, lse = _inputs(d, dtype, seqlen)
    batch, heads = q.shape[0], q.shape[2]
    params = dict(softmax_scale=d ** -0.5, causal=causal, window_left=-1,
                  window_right=0 if causal else -1, softcap=0.0, alibi_slopes=None,
                  dropout_p=0.0, philox_seed=0)
    if feature == "softcap":
        params["softcap"] = 30.0
    elif feature == "alibi":
        params["alibi_slopes"] = torch.rand(batch, heads, dtype=torch.float32)
    elif feature == "dropout":
        params.update(dropout_p=0.1, philox_seed=1234)
    elif feature == "local":
        params.update(window_left=seqlen // 4, window_right=seqlen // 8)
    if feature == "varlen":
        # the packed layout: (total, h, d) and cu_seqlens; one sequence per batch entry
        lens = torch.tensor([seqlen] * batch, dtype=torch.int32)
        cu = torch.cat([torch.zeros(1, dtype=torch.int32), lens.cumsum(0).to(torch.int32)])
        flat = [x.reshape(batch * seqlen, heads, d) for x in (q, k, v, out, dout)]
        lse_packed = torch.randn(heads, batch * seqlen, dtype=torch.float32)
        if kind == "fwd":
            fwd.flash_varlen_fwd(*flat[:3], cu, cu, None, seqlen, seqlen, return_softmax=False,
                                 **params)
        else:
            bwd.flash_varlen_bwd(flat[4], *flat[:3], flat[3], lse_packed, cu, cu, None, seqlen,
                                 seqlen, deterministic=True, **params)
        return
    if kind == "fwd":
        fwd.flash_fwd(q, k, v, return_softmax=False, **params)
    else:
        with _env(FLASHATTN_ATOMIC_DQ="1" if feature == "atomic_dq" else "0"):
            bwd.flash_bwd(dout, q, k, v, out, lse, deterministic=feature != "atomic_dq",
                          **params)


def portable_variants(kernels: Iterable[str] = ("fwd", "bwd"), head_dims: Iterable[int] = HEAD_DIMS,
                      *, configs: str = "all", masks: Iterable[str] = ("plain", "causal"),
                      features: Iterable[str] = FEATURES, seqlen: int = 256, tma: bool = True
                      ) -> List[CompileJob]:
    """The compile jobs of the portable kernels for sm90, recorded from real wrapper calls.

    For each head dim and mask (bf16): every candidate config of each autotune space
    (``configs="all"``; ``"first"``: the first only, as FLASHATTN_AUTOTUNE=0). Each feature
    variant (bf16 unless ``fp32``) with the first config. kernels: ``fwd``, ``bwd`` or single
    kernels (``preprocess``, ``dkdv``, ``dq``). Identical compiles (the preprocess kernel
    does not depend on the mask) are kept once. Shapes: batch 2, 4 heads, seqlen_q =
    seqlen_k = ``seqlen`` (sets only the JIT's divisibility hints on the length arguments).
    """
    if configs not in ("all", "first"):
        raise ValueError(f"configs must be 'all' or 'first', got {configs!r}")
    wanted = [w.strip() for w in kernels if w.strip()]
    unknown = [f for f in features if f not in FEATURES]
    if unknown:
        raise ValueError(f"features: unknown {unknown}; allowed {list(FEATURES)}")
    kinds = [k for k in ("fwd", "bwd") if any(_selected(n, wanted) for n in
                                              ({"fwd"} if k == "fwd" else
                                               {"bwd_preprocess", "bwd_dkdv", "bwd_dq"}))]
    calls = []  # (kind, d, causal, feature, all configs?, variant label)
    for d in head_dims:
        for mask in masks:
            for kind in kinds:
                calls.append((kind, d, mask == "causal", None, configs == "all", f"d{d} {mask}"))
        for feature in features:
            for kind in kinds:
                if feature == "atomic_dq" and kind == "fwd":
                    continue
                calls.append((kind, d, False, feature, False, f"d{d} {feature}"))

    jobs: List[CompileJob] = []
    seen = set()
    for kind, d, causal, feature, every, variant in calls:
        try:
            with sm90_launch_setup(tma), _env(FLASHATTN_AUTOTUNE="1" if every else "0"), \
                    record_launches() as records:
                _call_wrappers(kind, d, causal=causal, feature=feature, seqlen=seqlen)
        except Exception as exc:  # a wrapper that changed under us fails its rows, not the run
            failed = KernelReport(kind, None, None, None, None, 0.0, False,
                                  "recording the launch failed: " + _short_error(exc))
            jobs.append(CompileJob(kind, variant, "-", _bind(lambda r: r, failed)))
            continue
        for rec in records:
            name = rec.kernel_name
            if not _selected(name, wanted):
                continue
            # key = what the compiler sees; labels do not count
            signature, constexprs, attrs, options = launch_compile_args(rec)
            key = (name, json.dumps(signature, sort_keys=True), repr(sorted(constexprs.items())),
                   repr(sorted(attrs.items())), repr(sorted(options.items())))
            if key in seen:
                continue
            seen.add(key)
            jobs.append(CompileJob(name, variant, config_label(rec, options),
                                   _bind(compile_launch, rec, name)))
    return jobs


def _bind(fn, *args):
    def run():
        return fn(*args)
    return run


def format_table(reports: Sequence[KernelReport]) -> str:
    """The report as a fixed-width table (one row per compiled variant)."""
    head = ("kernel", "variant", "config", "regs", "spills (st/ld B)", "shared KiB", "compile s")
    rows = []
    for r in reports:
        if r.ok:
            rows.append((r.kernel or r.name, r.variant, r.config, str(r.registers),
                         f"{r.spill_stores}/{r.spill_loads}" + (" SPILL" if r.spills else ""),
                         f"{r.shared_bytes / 1024:.1f}"
                         + (" OVER" if r.shared_bytes > SM90_SHARED_LIMIT else ""),
                         f"{r.compile_seconds:.1f}"))
        else:
            first = (r.error or "").splitlines()[0][:60] if r.error else ""
            rows.append((r.kernel or r.name, r.variant, r.config, "-", "FAILED", "-",
                         f"{r.compile_seconds:.1f}  {first}"))
    widths = [max(len(h), *(len(row[i]) for row in rows)) if rows else len(h)
              for i, h in enumerate(head)]
    lines = ["  ".join(h.ljust(w) for h, w in zip(head, widths))]
    lines.append("  ".join("-" * w for w in widths))
    lines += ["  ".join(c.ljust(w) for c, w in zip(row, widths)).rstrip() for row in rows]
    return "\n".join(lines)

