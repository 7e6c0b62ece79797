"""The dense ops' bodies: empty shapes answered here, few query rows through the decode kernel,
the rest on the backend :mod:`flashattn.dispatch.select` picks.

Degenerate shapes (batch, seqlen_q or seqlen_k of 0) are answered without calling any
backend: zero-size grids are not worth special-casing in every kernel.
"""
from __future__ import annotations

from typing import Optional, Tuple

import torch

from flashattn.dispatch import merge as _merge
from flashattn.dispatch import select as _select
from flashattn.params import AttnParams
from flashattn.runtime.device import capturing


def unit_last_stride(dout: torch.Tensor) -> torch.Tensor:
    """The gradient of out as the backends take it: unit last-dim stride (e.g. the expanded
    gradient of ``out.sum()`` has stride 0 there). Both autograd paths above dispatch apply it,
    the op path (:mod:`flashattn.ops`) and the recorded calls
    (:mod:`flashattn.replay.autograd`)."""
    if dout.stride(-1) != 1 and dout.shape[-1] > 1:
        return dout.contiguous()
    return dout


def is_degenerate(q: torch.Tensor, k: torch.Tensor) -> bool:
    return q.shape[0] == 0 or q.shape[1] == 0 or k.shape[1] == 0


def degenerate_fwd(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, return_softmax: bool
) -> Tuple[torch.Tensor, torch.Tensor, Optional[torch.Tensor]]:
    # No batch, no query or no key: every row sees no key -> out 0, lse -inf.
    b, s_q, h, _ = q.shape
    s_k, d_v = k.shape[1], v.shape[3]
    out = torch.zeros((b, s_q, h, d_v), dtype=q.dtype, device=q.device)
    lse = torch.full((b, h, s_q), float("-inf"), dtype=torch.float32, device=q.device)
    s_dmask = (
        torch.zeros((b, h, s_q, s_k), dtype=q.dtype, device=q.device) if return_softmax else None
    )
    return out, lse, s_dmask


def small_query(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, params: AttnParams,
                return_softmax: bool) -> bool:
    """Whether this dense forward runs the decode kernel
    (:func:`flashattn.dispatch.select.small_query_allowed`)."""
    return _select.small_query_allowed(q, q.shape[1], params, return_softmax)


def one_row_right_edge(params: AttnParams, s_q: int) -> AttnParams:
    """A single query row sits on the last key (bottom-right alignment): a right window edge
    of 0 hides nothing there, so drop it (the decode kernel then skips the mask work)."""
    if s_q == 1 and params.window_right == 0:
        return params._replace(window_right=-1)
    return params


def small_query_runner(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, params: AttnParams,
                       need_lse: bool = True, out_dtype: Optional[torch.dtype] = None):
    """The dense forward through the decode kernel (k / v a full 'cache' of s_k keys), as a
    call ``run(q, k, v) -> (out, lse)`` for tensors of these shapes. What depends only on the
    shapes is made once: the bottom-right params and the (b,) int32 key counts, which the
    kernel only reads (a repeated call, e.g. a generate() step without padding through the
    fast path's runner, saves an allocation and a fill launch). ``out_dtype``: out's dtype
    when not q's (float32 for the learnable-sink pass)."""
    row_params = one_row_right_edge(params, q.shape[1])
    seqlens = torch.full((q.shape[0],), k.shape[1], dtype=torch.int32, device=q.device)
    if capturing():
        # the fill above is only recorded into the graph, not run: a runner kept for eager
        # calls after the capture would read unset counts. Fill per call then.
        def run_capture(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor):
            lens = torch.full((q.shape[0],), k.shape[1], dtype=torch.int32, device=q.device)
            return _select.backend("portable").kvcache_attention(
                q, k, v, lens, 0, p=row_params, leftpad=None, batch_idx=None, block_table=None,
                num_splits=0, capacity=k.shape[1], out_dtype=out_dtype)
        return run_capture
    call = _select.backend("portable").kvcache_call(q, k, v, seqlens, 0, p=row_params,
                                                    leftpad=None, batch_idx=None,
                                                    block_table=None, num_splits=0,
                                                    capacity=k.shape[1], out_dtype=out_dtype)

    def run(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor):
        return call(q, k, v, seqlens, None, None, None, row_params.alibi_slopes,
                    need_lse=need_lse)
    return run


def _small_query_forward(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                         params: AttnParams) -> Tuple[torch.Tensor, torch.Tensor, None]:
    """The dense forward through the decode kernel (see small_query_runner)."""
    out, lse = small_query_runner(q, k, v, params)(q, k, v)
    return out, lse, None


def forward(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, params: AttnParams,
            return_softmax: bool = False
            ) -> Tuple[torch.Tensor, torch.Tensor, Optional[torch.Tensor]]:
    """Dense forward: ``(out, lse, S_dmask | None)``. Inputs validated and normalised."""
    if is_degenerate(q, k):
        return degenerate_fwd(q, k, v, return_softmax)
    if small_query(q, k, v, params, return_softmax):
        return _small_query_forward(q, k, v, params)
    name = _select.select("fwd", q, k, v, params, return_softmax)
    return _select.backend(name).fwd(q, k, v, params, return_softmax)


def forward_with_sink(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, params: AttnParams,
                      sink: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor]:
    """Dense forward with learnable sinks (h,): (out, lse) of attention whose softmax
    denominators include exp(sink[h]). The Hopper kernel folds the sink into its epilogue
    (no extra pass); the portable kernel writes its output in float32 and the sink pass rounds
    it once, to q's dtype (a 16-bit output rounded before the pass and again after it missed
    flash-attn's accuracy rule in bf16); so does the few-query route's decode kernel; the other
    paths (the cpu backend, no key) run the plain forward and then :func:`sink_apply`."""
    if is_degenerate(q, k):
        out, lse, _ = degenerate_fwd(q, k, v, False)
    elif small_query(q, k, v, params, False):
        out, lse = small_query_runner(q, k, v, params, out_dtype=torch.float32)(q, k, v)
    else:
        name = _select.select("fwd", q, k, v, params)
        if name == "hopper":
            out, lse, _ = _select.backend("hopper").fwd(q, k, v, params, False, sink=sink)
            return out, lse
        wide = {"out_dtype": torch.float32} if name == "portable" else {}
        out, lse, _ = _select.backend(name).fwd(q, k, v, params, False, **wide)
    return _merge.sink_apply(out, lse, sink, packed=False, out_dtype=q.dtype)


def wide_v_slices_on_hopper(q: torch.Tensor, slice_width: int, has_alibi: bool,
                            dropout_p: float) -> bool:
    """Whether a dense forward with V wider than the Hopper kernel takes would run its column
    slices (``slice_width`` wide, :mod:`flashattn.api.wide_v`) on the Hopper kernel: on the
    H200 the slices took 0.75-0.85x the portable kernel's one pass over all of V at d 64 / 128,
    d_v 512, 4k-16k, causal or not (benchmarks/NOTES.md, 2026-11-28), the recomputed Q K^T
    included. ALiBi and dropout take the portable kernel, where slices would only add work."""
    from flashattn.backends.sm90.support import DTYPES, HEAD_DIMS

    return (not has_alibi and dropout_p == 0.0 and q.dtype in DTYPES
            and q.shape[-1] in HEAD_DIMS and slice_width in HEAD_DIMS
            and _select.family_for(q) == "hopper")


def backward(dout: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
             out: torch.Tensor, lse: torch.Tensor, params: AttnParams
             ) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Dense backward: ``(dq, dk, dv)`` shaped and typed like q, k, v. The Hopper backward
    takes the calls it covers; the rest run the portable backward (same lse contract, so
    either forward's lse serves either backward)."""
    if is_degenerate(q, k):
        return tuple(  # type: ignore[return-value]
            torch.zeros(x.shape, dtype=x.dtype, device=x.device) for x in (q, k, v)
        )
    name = _select.select("bwd", q, k, v, params)
    return _select.backend(name).bwd(dout, q, k, v, out, lse, params)


__all__ = ["backward", "degenerate_fwd", "forward", "forward_with_sink", "is_degenerate",
           "one_row_right_edge", "small_query", "small_query_runner", "unit_last_stride",
           "wide_v_slices_on_hopper"]
