"""FP8 attention entry points (FlashAttention-3's FP8 forward, with its descale API).

- ``flash_attn_func`` / ``flash_attn_varlen_func`` with float8_e4m3fn q, k, v come here, with
  FA3's ``q_descale, k_descale, v_descale``: float32 (batch, nheads_k), the real value being
  ``fp8 × descale`` (None = 1). FA3's q_descale is per *kv* head too: every query head of a
  group shares it.
- :func:`attention_quantized`: the output of ``flashattn.fp8.quantize`` (block descales: one
  per (batch, head, block_m rows) of q, per (batch, kv head, block_n keys) of k and v).
- :func:`flash_attn_fp8_func`: bf16 / fp16 in, quantize (block scales + incoherent
  processing) and FP8 attention, out in the input dtype: the drop-in for inference prefill.

Forward only: inputs that require grad run the forward (as FlashAttention-3's do); a backward
through the output raises NotImplementedError naming the bf16 path (``ops.forward_only``).
Dropout, ALiBi and S_dmask are not part of FA3's FP8 path and raise.

``attention_chunk`` (both calls) and ``seqused_q`` (the varlen call) run as the FP8 varlen
kernel over the segments of :mod:`flashattn.api.segments`, as the 16-bit calls do
(:mod:`flashattn.api.chunked`): each segment takes its sequence's descales (a gather of the
(batch, nheads_k) rows), so the products are those of the unsegmented call.
"""
from __future__ import annotations

import numbers
from typing import Optional, Sequence, Tuple

import torch

from flashattn import ops as _ops
from flashattn.api import chunked as _chunked
from flashattn.api import fastpath as _fast
from flashattn.api import out as _out
from flashattn.api import normalise as _p
from flashattn.api import segments as _segments
from flashattn.api import validation as _v
from flashattn.api.fp8_quantize import (QuantizedQKV, check_quantize_args, quantize_for_kernels,
                               random_signs)
from flashattn.params import ONE_BLOCK_SHIFT, AttnParams

Tensor = torch.Tensor
FP8 = torch.float8_e4m3fn
FP8_TYPES = (torch.float8_e4m3fn, torch.float8_e5m2, torch.float8_e4m3fnuz, torch.float8_e5m2fnuz)
OUT_DTYPES = (torch.bfloat16, torch.float16, torch.float32)
_NO_BACKWARD = ("FP8 attention is forward only (FlashAttention-3's FP8 path has no backward): "
                "for training, call flash_attn_func with bfloat16 / float16 tensors, or run "
                "the FP8 call under torch.no_grad()")


def is_fp8(*tensors: object) -> bool:
    """Whether any of the tensors has an 8-bit float dtype (the call takes the FP8 path)."""
    return any(isinstance(t, torch.Tensor) and t.dtype in FP8_TYPES for t in tensors)


def check_fp8_qkv(q: Tensor, k: Tensor, v: Tensor, names: Tuple[str, str, str],
                  varlen: bool = False) -> None:
    """q, k, v all float8_e4m3fn, shapes as check_qkv's (rank 3 when ``varlen``); v may have
    its head dim or its key axis contiguous (``flashattn.fp8.quantize`` writes the latter)."""
    for x, n in zip((q, k, v), names):
        if not isinstance(x, torch.Tensor):
            raise TypeError(f"{n} must be a torch.Tensor, got {_v._describe(x)}")
    dtypes = [x.dtype for x in (q, k, v)]
    if any(d != FP8 for d in dtypes):
        bad = [f"{n} {d}" for n, d in zip(names, dtypes) if d != FP8]
        if all(d in FP8_TYPES for d in dtypes):
            why = "only float8_e4m3fn is supported (FlashAttention-3's FP8 format)"
        else:
            why = "FP8 attention needs all three in float8_e4m3fn (mixed FP8 / 16-bit inputs)"
        raise TypeError(f"{', '.join(names)}: {why}; got {', '.join(bad)}")
    rank = 3 if varlen else 4
    for x, n in zip((q, k, v), names):
        _v.check_tensor(x, n, rank, "(total, nheads, headdim)" if varlen
                        else "(batch, seqlen, nheads, headdim)")
    # check_qkv's shape rules, on float32 stand-ins of the same shapes (no data touched)
    if not (q.device == k.device == v.device):
        raise ValueError(f"{', '.join(names)} must be on the same device, got {q.device}, "
                         f"{k.device}, {v.device}")
    stand_in = [torch.empty(x.shape, dtype=torch.float32, device="meta") for x in (q, k, v)]
    if varlen:
        stand_in = [t.unsqueeze(0) for t in stand_in]
    _v.check_qkv(*stand_in, names)
    for x, n in ((q, names[0]), (k, names[1])):
        if x.shape[-1] > 1 and x.stride(-1) != 1:
            raise ValueError(f"{n} must have a contiguous last dimension (stride 1), got "
                             f"strides {tuple(x.stride())}")
    key_axis = 0 if varlen else 1
    if v.shape[-1] > 1 and v.stride(-1) != 1 and v.stride(key_axis) != 1:
        raise ValueError(f"{names[2]} must have its last dimension or its key axis contiguous "
                         f"(stride 1), got strides {tuple(v.stride())}")
    # inputs that require grad are accepted, as FlashAttention-3 does: the forward runs and a
    # backward raises (ops.forward_only)


def check_descale(x: Optional[Tensor], name: str, batch: int, nheads_k: int,
                  device: torch.device) -> Tensor:
    """FA3's descale: float32 (batch, nheads_k) on the inputs' device, or None (= 1). Returns
    it as (batch, nheads_k) float32."""
    if x is None:
        return torch.ones((batch, nheads_k), dtype=torch.float32, device=device)
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"{name} must be a float32 tensor of shape (batch, nheads_k) = "
                        f"({batch}, {nheads_k}) or None, got {_v._describe(x)}")
    if x.dtype != torch.float32:
        raise TypeError(f"{name} must be float32 (FlashAttention-3's descale), got {x.dtype}")
    if tuple(x.shape) != (batch, nheads_k):
        raise ValueError(f"{name} must have shape (batch, nheads_k) = ({batch}, {nheads_k}), "
                         f"got {tuple(x.shape)}")
    if x.device != device:
        raise ValueError(f"{name} must be on the inputs' device {device}, got {x.device}")
    if x.device.type == "cpu" and not bool(torch.isfinite(x).all() and (x > 0).all()):
        raise ValueError(f"{name} must be finite and > 0 (the real value is fp8 × descale)")
    return x


def check_descales_need_fp8(fp8: bool, descales: Sequence[Optional[Tensor]],
                            out_dtype: Optional[torch.dtype]) -> None:
    """Descales and out_dtype belong to FP8 calls: with 16/32-bit inputs they would be ignored
    silently, so they raise."""
    if fp8:
        return
    for name, x in zip(("q_descale", "k_descale", "v_descale"), descales):
        if x is not None:
            raise ValueError(f"{name} applies to float8_e4m3fn inputs only (the real value is "
                             f"fp8 × descale); these inputs are not FP8")
    if out_dtype is not None:
        raise ValueError("out_dtype applies to FP8 inputs only (16/32-bit calls return q's "
                         "dtype)")


def _check_out_dtype(out_dtype: Optional[torch.dtype]) -> torch.dtype:
    if out_dtype is None:
        return torch.bfloat16
    if out_dtype not in OUT_DTYPES:
        raise TypeError(f"out_dtype must be one of {OUT_DTYPES} or None (bfloat16), got "
                        f"{out_dtype!r}")
    return out_dtype


def _check_unsupported(dropout_p: float, alibi_slopes: Optional[Tensor],
                       return_attn_probs: bool) -> None:
    if float(dropout_p) != 0.0:
        raise ValueError(f"dropout_p must be 0.0 with FP8 inputs (FP8 attention is for "
                         f"inference), got {dropout_p!r}")
    if alibi_slopes is not None:
        raise ValueError("alibi_slopes is not supported with FP8 inputs (FlashAttention-3's "
                         "FP8 path has no ALiBi)")
    if _v.check_bool(return_attn_probs, "return_attn_probs"):
        raise ValueError("return_attn_probs=True is not supported with FP8 inputs (no "
                         "S_dmask); the FP8 forward returns out only")


def _common(softmax_scale, causal, window_size, softcap, head_dim, seqlen_k):
    scale = _p.softmax_scale_or_default(_v.check_softmax_scale(softmax_scale), head_dim)
    causal = _v.check_causal(causal)
    left, right = _v.check_window_size(window_size)
    softcap = _v.check_softcap(softcap)
    left, right = _p.window(left, right, causal, seqlen_k)
    return scale, causal, left, right, softcap


def _over_segments(q: Tensor, k: Tensor, v: Tensor, seg: "_segments.Segments", qd: Tensor,
                   kd: Tensor, vd: Tensor, scale: float, causal: bool, left: int, right: int,
                   softcap: float, out_dtype: torch.dtype) -> Tuple[Tensor, Tensor]:
    """The FP8 varlen kernel over segments: packed q (total_q, h, d), k / v (total_k, h_k,
    d[_v]), descales (batch, h_k) of the segments' sequences (``seg.sequence`` picks each
    segment's row). Window sides as normalised for the whole call. Returns out (total_q, h,
    d_v) in out_dtype (0 on rows no segment gives keys) and lse (h, total_q)."""
    h, h_k = q.shape[1], k.shape[1]
    qd, kd, vd = (x.index_select(0, seg.sequence) for x in (qd, kd, vd))
    qd = qd.repeat_interleave(h // h_k, dim=1).unsqueeze(-1).contiguous()
    return _ops.fp8_varlen_attention(q, k, v, seg.cu_seqlens_q, seg.cu_seqlens_k, seg.seqused_k,
                                     seg.max_seqlen_q, seg.max_seqlen_k, qd,
                                     kd.unsqueeze(-1).contiguous(),
                                     vd.unsqueeze(-1).contiguous(), scale, causal, left, right,
                                     softcap, out_dtype)


def _chunked_dense(q: Tensor, k: Tensor, v: Tensor, qd: Tensor, kd: Tensor, vd: Tensor,
                   scale: float, causal: bool, left: int, right: int, softcap: float,
                   out_dtype: torch.dtype, chunk: int) -> Tuple[Tensor, Tensor]:
    """FP8 dense attention with ``attention_chunk`` = chunk: q (b, s_q, h, d), k / v (b, s_k,
    h_k, d[_v]), descales (b, h_k) float32. Returns out (b, s_q, h, d_v), lse (b, h, s_q),
    as the 16-bit call does (:func:`flashattn.api.chunked.by_chunks`), each chunk or segment
    with its sequence's descales."""
    h, h_k = q.shape[2], k.shape[2]

    def dense_call(qc: Tensor, kc: Tensor, vc: Tensor, n: int) -> Tuple[Tensor, Tensor]:
        qn, kn, vn = (x.repeat_interleave(n, dim=0) for x in (qd, kd, vd))
        qn = qn.repeat_interleave(h // h_k, dim=1).unsqueeze(-1).contiguous()
        return _ops.fp8_attention(qc, kc, vc, qn, kn.unsqueeze(-1).contiguous(),
                                  vn.unsqueeze(-1).contiguous(), ONE_BLOCK_SHIFT,
                                  ONE_BLOCK_SHIFT, scale, causal, left, right, softcap,
                                  out_dtype)

    def segments_call(qp: Tensor, kp: Tensor, vp: Tensor, seg: "_segments.Segments"
                      ) -> Tuple[Tensor, Tensor]:
        return _over_segments(qp, kp, vp, seg, qd, kd, vd, scale, causal, left, right,
                              softcap, out_dtype)

    return _chunked.by_chunks(q, k, v, chunk, dense_call, segments_call)


def dense(q: Tensor, k: Tensor, v: Tensor, *, dropout_p: float, softmax_scale: Optional[float],
          causal: bool, window_size: Sequence[int], softcap: float,
          alibi_slopes: Optional[Tensor], return_attn_probs: bool,
          q_descale: Optional[Tensor], k_descale: Optional[Tensor],
          v_descale: Optional[Tensor], out_dtype: Optional[torch.dtype],
          names: Tuple[str, str, str] = ("q", "k", "v"), return_lse: bool = False,
          attention_chunk: int = 0):
    """``flash_attn_func`` with FP8 inputs (see the module doc). Returns out (b, s_q, h, d_v)
    in ``out_dtype`` (default bfloat16), or (out, lse (b, h, s_q)) with ``return_lse``.
    ``attention_chunk``: FlashAttention-3's chunked local attention (0 = off)."""
    attention_chunk = _v.check_attention_chunk(attention_chunk)
    # a repeated call signature replays the recorded call (api/fastpath.py,
    # replay.fp8.Fp8DescaleCall); chunked calls are not recorded
    key = None if attention_chunk else _fast.fa3_fp8_key(
        q, k, v, dropout_p, softmax_scale, causal, window_size, softcap, alibi_slopes,
        return_attn_probs, q_descale, k_descale, v_descale, out_dtype, return_lse)
    run = None if key is None else _fast.FA3_FP8.get(key)
    if run:
        out, lse = run(q, k, v, q_descale, k_descale, v_descale)
        return (out, lse) if return_lse else out
    check_fp8_qkv(q, k, v, names)
    _check_unsupported(dropout_p, alibi_slopes, return_attn_probs)
    out_dtype = _check_out_dtype(out_dtype)
    b, _, h, d = q.shape
    s_k, h_k = k.shape[1], k.shape[2]
    qd = check_descale(q_descale, "q_descale", b, h_k, q.device)
    kd = check_descale(k_descale, "k_descale", b, h_k, q.device)
    vd = check_descale(v_descale, "v_descale", b, h_k, q.device)
    scale, causal, left, right, softcap = _common(softmax_scale, causal, window_size, softcap,
                                                  d, s_k)
    if key is not None and run is None:  # the signature's first call: record it
        params = AttnParams(scale, causal, left, right, softcap, None, 0.0, 0)
        run = _fast.fa3_fp8_record(key, q, k, v, (q_descale, k_descale, v_descale), params,
                                   out_dtype, bool(return_lse))
        if run:
            out, lse = run(q, k, v, q_descale, k_descale, v_descale)
            return (out, lse) if return_lse else out
    if (not _segments.chunk_is_noop(attention_chunk, s_k, right, q.shape[1] <= s_k)
            and min(b, q.shape[1], s_k) > 0):
        out, lse = _chunked_dense(q, k, v, qd, kd, vd, scale, causal, left, right, softcap,
                                  out_dtype, attention_chunk)
    else:
        # q's descale is per kv head (FA3): one per query head of the group, in block form
        qd = qd.repeat_interleave(h // h_k, dim=1).unsqueeze(-1).contiguous()
        out, lse = _ops.fp8_attention(q, k, v, qd, kd.unsqueeze(-1).contiguous(),
                                      vd.unsqueeze(-1).contiguous(), ONE_BLOCK_SHIFT,
                                      ONE_BLOCK_SHIFT, scale, causal, left, right, softcap,
                                      out_dtype)
    out = _ops.forward_only(out, (q, k, v), _NO_BACKWARD)
    return (out, lse) if return_lse else out


def varlen(q: Tensor, k: Tensor, v: Tensor, cu_seqlens_q: Tensor, cu_seqlens_k: Tensor,
           seqused_k: Optional[Tensor], max_seqlen_q: int, max_seqlen_k: int, *,
           dropout_p: float, softmax_scale: Optional[float], causal: bool,
           window_size: Sequence[int], softcap: float, alibi_slopes: Optional[Tensor],
           return_attn_probs: bool, q_descale: Optional[Tensor], k_descale: Optional[Tensor],
           v_descale: Optional[Tensor], out_dtype: Optional[torch.dtype],
           record: Optional[list] = None, seqused_q: Optional[Tensor] = None,
           attention_chunk: int = 0) -> Tensor:
    """``flash_attn_varlen_func`` with FP8 inputs: descales (batch, nheads_k), batch = the
    number of sequences. q / k / v (check_fp8_qkv), cu_seqlens, max_seqlen, seqused_q and
    attention_chunk already validated by the caller (api/varlen.py). Returns out
    (total_q, h, d_v) in ``out_dtype`` (0 on rows past seqused_q). ``record``: a list that
    receives the normalised (:class:`AttnParams`, out_dtype) once every check passed (the fast
    path's entry; calls with seqused_q or a chunk are not recorded)."""
    _check_unsupported(dropout_p, alibi_slopes, return_attn_probs)
    out_dtype = _check_out_dtype(out_dtype)
    batch = cu_seqlens_q.shape[0] - 1
    h, d = q.shape[1], q.shape[2]
    h_k = k.shape[1]
    qd = check_descale(q_descale, "q_descale", batch, h_k, q.device)
    kd = check_descale(k_descale, "k_descale", batch, h_k, q.device)
    vd = check_descale(v_descale, "v_descale", batch, h_k, q.device)
    # a window side >= the longest key sequence is unbounded for every sequence
    scale, causal, left, right, softcap = _common(softmax_scale, causal, window_size, softcap,
                                                  d, max(int(max_seqlen_k), 1))
    if (seqused_q is not None or not _segments.chunk_is_noop(attention_chunk, max_seqlen_k,
                                                             right, False)) and batch > 0:
        seg = _segments.build(cu_seqlens_q, cu_seqlens_k, seqused_q, seqused_k,
                              attention_chunk, int(max_seqlen_q), int(max_seqlen_k))
        out, _ = _over_segments(q, k, v, seg, qd, kd, vd, scale, causal, left, right, softcap,
                                out_dtype)
        return _ops.forward_only(out, (q, k, v), _NO_BACKWARD)
    if record is not None:
        record.append((AttnParams(scale, causal, left, right, softcap, None, 0.0, 0),
                       out_dtype))
    qd = qd.repeat_interleave(h // h_k, dim=1).unsqueeze(-1).contiguous()
    out, _ = _ops.fp8_varlen_attention(q, k, v, cu_seqlens_q, cu_seqlens_k, seqused_k,
                                       int(max_seqlen_q), int(max_seqlen_k), qd,
                                       kd.unsqueeze(-1).contiguous(),
                                       vd.unsqueeze(-1).contiguous(), scale, causal, left,
                                       right, softcap, out_dtype)
    return _ops.forward_only(out, (q, k, v), _NO_BACKWARD)


@_out.writes_out(lambda bound: None)
def attention_quantized(qkv: QuantizedQKV, softmax_scale: Optional[float] = None,
                        causal: bool = False, window_size: Tuple[int, int] = (-1, -1),
                        softcap: float = 0.0, out_dtype: Optional[torch.dtype] = None,
                        return_lse: bool = False):
    """FP8 attention over the output of :func:`flashattn.fp8.quantize` (block descales).

    Arguments as ``flash_attn_func``'s (softmax_scale defaults to headdim ** -0.5: the
    rotation does not change the head dim); out_dtype default bfloat16. Returns out (b, s_q,
    h, d_v), or (out, lse (b, h, s_q) float32) with ``return_lse``.
    """
    # a repeated call signature replays the recorded call (api/fastpath.py,
    # replay.fp8.Fp8DescaleCall over the block tables)
    key = (_fast.quantized_key(qkv, softmax_scale, causal, window_size, softcap, out_dtype,
                               return_lse) if type(qkv) is QuantizedQKV else None)
    run = None if key is None else _fast.FP8_QUANTIZED.get(key)
    if run is None and key is not None:  # the signature's first call: check, then record
        _check_quantized(qkv, False)
        out_dtype_ = _check_out_dtype(out_dtype)
        scale, causal_, left, right, softcap_ = _common(softmax_scale, causal, window_size,
                                                        softcap, qkv.q.shape[3], qkv.k.shape[1])
        params = AttnParams(scale, causal_, left, right, softcap_, None, 0.0, 0)
        run = _fast.quantized_record(key, qkv, params, out_dtype_, bool(return_lse))
    if run:
        out, lse = run(qkv.q, qkv.k, qkv.v, qkv.q_descale, qkv.k_descale, qkv.v_descale)
        return (out, lse) if return_lse else out
    return _attention_quantized(qkv, softmax_scale, causal, window_size, softcap, out_dtype,
                                return_lse, v_wgmma=False)


def _attention_quantized(qkv: QuantizedQKV, softmax_scale: Optional[float], causal: bool,
                         window_size: Tuple[int, int], softcap: float,
                         out_dtype: Optional[torch.dtype], return_lse: bool, v_wgmma: bool,
                         trusted: bool = False):
    """attention_quantized's body; ``v_wgmma``: qkv.v is in wgmma key order (quantized for
    the Hopper kernels by flash_attn_fp8_func: fp8_format.wgmma_vt_empty's layout).
    ``trusted``: qkv comes straight from this package's quantize pass on checked inputs
    (flash_attn_fp8_func), so the checks of its tensors are skipped (their outcome is fixed:
    ~50 us of host per call on the H100 host); the scalar arguments are still checked."""
    if not trusted:
        _check_quantized(qkv, v_wgmma)
    q, k, v = qkv.q, qkv.k, qkv.v
    out_dtype = _check_out_dtype(out_dtype)
    d, s_k = q.shape[3], k.shape[1]
    scale, causal, left, right, softcap = _common(softmax_scale, causal, window_size, softcap,
                                                  d, s_k)
    descales = (qkv.q_descale, qkv.k_descale, qkv.v_descale)
    if not trusted:  # (the pass writes them contiguous)
        descales = tuple(x.contiguous() for x in descales)
    out, lse = _ops.fp8_attention(q, k, v, *descales,
                                  int(qkv.block_m).bit_length() - 1,
                                  int(qkv.block_n).bit_length() - 1, scale, causal, left, right,
                                  softcap, out_dtype, v_wgmma)
    return (out, lse) if return_lse else out


@_out.writes_out(_out.like_q("q", "v", 4, 4))
def flash_attn_fp8_func(q: Tensor, k: Tensor, v: Tensor, softmax_scale: Optional[float] = None,
                        causal: bool = False, window_size: Tuple[int, int] = (-1, -1),
                        softcap: float = 0.0, incoherent: bool = True,
                        seed: Optional[int] = 0, block_m: int = 128, block_n: int = 128,
                        return_lse: bool = False):
    """FP8 attention for bf16 / fp16 inputs: block quantization (+ incoherent processing) and
    the FP8 forward, in one call (FlashAttention-3, section 3.3). Inference only.

    Arguments:
        q: (batch, seqlen_q, nheads, headdim), k: (batch, seqlen_k, nheads_k, headdim),
            v: (batch, seqlen_k, nheads_k, headdim_v); float16 or bfloat16 (float32 too).
            Inputs that require grad are accepted; a backward through the result raises
            NotImplementedError (forward only).
        softmax_scale, causal, window_size, softcap: as ``flash_attn_func``.
        incoherent: rotate q and k by the same random orthogonal M = H · diag(signs) before
            quantizing (q k^T is unchanged; outlier channels are spread first).
        seed: int, the key of the random signs: a fixed rotation by default (reproducible
            outputs, no per-call host work); None draws new signs from torch's default
            generator on every call.
        block_m, block_n: rows of q / keys of k and v per scale (powers of two).
        return_lse: also return the float32 (batch, nheads, seqlen_q) log-sum-exp.

    Returns out (batch, seqlen_q, nheads, headdim_v) in q's dtype (and lse).
    """
    # a repeated call signature replays the recorded call (api/fastpath.py, replay.fp8.Fp8Call)
    key = _fast.fp8_key(q, k, v, softmax_scale, causal, window_size, softcap, incoherent, seed,
                        block_m, block_n, return_lse)
    run = None if key is None else _fast.FP8.get(key)
    if run:
        out, lse = run(q, k, v)
        return (out, lse) if return_lse else out
    incoherent, block_m, block_n = check_quantize_args(q, k, v, incoherent, seed, block_m,
                                                       block_n)
    # when the Hopper kernel will run, the quantize pass writes V in its key order (no
    # permuting pass in the forward)
    scale, causal_, left, right, softcap_ = _common(softmax_scale, causal, window_size, softcap,
                                                    q.shape[-1], k.shape[1])
    params = AttnParams(scale, causal_, left, right, softcap_, None, 0.0, 0)
    if key is not None and run is None:  # the signature's first call: record it
        signs = random_signs(q.shape[-1], seed, q.device) if incoherent else None
        run = _fast.fp8_record(key, q, k, v, params, signs, block_m, block_n,
                               bool(return_lse))
        if run:
            out, lse = run(q, k, v)
            return (out, lse) if return_lse else out
    v_wgmma = _ops.fp8_v_wgmma(q, k, v, params, block_m, block_n)
    with torch.no_grad():  # forward only: a backward raises (ops.forward_only)
        qkv8 = quantize_for_kernels(q, k, v, incoherent, seed, block_m, block_n, v_wgmma,
                                    copy_signs=False)
        res = _attention_quantized(qkv8, softmax_scale, causal, window_size, softcap, q.dtype,
                                   return_lse, v_wgmma, trusted=True)
    if return_lse:
        return _ops.forward_only(res[0], (q, k, v), _NO_BACKWARD), res[1]
    return _ops.forward_only(res, (q, k, v), _NO_BACKWARD)


def _check_quantized(qkv: QuantizedQKV, v_wgmma: bool) -> None:
    """The checks of a QuantizedQKV handed to attention_quantized: fp8 tensors of matching
    shapes on one device, descales float32 of the block counts, blocks powers of two."""
    if not isinstance(qkv, QuantizedQKV):
        raise TypeError(f"qkv must be the QuantizedQKV that flashattn.fp8.quantize returns, got "
                        f"{_v._describe(qkv)}")
    q, k, v = qkv.q, qkv.k, qkv.v
    check_fp8_qkv(q, k, v[:, :k.shape[1]] if v_wgmma else v, ("qkv.q", "qkv.k", "qkv.v"))
    b, s_q, h, _ = q.shape
    s_k, h_k = k.shape[1], k.shape[2]
    for name, x, shape in (("q_descale", qkv.q_descale, (b, h, -(-s_q // qkv.block_m))),
                           ("k_descale", qkv.k_descale, (b, h_k, -(-s_k // qkv.block_n))),
                           ("v_descale", qkv.v_descale, (b, h_k, -(-s_k // qkv.block_n)))):
        if not isinstance(x, torch.Tensor) or x.dtype != torch.float32 \
                or tuple(x.shape) != shape or x.device != q.device:
            raise ValueError(f"qkv.{name} must be float32 of shape {shape} on {q.device}, got "
                             f"{_v._describe(x)}")
    for name, block in (("block_m", qkv.block_m), ("block_n", qkv.block_n)):
        if isinstance(block, bool) or not isinstance(block, numbers.Integral) or block < 1 \
                or block & (block - 1):
            raise ValueError(f"qkv.{name} must be a power of two, got {block!r}")


__all__ = ["attention_quantized", "check_descale", "check_descales_need_fp8", "check_fp8_qkv", "dense",
           "flash_attn_fp8_func", "is_fp8", "varlen"]
