"""The flashattn benchmark grid: our kernels beside the anchors of ``shared/ANCHORS.md``.

Grid (flash-attn's own benchmark configuration): 16k tokens per call (``b = 16384 // s``),
hidden 2048 (``h = 2048 // d``), layout (b, s, h, d), bf16, random normal inputs.

- ``fwd`` / ``bwd``: TFLOP/s with FLOPs ``4·b·s²·h·d`` (halved when causal) and
  ``bwd = 2.5 × fwd``. The backward is timed alone: one forward builds the graph, then
  ``torch.autograd.grad(out, inputs, dout, retain_graph=True)`` is timed.
- ``decode``: one new query token against a KV cache, GQA 32/8 heads, d=128;
  TB/s = bytes of K and V / time. Ours also runs with a paged cache (page size
  ``DECODE_PAGE_SIZE``, shuffled page table): rows with a ``page_size`` key.
- ``mem``: peak extra bytes of one forward + backward (b=1, h=16, d=128, causal), MiB.

Impls: ``flashattn`` (ours, FLASHATTN_BACKEND=auto), ``flashattn-<backend>`` (ours, backend
forced: portable, cpu, hopper), ``sdpa-flash``, ``sdpa-cudnn``, ``sdpa-math`` (SDPA with one
backend forced; inputs transposed to (b, h, s, d) outside the timed region), ``flex``
(``torch.compile(flex_attention)``, a causal block mask when causal; d=128 only unless asked)
and ``fa4`` (FlashAttention-4, ``flash_attn.cute.flash_attn_func`` of the ``flash-attn-4``
package, on the same (b, s, h, d) tensors as ours; fwd, bwd and mem rows, no decode row).
``fa4`` is in the default set: where ``flash_attn.cute`` does not import, the run drops it with
one line saying why (:func:`drop_unavailable`) and goes on.

Timing: ``triton.testing.do_bench``, median, after one untimed call (compilation and
autotuning happen there). An impl that fails or is unsupported for a point becomes a row with
``"error"`` and no number; the run goes on.

Rows: ``{"impl", "mode", "d", "causal", "s", "b", "h", "tflops" | "tbps" | "mib", "ms",
"date", "torch", "triton", "gpu"}`` (plus ``"error"`` on failure, and with ``--rounds`` N > 1
``"rounds"``: every round's value, the row holding the best). Result files hold
``{"rows": [...]}``; merging replaces rows with the same (impl, mode, d, causal, s, b, h).

Importable without a GPU (the helpers are tested on CPU); ``python -m flashattn bench`` is the
command line. ``python -m flashattn.bench merge SRC DST`` merges one result file into another.
"""
from __future__ import annotations

import contextlib
import datetime
import json
import math
import os
import re
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Dict, Iterable, List, Optional, Sequence, Tuple

# ---------------------------------------------------------------------------------------------
# The grid
# ---------------------------------------------------------------------------------------------
TOKENS = 16384
HIDDEN = 2048
HEAD_DIMS: Tuple[int, ...] = (128, 64, 256)  # d=128 first: the most useful under a time budget
SEQLENS: Tuple[int, ...] = (512, 1024, 2048, 4096, 8192, 16384)
MODES: Tuple[str, ...] = ("fwd", "bwd", "decode", "mem", "quant")
ATTN_MODES: Tuple[str, ...] = ("fwd", "bwd")

DECODE_POINTS: Tuple[Tuple[int, int], ...] = ((1, 16384), (1, 131072), (8, 8192), (32, 4096),
                                              (64, 32768))
DECODE_HEADS, DECODE_HEADS_K, DECODE_D = 32, 8, 128
DECODE_PAGE_SIZE = 16  # the paged decode row (ours only)

MEM_SEQLENS: Tuple[int, ...] = (4096, 16384, 65536)
MEM_B, MEM_H, MEM_D = 1, 16, 128

OURS = "flashattn"
FA4 = "fa4"  # FlashAttention-4 (flash-attn-4, CuTe DSL): the anchor the project measures against
ANCHORS: Tuple[str, ...] = ("sdpa-flash", "sdpa-cudnn", "flex", FA4)
DEFAULT_IMPLS: Tuple[str, ...] = (OURS,) + ANCHORS
SDPA_BACKENDS = {"sdpa-flash": "FLASH_ATTENTION", "sdpa-cudnn": "CUDNN_ATTENTION",
                 "sdpa-math": "MATH", "sdpa-efficient": "EFFICIENT_ATTENTION"}
FLEX_HEAD_DIMS: Tuple[int, ...] = (128,)
# FA4's sm90 head dims (flash_attn/cute/interface.py, _validate_head_dims): 8..256, a multiple of
# 16 bytes of the element (8 in bf16); the same d for q, k and v here
FA4_HEAD_DIM_RANGE: Tuple[int, int] = (8, 256)
FA4_HEAD_DIM_MULTIPLE = 8

ROW_KEY: Tuple[str, ...] = ("impl", "mode", "d", "causal", "s", "b", "h", "page_size")
METRIC = {"fwd": "tflops", "bwd": "tflops", "decode": "tbps", "mem": "mib", "quant": "tbps"}
# FP8 rows (``flashattn bench --dtype fp8``): the FP8 forward on inputs quantized beforehand
# (block scales + incoherent processing), flash_attn_fp8_func end to end (bf16 in, quantize +
# FP8 forward, bf16 out), the portable FP8 kernel, and the fused quantize pass alone (mode
# "quant", TB/s of bf16 read + fp8 written)
# FP8 rows (cont.): "flashattn-fp8-fa3" is FlashAttention-3's API, flash_attn_func on e4m3
# q, k, v in their own (b, s, h, d) layout with one descale per (batch, kv head): V^T pass +
# FP8 forward, as a caller with FP8 tensors of its own pays them
FP8_IMPLS: Tuple[str, ...] = ("flashattn-fp8", "flashattn-fp8-e2e", "flashattn-fp8-fa3",
                              "flashattn-fp8-portable")
FP8_QUANTIZE = "flashattn-fp8-quantize"
FP8_DEFAULT_IMPLS: Tuple[str, ...] = ("flashattn-fp8", "flashattn-fp8-e2e", "flashattn-fp8-fa3",
                                      OURS, "sdpa-cudnn")

DTYPE = "bfloat16"


# ---------------------------------------------------------------------------------------------
# Small pure helpers (no torch needed)
# ---------------------------------------------------------------------------------------------
_SIZE_RE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([kKmM]?)\s*$")


def parse_seqlen(text: str) -> int:
    """'512' -> 512, '2k' -> 2048, '16K' -> 16384, '1m' -> 1048576 (k = 1024)."""
    m = _SIZE_RE.match(str(text))
    if not m:
        raise ValueError(f"not a sequence length: {text!r} (examples: 512, 2k, 16k)")
    value = float(m.group(1)) * {"": 1, "k": 1024, "m": 1024 * 1024}[m.group(2).lower()]
    if value != int(value) or value < 1:
        raise ValueError(f"not a sequence length: {text!r} (examples: 512, 2k, 16k)")
    return int(value)


def format_seqlen(s: int) -> str:
    """2048 -> '2k', 512 -> '512', 131072 -> '128k'."""
    return f"{s // 1024}k" if s >= 1024 and s % 1024 == 0 else str(s)


def parse_list(text: str, item: Callable[[str], Any] = str) -> List[Any]:
    """'a,b, c' -> [item('a'), item('b'), item('c')]; empty entries are dropped."""
    return [item(p.strip()) for p in str(text).split(",") if p.strip()]


def grid_shape(s: int, d: int) -> Tuple[int, int]:
    """(batch, heads) of the grid: 16k tokens, hidden 2048."""
    return max(1, TOKENS // s), max(1, HIDDEN // d)


def attn_flops(mode: str, b: int, s: int, h: int, d: int, causal: bool) -> float:
    """FLOPs of one call: fwd = 4·b·s²·h·d (halved when causal); bwd = 2.5 × fwd."""
    f = 4.0 * b * s * s * h * d
    if causal:
        f /= 2
    if mode == "bwd":
        f *= 2.5
    return f


def decode_bytes(b: int, kv_len: int, h_k: int = DECODE_HEADS_K, d: int = DECODE_D,
                 elem: int = 2) -> int:
    """Bytes of K and V read by one decode step."""
    return 2 * b * kv_len * h_k * d * elem


def row_key(row: Dict[str, Any]) -> Tuple[Any, ...]:
    return tuple(row.get(k) for k in ROW_KEY)


def merge_rows(old: Iterable[Dict[str, Any]], new: Iterable[Dict[str, Any]]) -> List[Dict[str, Any]]:
    """Rows of ``old`` with those of ``new`` merged in: a new row replaces the old row with the
    same (impl, mode, d, causal, s, b, h) in place; other new rows are appended in order."""
    merged: List[Dict[str, Any]] = list(old)
    index = {row_key(r): i for i, r in enumerate(merged)}
    for r in new:
        k = row_key(r)
        if k in index:
            merged[index[k]] = r
        else:
            index[k] = len(merged)
            merged.append(r)
    return merged


def load_rows(path: "str | os.PathLike[str]") -> List[Dict[str, Any]]:
    """Rows of a result file; [] when it does not exist."""
    p = Path(path)
    if not p.exists():
        return []
    with open(p) as f:
        data = json.load(f)
    rows = data.get("rows", []) if isinstance(data, dict) else data
    if not isinstance(rows, list):
        raise ValueError(f"{p}: expected {{\"rows\": [...]}}")
    return rows


def save_rows(path: "str | os.PathLike[str]", rows: Iterable[Dict[str, Any]],
              merge: bool = True) -> List[Dict[str, Any]]:
    """Write ``{"rows": [...]}`` to ``path`` (merged into what is there unless merge=False),
    atomically; returns the rows written."""
    p = Path(path)
    out = merge_rows(load_rows(p), rows) if merge else list(rows)
    if p.parent and not p.parent.exists():
        p.parent.mkdir(parents=True, exist_ok=True)
    tmp = p.with_name(p.name + ".tmp")
    with open(tmp, "w") as f:
        json.dump({"rows": out}, f, indent=1)
        f.write("\n")
    os.replace(tmp, p)
    return out


def gpu_slug(name: str) -> str:
    """File-name form of a device name: 'NVIDIA H100 80GB HBM3' -> 'h100'."""
    low = name.lower()
    for token in ("gb200", "b200", "gh200", "h200", "h100", "h800", "h20", "a100", "a800", "a10g",
                  "l40s", "l40", "l4", "mi300x", "mi250x", "rtx 4090", "rtx 3090", "t4", "v100"):
        if re.search(r"(^|[^a-z0-9])" + re.escape(token) + r"($|[^a-z0-9])", low):
            return token.replace(" ", "")
    slug = re.sub(r"[^a-z0-9]+", "-", low).strip("-")
    return slug or "unknown"


def cpu_speed_rows(seqlens: Sequence[int], dtypes: Sequence[Any] = (), heads: int = 8,
                   head_dim: int = 64, causal: bool = True) -> List[Dict[str, Any]]:
    """CPU fwd + bwd time (causal unless told otherwise, b=1) of ``flash_attn_func`` beside
    ``F.scaled_dot_product_attention`` on the same (b, s, h, d) tensors (transposed views).
    Rows: dtype, s, ours_ms, sdpa_ms, speed (SDPA's time / ours: >= 1 means ours is at least
    as fast).

    Timing: rounds of blocks, each implementation a block of back-to-back calls after one
    untimed call, the fastest call of all blocks kept. Blocks, not single calls alternated:
    with calls alternated, each implementation's allocations land in the memory the other
    just freed, and the kernels' zero-filled gradient buffers then page-fault (measured at
    s = 1k: 3 fills of 340 us instead of 36 us for whichever runs second), which says
    nothing about either implementation."""
    import torch
    import torch.nn.functional as F

    import flashattn

    dtypes = list(dtypes) or [torch.float32, torch.bfloat16]
    rows = []
    for dtype in dtypes:
        for s in seqlens:
            q, k, v = (torch.randn(1, s, heads, head_dim, dtype=dtype, requires_grad=True)
                       for _ in range(3))
            g = torch.randn(1, s, heads, head_dim, dtype=dtype)

            def ours():
                flashattn.flash_attn_func(q, k, v, causal=causal).backward(g)

            def sdpa():
                F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2),
                                               v.transpose(1, 2), is_causal=causal
                                               ).backward(g.transpose(1, 2))

            best = {"ours": float("inf"), "sdpa": float("inf")}
            block = 5 if s <= 2048 else (2 if s <= 8192 else 1)
            for _ in range(3):  # rounds
                for name, fn in (("ours", ours), ("sdpa", sdpa)):
                    fn()  # untimed: this block's allocator state
                    for _ in range(block):
                        t0 = time.perf_counter()
                        fn()
                        best[name] = min(best[name], (time.perf_counter() - t0) * 1e3)
            rows.append(dict(dtype=str(dtype).replace("torch.", ""), s=s, d=head_dim,
                             causal=causal, ours_ms=best["ours"], sdpa_ms=best["sdpa"],
                             speed=best["sdpa"] / best["ours"]))
    return rows


def default_results_path(gpu_name: str) -> Path:
    """benchmarks/results/<gpu>.json of the repository checkout this package runs from (an
    editable install), else under the current directory."""
    repo = Path(__file__).resolve().parents[2]
    base = repo if (repo / "benchmarks" / "results").is_dir() else Path.cwd()
    return base / "benchmarks" / "results" / f"{gpu_slug(gpu_name)}.json"


def make_row(impl: str, mode: str, d: int, causal: bool, s: int, b: int, h: int, *,
             value: Optional[float], ms: Optional[float], env: Dict[str, str],
             error: Optional[str] = None, note: Optional[str] = None,
             page_size: Optional[int] = None) -> Dict[str, Any]:
    """One result row in the schema of the module docstring (metric key chosen by mode)."""
    row: Dict[str, Any] = {
        "impl": impl, "mode": mode, "d": int(d), "causal": bool(causal), "s": int(s),
        "b": int(b), "h": int(h),
        METRIC[mode]: _round(value, 5),
        "ms": _round(ms, 6),
        "date": env["date"], "torch": env["torch"], "triton": env["triton"], "gpu": env["gpu"],
    }
    if page_size is not None:
        row["page_size"] = int(page_size)
    if error is not None:
        row["error"] = error
    if note is not None:
        row["note"] = note
    return row


def _round(x: Optional[float], digits: int) -> Optional[float]:
    """``digits`` significant digits (results are measurements, not exact numbers)."""
    return None if x is None else float(f"{float(x):.{digits}g}")


def row_value(row: Dict[str, Any]) -> Optional[float]:
    v = row.get(METRIC.get(row.get("mode", ""), "tflops"))
    return None if v is None else float(v)


def short_error(exc: BaseException, limit: int = 240) -> str:
    msg = str(exc).strip().splitlines()
    first = next((m.strip() for m in msg if m.strip()), "")
    text = f"{type(exc).__name__}: {first}" if first else type(exc).__name__
    return text if len(text) <= limit else text[: limit - 3] + "..."


# ---------------------------------------------------------------------------------------------
# Plan: which (point, impl) pairs to run
# ---------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Point:
    mode: str
    d: int
    causal: bool
    s: int
    b: int
    h: int
    page_size: Optional[int] = None  # decode with a paged KV cache

    def label(self) -> str:
        c = "causal" if self.causal else "full"
        page = f" page={self.page_size}" if self.page_size else ""
        return f"{self.mode} d={self.d} {c} s={format_seqlen(self.s)} b={self.b} h={self.h}{page}"


def plan(modes: Sequence[str] = ATTN_MODES, head_dims: Sequence[int] = HEAD_DIMS,
         causals: Sequence[bool] = (False, True), seqlens: Sequence[int] = SEQLENS,
         impls: Sequence[str] = DEFAULT_IMPLS, flex_all_d: bool = False,
         decode_points: Sequence[Tuple[int, int]] = DECODE_POINTS,
         mem_seqlens: Sequence[int] = MEM_SEQLENS) -> List[Tuple[Point, str]]:
    """The (point, impl) pairs in run order: fwd/bwd by (d, causal, s), then decode, then mem.

    Flex runs at d in FLEX_HEAD_DIMS only unless ``flex_all_d``; decode uses SDPA anchors and
    ours (flex and fa4 have no decode row here); mem adds the naive ``sdpa-math`` row.
    """
    for m in modes:
        if m not in MODES:
            raise ValueError(f"unknown mode {m!r}; allowed: {', '.join(MODES)}")
    for i in impls:
        check_impl(i)
    out: List[Tuple[Point, str]] = []
    attn = [m for m in ATTN_MODES if m in modes]
    if attn:
        for d in head_dims:
            for causal in causals:
                for s in seqlens:
                    b, h = grid_shape(s, d)
                    for mode in attn:
                        for impl in impls:
                            if impl == "flex" and not flex_all_d and d not in FLEX_HEAD_DIMS:
                                continue
                            out.append((Point(mode, d, causal, s, b, h), impl))
    if "decode" in modes:
        for b, kv_len in decode_points:
            for impl in impls:
                if impl in ("flex", FA4):
                    continue
                out.append((Point("decode", DECODE_D, False, kv_len, b, DECODE_HEADS), impl))
            for impl in impls:  # ours again with a paged cache
                if is_ours(impl):
                    out.append((Point("decode", DECODE_D, False, kv_len, b, DECODE_HEADS,
                                      DECODE_PAGE_SIZE), impl))
    if "quant" in modes:
        for d in head_dims:
            for s in seqlens:
                b, h = grid_shape(s, d)
                out.append((Point("quant", d, False, s, b, h), FP8_QUANTIZE))
    if "mem" in modes:
        mem_impls = [i for i in impls if i != "flex"]
        if "sdpa-math" not in mem_impls:
            mem_impls.append("sdpa-math")
        for s in mem_seqlens:
            for impl in mem_impls:
                out.append((Point("mem", MEM_D, True, s, MEM_B, MEM_H), impl))
    return out


# Every name check_impl accepts, in the order an error message lists them.
VALID_IMPLS: Tuple[str, ...] = (
    (OURS,) + tuple(f"{OURS}-{b}" for b in ("auto", "portable", "cpu", "hopper"))
    + ("flex", FA4) + tuple(SDPA_BACKENDS) + FP8_IMPLS + (FP8_QUANTIZE,))


def check_impl(impl: str) -> str:
    if impl in (OURS, "flex", FA4) or impl in SDPA_BACKENDS:
        return impl
    if impl in FP8_IMPLS or impl == FP8_QUANTIZE:
        return impl
    if impl.startswith(OURS + "-") and impl[len(OURS) + 1:] in ("auto", "portable", "cpu", "hopper"):
        return impl
    raise ValueError(f"unknown impl {impl!r}; allowed: {', '.join(VALID_IMPLS)}")


def is_ours(impl: str) -> bool:
    return impl == OURS or impl.startswith(OURS + "-")


def is_fp8(impl: str) -> bool:
    return impl in FP8_IMPLS or impl == FP8_QUANTIZE


# ---------------------------------------------------------------------------------------------
# FlashAttention-4: an optional package, imported only when its rows run
# ---------------------------------------------------------------------------------------------
def fa4_function() -> Callable[..., Any]:
    """``flash_attn.cute.flash_attn_func`` (raises what its import raises)."""
    from flash_attn.cute import flash_attn_func

    return flash_attn_func


def fa4_unavailable() -> Optional[str]:
    """Why FA4 cannot run here (one line), or None when ``flash_attn.cute`` imports. Any
    exception counts: the CuTe DSL can fail at import for reasons other than a missing module."""
    try:
        fa4_function()
    except Exception as exc:
        return f"flash_attn.cute does not import ({short_error(exc, 160)})"
    return None


def fa4_unsupported(d: int) -> Optional[str]:
    """Why FA4's sm90 kernels refuse head dim ``d`` (bf16, d_v = d), or None."""
    lo, hi = FA4_HEAD_DIM_RANGE
    if lo <= d <= hi and d % FA4_HEAD_DIM_MULTIPLE == 0:
        return None
    return (f"fa4 (sm90) takes head dims {lo}..{hi} in multiples of {FA4_HEAD_DIM_MULTIPLE}, "
            f"not d={d}")


def first_output(result: Any) -> Any:
    """The attention output of a call that returns ``out`` or ``(out, lse, ...)``: FA4's
    ``flash_attn_func`` has returned both forms across its releases."""
    return result[0] if isinstance(result, (tuple, list)) else result


def drop_unavailable(pairs: Sequence[Tuple[Point, str]],
                     say: Optional[Callable[[str], None]] = None) -> List[Tuple[Point, str]]:
    """``pairs`` without those of an optional impl that cannot run here (``fa4`` where
    ``flash_attn.cute`` does not import), with one line per dropped impl through ``say``
    (stderr by default). Other impls keep the error-row convention per point."""
    if not any(impl == FA4 for _, impl in pairs):
        return list(pairs)
    why = fa4_unavailable()
    if why is None:
        return list(pairs)
    n = sum(impl == FA4 for _, impl in pairs)
    line = f"bench: {FA4} skipped ({n} measurements): {why}"
    if say is None:
        print(line, file=sys.stderr, flush=True)
    else:
        say(line)
    return [(p, impl) for p, impl in pairs if impl != FA4]


# ---------------------------------------------------------------------------------------------
# Environment
# ---------------------------------------------------------------------------------------------
def environment() -> Dict[str, str]:
    """date, torch, triton and gpu of this run (gpu = CUDA device name, or 'cpu')."""
    import torch

    try:
        import triton

        triton_version = triton.__version__
    except Exception:  # pragma: no cover - no triton
        triton_version = "none"
    gpu = torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu"
    return {"date": datetime.date.today().isoformat(), "torch": torch.__version__,
            "triton": triton_version, "gpu": gpu}


# ---------------------------------------------------------------------------------------------
# Impl construction: (inputs to differentiate, callable, context that must be active)
# ---------------------------------------------------------------------------------------------
_FLEX_COMPILED: Optional[Callable[..., Any]] = None


def _flex() -> Callable[..., Any]:
    global _FLEX_COMPILED
    if _FLEX_COMPILED is None:
        import torch
        from torch.nn.attention.flex_attention import flex_attention

        # Every grid shape compiles once; the default recompile limit (8) would silently
        # fall back to eager (very slow) half-way through the grid.
        dyn = torch._dynamo.config
        for name in ("cache_size_limit", "recompile_limit", "accumulated_cache_size_limit",
                     "accumulated_recompile_limit"):
            if hasattr(dyn, name):
                setattr(dyn, name, max(getattr(dyn, name), 512))
        _FLEX_COMPILED = torch.compile(flex_attention, dynamic=False)
    return _FLEX_COMPILED


def impl_context(impl: str) -> "contextlib.AbstractContextManager[None]":
    """What must be active while ``impl`` runs: the SDPA backend, or FLASHATTN_BACKEND."""
    if impl in SDPA_BACKENDS:
        from torch.nn.attention import SDPBackend, sdpa_kernel

        return sdpa_kernel([getattr(SDPBackend, SDPA_BACKENDS[impl])])
    if is_fp8(impl):
        from flashattn import use_backend

        return use_backend("portable" if impl.endswith("-portable") else "auto")
    if is_ours(impl):
        backend = impl[len(OURS) + 1:] if impl != OURS else "auto"
        from flashattn import use_backend

        return use_backend(backend)
    return contextlib.nullcontext()


def per_head_fp8(q: Any, k: Any, v: Any) -> Tuple[Any, ...]:
    """(q8, k8, v8, q_descale, k_descale, v_descale): q, k, v (b, s, h, d) cast to e4m3 with
    FlashAttention-3's per-tensor scaling, one descale per (batch, kv head) = amax / 448 (q's
    over the query heads of each group), no rotation: what a caller of FA3's FP8 API hands it."""
    import torch

    from flashattn.fp8_format import E4M3_MAX, FP8_DTYPE

    b, _, h, _ = q.shape
    h_k = k.shape[2]

    def cast(x: Any, heads_per_scale: int) -> Tuple[Any, Any]:
        xf = x.float()
        amax = xf.abs().amax(dim=(1, 3)).view(b, -1, heads_per_scale).amax(dim=2)
        descale = torch.where(amax > 0, amax / E4M3_MAX, torch.ones_like(amax))
        per_head = descale.repeat_interleave(heads_per_scale, dim=1)[:, None, :, None]
        return (xf / per_head).clamp(-E4M3_MAX, E4M3_MAX).to(FP8_DTYPE), descale

    (q8, qd), (k8, kd), (v8, vd) = cast(q, h // h_k), cast(k, 1), cast(v, 1)
    return q8, k8, v8, qd, kd, vd


def build_attention(impl: str, q: Any, k: Any, v: Any, causal: bool
                    ) -> Tuple[Tuple[Any, ...], Callable[..., Any]]:
    """``(inputs, fn)`` with ``fn(*inputs) -> out``. q, k, v are (b, s, h, d); the SDPA and
    flex impls get (b, h, s, d) contiguous copies, made here, outside any timed region; ours
    and fa4 take q, k, v as they are. The FP8 forward gets q, k, v quantized here (block
    scales, incoherent processing). fa4 at a head dim its sm90 kernels refuse raises
    NotImplementedError (an error row)."""
    if impl in ("flashattn-fp8", "flashattn-fp8-portable"):
        from flashattn import fp8

        qkv8 = fp8.quantize(q.detach(), k.detach(), v.detach(), seed=0)

        def ours_fp8():
            return fp8.attention(qkv8, causal=causal)

        return (), ours_fp8
    if impl == "flashattn-fp8-fa3":
        import flashattn

        q8, k8, v8, qd, kd, vd = per_head_fp8(q.detach(), k.detach(), v.detach())

        def ours_fp8_fa3():
            return flashattn.flash_attn_func(q8, k8, v8, causal=causal, q_descale=qd,
                                             k_descale=kd, v_descale=vd)

        return (), ours_fp8_fa3
    if impl == "flashattn-fp8-e2e":
        from flashattn import fp8

        def ours_fp8_e2e(q_, k_, v_):
            return fp8.flash_attn_fp8_func(q_, k_, v_, causal=causal, seed=0)

        return (q.detach(), k.detach(), v.detach()), ours_fp8_e2e
    if is_ours(impl):
        import flashattn

        def ours(q_, k_, v_):
            return flashattn.flash_attn_func(q_, k_, v_, causal=causal)

        return (q, k, v), ours
    if impl == FA4:
        why = fa4_unsupported(q.shape[-1])
        if why is not None:
            raise NotImplementedError(why)
        fa4_func = fa4_function()

        def fa4(q_, k_, v_):
            # the default softmax scale (d ** -0.5), as ours; out only, lse is not timed apart
            return first_output(fa4_func(q_, k_, v_, causal=causal))

        return (q, k, v), fa4
    import torch

    qt, kt, vt = (x.detach().transpose(1, 2).contiguous().requires_grad_(x.requires_grad)
                  for x in (q, k, v))
    if impl in SDPA_BACKENDS:
        import torch.nn.functional as F

        gqa = qt.shape[1] != kt.shape[1]

        def sdpa(q_, k_, v_):
            if gqa:
                return F.scaled_dot_product_attention(q_, k_, v_, is_causal=causal, enable_gqa=True)
            return F.scaled_dot_product_attention(q_, k_, v_, is_causal=causal)

        return (qt, kt, vt), sdpa
    if impl == "flex":
        from torch.nn.attention.flex_attention import create_block_mask

        block_mask = None
        if causal:
            s_q, s_k = qt.shape[2], kt.shape[2]

            def causal_mod(b, h, q_idx, kv_idx):
                return q_idx + (s_k - s_q) >= kv_idx

            block_mask = create_block_mask(causal_mod, None, None, s_q, s_k, device=qt.device)
        compiled = _flex()
        gqa = qt.shape[1] != kt.shape[1]

        def flex(q_, k_, v_):
            return compiled(q_, k_, v_, block_mask=block_mask, enable_gqa=gqa)

        return (qt, kt, vt), flex
    raise ValueError(check_impl(impl))


# ---------------------------------------------------------------------------------------------
# Measurements (CUDA)
# ---------------------------------------------------------------------------------------------
@dataclass
class Timing:
    warmup_ms: int = 25
    rep_ms: int = 100


def _time_ms(fn: Callable[[], Any], timing: Timing, device: str) -> float:
    """Median ms of ``fn``: triton's do_bench on CUDA (L2 flushed between calls); on CPU (used
    by the tests of this module) a plain wall-clock median."""
    if device == "cuda":
        from triton.testing import do_bench

        return float(do_bench(fn, warmup=timing.warmup_ms, rep=timing.rep_ms, return_mode="median"))
    times: List[float] = []
    deadline = time.perf_counter() + timing.rep_ms * 1e-3
    while len(times) < 3 or time.perf_counter() < deadline:
        t0 = time.perf_counter()
        fn()
        times.append((time.perf_counter() - t0) * 1e3)
    times.sort()
    return times[len(times) // 2]


def _sync(device: str) -> None:
    if device == "cuda":
        import torch

        torch.cuda.synchronize()


def _randn(shape: Sequence[int], dtype: Any, requires_grad: bool = False,
           device: str = "cuda") -> Any:
    import torch

    return torch.randn(*shape, device=device, dtype=dtype).requires_grad_(requires_grad)


def measure_attention(impl: str, point: Point, timing: Timing,
                      device: str = "cuda") -> Tuple[float, float]:
    """(TFLOP/s, ms) of ``impl`` at a fwd/bwd grid point."""
    import torch

    dtype = getattr(torch, DTYPE)
    grad = point.mode == "bwd"
    shape = (point.b, point.s, point.h, point.d)
    with impl_context(impl):
        q, k, v = (_randn(shape, dtype, grad, device) for _ in range(3))
        inputs, fn = build_attention(impl, q, k, v, point.causal)
        del q, k, v
        if point.mode == "fwd":
            def step():
                return fn(*inputs)
        else:
            out = fn(*inputs)
            dout = torch.randn_like(out)

            def step():
                return torch.autograd.grad(out, inputs, dout, retain_graph=True)
        step()  # compile / autotune outside the timed region
        _sync(device)
        ms = _time_ms(step, timing, device)
    flops = attn_flops(point.mode, point.b, point.s, point.h, point.d, point.causal)
    return flops / (ms * 1e-3) / 1e12, ms


def measure_decode(impl: str, point: Point, timing: Timing,
                   device: str = "cuda") -> Tuple[float, float, Optional[str]]:
    """(TB/s, ms, note) of one decode step: 1 query token, KV cache of point.s tokens."""
    import torch

    dtype = getattr(torch, DTYPE)
    b, kv_len, h, h_k, d = point.b, point.s, DECODE_HEADS, DECODE_HEADS_K, DECODE_D
    note = None
    with impl_context(impl):
        if is_ours(impl):
            import flashattn

            kvcache = getattr(flashattn, "flash_attn_with_kvcache", None)
            if kvcache is None:
                raise NotImplementedError("flashattn.flash_attn_with_kvcache does not exist yet")
            q = _randn((b, 1, h, d), dtype, device=device)
            seqlens = torch.full((b,), kv_len, dtype=torch.int32, device=device)
            if point.page_size:
                # pages of every sequence scattered over the pool in random order
                page = point.page_size
                n_pages = -(-kv_len // page)
                k_cache = _randn((b * n_pages, page, h_k, d), dtype, device=device)
                v_cache = _randn((b * n_pages, page, h_k, d), dtype, device=device)
                table = torch.randperm(b * n_pages, device=device).view(b, n_pages).to(
                    torch.int32)
                note = f"paged, page_size {page}, shuffled block_table"

                def step():
                    return kvcache(q, k_cache, v_cache, cache_seqlens=seqlens, block_table=table)
            else:
                k_cache = _randn((b, kv_len, h_k, d), dtype, device=device)
                v_cache = _randn((b, kv_len, h_k, d), dtype, device=device)

                def step():
                    return kvcache(q, k_cache, v_cache, cache_seqlens=seqlens)
        elif impl in SDPA_BACKENDS:
            import torch.nn.functional as F

            if point.page_size:
                raise NotImplementedError("SDPA has no paged KV cache")
            q = _randn((b, h, 1, d), dtype, device=device)
            k_cache = _randn((b, h_k, kv_len, d), dtype, device=device)
            v_cache = _randn((b, h_k, kv_len, d), dtype, device=device)

            def step():
                return F.scaled_dot_product_attention(q, k_cache, v_cache, enable_gqa=True)

            try:
                step()
            except RuntimeError:
                # The backend refuses enable_gqa: fold the query heads of each KV head into
                # the query length instead (same math for one non-causal query token, K/V
                # still read once).
                q_packed = q.view(b, h_k, h // h_k, d)
                note = "gqa folded into the query length"

                def step():
                    return F.scaled_dot_product_attention(q_packed, k_cache, v_cache)
        else:
            raise NotImplementedError(f"{impl} has no decode row")
        step()
        _sync(device)
        # A decode step is tens of microseconds: do_bench's warm-up alone leaves the GPU below
        # its boost clock after the set-up above (measured on the H100: three back-to-back
        # measurements of one point gave 1.09, 1.88, 2.80 TB/s). Keep it busy for a while first.
        _busy(step, DECODE_SPIN_UP_S, device)
        ms = _time_ms(step, timing, device)
    return decode_bytes(b, kv_len, h_k, d) / (ms * 1e-3) / 1e12, ms, note


DECODE_SPIN_UP_S = 0.5


def _busy(fn: Callable[[], Any], seconds: float, device: str) -> None:
    """Call ``fn`` back to back for ``seconds`` (synchronising every 50 calls)."""
    deadline = time.perf_counter() + (seconds if device == "cuda" else 0.0)
    n = 0
    while time.perf_counter() < deadline:
        fn()
        n += 1
        if n % 50 == 0:
            _sync(device)
    _sync(device)


def measure_memory(impl: str, point: Point, device: str = "cuda") -> Tuple[float, float]:
    """(peak extra MiB, ms) of one forward + backward: allocated beyond the inputs and dout."""
    import torch

    if device != "cuda":
        raise NotImplementedError("the mem rows use CUDA allocator statistics")

    dtype = getattr(torch, DTYPE)
    shape = (point.b, point.s, point.h, point.d)
    with impl_context(impl):
        q, k, v = (_randn(shape, dtype, True) for _ in range(3))
        inputs, fn = build_attention(impl, q, k, v, point.causal)
        del q, k, v
        dout = torch.randn_like(fn(*inputs).detach())  # also compiles / autotunes

        def fwd_bwd():
            out = fn(*inputs)
            return torch.autograd.grad(out, inputs, dout)

        fwd_bwd()  # warm: autotuning allocates scratch that a real step does not
        torch.cuda.synchronize()
        torch.cuda.empty_cache()
        base = torch.cuda.memory_allocated()
        torch.cuda.reset_peak_memory_stats()
        t0 = time.perf_counter()
        grads = fwd_bwd()
        torch.cuda.synchronize()
        ms = (time.perf_counter() - t0) * 1e3
        peak = torch.cuda.max_memory_allocated() - base
        del grads
    return peak / 2**20, ms


def _cleanup_after_error(device: str) -> None:
    import torch

    if device != "cuda":
        return
    try:
        torch.cuda.synchronize()
    except Exception:
        pass
    torch.cuda.empty_cache()


def measure_quantize(point: Point, timing: Timing, device: str = "cuda") -> Tuple[float, float]:
    """(TB/s, ms) of the fused FP8 quantize pass (block scales + incoherent processing) over
    bf16 q, k, v of the point's shape: bytes = bf16 read + fp8 written (+ the descales)."""
    import torch

    from flashattn import fp8

    shape = (point.b, point.s, point.h, point.d)
    q, k, v = (_randn(shape, torch.bfloat16, False, device) for _ in range(3))

    def step():
        return fp8.quantize(q, k, v, seed=0)

    out = step()
    _sync(device)
    ms = _time_ms(step, timing, device)
    moved = 3 * q.numel() * (2 + 1) + sum(t.numel() * 4 for t in out[3:6])
    return moved / (ms * 1e-3) / 1e12, ms


def measure(point: Point, impl: str, timing: Timing, env: Dict[str, str],
            device: str = "cuda") -> Dict[str, Any]:
    """One row; failures become error rows."""
    note = None
    try:
        if point.mode == "quant":
            value, ms = measure_quantize(point, timing, device)
        elif point.mode in ATTN_MODES:
            value, ms = measure_attention(impl, point, timing, device)
        elif point.mode == "decode":
            value, ms, note = measure_decode(impl, point, timing, device)
        else:
            value, ms = measure_memory(impl, point, device)
    except Exception as exc:  # an anchor (or we) failing must not stop the grid
        _cleanup_after_error(device)
        return make_row(impl, point.mode, point.d, point.causal, point.s, point.b, point.h,
                        value=None, ms=None, env=env, error=short_error(exc),
                        page_size=point.page_size)
    if not math.isfinite(value):
        return make_row(impl, point.mode, point.d, point.causal, point.s, point.b, point.h,
                        value=None, ms=ms, env=env, error="non-finite measurement",
                        page_size=point.page_size)
    return make_row(impl, point.mode, point.d, point.causal, point.s, point.b, point.h,
                    value=value, ms=ms, env=env, note=note, page_size=point.page_size)


# ---------------------------------------------------------------------------------------------
# Runner
# ---------------------------------------------------------------------------------------------
class _Progress:
    """tqdm on a terminal; one plain line per result otherwise (readable in log files)."""

    def __init__(self, total: int, stream: Any = None):
        self.total, self.done = total, 0
        self.stream = stream if stream is not None else sys.stderr
        self.bar = None
        if getattr(self.stream, "isatty", lambda: False)():
            try:
                from tqdm import tqdm

                self.bar = tqdm(total=total, file=self.stream, unit="pt", dynamic_ncols=True)
            except ImportError:
                pass

    def start(self, text: str) -> None:
        if self.bar is not None:
            self.bar.set_description(text)

    def result(self, text: str) -> None:
        self.done += 1
        width = len(str(self.total))
        line = f"[{self.done:>{width}}/{self.total}] {text}"
        if self.bar is not None:
            self.bar.update(1)
            self.bar.write(line)
        else:
            print(line, file=self.stream, flush=True)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()


def describe_row(row: Dict[str, Any]) -> str:
    p = Point(row["mode"], row["d"], row["causal"], row["s"], row["b"], row["h"],
              row.get("page_size"))
    if row.get("error"):
        return f"{p.label():<44} {row['impl']:<18} ERROR {row['error']}"
    unit = {"tflops": "TFLOP/s", "tbps": "TB/s", "mib": "MiB"}[METRIC[row["mode"]]]
    return f"{p.label():<44} {row['impl']:<18} {row_value(row):9.2f} {unit:<8} {row['ms']:.3f} ms"


def best_of(rows: Sequence[Dict[str, Any]]) -> Dict[str, Any]:
    """One (point, impl)'s row over interleaved rounds: the fastest (for ``mem`` the smallest)
    of those without an error, with every round's value under ``rounds``; the last row when
    every round failed."""
    ok = [r for r in rows if not r.get("error")]
    if not ok:
        return dict(rows[-1])
    lower = METRIC[ok[0]["mode"]] == "mib"
    best = dict(min(ok, key=row_value) if lower else max(ok, key=row_value))
    if len(rows) > 1:
        best["rounds"] = [row_value(r) for r in rows]
    return best


def run(pairs: Sequence[Tuple[Point, str]], timing: Optional[Timing] = None,
        time_budget_s: Optional[float] = None,
        on_row: Optional[Callable[[Dict[str, Any]], None]] = None,
        progress: bool = True, device: str = "cuda",
        rounds: int = 1) -> Tuple[List[Dict[str, Any]], int]:
    """Measure every (point, impl); returns (rows, number of pairs skipped for the time budget).

    ``rounds``: each point's implementations are measured that many times, interleaved (every
    implementation once per round, the order reversed every other round, so that drift in
    clocks and temperature hits them alike), and a pair's row is its best round
    (:func:`best_of`). ``on_row`` sees each row as it is made (to save incrementally). Ctrl-C
    (or SIGINT from ``timeout -s INT``) stops the run early and returns what was measured.
    ``device='cpu'`` exists for the tests of this module (wall-clock timing, no mem rows).
    """
    import torch

    if device == "cuda" and not torch.cuda.is_available():
        raise RuntimeError("the benchmark grid needs a CUDA GPU")
    if rounds < 1:
        raise ValueError(f"rounds must be >= 1, got {rounds}")
    pairs = drop_unavailable(pairs)
    timing = timing or Timing()
    env = environment()
    # consecutive pairs of one point form a group, measured round by round
    groups: List[List[int]] = []
    for i, (point, _) in enumerate(pairs):
        if groups and pairs[groups[-1][0]][0] == point:
            groups[-1].append(i)
        else:
            groups.append([i])
    rows: List[Dict[str, Any]] = []
    bar = _Progress(len(pairs) * rounds) if progress else None
    t0 = time.monotonic()
    stop = False
    measured: Dict[int, List[Dict[str, Any]]] = {}  # the group in hand: its rounds so far

    def keep_group() -> None:
        """Each measured pair of the group in hand becomes its row (best round)."""
        for i, tried in measured.items():
            if tried:
                rows.append(best_of(tried))
                if on_row is not None:
                    on_row(rows[-1])
        measured.clear()

    try:
        for group in groups:
            measured.update((i, []) for i in group)
            for r in range(rounds):
                for i in (group if r % 2 == 0 else group[::-1]):
                    if time_budget_s is not None and time.monotonic() - t0 > time_budget_s:
                        stop = True
                        break
                    point, impl = pairs[i]
                    if bar is not None:
                        bar.start(f"{point.label()} {impl}")
                    row = measure(point, impl, timing, env, device)
                    measured[i].append(row)
                    if bar is not None:
                        bar.result(describe_row(row) + (f"  (round {r + 1} of {rounds})"
                                                        if rounds > 1 else ""))
                if stop:
                    break
            keep_group()
            if stop:
                break
    except KeyboardInterrupt:
        keep_group()  # (what the interrupted point measured is kept too)
        print(f"interrupted: {len(pairs) - len(rows)} points not run", file=sys.stderr,
              flush=True)
        return rows, len(pairs) - len(rows)
    finally:
        if bar is not None:
            bar.close()
    skipped = len(pairs) - len(rows)
    if stop:
        print(f"time budget of {time_budget_s:.0f} s spent: {skipped} points not run",
              file=sys.stderr, flush=True)
    return rows, skipped


# ---------------------------------------------------------------------------------------------
# Reports: tables and plots
# ---------------------------------------------------------------------------------------------
def impl_label(row: Dict[str, Any]) -> str:
    """The impl as a table column: paged decode rows are ``<impl>-page<N>``."""
    return row["impl"] + (f"-page{row['page_size']}" if row.get("page_size") else "")


def _fmt(v: Optional[float], digits: int = 1) -> str:
    return "-" if v is None else f"{v:.{digits}f}"


def summary_tables(rows: Sequence[Dict[str, Any]]) -> List[Tuple[str, List[str], List[List[str]]]]:
    """Per mode: (title, headers, lines). One line per point, one column per impl, then
    ``ours/best``: our number over the best anchor's at that point (for mem: the lowest)."""
    tables = []
    for mode in MODES:
        mrows = [r for r in rows if r.get("mode") == mode]
        if not mrows:
            continue
        impls: List[str] = []
        for r in mrows:
            if impl_label(r) not in impls:
                impls.append(impl_label(r))
        impls.sort(key=lambda i: (not is_ours(i), i != OURS, i))
        points: Dict[Tuple[Any, ...], Dict[str, Dict[str, Any]]] = {}
        for r in mrows:
            points.setdefault((r["d"], r["causal"], r["s"], r["b"], r["h"]), {})[impl_label(r)] = r
        ours = next((i for i in impls if is_ours(i)), None)
        unit = {"tflops": "TFLOP/s", "tbps": "TB/s", "mib": "peak extra MiB"}[METRIC[mode]]
        headers = ["d", "causal", "s", "b", "h"] + impls + ([f"{ours}/best anchor"] if ours else [])
        lines = []
        for (d, causal, s, b, h), by_impl in sorted(points.items()):
            line = [str(d), "yes" if causal else "no", format_seqlen(s), str(b), str(h)]
            for i in impls:
                r = by_impl.get(i)
                if r is None:
                    line.append("")
                elif r.get("error"):
                    line.append("err")
                else:
                    line.append(_fmt(row_value(r), 2 if mode == "decode" else (0 if mode == "mem" else 1)))
            if ours:
                mine = by_impl.get(ours)
                anchors = [row_value(r) for i, r in by_impl.items()
                           if not is_ours(i) and row_value(r) is not None
                           and not (mode == "mem" and i == "sdpa-math")]
                mv = row_value(mine) if mine else None
                if mv is None or not anchors:
                    line.append("-")
                else:
                    best = min(anchors) if mode == "mem" else max(anchors)
                    line.append(f"{mv / best:.2f}x" if best else "-")
            lines.append(line)
        tables.append((f"{mode} ({unit})", headers, lines))
    return tables


def render_tables(rows: Sequence[Dict[str, Any]]) -> str:
    """The summary tables (and the error rows) as text."""
    from flashattn.report import format_table

    parts = []
    for title, headers, lines in summary_tables(rows):
        parts.append(f"== {title}\n{format_table(headers, lines)}")
    errors = [r for r in rows if r.get("error")]
    if errors:
        parts.append("== errors\n" + "\n".join(describe_row(r) for r in errors))
    return "\n\n".join(parts)


def _save_figure(fig: Any, path: "str | os.PathLike[str]") -> Path:
    """Write ``fig`` to ``path`` (its folder made if missing) and release it."""
    import matplotlib.pyplot as plt

    out = Path(path)
    if out.parent and not out.parent.exists():
        out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=110)
    plt.close(fig)
    return out


def plot(rows: Sequence[Dict[str, Any]], path: "str | os.PathLike[str]") -> Path:
    """One subplot per (mode, d, causal) of TFLOP/s vs seqlen, one line per impl; decode as
    grouped bars (TB/s), mem as lines on a log scale. Needs matplotlib."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    # one figure row per mode: fwd panels, bwd panels, then decode and mem side by side
    layout: List[List[Tuple[str, Any, Any]]] = []
    for mode in ATTN_MODES:
        keys = sorted({(r["d"], r["causal"]) for r in rows if r.get("mode") == mode})
        if keys:
            layout.append([(mode, d, c) for d, c in keys])
    extra = [(m, None, None) for m in ("decode", "mem") if any(r.get("mode") == m for r in rows)]
    if extra:
        layout.append(extra)
    if not layout:
        raise ValueError("nothing to plot: no rows")
    ncols = max(len(r) for r in layout)
    nrows = len(layout)
    fig, axes = plt.subplots(nrows, ncols, figsize=(4.4 * ncols, 3.5 * nrows), squeeze=False)
    placed = [(axes[i][j], panel) for i, row in enumerate(layout) for j, panel in enumerate(row)]
    for i, row in enumerate(layout):
        for j in range(len(row), ncols):
            axes[i][j].axis("off")
    all_impls = sorted({r["impl"] for r in rows}, key=lambda i: (not is_ours(i), i))
    colors = {impl: f"C{i % 10}" for i, impl in enumerate(all_impls)}
    for ax, (mode, d, causal) in placed:
        if mode in ATTN_MODES:
            sel = [r for r in rows if r.get("mode") == mode and r["d"] == d and r["causal"] == causal]
            for impl in all_impls:
                pts = sorted((r["s"], row_value(r)) for r in sel
                             if r["impl"] == impl and row_value(r) is not None)
                if pts:
                    ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", label=impl,
                            color=colors[impl], linewidth=2.2 if is_ours(impl) else 1.4)
            ax.set_xscale("log", base=2)
            seqs = sorted({r["s"] for r in sel})
            ax.set_xticks(seqs, [format_seqlen(s) for s in seqs])
            ax.set_ylim(bottom=0)
            ax.set_ylabel("TFLOP/s")
            ax.set_xlabel("seqlen (b = 16k / s, h = 2048 / d)")
            ax.set_title(f"{mode}, d={d}, {'causal' if causal else 'non-causal'}")
        elif mode == "decode":
            sel = [r for r in rows if r.get("mode") == "decode"]
            pts = sorted({(r["b"], r["s"]) for r in sel})
            impls = sorted({impl_label(r) for r in sel}, key=lambda i: (not is_ours(i), i))
            for i in impls:
                colors.setdefault(i, f"C{len(colors) % 10}")
            width = 0.8 / max(1, len(impls))
            for j, impl in enumerate(impls):
                vals = []
                for b, s in pts:
                    r = next((r for r in sel if impl_label(r) == impl and r["b"] == b
                              and r["s"] == s), None)
                    vals.append(row_value(r) or 0.0 if r else 0.0)
                ax.bar([x + j * width for x in range(len(pts))], vals, width, label=impl,
                       color=colors[impl])
            ax.set_xticks([x + width * (len(impls) - 1) / 2 for x in range(len(pts))],
                          [f"b={b}\nkv={format_seqlen(s)}" for b, s in pts])
            ax.set_ylabel("TB/s (K+V bytes / time)")
            ax.set_title(f"decode, GQA {DECODE_HEADS}/{DECODE_HEADS_K}, d={DECODE_D}")
        else:
            sel = [r for r in rows if r.get("mode") == "mem"]
            for impl in all_impls:
                pts = sorted((r["s"], row_value(r)) for r in sel
                             if r["impl"] == impl and row_value(r) is not None)
                if pts:
                    ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", label=impl,
                            color=colors[impl])
            ax.set_xscale("log", base=2)
            ax.set_yscale("log")
            seqs = sorted({r["s"] for r in sel})
            ax.set_xticks(seqs, [format_seqlen(s) for s in seqs])
            ax.set_ylabel("peak extra MiB (fwd+bwd)")
            ax.set_title(f"memory, b={MEM_B}, h={MEM_H}, d={MEM_D}, causal")
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize=7)
    env_rows = [r for r in rows if r.get("gpu")]
    if env_rows:
        r0 = env_rows[-1]
        fig.suptitle(f"flashattn bench, {r0['gpu']}, torch {r0['torch']}, triton {r0['triton']}, "
                     f"{DTYPE}", fontsize=10)
    fig.tight_layout(rect=(0, 0, 1, 0.97))
    return _save_figure(fig, path)


def plot_cpu(speed: Sequence[Dict[str, Any]], memory: Sequence[Dict[str, Any]],
             path: "str | os.PathLike[str]", title: str = "") -> Path:
    """The CPU demo's tables as one figure (``flashattn bench --plot`` without a GPU): fwd + bwd
    ms vs seqlen of ours and SDPA per (dtype, d, causal), and peak extra MiB vs seqlen of ours
    and naive attention. Rows as the demo builds them (:func:`cpu_speed_rows`; memory rows
    with s, d, causal, ours_mib, naive_mib). Needs matplotlib."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    # (panel, rows, the keys one line per group, (label, value key) per line, y label)
    specs = [("speed", speed, ("dtype", "d", "causal"),
              ((OURS, "ours_ms"), ("sdpa", "sdpa_ms")), "fwd + bwd ms (lower is better)"),
             ("memory", memory, ("d", "causal"),
              ((OURS, "ours_mib"), ("naive", "naive_mib")), "peak extra MiB of fwd + bwd, fp32")]
    specs = [spec for spec in specs if spec[1]]
    if not specs:
        raise ValueError("nothing to plot: no rows")
    fig, axes = plt.subplots(1, len(specs), figsize=(5.2 * len(specs), 3.8), squeeze=False)
    for ax, (name, rows, keys, series, ylabel) in zip(axes[0], specs):
        for group in sorted({tuple(r[k] for k in keys) for r in rows}):
            sel = [r for r in rows if tuple(r[k] for k in keys) == group]
            tag = " ".join(("causal" if v else "non-causal") if k == "causal" else
                           (f"d={v}" if k == "d" else str(v)) for k, v in zip(keys, group))
            for who, key in series:
                pts = sorted((r["s"], r[key]) for r in sel if r.get(key) is not None)
                if pts:
                    ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o",
                            label=f"{who} {tag}", linewidth=2.2 if who == OURS else 1.4)
        seqs = sorted({r["s"] for r in rows})
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xticks(seqs, [format_seqlen(s) for s in seqs])
        ax.set_xlabel("seqlen (b=1)")
        ax.set_ylabel(ylabel)
        ax.set_title(f"CPU {name}")
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize=7)
    if title:
        fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    return _save_figure(fig, path)


# ---------------------------------------------------------------------------------------------
# Script entry: `python benchmarks/bench.py merge SRC DST` (the grid itself: python -m flashattn bench)
# ---------------------------------------------------------------------------------------------
def _main(argv: Optional[Sequence[str]] = None) -> int:
    import argparse

    ap = argparse.ArgumentParser(
        prog="benchmarks/bench.py",
        description="Result-file helpers. The grid runs with `python -m flashattn bench`.")
    sub = ap.add_subparsers(dest="cmd", required=True)
    m = sub.add_parser("merge", help="merge the rows of SRC into DST (same key: SRC wins)")
    m.add_argument("src")
    m.add_argument("dst")
    t = sub.add_parser("table", help="print the tables of a result file")
    t.add_argument("path")
    p = sub.add_parser("plot", help="plot a result file")
    p.add_argument("path")
    p.add_argument("png")
    args = ap.parse_args(argv)
    if args.cmd == "merge":
        rows = save_rows(args.dst, load_rows(args.src))
        print(f"{args.dst}: {len(rows)} rows")
    elif args.cmd == "table":
        print(render_tables(load_rows(args.path)))
    else:
        print(plot(load_rows(args.path), args.png))
    return 0


if __name__ == "__main__":
    sys.exit(_main())
