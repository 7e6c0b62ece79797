"""Argument checks for the public API.

Every check raises ``TypeError`` (wrong kind of object) or ``ValueError`` (right kind, wrong
value) with a message that names the argument, says what was given and what is allowed. The
checks only read tensor metadata (shape, dtype, device, strides): they never touch data, so
they never synchronise a device.

Argument names in messages are the public ones, so the packed entry points pass their own
names (``qkv``, ``kv``) and the message points at what the caller actually wrote.
"""
from __future__ import annotations

import math
import numbers
from typing import Any, Optional, Sequence, Tuple

import torch

SUPPORTED_DTYPES: Tuple[torch.dtype, ...] = (torch.float16, torch.bfloat16, torch.float32)
MAX_HEAD_DIM = 256
# V's head dim in a forward: the split-KV decode kernel (KV-cache calls) and the portable
# forward keep a (rows x d_v) fp32 accumulator and stream (keys x d_v) V tiles, sized for d_v
# up to 512 (multi-head latent attention's latent width, FlashAttention-3's hdimv 512). The
# backward kernels stop at MAX_HEAD_DIM: a call that records a gradient goes by V's column
# slices (api/wide_v.py).
MAX_HEAD_DIM_V = 512

_DTYPE_NAMES = "torch.float16, torch.bfloat16 or torch.float32"


def _describe(x: Any) -> str:
    """Short description of a value for an error message (never prints tensor data)."""
    if isinstance(x, torch.Tensor):
        return f"a {x.dtype} tensor of shape {tuple(x.shape)} on {x.device}"
    r = repr(x)
    if len(r) > 80:
        r = r[:77] + "..."
    return f"{r} (type {type(x).__name__})"


def check_tensor(x: Any, name: str, ndim: int, layout: str) -> None:
    """``x`` must be a tensor of rank ``ndim``; ``layout`` names the dims, e.g. ``(b, s, h, d)``."""
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor of shape {layout}, got {_describe(x)}")
    if x.dim() != ndim:
        raise ValueError(
            f"{name} must be a {ndim}-d tensor of shape {layout}, got {x.dim()}-d tensor of "
            f"shape {tuple(x.shape)}"
        )


def _check_dtype(x: torch.Tensor, name: str) -> None:
    if x.dtype not in SUPPORTED_DTYPES:
        raise TypeError(f"{name} has dtype {x.dtype}; supported dtypes are {_DTYPE_NAMES}")


def _check_last_dim_contiguous(x: torch.Tensor, name: str) -> None:
    # A size-1 last dim has a meaningless stride; anything else must be unit-stride so the
    # kernels can load whole head vectors.
    if x.shape[-1] > 1 and x.stride(-1) != 1:
        raise ValueError(
            f"{name} must have a contiguous last dimension (stride 1), got strides "
            f"{tuple(x.stride())}; call .contiguous() first"
        )


def _check_head_dim(d: int, name: str, what: str, limit: int = MAX_HEAD_DIM) -> None:
    if not 1 <= d <= limit:
        raise ValueError(f"{name} has {what} {d}; supported range is 1..{limit}")


def check_qkv(
    q: Any,
    k: Any,
    v: Any,
    names: Tuple[str, str, str] = ("q", "k", "v"),
    max_head_dim_v: int = MAX_HEAD_DIM,
) -> None:
    """Check q (b, s_q, h, d_qk), k (b, s_k, h_k, d_qk), v (b, s_k, h_k, d_v).

    Same dtype (fp16/bf16/fp32) and device for all three, h % h_k == 0, head dims in
    1..256 (d_v in 1..``max_head_dim_v``: forwards take up to MAX_HEAD_DIM_V), last-dim
    stride 1.
    b = 0 (and empty sequences) are allowed.
    """
    qn, kn, vn = names
    check_tensor(q, qn, 4, "(batch, seqlen_q, nheads, headdim)")
    check_tensor(k, kn, 4, "(batch, seqlen_k, nheads_k, headdim)")
    check_tensor(v, vn, 4, "(batch, seqlen_k, nheads_k, headdim_v)")

    for x, n in ((q, qn), (k, kn), (v, vn)):
        _check_dtype(x, n)
    if not (q.dtype == k.dtype == v.dtype):
        raise TypeError(
            f"{qn}, {kn}, {vn} must have the same dtype, got {qn} {q.dtype}, {kn} {k.dtype}, "
            f"{vn} {v.dtype}"
        )
    if not (q.device == k.device == v.device):
        raise ValueError(
            f"{qn}, {kn}, {vn} must be on the same device, got {qn} on {q.device}, "
            f"{kn} on {k.device}, {vn} on {v.device}"
        )

    b, s_q, h, d_qk = q.shape
    b_k, s_k, h_k, d_k = k.shape
    b_v, s_v, h_v, d_v = v.shape
    if b_k != b or b_v != b:
        raise ValueError(
            f"batch size mismatch: {qn} has batch {b}, {kn} has {b_k}, {vn} has {b_v} "
            f"(shapes {qn} {tuple(q.shape)}, {kn} {tuple(k.shape)}, {vn} {tuple(v.shape)})"
        )
    if s_v != s_k:
        raise ValueError(
            f"seqlen_k mismatch: {kn} has seqlen {s_k} but {vn} has seqlen {s_v} "
            f"(shapes {kn} {tuple(k.shape)}, {vn} {tuple(v.shape)}); they must be equal"
        )
    if h_v != h_k:
        raise ValueError(
            f"nheads_k mismatch: {kn} has {h_k} heads but {vn} has {h_v} "
            f"(shapes {kn} {tuple(k.shape)}, {vn} {tuple(v.shape)}); they must be equal"
        )
    if d_k != d_qk:
        raise ValueError(
            f"head dim mismatch: {qn} has headdim {d_qk} but {kn} has {d_k} "
            f"(shapes {qn} {tuple(q.shape)}, {kn} {tuple(k.shape)}); they must be equal"
        )
    if h < 1 or h_k < 1:
        raise ValueError(
            f"nheads must be >= 1, got {qn} with {h} heads and {kn} with {h_k} heads"
        )
    if h % h_k != 0:
        raise ValueError(
            f"nheads of {qn} ({h}) must be a multiple of nheads_k of {kn} ({h_k}) "
            f"for GQA/MQA; got {h} % {h_k} = {h % h_k}"
        )
    _check_head_dim(d_qk, qn, "headdim")
    _check_head_dim(d_v, vn, "headdim_v", max_head_dim_v)
    for x, n in ((q, qn), (k, kn), (v, vn)):
        _check_last_dim_contiguous(x, n)


def check_qkvpacked(qkv: Any, name: str = "qkv") -> None:
    """qkv must be (b, s, 3, h, d); the unbound q, k, v are then checked by :func:`check_qkv`."""
    check_tensor(qkv, name, 5, "(batch, seqlen, 3, nheads, headdim)")
    if qkv.shape[2] != 3:
        raise ValueError(
            f"{name} must have shape (batch, seqlen, 3, nheads, headdim) with size 3 in dim 2, "
            f"got shape {tuple(qkv.shape)}"
        )


def check_kvpacked(kv: Any, name: str = "kv") -> None:
    """kv must be (b, s_k, 2, h_k, d)."""
    check_tensor(kv, name, 5, "(batch, seqlen_k, 2, nheads_k, headdim)")
    if kv.shape[2] != 2:
        raise ValueError(
            f"{name} must have shape (batch, seqlen_k, 2, nheads_k, headdim) with size 2 in "
            f"dim 2, got shape {tuple(kv.shape)}"
        )


def _is_real(x: Any) -> bool:
    t = type(x)
    if t is float or t is int:  # the common case, without the ABC machinery (~0.5 us)
        return True
    return isinstance(x, numbers.Real) and not isinstance(x, bool)


def check_dropout_p(dropout_p: Any) -> float:
    """dropout_p must be a real number in [0, 1); returns it as float."""
    if not _is_real(dropout_p):
        raise TypeError(f"dropout_p must be a float in [0, 1), got {_describe(dropout_p)}")
    p = float(dropout_p)
    if not (0.0 <= p < 1.0):  # also rejects NaN
        raise ValueError(f"dropout_p must be in [0, 1), got {dropout_p!r}")
    return p


def check_softmax_scale(softmax_scale: Any) -> Optional[float]:
    """softmax_scale must be None or a finite positive real; returns it as float (or None)."""
    if softmax_scale is None:
        return None
    if not _is_real(softmax_scale):
        raise TypeError(
            f"softmax_scale must be None or a finite positive float, got {_describe(softmax_scale)}"
        )
    s = float(softmax_scale)
    if not (math.isfinite(s) and s > 0.0):
        raise ValueError(
            f"softmax_scale must be None or a finite positive float, got {softmax_scale!r}"
        )
    return s


def check_softcap(softcap: Any) -> float:
    """softcap must be a finite real >= 0 (0 disables it); returns it as float."""
    if not _is_real(softcap):
        raise TypeError(f"softcap must be a float >= 0 (0.0 = off), got {_describe(softcap)}")
    c = float(softcap)
    if not (math.isfinite(c) and c >= 0.0):
        raise ValueError(f"softcap must be a finite float >= 0 (0.0 = off), got {softcap!r}")
    return c


def _is_int_array(x: Any) -> bool:
    """A torch tensor or numpy array of an integer dtype (bool excluded)."""
    if isinstance(x, torch.Tensor):
        return not x.dtype.is_floating_point and not x.dtype.is_complex and x.dtype != torch.bool
    dtype = getattr(x, "dtype", None)
    return type(x).__module__ == "numpy" and getattr(dtype, "kind", "") in ("i", "u")


def check_window_size(window_size: Any) -> Tuple[int, int]:
    """window_size must be two ints >= -1 (-1 = unbounded): a tuple / list of ints (Python,
    numpy or 0-d integer tensors), or a 2-element integer tensor / numpy array; returns a
    tuple of Python ints."""
    if type(window_size) is tuple and len(window_size) == 2:  # the common case, fast
        left, right = window_size
        if type(left) is int and type(right) is int and left >= -1 and right >= -1:
            return left, right
    # flash-attn's own tests pass torch.randint(...) results: a 2-element integer tensor (or
    # numpy array), or a pair of 0-d ones; read them as host ints (a CUDA tensor costs a sync)
    if _is_int_array(window_size) and window_size.ndim == 1:
        window_size = tuple(window_size.tolist())
    if not isinstance(window_size, (tuple, list)) or len(window_size) != 2:
        raise TypeError(
            "window_size must be a tuple or list of two ints (left, right), -1 = unbounded, "
            f"got {_describe(window_size)}"
        )
    window_size = tuple(w.item() if _is_int_array(w) and w.ndim == 0 else w
                        for w in window_size)
    out = []
    for side, w in zip(("left", "right"), window_size):
        if isinstance(w, bool) or not isinstance(w, numbers.Integral):
            raise TypeError(
                f"window_size[{0 if side == 'left' else 1}] ({side}) must be an int >= -1, "
                f"got {_describe(w)} in window_size={window_size!r}"
            )
        if int(w) < -1:
            raise ValueError(
                f"window_size ({side}) must be >= -1 (-1 = unbounded), got {int(w)} in "
                f"window_size={window_size!r}"
            )
        out.append(int(w))
    return out[0], out[1]


def check_attention_chunk(attention_chunk: Any) -> int:
    """attention_chunk (FlashAttention-3's chunked local attention): an int >= 0, 0 = off."""
    if _is_int_array(attention_chunk) and attention_chunk.ndim == 0:
        attention_chunk = attention_chunk.item()
    if isinstance(attention_chunk, bool) or not isinstance(attention_chunk, numbers.Integral) \
            or attention_chunk < 0:
        raise ValueError("attention_chunk must be an int >= 0 (0 = off: the chunk of key "
                         f"positions each query sees), got {_describe(attention_chunk)}")
    return int(attention_chunk)


def check_causal(causal: Any) -> bool:
    """causal must be a bool (numpy bools and 0/1 ints are accepted)."""
    return check_bool(causal, "causal")


def check_alibi_slopes(
    alibi_slopes: Any, batch: int, nheads: int, device: torch.device
) -> None:
    """alibi_slopes must be None or a float32 tensor of shape (nheads,) or (batch, nheads)
    on the device of q."""
    if alibi_slopes is None:
        return
    allowed = f"({nheads},) or ({batch}, {nheads})"
    if not isinstance(alibi_slopes, torch.Tensor):
        raise TypeError(
            f"alibi_slopes must be None or a torch.float32 tensor of shape {allowed}, got "
            f"{_describe(alibi_slopes)}"
        )
    shape = tuple(alibi_slopes.shape)
    if shape not in ((nheads,), (batch, nheads)):
        raise ValueError(
            f"alibi_slopes must have shape (nheads,) or (batch, nheads) = {allowed}, got {shape}"
        )
    if alibi_slopes.dtype != torch.float32:
        raise TypeError(f"alibi_slopes must have dtype torch.float32, got {alibi_slopes.dtype}")
    if alibi_slopes.device != device:
        raise ValueError(
            f"alibi_slopes must be on the same device as q ({device}), got {alibi_slopes.device}"
        )


def check_bool(x: Any, name: str) -> bool:
    """A plain flag (deterministic, return_attn_probs)."""
    if isinstance(x, bool):
        return x
    try:
        import numpy as np

        if isinstance(x, np.bool_):
            return bool(x)
    except ImportError:  # pragma: no cover
        pass
    if isinstance(x, numbers.Integral) and int(x) in (0, 1):
        return bool(x)
    raise TypeError(f"{name} must be a bool, got {_describe(x)}")


def check_options(softmax_scale: Any, causal: Any, window_size: Any, softcap: Any,
                  deterministic: Any) -> Tuple[Optional[float], bool, int, int, float, bool]:
    """The options every attention call takes, checked in one place: (softmax_scale or None,
    causal, window_left, window_right, softcap, deterministic)."""
    scale = check_softmax_scale(softmax_scale)
    causal = check_causal(causal)
    window_left, window_right = check_window_size(window_size)
    return (scale, causal, window_left, window_right, check_softcap(softcap),
            check_bool(deterministic, "deterministic"))


# ---------------------------------------------------------------------------------------------
# Variable-length (packed) sequences
# ---------------------------------------------------------------------------------------------
def check_varlen_qkv(
    q: Any,
    k: Any,
    v: Any,
    names: Tuple[str, str, str] = ("q", "k", "v"),
    max_head_dim_v: int = MAX_HEAD_DIM,
) -> None:
    """Check packed q (total_q, h, d_qk), k (total_k, h_k, d_qk), v (total_k, h_k, d_v).

    Same rules as :func:`check_qkv` (dtype, device, GQA, head dims, unit last stride) on the
    3-d packed layout; total_q / total_k = 0 are allowed.
    """
    qn, kn, vn = names
    check_tensor(q, qn, 3, "(total_q, nheads, headdim)")
    check_tensor(k, kn, 3, "(total_k, nheads_k, headdim)")
    check_tensor(v, vn, 3, "(total_k, nheads_k, headdim_v)")
    for x, n in ((q, qn), (k, kn), (v, vn)):
        _check_last_dim_contiguous(x, n)
    # The remaining rules are the dense ones on a (1, total, h, d) view: same messages.
    if k.shape[0] != v.shape[0]:
        raise ValueError(
            f"total_k mismatch: {kn} has {k.shape[0]} rows but {vn} has {v.shape[0]} "
            f"(shapes {kn} {tuple(k.shape)}, {vn} {tuple(v.shape)}); they must be equal"
        )
    check_qkv(q.unsqueeze(0), k.unsqueeze(0), v.unsqueeze(0), names, max_head_dim_v)


def check_paged_qkv(q: Any, k_cache: Any, v_cache: Any,
                    names: Tuple[str, str, str] = ("q", "k", "v")) -> None:
    """Check packed q (total_q, h, d) with paged k/v caches (num_blocks, page_size, h_k, d)."""
    qn, kn, vn = names
    check_tensor(q, qn, 3, "(total_q, nheads, headdim)")
    check_tensor(k_cache, kn, 4, "(num_blocks, page_size, nheads_k, headdim) with block_table")
    check_tensor(v_cache, vn, 4, "(num_blocks, page_size, nheads_k, headdim_v) with block_table")
    if k_cache.shape[0] != v_cache.shape[0]:
        raise ValueError(
            f"num_blocks mismatch: {kn} has {k_cache.shape[0]} blocks but {vn} has "
            f"{v_cache.shape[0]}; they must be equal"
        )
    if k_cache.shape[1] != v_cache.shape[1]:
        raise ValueError(
            f"page_size mismatch: {kn} has pages of {k_cache.shape[1]} rows but {vn} has "
            f"{v_cache.shape[1]}; they must be equal"
        )
    for x, n in ((q, qn), (k_cache, kn), (v_cache, vn)):
        _check_last_dim_contiguous(x, n)
    # The dense rules (dtype, device, GQA, head dims) on q against one page of the caches
    # (a view, never a copy of the cache).
    check_qkv(q.unsqueeze(0), k_cache[:1].flatten(0, 1).unsqueeze(0),
              v_cache[:1].flatten(0, 1).unsqueeze(0), names)


def _check_int32_vector(x: Any, name: str, length: int, what: str, device: torch.device) -> None:
    if not isinstance(x, torch.Tensor):
        raise TypeError(
            f"{name} must be a torch.int32 tensor of shape ({what},), got {_describe(x)}")
    if x.dtype != torch.int32:
        raise TypeError(f"{name} must have dtype torch.int32, got {x.dtype}")
    if x.dim() != 1 or x.shape[0] != length:
        raise ValueError(f"{name} must have shape ({what},) = ({length},), got {tuple(x.shape)}")
    if x.device != device:
        raise ValueError(f"{name} must be on the same device as q ({device}), got {x.device}")


def check_cu_seqlens(cu_seqlens_q: Any, cu_seqlens_k: Any, device: torch.device,
                     names: Tuple[str, str] = ("cu_seqlens_q", "cu_seqlens_k")) -> int:
    """cu_seqlens_q / cu_seqlens_k: int32 (batch + 1,) tensors on q's device; returns batch."""
    qn, kn = names
    for x, n in ((cu_seqlens_q, qn), (cu_seqlens_k, kn)):
        if not isinstance(x, torch.Tensor):
            raise TypeError(
                f"{n} must be a torch.int32 tensor of shape (batch + 1,), got {_describe(x)}")
        if x.dtype != torch.int32:
            raise TypeError(f"{n} must have dtype torch.int32, got {x.dtype}")
        if x.dim() != 1 or x.shape[0] < 1:
            raise ValueError(f"{n} must have shape (batch + 1,) with batch >= 0, got "
                             f"{tuple(x.shape)}")
    if cu_seqlens_k.shape[0] != cu_seqlens_q.shape[0]:
        raise ValueError(
            f"{qn} and {kn} must have the same shape (batch + 1,), got {tuple(cu_seqlens_q.shape)} "
            f"and {tuple(cu_seqlens_k.shape)}")
    for x, n in ((cu_seqlens_q, qn), (cu_seqlens_k, kn)):
        if x.device != device:
            raise ValueError(f"{n} must be on the same device as q ({device}), got {x.device}")
    return cu_seqlens_q.shape[0] - 1


def check_max_seqlen(max_seqlen: Any, name: str) -> int:
    """max_seqlen_q / max_seqlen_k: a Python (or numpy) int >= 0; returns it as int. 0 is a
    batch whose sequences are all empty (flash-attn returns zeros then).

    A tensor is refused: reading a device tensor's value would synchronise the device.
    """
    if isinstance(max_seqlen, bool) or not isinstance(max_seqlen, numbers.Integral):
        raise TypeError(f"{name} must be an int >= 0 (the longest sequence's length), got "
                        f"{_describe(max_seqlen)}")
    if int(max_seqlen) < 0:
        raise ValueError(f"{name} must be an int >= 0 (the longest sequence's length), got "
                         f"{int(max_seqlen)}")
    return int(max_seqlen)


def check_seqused_k(seqused_k: Any, batch: int, device: torch.device,
                    name: str = "seqused_k") -> None:
    """seqused_k (or seqused_q, by ``name``): None or an int32 (batch,) tensor on q's device."""
    if seqused_k is not None:
        _check_int32_vector(seqused_k, name, batch, "batch", device)


def check_block_table(block_table: Any, batch: int, device: torch.device) -> None:
    """block_table: int32 (batch, max_blocks_per_seq) tensor on q's device."""
    allowed = f"({batch}, max_blocks_per_seq)"
    if not isinstance(block_table, torch.Tensor):
        raise TypeError(f"block_table must be None or a torch.int32 tensor of shape {allowed}, "
                        f"got {_describe(block_table)}")
    if block_table.dtype != torch.int32:
        raise TypeError(f"block_table must have dtype torch.int32, got {block_table.dtype}")
    if block_table.dim() != 2 or block_table.shape[0] != batch or block_table.shape[1] < 1:
        raise ValueError(f"block_table must have shape (batch, max_blocks_per_seq) = {allowed} "
                         f"with max_blocks_per_seq >= 1, got {tuple(block_table.shape)}")
    if block_table.device != device:
        raise ValueError(
            f"block_table must be on the same device as q ({device}), got {block_table.device}")


def check_varlen_values(cu_seqlens_q: torch.Tensor, cu_seqlens_k: torch.Tensor,
                        seqused_k: Optional[torch.Tensor], max_seqlen_q: int, max_seqlen_k: int,
                        total_q: int, total_k: Optional[int]) -> None:
    """Value checks of the sequence lengths, for CPU tensors only (reading them is free there;
    on a GPU it would synchronise, so the kernels trust them, as flash-attn does).

    cu_seqlens non-decreasing, >= 0, last entry <= total rows; every length <= max_seqlen;
    seqused_k[b] in [0, cu_seqlens_k[b+1] - cu_seqlens_k[b]]. ``total_k`` None (paged KV)
    skips the key bounds, which the block table defines.
    """
    if cu_seqlens_q.device.type != "cpu" or torch.compiler.is_compiling():
        # (a torch.compile trace has no values to read: the check runs in eager calls)
        return
    checks = [(cu_seqlens_q, "cu_seqlens_q", total_q, max_seqlen_q, "max_seqlen_q", "q")]
    if total_k is not None:
        checks.append((cu_seqlens_k, "cu_seqlens_k", total_k, max_seqlen_k, "max_seqlen_k", "k"))
    for cu, name, total, max_len, max_name, tname in checks:
        c = cu.tolist()
        if c and c[0] < 0:
            raise ValueError(f"{name} must start at a value >= 0, got {name}[0] = {c[0]}")
        lens = [b - a for a, b in zip(c, c[1:])]
        if any(n < 0 for n in lens):
            i = next(i for i, n in enumerate(lens) if n < 0)
            raise ValueError(f"{name} must be non-decreasing, got {name}[{i}] = {c[i]} > "
                             f"{name}[{i + 1}] = {c[i + 1]}")
        if c and c[-1] > total:
            raise ValueError(f"{name}[-1] = {c[-1]} exceeds the {total} rows of {tname}")
        longest = max(lens, default=0)
        if seqused_k is None or tname == "q":
            if longest > max_len:
                raise ValueError(f"{max_name} = {max_len} is smaller than the longest sequence "
                                 f"in {name} ({longest})")
    if seqused_k is not None:
        used = seqused_k.tolist()
        if total_k is not None:
            c = cu_seqlens_k.tolist()
            room = [b - a for a, b in zip(c, c[1:])]
        else:
            room = [None] * len(used)
        for i, (u, r) in enumerate(zip(used, room)):
            if u < 0 or (r is not None and u > r):
                raise ValueError(
                    f"seqused_k[{i}] = {u} must be in [0, {r if r is not None else 'inf'}] "
                    f"(the keys cu_seqlens_k gives sequence {i})")
            if u > max_seqlen_k:
                raise ValueError(f"max_seqlen_k = {max_seqlen_k} is smaller than seqused_k[{i}] "
                                 f"= {u}")


__all__: Sequence[str] = (
    "SUPPORTED_DTYPES",
    "MAX_HEAD_DIM",
    "MAX_HEAD_DIM_V",
    "check_tensor",
    "check_qkv",
    "check_qkvpacked",
    "check_kvpacked",
    "check_dropout_p",
    "check_softmax_scale",
    "check_options",
    "check_softcap",
    "check_window_size",
    "check_causal",
    "check_alibi_slopes",
    "check_bool",
    "check_varlen_qkv",
    "check_paged_qkv",
    "check_cu_seqlens",
    "check_max_seqlen",
    "check_seqused_k",
    "check_block_table",
    "check_varlen_values",
)


def check_learnable_sink(sink: Any, nheads: int, device: torch.device,
                         dropout_p: float = 0.0) -> None:
    """None, or a floating (nheads,) tensor on the inputs' device (one sink logit per head,
    gpt-oss's ``sinks``); not with dropout (the sink's probability would be dropped too)."""
    if sink is None:
        return
    if not isinstance(sink, torch.Tensor):
        raise TypeError(f"learnable_sink must be a float tensor of shape (nheads,) = ({nheads},) "
                        f"or None, got {_describe(sink)}")
    if not sink.is_floating_point() or sink.dtype in (torch.float8_e4m3fn, torch.float8_e5m2):
        raise TypeError(f"learnable_sink must be a float16 / bfloat16 / float32 tensor, got "
                        f"{sink.dtype}")
    if tuple(sink.shape) != (nheads,):
        raise ValueError(f"learnable_sink must have shape (nheads,) = ({nheads},), got "
                         f"{tuple(sink.shape)}")
    if sink.device != device:
        raise ValueError(f"learnable_sink must be on the inputs' device {device}, got "
                         f"{sink.device}")
    if dropout_p > 0.0:
        raise ValueError("dropout_p must be 0.0 with learnable_sink")
