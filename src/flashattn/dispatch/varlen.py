"""The packed (varlen) ops' bodies: empty batches answered here, paged caches and few query rows
per sequence through the decode kernel, the rest on the backend :mod:`flashattn.dispatch.select`
picks."""
from __future__ import annotations

from typing import Optional, Tuple

import torch

from flashattn.dispatch import dense as _dense
from flashattn.dispatch import merge as _merge
from flashattn.dispatch import select as _select
from flashattn.params import AttnParams


def small_query_varlen(q: torch.Tensor, n_seqs: int, max_seqlen_q: int, params: AttnParams,
                       return_softmax: bool = False) -> bool:
    """Whether this packed forward runs the decode kernel: at most SMALL_QUERY_MAX query rows
    per sequence (a decoding step of a packed batch, speculative verification), under the dense
    rule (:func:`flashattn.dispatch.select.small_query_allowed`), and at least one sequence."""
    return n_seqs >= 1 and _select.small_query_allowed(q, max_seqlen_q, params, return_softmax)


def _packed_keys_as_cache(k: torch.Tensor, v: torch.Tensor, cu_seqlens_k: torch.Tensor,
                          seqused_k: Optional[torch.Tensor]):
    """Packed keys (total_k, h_k, d) as the decode kernel's cache: ``(k_cache, v_cache,
    starts, ends)``, one cache row (total_k, h_k, d) that every sequence shares (batch stride
    0, nothing copied), sequence b's keys at cache positions ``[starts[b], ends[b])``: its
    ``cu_seqlens_k`` slot, ``seqused_k[b]`` of them when given. The kernel takes the start as
    its left pad (``cache_leftpad``), so masks and ALiBi count from the sequence's first key,
    and clamps both bounds to the rows of k (no value reads outside it)."""
    n_seqs = cu_seqlens_k.shape[0] - 1
    # (the decode kernel reads its length vectors with unit stride)
    cu_seqlens_k = _unit_stride(cu_seqlens_k)
    k_cache = k.unsqueeze(0).expand(n_seqs, -1, -1, -1)
    v_cache = v.unsqueeze(0).expand(n_seqs, -1, -1, -1)
    starts = cu_seqlens_k[:-1]
    ends = cu_seqlens_k[1:] if seqused_k is None else starts + seqused_k
    return k_cache, v_cache, starts, ends


def _unit_stride(lengths: torch.Tensor) -> torch.Tensor:
    """A (n,) length vector as the decode kernel reads it: unit stride (a copy otherwise)."""
    return lengths if lengths.stride(0) == 1 else lengths.contiguous()


def small_query_varlen_runner(max_seqlen_q: int, max_seqlen_k: int, params: AttnParams,
                              out_dtype: Optional[torch.dtype] = None):
    """The packed forward through the decode kernel (split-KV, the GQA group packed into the
    query rows), as a call ``run(q, k, v, cu_seqlens_q, cu_seqlens_k, seqused_k) -> (out
    (total_q, h, d_v), lse float32 (h, total_q))``; rows outside every sequence get out 0 /
    lse -inf, as from the prefill kernels. Its first call makes the kernel's ``DecodeCall``
    from that call's tensors, later calls of the same signature replay it. The split count
    follows from ``max_seqlen_k`` (the host's bound: no value is read on the host).
    ``out_dtype``: out's dtype when not q's (float32 for the learnable-sink pass)."""
    row_params = _dense.one_row_right_edge(params, max_seqlen_q)
    call = None

    def run(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cu_seqlens_q: torch.Tensor,
            cu_seqlens_k: torch.Tensor, seqused_k: Optional[torch.Tensor]):
        nonlocal call
        k_cache, v_cache, starts, ends = _packed_keys_as_cache(k, v, cu_seqlens_k, seqused_k)
        cu_seqlens_q = _unit_stride(cu_seqlens_q)
        if call is None:
            call = _select.backend("portable").kvcache_call(
                q, k_cache, v_cache, ends, 0, p=row_params, leftpad=starts, batch_idx=None,
                block_table=None, num_splits=0, capacity=max(1, max_seqlen_k),
                cu_seqlens_q=cu_seqlens_q, max_seqlen_q=max_seqlen_q, out_dtype=out_dtype)
        return call(q, k_cache, v_cache, ends, starts, None, None, row_params.alibi_slopes,
                    cu_seqlens_q)
    return run


def varlen_forward(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cu_seqlens_q: torch.Tensor,
                   cu_seqlens_k: torch.Tensor, seqused_k: Optional[torch.Tensor],
                   block_table: Optional[torch.Tensor], max_seqlen_q: int, max_seqlen_k: int,
                   params: AttnParams, return_softmax: bool = False
                   ) -> Tuple[torch.Tensor, torch.Tensor, Optional[torch.Tensor]]:
    """Packed variable-length forward: ``(out (total_q, h, d_v), lse (h, total_q), S_dmask |
    None)``; with ``block_table`` k / v are paged caches (forward only, no dropout)."""
    if max_seqlen_q == 0 or max_seqlen_k == 0:
        # every query or every key sequence is empty: no row sees a key (no zero-size grids)
        total_q, h, _ = q.shape
        out = torch.zeros((total_q, h, v.shape[-1]), dtype=q.dtype, device=q.device)
        lse = torch.full((h, total_q), float("-inf"), dtype=torch.float32, device=q.device)
        s_dmask = (torch.zeros((cu_seqlens_q.shape[0] - 1, h, max_seqlen_q, max_seqlen_k),
                               dtype=q.dtype, device=q.device) if return_softmax else None)
        return out, lse, s_dmask
    if block_table is not None:
        out, lse = varlen_paged_forward(q, k, v, cu_seqlens_q, cu_seqlens_k, seqused_k,
                                        max_seqlen_q, max_seqlen_k, block_table, params)
        return out, lse, None
    if small_query_varlen(q, cu_seqlens_q.shape[0] - 1, max_seqlen_q, params, return_softmax):
        out, lse = small_query_varlen_runner(max_seqlen_q, max_seqlen_k, params)(
            q, k, v, cu_seqlens_q, cu_seqlens_k, seqused_k)
        return out, lse, None
    family = _select.varlen_forward_family(q, k, v, cu_seqlens_q.shape[0] - 1, seqused_k,
                                           params, return_softmax)
    return _select.backend(family).varlen_fwd(
        q, k, v, cu_seqlens_q, cu_seqlens_k, seqused_k, max_seqlen_q, max_seqlen_k, params,
        return_softmax)


def varlen_forward_with_sink(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                             cu_seqlens_q: torch.Tensor, cu_seqlens_k: torch.Tensor,
                             seqused_k: Optional[torch.Tensor], max_seqlen_q: int,
                             max_seqlen_k: int, params: AttnParams, sink: torch.Tensor
                             ) -> Tuple[torch.Tensor, torch.Tensor]:
    """Packed forward with learnable sinks (h,): (out (total_q, h, d_v), lse (h, total_q)) of
    attention whose softmax denominators include exp(sink[h]). As the dense
    :func:`flashattn.dispatch.dense.forward_with_sink`: the Hopper kernel folds the sink into
    its epilogue, the portable kernel's float32 output is rounded once by the sink pass, and
    so is the few-query route's; the other paths (cpu backend, no key anywhere) run the plain
    forward and then the sink pass."""
    n_seqs = cu_seqlens_q.shape[0] - 1
    if max_seqlen_q == 0 or max_seqlen_k == 0:  # (no row sees a key)
        out, lse, _ = varlen_forward(q, k, v, cu_seqlens_q, cu_seqlens_k, seqused_k, None,
                                     max_seqlen_q, max_seqlen_k, params)
    elif small_query_varlen(q, n_seqs, max_seqlen_q, params, False):
        out, lse = small_query_varlen_runner(max_seqlen_q, max_seqlen_k, params,
                                             out_dtype=torch.float32)(
            q, k, v, cu_seqlens_q, cu_seqlens_k, seqused_k)
    else:
        family = _select.varlen_forward_family(q, k, v, n_seqs, seqused_k, params)
        if family == "hopper":
            out, lse, _ = _select.backend("hopper").varlen_fwd(
                q, k, v, cu_seqlens_q, cu_seqlens_k, seqused_k, max_seqlen_q, max_seqlen_k,
                params, False, sink=sink)
            return out, lse
        wide = {"out_dtype": torch.float32} if family == "portable" else {}
        out, lse, _ = _select.backend(family).varlen_fwd(
            q, k, v, cu_seqlens_q, cu_seqlens_k, seqused_k, max_seqlen_q, max_seqlen_k,
            params, False, **wide)
    return _merge.sink_apply(out, lse, sink, packed=True, out_dtype=q.dtype)


def varlen_backward(dout: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                    out: torch.Tensor, lse: torch.Tensor, cu_seqlens_q: torch.Tensor,
                    cu_seqlens_k: torch.Tensor, seqused_k: Optional[torch.Tensor],
                    max_seqlen_q: int, max_seqlen_k: int, params: AttnParams
                    ) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Packed variable-length backward: ``(dq, dk, dv)``; dout / out (total_q, h, d_v) (dout
    with unit last-dim stride), lse float32 (h, total_q)."""
    if max_seqlen_q == 0 or max_seqlen_k == 0:  # no row saw a key: no gradient anywhere
        return tuple(  # type: ignore[return-value]
            torch.zeros(x.shape, dtype=x.dtype, device=x.device) for x in (q, k, v))
    family = _select.varlen_backward_family(q, k, v, cu_seqlens_q.shape[0] - 1, seqused_k, params)
    return _select.backend(family).varlen_bwd(
        dout, q, k, v, out, lse, cu_seqlens_q, cu_seqlens_k, seqused_k, max_seqlen_q,
        max_seqlen_k, params)


def varlen_paged_forward(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                         cu_seqlens_q: torch.Tensor, cu_seqlens_k: torch.Tensor,
                         seqused_k: Optional[torch.Tensor], max_seqlen_q: int, max_seqlen_k: int,
                         block_table: torch.Tensor, params: AttnParams
                         ) -> Tuple[torch.Tensor, torch.Tensor]:
    """Packed varlen queries (total_q, h, d) against a paged KV cache (num_blocks, page_size,
    h_k, d / d_v). Sequence b has queries ``q[cu_seqlens_q[b]:cu_seqlens_q[b + 1]]`` and keys
    at positions ``[0, s_k)`` of its pages, ``s_k = seqused_k[b]`` if given else the
    cu_seqlens_k difference. Returns out (total_q, h, d_v) (0 on rows outside every sequence)
    and lse float32 (h, total_q)."""
    total_q, h, _ = q.shape
    if total_q == 0 or cu_seqlens_q.shape[0] < 2:
        out = torch.zeros((total_q, h, v_cache.shape[3]), dtype=q.dtype, device=q.device)
        lse = torch.full((h, total_q), float("-inf"), dtype=torch.float32, device=q.device)
        return out, lse
    return _select.backend(_select.select("varlen_paged_fwd", q)).varlen_paged_fwd(
        q, k_cache, v_cache, cu_seqlens_q, cu_seqlens_k, seqused_k, max_seqlen_q, max_seqlen_k,
        block_table, params)


__all__ = ["small_query_varlen", "small_query_varlen_runner", "varlen_backward", "varlen_forward",
           "varlen_paged_forward"]
