"""Host side of the Hopper MLA decode (latent_kernel.py): what it covers, TMA descriptors,
launch.

The kernel computes the split-KV partials of a KV-cache call with FlashAttention-3's ``qv``
(multi-head latent attention): the caller (the portable backend's DecodeCall, which owns the
outputs, the split workspace and the combine pass) hands it the tensors of one call.
"""
from __future__ import annotations

import math
from typing import Any, Dict, Optional, Tuple

import torch

from flashattn.backends.sm90 import latent_kernel as _kernel
from flashattn.backends.sm90.descriptors import LOG2E, _GL_DTYPE, nvmma_layout
from flashattn.backends.sm90.support import DTYPES, device_unavailable, tma_ok
from flashattn.runtime.launch import LaunchPlan, LaunchPlans

ROPE_DIM = 64
LATENT_DIM = 512
# the kernel's tile (its constexprs: the descriptors' boxes and the grid follow them)
BLOCK_M, BLOCK_N, HALF_V = (int(c.value) for c in (_kernel.BLOCK_M, _kernel.BLOCK_N,
                                                    _kernel.HALF_V))
# pages smaller than a key block that it loads page by page (one TMA box per page; a page at
# least 8 rows tall keeps the boxes on the 128-byte swizzle's 8-row period)
SMALL_PAGES = (8, 16, 32)
NUM_STAGES = 2  # two 72 KiB key blocks: with q / qv (72 KiB) the shared memory is full
CONSUMER_REGS = 240
PRODUCER_REGS = 24
MAXNREG = 168


# positions of the FP8 descales among the kernel's arguments (launch_args' order)
DESCALE_SLOTS = (25, 26)
# recorded launches by call signature: a repeated decode step replays its launch with the new
# tensors (no descriptor validation, no binder), as the portable decode kernel's DecodeCall does
_PLANS = LaunchPlans(slots=tuple(range(8)) + DESCALE_SLOTS)


def latent_shapes_unsupported(nheads_k: int, headdim: int, headdim_v: int,
                              dtype: torch.dtype, page_size: Optional[int], *,
                              window_left: int = -1, window_right: int = -1,
                              softcap: float = 0.0) -> Optional[str]:
    """Why KV-cache calls with ``qv`` of these shapes are not the Hopper MLA decode kernel's
    (None: they are, tensors and device permitting): caches (``dtype``, FA3's qkv_dtype) 16-bit
    or float8_e4m3fn, one KV head, head dims 64 / 512, a contiguous cache (``page_size`` None)
    or pages of a multiple of 64 keys or of 8 / 16 / 32 keys, no mask but causal
    (``window_right`` 0), no softcap."""
    if dtype not in DTYPES and dtype != torch.float8_e4m3fn:
        return f"cache dtype {dtype} (16-bit or float8_e4m3fn)"
    if headdim != ROPE_DIM or headdim_v != LATENT_DIM:
        return f"head dims {headdim} / {headdim_v} (64 / 512)"
    if nheads_k != 1:
        return "caches other than one KV head of 64 / 512"
    if window_left >= 0 or window_right > 0 or softcap > 0.0:
        return "window or softcap"
    if page_size is not None and page_size % BLOCK_N and page_size not in SMALL_PAGES:
        return f"page size {page_size} (a multiple of {BLOCK_N}, or one of {SMALL_PAGES})"
    return None


def latent_unsupported(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                       qv: Optional[torch.Tensor], block_table: Optional[torch.Tensor], *,
                       window_left: int, window_right: int, softcap: float,
                       alibi_slopes: Optional[torch.Tensor], leftpad: Optional[torch.Tensor],
                       batch_idx: Optional[torch.Tensor], attention_chunk: int = 0,
                       k_descale: Optional[torch.Tensor] = None,
                       q_descale: Optional[torch.Tensor] = None,
                       varlen: bool = False,
                       v_descale: Optional[torch.Tensor] = None) -> Optional[str]:
    """Why the Hopper MLA decode kernel does not cover this KV-cache call (None: it does).

    Covered: a dense q (b, s_q, h, 64) and ``qv`` (b, s_q, h, 512) of the caches' 16-bit
    dtype (or over float8_e4m3fn caches with their (b, 1) float32 descales) over one KV head,
    rotary cache (.., 1, 64) and latent cache (.., 1, 512), contiguous or paged with pages of
    a multiple of 64 keys or of 8 / 16 / 32 keys, no mask but causal (bottom-right aligned),
    TMA-addressable tensors, on an sm90 device (:func:`latent_shapes_unsupported` and the
    tensors' own checks)."""
    if qv is None:
        return "no qv"
    if varlen:
        return "packed (varlen) queries"
    reason = device_unavailable(q.device)
    if reason is not None:
        return reason
    fp8 = k_cache.dtype == torch.float8_e4m3fn
    cache_dtype = torch.float8_e4m3fn if fp8 else q.dtype
    if (q.dtype not in DTYPES or qv.dtype != q.dtype or k_cache.dtype != cache_dtype
            or v_cache.dtype != cache_dtype):
        return (f"dtypes {q.dtype} / {qv.dtype} / {k_cache.dtype} / {v_cache.dtype} (16-bit q "
                "and qv; caches in their dtype or both float8_e4m3fn)")
    if q_descale is not None:
        return "an FP8 query (q_descale)"
    if fp8 and (k_descale is None or v_descale is None):
        return "FP8 caches without both descales"
    if not fp8 and (k_descale is not None or v_descale is not None):
        return "descales over 16-bit caches"
    if fp8 and any(t.dtype != torch.float32 or t.shape != (q.shape[0], 1) or t.stride(1) != 1
                   for t in (k_descale, v_descale)):
        return "FP8 descales other than float32 (batch, 1)"
    if q.dim() != 4 or k_cache.shape[3] != q.shape[3] or v_cache.shape[3] != qv.shape[3]:
        return "caches whose head dims differ from q's / qv's"
    if alibi_slopes is not None:
        return "alibi"
    reason = latent_shapes_unsupported(k_cache.shape[2], q.shape[3], qv.shape[3], k_cache.dtype,
                                       None if block_table is None else k_cache.shape[1],
                                       window_left=window_left, window_right=window_right,
                                       softcap=softcap)
    if reason is not None:
        return reason
    if attention_chunk > 0 or leftpad is not None or batch_idx is not None:
        return "attention_chunk, cache_leftpad or cache_batch_idx"
    if q.shape[1] * q.shape[2] >= 2**31 or q.shape[0] > 65535:
        return "too many query rows or sequences"
    # q and qv as (b, s_q * h, d): their (s_q, h) dimensions must merge
    for t in (q, qv):
        if t.stride(1) != t.shape[2] * t.stride(2) and t.shape[1] > 1:
            return "q / qv strides that do not merge (s_q, h)"
    if not all(tma_ok(t) for t in (q, qv, k_cache, v_cache)):
        return "strides or base not 16-byte aligned (TMA)"
    return None


def _desc(t: torch.Tensor, box_rows: int, box_cols: int) -> Any:
    """Rank-3 TMA descriptor over ``t`` (n, rows, cols) with a [1, box_rows, box_cols] box."""
    from triton.experimental.gluon.nvidia.hopper import TensorDescriptor

    block = [1, box_rows, box_cols]
    layout = nvmma_layout(tuple(block), _GL_DTYPE[t.dtype])
    return TensorDescriptor(t, list(t.shape), list(t.stride()), block, layout)


def _rows3(t: torch.Tensor) -> torch.Tensor:
    """(n, a, b, d) with (a, b) mergeable -> (n, a * b, d), as a strided view."""
    n, a, b, d = t.shape
    return t.as_strided((n, a * b, d), (t.stride(0), t.stride(2), t.stride(3)))


def launch_args(q: torch.Tensor, qv: torch.Tensor, k_cache: torch.Tensor,
                v_cache: torch.Tensor, seqlens: torch.Tensor, seqlen_k_add: int,
                block_table: Optional[torch.Tensor], out: torch.Tensor, lse: torch.Tensor,
                o_strides: Tuple[int, int, int, int], l_strides: Tuple[int, int, int, int],
                num_splits: int, softmax_scale: float, causal: bool, cache_cap: int,
                k_descale: Optional[torch.Tensor] = None,
                v_descale: Optional[torch.Tensor] = None
                ) -> Tuple[list, Dict[str, Any], Tuple[int, int, int]]:
    """(positional args, constexprs and options, grid) of latent_decode_kernel. Shared by the
    launch and the ahead-of-time compile (tools/aot_sm90.py)."""
    batch, s_q, h, _ = q.shape
    paged = block_table is not None
    kc = k_cache[:, :, 0]  # (pages or cache rows, rows, d): one KV head
    box = min(BLOCK_N, k_cache.shape[1]) if paged else BLOCK_N  # (one page per box)
    vc = v_cache[:, :, 0]
    args = [
        _desc(_rows3(q), BLOCK_M, ROPE_DIM), _desc(_rows3(qv), BLOCK_M, HALF_V),
        _desc(kc, box, ROPE_DIM), _desc(vc, box, HALF_V),
        out, lse, seqlens, block_table if paged else seqlens,
        block_table.stride(0) if paged else 0, int(seqlen_k_add), int(cache_cap),
        k_cache.shape[0], block_table.shape[1] if paged else 1,
        s_q, h, s_q * h, float(softmax_scale * LOG2E),
        *o_strides, *l_strides,
        # FP8 caches: the (b, 1) float32 descales and their batch strides (else stand-ins)
        seqlens if k_descale is None else k_descale,
        seqlens if v_descale is None else v_descale,
        0 if k_descale is None else k_descale.stride(0),
        0 if v_descale is None else v_descale.stride(0),
    ]
    constexprs = dict(PAGE_SIZE=k_cache.shape[1] if paged else 1, PAGED=paged,
                      CAUSAL=bool(causal) and s_q > 1, NUM_STAGES=NUM_STAGES,
                      CONSUMER_REGS=CONSUMER_REGS, PRODUCER_REGS=PRODUCER_REGS,
                      num_warps=4, maxnreg=MAXNREG)
    grid = (math.ceil(s_q * h / BLOCK_M), batch, num_splits)
    return args, constexprs, grid


def latent_decode(q: torch.Tensor, qv: torch.Tensor, k_cache: torch.Tensor,
                  v_cache: torch.Tensor, seqlens: torch.Tensor, seqlen_k_add: int,
                  block_table: Optional[torch.Tensor], out: torch.Tensor, lse: torch.Tensor,
                  o_strides: Tuple[int, int, int, int], l_strides: Tuple[int, int, int, int],
                  num_splits: int, *, softmax_scale: float, causal: bool,
                  cache_cap: int, k_descale: Optional[torch.Tensor] = None,
                  v_descale: Optional[torch.Tensor] = None) -> Optional[LaunchPlan]:
    """Launch the MLA decode kernel for one call (a call :func:`latent_unsupported` covers).

    q (b, s_q, h, 64), qv (b, s_q, h, 512); k_cache (n, rows, 1, 64) and v_cache (n, rows, 1,
    512), paged with ``block_table`` (b, pages) int32, or contiguous; seqlens int32 (b,): keys
    before the ``seqlen_k_add`` appended this call. Writes split s's output rows of sequence
    b, position i, head into ``out`` at s * o_strides[0] + b * o_strides[1] + i * o_strides[2]
    + head * o_strides[3] (fp32 partials, or with one split the output in q's dtype) and the
    natural-log LSE into ``lse`` by ``l_strides`` (split, b, head, i). float8_e4m3fn caches
    take ``k_descale`` / ``v_descale`` (b, 1) float32. Returns the launch's recorded plan
    (None where Triton's own path ran: interpreter, a profiler listening)."""
    # the launch's tensors and the tensors its descriptors cover, in _PLANS' slots (the kernel's
    # first eight arguments and the descales); everything else is in the key
    paged = block_table is not None
    tensors = (_rows3(q), _rows3(qv), k_cache[:, :, 0], v_cache[:, :, 0], out, lse, seqlens,
               block_table if paged else seqlens,
               seqlens if k_descale is None else k_descale,
               seqlens if v_descale is None else v_descale)
    key = (q.shape, q.stride(), qv.stride(), k_cache.shape, k_cache.stride(), v_cache.shape,
           v_cache.stride(), q.dtype, q.device, out.shape, out.dtype, tuple(o_strides),
           tuple(l_strides), block_table.shape if paged else None,
           block_table.stride() if paged else None, int(seqlen_k_add), int(num_splits),
           float(softmax_scale), bool(causal), int(cache_cap),
           None if k_descale is None else (k_descale.stride(), v_descale.stride()))

    def build():
        args, constexprs, grid = launch_args(q, qv, k_cache, v_cache, seqlens, seqlen_k_add,
                                             block_table, out, lse, o_strides, l_strides,
                                             num_splits, softmax_scale, causal, cache_cap,
                                             k_descale, v_descale)
        return _kernel.latent_decode_kernel, grid, args, constexprs

    return _PLANS.launch(key, tensors, build)


class Partials:
    """:func:`latent_decode` with a call's scalars bound (softmax scale, causal, the caches'
    capacity), called by the portable DecodeCall with each call's tensors and its split
    outputs: ``out_k`` (splits, b, s_q, h, 512) float32 and ``lse_k`` (splits, b, h, s_q), or
    with one split the output (b, s_q, h, 512) and LSE (b, h, s_q) themselves.

    One Partials serves one DecodeCall, whose calls all have the same signature (shapes,
    strides, dtypes, 16-byte alignment): its first call's recorded launch is replayed by the
    tensors' addresses after that (no views, no key, no descriptor objects per call; a
    replay the runtime refuses takes the full launch)."""

    def __init__(self, softmax_scale: float, causal: bool, capacity: int) -> None:
        self.softmax_scale, self.causal, self.capacity = softmax_scale, causal, capacity
        self._plan: Optional[LaunchPlan] = None

    def __call__(self, q: torch.Tensor, qv: torch.Tensor, k_cache: torch.Tensor,
                 v_cache: torch.Tensor, seqlens: torch.Tensor, seqlen_k_add: int,
                 block_table: Optional[torch.Tensor], out_k: torch.Tensor,
                 lse_k: torch.Tensor, num_splits: int,
                 k_descale: Optional[torch.Tensor] = None,
                 v_descale: Optional[torch.Tensor] = None) -> None:
        if self._plan is not None and self._plan.replay_addresses((
                q.data_ptr(), qv.data_ptr(), k_cache.data_ptr(), v_cache.data_ptr(),
                out_k.data_ptr(), lse_k.data_ptr(), seqlens.data_ptr(),
                (seqlens if block_table is None else block_table).data_ptr(),
                (seqlens if k_descale is None else k_descale).data_ptr(),
                (seqlens if v_descale is None else v_descale).data_ptr())):
            return
        o_strides = out_k.stride()[:4] if out_k.dim() == 5 else (0,) + out_k.stride()[:3]
        l_strides = lse_k.stride() if lse_k.dim() == 4 else (0,) + lse_k.stride()
        self._plan = latent_decode(q, qv, k_cache, v_cache, seqlens, seqlen_k_add,
                                   block_table, out_k, lse_k, o_strides, l_strides,
                                   num_splits, softmax_scale=self.softmax_scale,
                                   causal=self.causal, cache_cap=self.capacity,
                                   k_descale=k_descale, v_descale=v_descale)


__all__ = ["Partials", "latent_decode", "latent_shapes_unsupported", "latent_unsupported",
           "launch_args"]
