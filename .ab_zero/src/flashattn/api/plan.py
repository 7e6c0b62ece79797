"""Plan / run for serving loops (FlashInfer's idea): ``flashattn.plan_decode``.

A decode step in a serving loop runs the same shapes thousands of times. ``plan_decode``
validates the shapes and parameters once, fixes the split-KV decision (from the cache
capacity, not from the current lengths) and keeps the outputs and split workspaces; each
``plan.run(...)`` then checks only that its tensors are the planned ones (shapes, dtype,
device) and launches. Everything a launch depends on is fixed by the plan, so ``run`` can be
captured in a CUDA graph once and replayed with new ``cache_seqlens`` values written into the
same tensor (and new query / cache contents).

    plan = flashattn.plan_decode(batch=8, nheads=32, nheads_k=8, headdim=128,
                                 max_seqlen_k=8192, page_size=16, dtype=torch.bfloat16,
                                 device="cuda")
    out = plan.run(q, k_cache, v_cache, cache_seqlens, block_table)   # (8, 1, 32, 128)

The returned ``out`` (and lse) are the plan's own buffers, overwritten by the next ``run``:
copy them (or consume them) before the next step. The plain ``flash_attn_with_kvcache`` keeps
working without a plan (and appends new keys, rotates, ...); a plan runs attention over the
cache as it is.

FP8 KV caches (FlashAttention-3's descales, as in ``flash_attn_with_kvcache``): plan with
``kv_dtype=torch.float8_e4m3fn`` and pass each step's descales to ``run``; FA3's FP8 query
too with ``dtype=torch.float8_e4m3fn`` (out is then bfloat16):

    plan = flashattn.plan_decode(8, 32, 8, 128, max_seqlen_k=8192, page_size=16,
                                 dtype=torch.bfloat16, kv_dtype=torch.float8_e4m3fn)
    out = plan.run(q, k8, v8, cache_seqlens, block_table, k_descale=kd, v_descale=vd)

The descales are read by the kernel on every run (a captured graph reads their new values);
None stands for ones, which the plan holds.

Multi-head latent attention (FlashAttention-3's ``qv``): plan with ``has_qv=True`` (and
``headdim_v`` up to 512) and pass each step's latent query to ``run``; the default scale is
then ``(headdim + headdim_v) ** -0.5``, as in ``flash_attn_with_kvcache``:

    plan = flashattn.plan_decode(64, 128, 1, 64, headdim_v=512, max_seqlen_k=8192,
                                 page_size=64, has_qv=True)
    out = plan.run(q, kv_cache[..., :64], kv_cache, cache_seqlens, block_table, qv=qv)
"""
from __future__ import annotations

import numbers
from typing import Optional, Tuple

import torch

from flashattn.api import kvcache_validation as _kv
from flashattn.api import normalise as _p
from flashattn.api import validation as _v
from flashattn.params import AttnParams
from flashattn.replay import kvcache as _replay_kvcache

Tensor = torch.Tensor


def _positive_int(x: object, name: str, allow_zero: bool = False) -> int:
    if isinstance(x, bool) or not isinstance(x, numbers.Integral) or int(x) < (0 if allow_zero else 1):
        raise ValueError(f"{name} must be an int >= {0 if allow_zero else 1}, got {x!r}")
    return int(x)


class DecodePlan:
    """A planned decode call (see the module doc). Build with :func:`plan_decode`."""

    def __init__(self, batch: int, nheads: int, nheads_k: int, headdim: int, headdim_v: int,
                 seqlen_q: int, max_seqlen_k: int, page_size: Optional[int],
                 dtype: torch.dtype, device: torch.device, params: AttnParams,
                 num_splits: int, kv_dtype: Optional[torch.dtype] = None,
                 has_qv: bool = False) -> None:
        self.batch, self.nheads, self.nheads_k = batch, nheads, nheads_k
        self.has_qv = has_qv
        self.headdim, self.headdim_v, self.seqlen_q = headdim, headdim_v, seqlen_q
        self.max_seqlen_k, self.page_size = max_seqlen_k, page_size
        self.dtype, self.device, self.params = dtype, device, params
        self.kv_dtype = dtype if kv_dtype is None else kv_dtype
        self.num_splits = num_splits
        self._q_shape = (batch, seqlen_q, nheads, headdim)
        self._buffers: dict = {}  # outputs and split workspaces (the backend fills it)
        # FP8: the descale a None stands for (FlashAttention-3: 1.0), made here, outside any
        # graph capture, and reused by every run
        self._ones = None
        if self.kv_dtype == torch.float8_e4m3fn:
            self._ones = torch.ones((batch, nheads_k), dtype=torch.float32, device=device)

    def __repr__(self) -> str:
        paged = f", page_size={self.page_size}" if self.page_size else ""
        kv = f", kv_dtype={self.kv_dtype}" if self.kv_dtype != self.dtype else ""
        dv = f", headdim_v={self.headdim_v}" if self.headdim_v != self.headdim else ""
        qv = ", has_qv=True" if self.has_qv else ""
        return (f"DecodePlan(batch={self.batch}, nheads={self.nheads}, nheads_k={self.nheads_k}"
                f", headdim={self.headdim}{dv}, seqlen_q={self.seqlen_q}, max_seqlen_k="
                f"{self.max_seqlen_k}{paged}, dtype={self.dtype}{kv}{qv}, device={self.device})")

    def _check(self, q: Tensor, k_cache: Tensor, v_cache: Tensor, cache_seqlens: Tensor,
               block_table: Optional[Tensor]) -> None:
        if not isinstance(q, Tensor) or tuple(q.shape) != self._q_shape:
            raise ValueError(f"q must have the planned shape {self._q_shape}, got "
                             f"{_v._describe(q)}")
        for x, n, dtype in ((q, "q", self.dtype), (k_cache, "k_cache", self.kv_dtype),
                            (v_cache, "v_cache", self.kv_dtype)):
            if not isinstance(x, Tensor) or x.dtype != dtype or x.device != self.device:
                raise ValueError(f"{n} must be a {dtype} tensor on {self.device} (the "
                                 f"plan's), got {_v._describe(x)}")
            if x.shape[-1] > 1 and x.stride(-1) != 1:
                raise ValueError(f"{n} must have a contiguous last dimension")
        paged = self.page_size is not None
        if (block_table is not None) != paged:
            raise ValueError("block_table must be given exactly when the plan has a page_size "
                             f"(plan: page_size={self.page_size})")
        if k_cache.dim() != 4 or v_cache.dim() != 4 or k_cache.shape[2] != self.nheads_k \
                or k_cache.shape[3] != self.headdim or v_cache.shape[3] != self.headdim_v \
                or v_cache.shape[:3] != k_cache.shape[:3]:
            raise ValueError(f"k_cache / v_cache must be (rows, positions, {self.nheads_k}, "
                             f"{self.headdim} / {self.headdim_v}), got {tuple(k_cache.shape)} / "
                             f"{tuple(v_cache.shape)}")
        if paged:
            if k_cache.shape[1] != self.page_size:
                raise ValueError(f"k_cache has pages of {k_cache.shape[1]} positions, the plan "
                                 f"{self.page_size}")
            if not isinstance(block_table, Tensor) or block_table.dtype != torch.int32 \
                    or block_table.dim() != 2 or block_table.shape[0] != self.batch \
                    or block_table.device != self.device \
                    or block_table.shape[1] * self.page_size != self.max_seqlen_k:
                raise ValueError(
                    f"block_table must be int32 ({self.batch}, {self.max_seqlen_k // self.page_size})"
                    f" on {self.device} (max_seqlen_k / page_size columns), got "
                    f"{_v._describe(block_table)}")
        elif k_cache.shape[1] != self.max_seqlen_k or k_cache.shape[0] < self.batch:
            raise ValueError(f"k_cache must have {self.max_seqlen_k} positions (the plan's "
                             f"max_seqlen_k) and >= {self.batch} rows, got {tuple(k_cache.shape)}")
        if not isinstance(cache_seqlens, Tensor) or cache_seqlens.dtype != torch.int32 \
                or tuple(cache_seqlens.shape) != (self.batch,) \
                or cache_seqlens.device != self.device:
            raise ValueError(f"cache_seqlens must be an int32 ({self.batch},) tensor on "
                             f"{self.device} (a tensor: a captured graph reads its new values), "
                             f"got {_v._describe(cache_seqlens)}")

    def _latent(self, qv: Optional[Tensor]) -> dict:
        """The backends' qv keyword of a run: {} without, {"qv": qv} for a plan with qv."""
        if not self.has_qv:
            if qv is not None:
                raise ValueError("qv was given but the plan has none: plan with has_qv=True")
            return {}
        want = (self.batch, self.seqlen_q, self.nheads, self.headdim_v)
        if not isinstance(qv, Tensor) or tuple(qv.shape) != want or qv.dtype != self.dtype \
                or qv.device != self.device:
            raise ValueError(f"qv must be a {self.dtype} tensor of shape {want} on "
                             f"{self.device} (the plan has has_qv=True), got {_v._describe(qv)}")
        if qv.stride(-1) != 1:
            raise ValueError("qv must have a contiguous last dimension")
        return dict(qv=qv)

    def _descales(self, q: Tensor, k_cache: Tensor, q_descale: Optional[Tensor],
                  k_descale: Optional[Tensor], v_descale: Optional[Tensor]) -> dict:
        """The backends' FP8 keywords of a run (None -> the plan's ones); {} without FP8."""
        _kv.check_descales(k_descale, v_descale, k_cache, self.batch, q_descale, q)
        if self._ones is None:
            return {}
        one = lambda x: self._ones if x is None else x  # noqa: E731
        fp8 = dict(k_descale=one(k_descale), v_descale=one(v_descale))
        if self.dtype == torch.float8_e4m3fn:
            fp8["q_descale"] = one(q_descale)
        return fp8

    def run(self, q: Tensor, k_cache: Tensor, v_cache: Tensor, cache_seqlens: Tensor,
            block_table: Optional[Tensor] = None, return_softmax_lse: bool = False, *,
            q_descale: Optional[Tensor] = None, k_descale: Optional[Tensor] = None,
            v_descale: Optional[Tensor] = None, qv: Optional[Tensor] = None
            ) -> "Tensor | Tuple[Tensor, Tensor]":
        """Attention of q over the first ``cache_seqlens[b]`` keys of each cache row (bottom-
        right aligned, as ``flash_attn_with_kvcache`` without new keys).

        q: (batch, seqlen_q, nheads, headdim) in the plan's dtype; k_cache / v_cache: (>=
        batch, max_seqlen_k, nheads_k, headdim / headdim_v), or paged (num_blocks, page_size,
        nheads_k, ...) with block_table int32 (batch, max_seqlen_k / page_size), in the plan's
        kv_dtype; cache_seqlens int32 (batch,). FP8 (keyword only, FlashAttention-3's):
        k_descale / v_descale float32 (batch, nheads_k) with float8_e4m3fn caches, q_descale
        with a float8_e4m3fn q (real value = fp8 * descale; None = 1.0). qv (keyword only, a
        plan with has_qv): the latent query (batch, seqlen_q, nheads, headdim_v) in q's dtype.
        Returns out (batch, seqlen_q, nheads, headdim_v) in q's dtype (bfloat16 for an FP8
        q) (and lse float32 (batch, nheads, seqlen_q)): the plan's buffers, overwritten by the
        next run.
        """
        self._check(q, k_cache, v_cache, cache_seqlens, block_table)
        fp8 = self._descales(q, k_cache, q_descale, k_descale, v_descale)
        latent = self._latent(qv)
        out, lse = _replay_kvcache.kvcache_planned(q, k_cache, v_cache, cache_seqlens,
                                                   block_table, self.params, self.num_splits,
                                                   self.max_seqlen_k, self._buffers,
                                                   **fp8, **latent)
        return (out, lse) if return_softmax_lse else out


def plan_decode(batch: int, nheads: int, nheads_k: int, headdim: int, *,
                max_seqlen_k: int, headdim_v: Optional[int] = None, seqlen_q: int = 1,
                page_size: Optional[int] = None, dtype: torch.dtype = torch.bfloat16,
                kv_dtype: Optional[torch.dtype] = None,
                device: "torch.device | str | None" = None,
                softmax_scale: Optional[float] = None, causal: bool = True,
                window_size: Tuple[int, int] = (-1, -1), softcap: float = 0.0,
                num_splits: int = 0, has_qv: bool = False) -> DecodePlan:
    """Plan decode steps of one shape (see the module doc).

    Arguments:
        batch, nheads, nheads_k, headdim: the call's shapes (nheads % nheads_k == 0).
        max_seqlen_k: the cache capacity per sequence (contiguous cache: its length; paged:
            block_table columns x page_size). It sizes the split-KV decision, which the plan
            fixes: later calls may have any cache_seqlens up to it.
        headdim_v: V's head dim (default headdim; up to 512, as flash_attn_with_kvcache).
            seqlen_q: query rows per step (1 for decode, up to 16 for speculative
            verification).
        page_size: None for a contiguous cache, else the paged cache's page size.
        dtype, device: of q and the caches (float16 / bfloat16 / float32, or float8_e4m3fn:
            FlashAttention-3's FP8 query, with FP8 caches; default device the current CUDA
            device, else CPU).
        kv_dtype: the caches' dtype when it is not q's: float8_e4m3fn (an FP8 KV cache with
            its descales, see the module doc). Default: dtype.
        softmax_scale, causal, window_size, softcap: as flash_attn_with_kvcache.
        num_splits: 0 = the heuristic (from max_seqlen_k), else the number of key splits.
        has_qv: each run takes FlashAttention-3's latent query ``qv`` (multi-head latent
            attention: scores ``softmax_scale * (q . k + qv . v)``; default softmax_scale then
            ``(headdim + headdim_v) ** -0.5``). Not with an FP8 query.
    """
    batch = _positive_int(batch, "batch")
    nheads, nheads_k = _positive_int(nheads, "nheads"), _positive_int(nheads_k, "nheads_k")
    if nheads % nheads_k:
        raise ValueError(f"nheads ({nheads}) must be a multiple of nheads_k ({nheads_k})")
    headdim = _positive_int(headdim, "headdim")
    headdim_v = headdim if headdim_v is None else _positive_int(headdim_v, "headdim_v")
    for d, n, most in ((headdim, "headdim", _v.MAX_HEAD_DIM),
                       (headdim_v, "headdim_v", _v.MAX_HEAD_DIM_V)):
        if d > most:
            raise ValueError(f"{n} must be in 1..{most}, got {d}")
    seqlen_q = _positive_int(seqlen_q, "seqlen_q")
    max_seqlen_k = _positive_int(max_seqlen_k, "max_seqlen_k")
    if page_size is not None:
        page_size = _positive_int(page_size, "page_size")
        if max_seqlen_k % page_size:
            raise ValueError(f"max_seqlen_k ({max_seqlen_k}) must be a multiple of page_size "
                             f"({page_size}): the block table's columns x page_size")
    fp8 = torch.float8_e4m3fn
    if dtype not in _v.SUPPORTED_DTYPES + (fp8,):
        raise TypeError(f"dtype must be one of {_v.SUPPORTED_DTYPES + (fp8,)}, got {dtype!r}")
    kv_dtype = dtype if kv_dtype is None else kv_dtype
    if dtype == fp8 and kv_dtype != fp8:
        raise TypeError(f"dtype={dtype} (an FP8 query) needs kv_dtype=torch.float8_e4m3fn "
                        f"(FlashAttention-3 takes q, k and v in one dtype), got {kv_dtype!r}")
    if kv_dtype != dtype and kv_dtype != fp8:
        raise TypeError(f"kv_dtype must be None, dtype ({dtype}) or torch.float8_e4m3fn (an FP8 "
                        f"KV cache), got {kv_dtype!r}")
    if device is None:
        device = torch.device("cuda", torch.cuda.current_device()) if torch.cuda.is_available() \
            else torch.device("cpu")
    device = torch.device(device)
    if device.type == "cuda" and device.index is None:
        device = torch.device("cuda", torch.cuda.current_device())
    num_splits = _positive_int(num_splits, "num_splits", allow_zero=True)
    if not isinstance(has_qv, bool):
        raise TypeError(f"has_qv must be a bool, got {has_qv!r}")
    if has_qv and dtype == fp8:
        raise NotImplementedError(
            "has_qv (multi-head latent attention) with dtype=torch.float8_e4m3fn is not "
            "supported: plan q and qv in bfloat16 / float16 (kv_dtype may stay float8_e4m3fn)")
    # FlashAttention-3: with qv the score sums headdim + headdim_v products, so does the scale
    scale = _p.softmax_scale_or_default(_v.check_softmax_scale(softmax_scale),
                                        headdim + headdim_v if has_qv else headdim)
    causal = _v.check_causal(causal)
    left, right = _v.check_window_size(window_size)
    softcap = _v.check_softcap(softcap)
    left, right = _p.window(left, right, causal, max_seqlen_k)
    params = AttnParams(scale, causal, left, right, softcap, None, 0.0, 0)
    return DecodePlan(batch, nheads, nheads_k, headdim, headdim_v, seqlen_q, max_seqlen_k,
                      page_size, dtype, device, params, num_splits, kv_dtype, has_qv)


__all__ = ["DecodePlan", "plan_decode"]
