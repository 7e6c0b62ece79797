"""Recorded packed (varlen) calls: :class:`VarlenRunner`."""
from __future__ import annotations

from typing import Optional, Tuple

import torch

from flashattn.dispatch import select as _select
from flashattn.dispatch import varlen as _varlen
from flashattn.params import AttnParams


class VarlenRunner:
    """:func:`varlen_forward` and :func:`varlen_backward`'s decisions for one packed call
    signature, made once (no block_table, dropout, S_dmask, ALiBi or sink): the families, and
    the backend's recorded calls where it has them (the Hopper backend's
    ``varlen_fwd_call`` / ``varlen_bwd_call``: output shapes, config and launch plans found
    once; the decode kernel's call for few query rows per sequence). The api's fast path
    (api/fastpath.VARLEN) keeps one per signature, keyed on everything these decisions read:
    shapes, strides, dtypes, device, alignment, the number of sequences, whether seqused_k is
    given, the maxima, the params and the settings.

    Built from the signature's first call (validated, normalised ``params``); ``forward`` and
    ``backward`` take later calls' tensors."""

    def __init__(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                 cu_seqlens_q: torch.Tensor, seqused_k: Optional[torch.Tensor],
                 max_seqlen_q: int, max_seqlen_k: int, params: AttnParams) -> None:
        self.params, self.max_seqlen_q, self.max_seqlen_k = params, max_seqlen_q, max_seqlen_k
        self.n_seqs = cu_seqlens_q.shape[0] - 1
        # every query or every key sequence empty: varlen_forward's early exit on each call
        self.empty = max_seqlen_q == 0 or max_seqlen_k == 0
        self._fwd = self._fwd_call = None
        self._bwd = self._bwd_call = None  # (decided by the signature's first backward)
        if self.empty:
            return
        if _varlen.small_query_varlen(q, self.n_seqs, max_seqlen_q, params):
            self._fwd_call = _varlen.small_query_varlen_runner(max_seqlen_q, max_seqlen_k, params)
            return
        impl = _select.backend(_select.varlen_forward_family(q, k, v, self.n_seqs, seqused_k,
                                                             params))
        make = getattr(impl, "varlen_fwd_call", None)
        if make is not None:
            self._fwd_call = make(q, k, v, self.n_seqs, seqused_k is not None, params)
        self._fwd = impl.varlen_fwd

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                cu_seqlens_q: torch.Tensor, cu_seqlens_k: torch.Tensor,
                seqused_k: Optional[torch.Tensor]) -> Tuple[torch.Tensor, torch.Tensor]:
        """(out (total_q, h, d_v), lse float32 (h, total_q)), contiguous."""
        if self._fwd_call is not None:
            return self._fwd_call(q, k, v, cu_seqlens_q, cu_seqlens_k, seqused_k)
        if self.empty:
            out, lse, _ = _varlen.varlen_forward(q, k, v, cu_seqlens_q, cu_seqlens_k, seqused_k,
                                                 None, self.max_seqlen_q, self.max_seqlen_k,
                                                 self.params)
        else:
            out, lse, _ = self._fwd(q, k, v, cu_seqlens_q, cu_seqlens_k, seqused_k,
                                    self.max_seqlen_q, self.max_seqlen_k, self.params, False)
        return out.contiguous(), lse.contiguous()

    def backward(self, dout: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                 out: torch.Tensor, lse: torch.Tensor, cu_seqlens_q: torch.Tensor,
                 cu_seqlens_k: torch.Tensor, seqused_k: Optional[torch.Tensor]
                 ) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(dq, dk, dv), contiguous, shaped and typed like q, k, v; dout (total_q, h, d_v)
        with unit last-dim stride."""
        if self.empty:
            return _varlen.varlen_backward(dout, q, k, v, out, lse, cu_seqlens_q, cu_seqlens_k,
                                           seqused_k, self.max_seqlen_q, self.max_seqlen_k,
                                           self.params)
        if self._bwd is None:
            impl = _select.backend(_select.varlen_backward_family(q, k, v, self.n_seqs,
                                                                  seqused_k, self.params))
            make = getattr(impl, "varlen_bwd_call", None)
            if make is not None:
                self._bwd_call = make(q, k, v, dout, self.n_seqs, seqused_k is not None,
                                      self.params)
            self._bwd = impl.varlen_bwd
        if self._bwd_call is not None:
            return self._bwd_call(dout, q, k, v, out, lse, cu_seqlens_q, cu_seqlens_k,
                                  seqused_k)
        dq, dk, dv = self._bwd(dout, q, k, v, out, lse, cu_seqlens_q, cu_seqlens_k, seqused_k,
                               self.max_seqlen_q, self.max_seqlen_k, self.params)
        return dq.contiguous(), dk.contiguous(), dv.contiguous()


__all__ = ["VarlenRunner"]
