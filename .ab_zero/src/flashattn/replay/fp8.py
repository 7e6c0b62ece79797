"""Recorded FP8 calls: one call signature's passes and forward replayed from their launch plans,
their intermediates in a per-stream workspace (:mod:`flashattn.replay.workspace`)."""
from __future__ import annotations

from typing import Optional, Tuple

import torch

from flashattn import fp8_format
from flashattn.dispatch import dense as _dense
from flashattn.dispatch import fp8 as _fp8
from flashattn.dispatch import select as _select
from flashattn.params import ONE_BLOCK_SHIFT, AttnParams, Fp8Scales
from flashattn.replay.workspace import WorkspaceCall, meta


def fp8_e2e_runner(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, params: AttnParams,
                   signs: Optional[torch.Tensor], block_m: int, block_n: int, need_lse: bool
                   ) -> Optional["Fp8Call"]:
    """``flash_attn_fp8_func``'s decisions for these validated 16/32-bit inputs, made once: a
    :class:`Fp8Call` for the calls that run the Triton quantize pass and then the Hopper FP8
    kernel (CUDA, V in wgmma key order, >= 32 keys per scale), None for the rest (they take
    the full path on every call). The caller keys it on everything the decisions read
    (shapes, strides, dtypes, device, alignment, params, blocks, seed, settings)."""
    if (q.device.type != "cuda" or _dense.is_degenerate(q, k)
            or block_n < fp8_format.WGMMA_KEY_GROUP
            or _select.quantize_backend(q, block_m, block_n) != "portable"
            or not _fp8.fp8_v_wgmma(q, k, v, params, block_m, block_n)):
        return None
    return Fp8Call(q, k, v, params, signs, block_m, block_n, need_lse)


class Fp8Call(WorkspaceCall):
    """``flash_attn_fp8_func`` for one call signature (a recorded call, for FP8
    prefill): the quantize pass and the Hopper FP8 forward, both launched by replaying their
    recorded launch plans with addresses. The pass's outputs, the LSE when the caller drops it
    and the forward's tile-queue counter live in one workspace reused per (stream, thread)
    (``runtime.buffers``; the stream orders one call's forward before the next call's pass),
    so a call allocates only ``out`` (and ``lse`` when it is returned). The full path
    allocated nine tensors and checked the pass's outputs again (~400 µs of host per call on
    the H100 host, benchmarks/NOTES.md, 2026-11-24).

    Made by :func:`fp8_e2e_runner`. The first call (and any call whose replay cannot run now:
    fast launches off, a profiler listening) launches through tensor views of the workspace
    and records the plans."""

    # the workspace's regions: the pass's six outputs (fp8_format.quantized_empty's order),
    # the LSE when the caller drops it, the tile-queue counter
    _REGIONS = ("q8", "k8", "v8", "q_descale", "k_descale", "v_descale", "lse", "counter")

    def __init__(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, params: AttnParams,
                 signs: Optional[torch.Tensor], block_m: int, block_n: int,
                 need_lse: bool) -> None:
        b, s_q, h, d = q.shape
        d_v = v.shape[3]
        # the pass's outputs as the pass lays them out (V^T in wgmma key order: a view that
        # covers all of its storage), then the LSE and the counter: (name, meta tensor)
        metas = fp8_format.quantized_empty(q.shape, k.shape, v.shape, block_m, block_n, True,
                                           torch.device("meta"))
        self._setup("fp8-call", list(zip(self._REGIONS,
                                         metas + (meta((b, h, s_q), torch.float32),
                                                  meta((1,), torch.int32)))),
                    (b, s_q, h, d_v), q.dtype, (b, h, s_q), q.device, need_lse)
        self._offsets = tuple(self._ws.offset(name) for name in self._REGIONS)
        self._shifts = (int(block_m).bit_length() - 1, int(block_n).bit_length() - 1)
        self._quantize = _select.backend("portable").fp8_quantize_call(signs, block_m, block_n)
        self._fwd = _select.backend("hopper").fp8_fwd_call(d, d_v, params, q.dtype)

    def __call__(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor
                 ) -> Tuple[torch.Tensor, Optional[torch.Tensor]]:
        """(out (b, s_q, h, d_v) in q's dtype, lse (b, h, s_q) float32 or None when the
        signature does not return it) for q, k, v of this call signature."""
        ws, out, lse = self._begin()
        if self._recorded:
            base = ws.data_ptr()
            q8, k8, v8, qs, ks, vs, lse_ws, counter = (base + o for o in self._offsets)
            lse_at = lse_ws if lse is None else lse.data_ptr()
            if (self._quantize.replay(q, k, v, (q8, k8, v8, qs, ks, vs))
                    and self._fwd.replay((q8, k8, v8, out.data_ptr(), lse_at,
                                          counter if self._fwd.uses_counter else lse_at,
                                          qs, ks, vs))):
                return out, lse
            # (a replay that cannot run now launches through the views below; the pass may
            # then run twice, which writes the same values)
        views = {name: self._ws.view(ws, name) for name in self._REGIONS}
        q8, k8, v8 = views["q8"], views["k8"], views["v8"]
        self._quantize.record(q, k, v, (q8, k8, v8, views["q_descale"], views["k_descale"],
                                        views["v_descale"]))
        scales = Fp8Scales(views["q_descale"], views["k_descale"], views["v_descale"],
                           *self._shifts)
        lse_t = views["lse"] if lse is None else lse
        self._fwd.record(q8, k8, v8, scales, out, lse_t,
                         views["counter"] if self._fwd.uses_counter else lse_t)
        self._recorded = self._quantize.plan is not None and self._fwd.plan is not None
        return out, lse


def fp8_quantize_runner(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                        signs: Optional[torch.Tensor], block_m: int, block_n: int
                        ) -> Optional["Fp8QuantizeCall"]:
    """``fp8.quantize``'s decisions for these validated inputs, made once: a
    :class:`Fp8QuantizeCall` where the Triton pass runs them (CUDA, every tensor non-empty),
    None elsewhere (the full path on every call)."""
    if (q.device.type != "cuda" or _select.quantize_backend(q, block_m, block_n) != "portable"
            or q.numel() == 0 or k.numel() == 0 or v.numel() == 0):
        return None
    return Fp8QuantizeCall(q, k, v, signs, block_m, block_n)


class Fp8QuantizeCall:
    """``fp8.quantize`` for one call signature: its six outputs allocated fresh (the caller
    owns them; V keys contiguous, fp8_format.keys_contiguous_empty) and the pass's recorded
    launch replayed with their addresses (triton/fp8_quantize.QuantizeCall). The full path's
    checks, dispatch and launch-plan lookup cost ~200 µs of host per call on the H100 host
    (benchmarks/NOTES.md, 2026-11-24)."""

    def __init__(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                 signs: Optional[torch.Tensor], block_m: int, block_n: int) -> None:
        self._shapes = (q.shape, k.shape, v.shape, block_m, block_n)
        self._device = q.device
        self._quantize = _select.backend("portable").fp8_quantize_call(signs, block_m,
                                                                       block_n, v_wgmma=False)

    def __call__(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor
                 ) -> Tuple[torch.Tensor, ...]:
        """(q8, k8, v8, q_descale, k_descale, v_descale), as the full path returns them."""
        outs = fp8_format.quantized_empty(*self._shapes, False, self._device)
        if not self._quantize.replay(q, k, v, tuple(t.data_ptr() for t in outs)):
            self._quantize.record(q, k, v, outs)  # (first call, or no replay now)
        return outs


def fp8_descale_runner(q8: torch.Tensor, k8: torch.Tensor, v8: torch.Tensor,
                       descales: Tuple[Optional[torch.Tensor], ...], params: AttnParams,
                       out_dtype: torch.dtype, need_lse: bool,
                       shifts: Tuple[int, int] = (ONE_BLOCK_SHIFT, ONE_BLOCK_SHIFT)
                       ) -> Optional["Fp8DescaleCall"]:
    """An FP8 forward on e4m3 q, k, v whose descales the caller holds: FlashAttention-3's API
    (``flash_attn_func``, (batch, nheads_k) descales or None, ``shifts`` one block per head) or
    ``fp8.attention`` (block tables (batch, heads, blocks) of 2^shifts rows / keys). The
    decisions for these validated inputs, made once: a :class:`Fp8DescaleCall` where the
    Hopper FP8 kernel runs them (CUDA, not degenerate), None elsewhere (the full path on every
    call). The caller keys it on everything the decisions read (shapes, strides, dtypes,
    device, alignment, params, which descales are given, the blocks)."""
    if q8.device.type != "cuda" or _dense.is_degenerate(q8, k8):
        return None
    b, h, h_k = q8.shape[0], q8.shape[2], k8.shape[2]
    meta = torch.empty((b, h, 1), dtype=torch.float32, device="meta")
    scales = Fp8Scales(meta, meta[:, :h_k], meta[:, :h_k], *shifts)
    name = _select.select("fp8_fwd", q8, k8, v8, params, scales=scales, out_dtype=out_dtype)
    if name != "hopper":
        return None
    return Fp8DescaleCall(q8, k8, v8, descales, params, out_dtype, need_lse, shifts)


class Fp8DescaleCall(WorkspaceCall):
    """FlashAttention-3's FP8 API for one call signature (a recorded call): V^T in
    the kernel's wgmma key order written by a replayed pass (sm90/v_layout.VtCall), then the
    Hopper FP8 forward replayed (sm90/fwd.Fp8FwdCall), both with addresses. V^T, the dropped
    LSE, the tile-queue counter and the descale tables that must be copied live in one
    workspace reused per (stream, thread) (``runtime.buffers``), so a call allocates only
    ``out`` (and ``lse`` when it is returned). The full path validated the inputs on meta
    tensors, expanded the descales and allocated V^T on every call.

    The kernel reads one float32 descale table per tensor, (batch, heads, blocks) contiguous.
    FA3's descales are (batch, nheads_k) with one block per head (``shifts`` 31); block tables
    (``fp8.attention``) are already (batch, heads, blocks). Per descale, fixed by the
    signature: a table of ones made once (None: FA3's "= 1"), the caller's tensor read in place
    (contiguous, and for FA3's q, one query head per kv head), or a copy into the workspace on
    every call (FA3's q descale of a GQA group: one entry per query head; a non-contiguous
    descale). Values are never cached: a call with new descale values (same signature)
    computes with them.

    Made by :func:`fp8_descale_runner`. The first call (and any call whose replay cannot run
    now: fast launches off, a profiler listening) launches through tensor views of the
    workspace and records the plans."""

    def __init__(self, q8: torch.Tensor, k8: torch.Tensor, v8: torch.Tensor,
                 descales: Tuple[Optional[torch.Tensor], ...], params: AttnParams,
                 out_dtype: torch.dtype, need_lse: bool,
                 shifts: Tuple[int, int] = (ONE_BLOCK_SHIFT, ONE_BLOCK_SHIFT)) -> None:
        b, s_q, h, d = q8.shape
        s_k, h_k, d_v = k8.shape[1], k8.shape[2], v8.shape[3]
        self._group = h // h_k
        self._shifts = tuple(shifts)
        # FA3's (batch, nheads_k) descales, or block tables as the kernel reads them
        self._fa3 = all(x is None or x.dim() == 2 for x in descales)
        f32, device = torch.float32, q8.device
        # the workspace's regions: V^T, the LSE, the counter, then the tables to copy
        regions = [("vt", meta((b, h_k, d_v, fp8_format.wgmma_padded_keys(s_k)), torch.uint8)),
                   ("lse", meta((b, h, s_q), f32)), ("counter", meta((1,), torch.int32))]
        # per descale (q, k, v): ("ones", table), ("given", None) or ("copy", region name)
        self._tables: list = []
        for name, x, heads in (("q", descales[0], h), ("k", descales[1], h_k),
                               ("v", descales[2], h_k)):
            shape = (b, heads, 1) if self._fa3 else tuple(x.shape)
            if x is None:
                self._tables.append(("ones", torch.ones(shape, dtype=f32, device=device)))
            elif (self._fa3 and name == "q" and self._group > 1) or not x.is_contiguous():
                self._tables.append(("copy", name))
                regions.append((name, meta(shape, f32)))
            else:
                self._tables.append(("given", None))
        self._setup("fp8-descale-call", regions, (b, s_q, h, d_v), out_dtype, (b, h, s_q),
                    device, need_lse)
        self._offsets = tuple(self._ws.offset(name) for name in ("vt", "lse", "counter"))
        self._vt = _select.backend("hopper").fp8_vt_call()
        self._fwd = _select.backend("hopper").fp8_fwd_call(d, d_v, params, out_dtype)

    def _copy(self, ws: torch.Tensor, name: str, x: torch.Tensor) -> torch.Tensor:
        """Table ``name``'s workspace region filled from the caller's descale ``x``: one entry
        per query head of the group (FA3's q), or a contiguous copy."""
        table = self._ws.view(ws, name)
        if self._fa3:
            b, heads = table.shape[0], x.shape[1]
            table.view(b, heads, -1).copy_(x.unsqueeze(-1).expand(b, heads,
                                                                  table.shape[1] // heads))
        else:
            table.copy_(x)
        return table

    def __call__(self, q8: torch.Tensor, k8: torch.Tensor, v8: torch.Tensor,
                 q_descale: Optional[torch.Tensor], k_descale: Optional[torch.Tensor],
                 v_descale: Optional[torch.Tensor]
                 ) -> Tuple[torch.Tensor, Optional[torch.Tensor]]:
        """(out (b, s_q, h, d_v) in the signature's out_dtype, lse (b, h, s_q) float32 or None
        when the signature does not return it) for these inputs and descales (float32, as the
        signature's: FA3's (b, h_k) or None, or block tables)."""
        ws, out, lse = self._begin()
        descales = (q_descale, k_descale, v_descale)
        # the tables the forward reads: constant ones, the caller's, or refilled copies
        tables = [what if how == "ones" else x if how == "given" else self._copy(ws, what, x)
                  for (how, what), x in zip(self._tables, descales)]
        if self._recorded:  # addresses only: no view of the workspace per call
            base = ws.data_ptr()
            vt, lse_ws, counter = (base + o for o in self._offsets)
            lse_at = lse_ws if lse is None else lse.data_ptr()
            if (self._vt.replay(v8.data_ptr(), vt)
                    and self._fwd.replay((q8.data_ptr(), k8.data_ptr(), vt, out.data_ptr(),
                                          lse_at, counter if self._fwd.uses_counter else lse_at,
                                          *(t.data_ptr() for t in tables)))):
                return out, lse
        # (a replay that cannot run now launches through the views; V^T may then be
        # written twice, with the same values)
        vt = self._ws.view(ws, "vt")
        lse_t = self._ws.view(ws, "lse") if lse is None else lse
        counter_t = self._ws.view(ws, "counter") if self._fwd.uses_counter else lse_t
        self._vt.record(v8, vt)
        if self._fa3:  # (the caller's (b, h_k) descales as the kernel's (b, h_k, 1) tables)
            tables = [t.unsqueeze(-1) if how == "given" else t
                      for (how, _), t in zip(self._tables, tables)]
        scales = Fp8Scales(*tables, *self._shifts)
        self._fwd.record(q8, k8, vt.view(fp8_format.FP8_DTYPE).permute(0, 3, 1, 2), scales,
                         out, lse_t, counter_t)
        self._recorded = self._vt.plan is not None and self._fwd.plan is not None
        return out, lse


def fp8_varlen_runner(q8: torch.Tensor, k8: torch.Tensor, v8: torch.Tensor,
                      cu_seqlens_q: torch.Tensor, seqused_k: Optional[torch.Tensor],
                      max_seqlen_k: int, descales: Tuple[Optional[torch.Tensor], ...],
                      params: AttnParams, out_dtype: torch.dtype
                      ) -> Optional["Fp8VarlenCall"]:
    """``flash_attn_varlen_func``'s FP8 decisions (FA3's descale API) for these validated
    inputs, made once: an :class:`Fp8VarlenCall` where the Hopper FP8 kernel's varlen mode runs
    them, None elsewhere (the full path on every call)."""
    n_seqs = cu_seqlens_q.shape[0] - 1
    call = Fp8VarlenCall(q8, k8, n_seqs, descales)
    scales = call.scales(*descales)
    if not _select.fp8_varlen_on_hopper(q8, k8, v8, n_seqs, params, scales, out_dtype):
        return None
    call.packed = _select.backend("hopper").fp8_varlen_call(
        q8, k8, v8, n_seqs, seqused_k is not None, max_seqlen_k, scales, params, out_dtype)
    return call


class Fp8VarlenCall:
    """A packed FP8 signature (FA3's descale API on ``flash_attn_varlen_func``) on the Hopper
    kernel: FA3's (b, h_k) descales (or None: ones made once) as the kernel's (b, h, 1) /
    (b, h_k, 1) tables, then the backend's recorded packed call (sm90 PackedFwdCall: the V^T
    pass, the clearing pass and the forward from their launch plans). The full path's checks,
    dispatch and plan keys measured 250-570 µs of host per call on the H100 host (2026-11-25,
    benchmarks/NOTES.md); the api's fast path (api/fastpath.FA3_FP8_VARLEN) keeps one per
    signature."""

    def __init__(self, q8: torch.Tensor, k8: torch.Tensor, n_seqs: int,
                 descales: Tuple[Optional[torch.Tensor], ...]) -> None:
        self.group = q8.shape[1] // k8.shape[1]
        heads = (q8.shape[1], k8.shape[1], k8.shape[1])
        # (a descale left out is 1: its table is made once and only read)
        self._ones = [torch.ones((n_seqs, n, 1), dtype=torch.float32, device=q8.device)
                      if x is None else None for x, n in zip(descales, heads)]
        self.packed = None

    def scales(self, q_descale: Optional[torch.Tensor], k_descale: Optional[torch.Tensor],
               v_descale: Optional[torch.Tensor]) -> Fp8Scales:
        """The kernel's tables for FA3's descales: q's repeated for each query head of its
        group, every table (b, heads, 1) contiguous, one block per sequence."""
        if q_descale is None:
            qd = self._ones[0]
        elif self.group > 1:
            qd = q_descale.repeat_interleave(self.group, dim=1).unsqueeze(-1)
        else:
            qd = q_descale.unsqueeze(-1).contiguous()
        kd, vd = (ones if x is None else x.unsqueeze(-1).contiguous()
                  for ones, x in zip(self._ones[1:], (k_descale, v_descale)))
        return Fp8Scales(qd, kd, vd, ONE_BLOCK_SHIFT, ONE_BLOCK_SHIFT)

    def __call__(self, q8: torch.Tensor, k8: torch.Tensor, v8: torch.Tensor,
                 cu_seqlens_q: torch.Tensor, cu_seqlens_k: torch.Tensor,
                 seqused_k: Optional[torch.Tensor], q_descale: Optional[torch.Tensor],
                 k_descale: Optional[torch.Tensor], v_descale: Optional[torch.Tensor]
                 ) -> torch.Tensor:
        """out (total_q, h, d_v) in the signature's out_dtype."""
        out, _ = self.packed(q8, k8, v8, cu_seqlens_q, cu_seqlens_k, seqused_k,
                             self.scales(q_descale, k_descale, v_descale))
        return out


__all__ = ["fp8_descale_runner", "fp8_e2e_runner", "fp8_quantize_runner", "fp8_varlen_runner",
           "Fp8Call", "Fp8DescaleCall", "Fp8QuantizeCall", "Fp8VarlenCall"]
