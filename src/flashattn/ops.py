"""torch.library ops: the attention kernels as opaque custom ops, so torch.compile traces through.

Registered ops (namespace ``flashattn``; call them as ``torch.ops.flashattn.<name>``)::

    fwd(q, k, v, alibi_slopes?, philox_seed?, softmax_scale, causal, window_left, window_right,
        softcap, dropout_p, deterministic, return_softmax[, alibi_shift]) -> (out, lse, S_dmask)
    bwd(dout, q, k, v, out, lse, alibi_slopes?, philox_seed?, softmax_scale, causal,
        window_left, window_right, softcap, dropout_p, deterministic[, alibi_shift])
        -> (dq, dk, dv)
    varlen_fwd(q, k, v, cu_seqlens_q, cu_seqlens_k, seqused_k?, block_table?, alibi_slopes?,
        philox_seed?, max_seqlen_q, max_seqlen_k, softmax_scale, causal, window_left,
        window_right, softcap, dropout_p, deterministic, return_softmax) -> (out, lse, S_dmask)
    varlen_bwd(dout, q, k, v, out, lse, cu_seqlens_q, cu_seqlens_k, seqused_k?, alibi_slopes?,
        philox_seed?, max_seqlen_q, max_seqlen_k, softmax_scale, ..., deterministic)
        -> (dq, dk, dv)
    fwd_kvcache(q, k_cache!, v_cache!, k?, v?, rotary_cos?, rotary_sin?, cache_seqlens?,
        cache_batch_idx?, cache_leftpad?, block_table?, alibi_slopes?, softmax_scale?, causal,
        window_left, window_right, softcap, rotary_interleaved, num_splits[, attention_chunk,
        cu_seqlens_q?, max_seqlen_q, cu_seqlens_k_new?, rotary_seqlens?, k_descale?,
        v_descale?, q_descale?, qv?]) -> (out, lse)
    combine(out_partial, lse_partial, out_dtype?) -> (out, lse)

Python entry points the api layer calls: :func:`attention`, :func:`varlen_attention`,
:func:`kvcache_attention` and :func:`combine_splits`. For plain eager tensors they run the op
bodies directly (same functions, same autograd formula; torch.library's dispatch measured
~86 us per call on the H100 host); under torch.compile / export, a dispatch mode or a tensor
subclass they call the registered ops. :func:`eager_call` is that test; the api asks it too
before it keys a repeated call signature. The recorded calls (a signature's decisions made
once, their autograd functions included) live in :mod:`flashattn.replay`, which this module
never imports.

This module imports only :mod:`flashattn.dispatch`'s op-family modules (``dense``, ``varlen``,
``kvcache``, ``fp8``, ``merge``) and the parameter object: each op body builds one
:class:`flashattn.params.AttnParams` from its flat arguments (op schemas have no structs) and
calls the dispatch function of the same name.

Parameters are the normalised ones of ``docs/internals.md`` (the api layer has already
validated and normalised them), with these differences forced by graph capture:

- ``philox_seed`` is an int64 CPU tensor of one element, or None when ``dropout_p == 0``.
  Drawn by ``torch.randint`` in the caller, it is an ordinary random op of the traced graph:
  a compiled model draws a fresh seed on every call from torch's generator (so
  ``torch.manual_seed`` reproduces it) instead of baking the trace-time value into the graph.
  The op reads it with ``.item()``; a CPU tensor never synchronises a GPU.
- ``S_dmask`` is always a tensor: an empty ``(0,)`` tensor when ``return_softmax`` is False
  (a custom op has no optional outputs). ``fwd`` takes ``deterministic`` only so that its
  autograd formula can hand it to ``bwd``.
- ``lse`` and ``S_dmask`` are not differentiable; backward through the ``fwd`` op is
  ``bwd``; ``bwd`` itself has no derivative (no double backward, like flash-attn).

Why ``custom_op`` + ``register_fake`` and not ``triton_op`` + ``wrap_triton`` (tried on torch
2.13 + triton 3.6; torch 2.11 could not be installed here, its ``triton_op`` likewise builds
the fake kernel by tracing the Python body, so points 1 and 3 hold there too):

1. ``triton_op`` builds its fake (meta) kernel by running the op's Python body on
   FakeTensors. Our launch code chooses the TMA path from data pointers
   (``triton.config.use_tma`` checks 16-byte alignment of ``data_ptr()``), and the Hopper
   family checks the same in ``sm90.support.call_unsupported``: a ``triton_op`` around
   ``triton.fwd.flash_fwd`` fails under torch.compile with "Cannot access data pointer of
   Tensor (e.g. FakeTensor, FunctionalTensor)". The choice depends on the address at run
   time, which a trace cannot know.
2. Under ``TRITON_INTERPRET=1`` (the CPU CI) ``wrap_triton`` hands back interpreted kernels
   unchanged (``torch/_library/triton.py``: an InterpretedFunction is not traceable), so the
   fake pass launches the kernel on FakeTensors and fails even with TMA forced off
   (checked). The plain-torch CPU path (``cpu/``) would be traced into the graph instead,
   so one op would mean different graphs per device.
3. ``wrap_triton`` must wrap every launch site inside ``triton/*.py`` and
   ``sm90/*.py`` (autotuned kernels with ``early_config_prune``, ``reset_to_zero``,
   ``cache_results`` and in-kernel TMA descriptors that need ``triton.set_allocator``);
   Inductor would re-launch them through its own launcher, a second code path to keep right.

An opaque custom op runs exactly the eager code (autotuning, allocator, backend dispatch
included); the compiler only needs the output shapes (``register_fake``) and the gradient
formula (``register_autograd``). The cost is that Inductor cannot fuse into our kernels,
which it could not do with hand-written Triton kernels either.

Adding an op: write its body as a dispatch function (``dispatch/varlen.py``'s
``varlen_forward``), register it here in its own section with ``torch.library.custom_op``
(``mutates_args`` naming every tensor written in place), a fake that allocates the outputs
with the real strides, and, if differentiable, ``register_autograd``; check it with
``torch.library.opcheck`` (``tests/internals/test_ops.py``).
"""
from __future__ import annotations

from typing import Any, Optional, Tuple, Union

import torch

from flashattn.dispatch import dense as _dense
from flashattn.dispatch import fp8 as _fp8
from flashattn.dispatch import kvcache as _kvcache
from flashattn.dispatch import merge as _merge
from flashattn.dispatch import varlen as _varlen
from flashattn.fp8_format import quantized_empty
from flashattn.params import ONE_BLOCK_SHIFT, AttnParams, Fp8Scales

Tensor = torch.Tensor


def _seed_value(philox_seed: Optional[Tensor]) -> int:
    return 0 if philox_seed is None else int(philox_seed.item())


def _empty_dmask(q: Tensor) -> Tensor:
    return q.new_empty((0,))


def _fresh(*tensors: Tensor) -> Tuple[Tensor, ...]:
    """Contiguous outputs, as the fake kernels promise (a no-op for the backends' outputs)."""
    return tuple(t.contiguous() for t in tensors)


def _eager_autograd(name: str, fwd_impl, setup_context, backward, bwd_impl):
    """An autograd.Function running an op's bodies and autograd formula without torch.library's
    dispatch: that layer measured 86 us per dense forward call on the H100 host
    (benchmarks/probes/overhead_probe.py, ``ops.attention`` vs ``dispatch.dense.forward``),
    more than a small attention kernel runs. Used only for plain eager tensors (see
    :func:`eager_call`); torch.compile, export, dispatch modes and tensor subclasses always
    see the registered ops."""

    def forward(ctx, *inputs):
        output = fwd_impl(*inputs)
        setup_context(ctx, inputs, output)
        return output

    def backward_(ctx, *grads):
        return backward(ctx, *grads, backward_fn=bwd_impl)

    return type(name, (torch.autograd.Function,),
                {"forward": staticmethod(forward), "backward": staticmethod(backward_)})


def _no_backward_impl(grad: Tensor, message: str) -> Tensor:
    """Raises NotImplementedError(message) (its 0-d output, in grad's dtype, is never made)."""
    raise NotImplementedError(message)


# the refusal as an op: torch.compile traces a backward when it compiles the forward, so a
# Python raise there would fail the compile of a forward that is fine; the op raises when the
# compiled backward runs, as the eager one does
no_backward = torch.library.custom_op("flashattn::no_backward", _no_backward_impl,
                                      mutates_args=())


@no_backward.register_fake
def _(grad: Tensor, message: str) -> Tensor:
    return grad.new_empty(())


class _ForwardOnly(torch.autograd.Function):
    """``out`` as an output of ``inputs`` whose backward raises (forward-only computations, such
    as FP8 attention, called on inputs that require grad: FlashAttention-3 runs the forward
    and refuses only the backward)."""

    @staticmethod
    def forward(ctx, out, message, *inputs):
        ctx.message = message
        ctx.inputs = [None if x is None else (x.shape, x.dtype) for x in inputs]
        return out.view_as(out)

    @staticmethod
    def backward(ctx, *grads):
        if not tracing():
            raise NotImplementedError(ctx.message)
        refused = no_backward(grads[0], ctx.message)
        # every input's gradient is read from the refusal's output, so the compiled backward
        # keeps it (a custom op whose output nobody reads would be dropped)
        return (None, None) + tuple(None if spec is None else refused.to(spec[1]).expand(spec[0])
                                    for spec in ctx.inputs)


def forward_only(out: Tensor, inputs: Tuple[Optional[Tensor], ...], message: str) -> Tensor:
    """``out``, attached to ``inputs`` by a backward that raises NotImplementedError(message)
    when any of them requires grad under grad mode; ``out`` unchanged otherwise."""
    if grad_recorded(*inputs):
        return _ForwardOnly.apply(out, message, *inputs)
    return out


def grad_recorded(*inputs: Optional[Tensor]) -> bool:
    """Autograd would record a graph through ``inputs`` (grad mode on, one requires grad)."""
    return torch.is_grad_enabled() and any(isinstance(x, Tensor) and x.requires_grad
                                           for x in inputs)


def wide_v_slices_faster(q: Tensor, slice_width: int, has_alibi: bool, dropout_p: float
                         ) -> bool:
    """A dense forward without a gradient and with V past the Hopper kernel's width runs
    faster by V's column slices ``slice_width`` wide than in one portable pass
    (:func:`flashattn.dispatch.dense.wide_v_slices_on_hopper`)."""
    return _dense.wide_v_slices_on_hopper(q, slice_width, has_alibi, dropout_p)


def tracing() -> bool:
    """torch.compile / export tracing, or a Python dispatch mode, is active."""
    return torch.compiler.is_compiling() or bool(torch._C._len_torch_dispatch_stack())


def eager_call(*tensors: Optional[Tensor]) -> bool:
    """True for a plain eager call: not under torch.compile / export tracing, no tensor
    subclass (FakeTensor, FunctionalTensor, DTensor, nested), no Python dispatch mode."""
    if tracing():
        return False
    return all(t is None or type(t) is torch.Tensor for t in tensors)


def _run(op, eager_fn, fwd_impl, inputs, tensors, differentiable):
    """``op(*inputs)``, or for plain eager tensors the same bodies without the dispatch."""
    if not eager_call(*tensors):
        return op(*inputs)
    if torch.is_grad_enabled() and any(t.requires_grad for t in differentiable):
        return eager_fn.apply(*inputs)
    return fwd_impl(*inputs)


# ---------------------------------------------------------------------------------------------
# Dense attention: flash_attn_func, flash_attn_qkvpacked_func, flash_attn_kvpacked_func
# ---------------------------------------------------------------------------------------------
def _fwd_impl(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    alibi_slopes: Optional[Tensor],
    philox_seed: Optional[Tensor],
    softmax_scale: float,
    causal: bool,
    window_left: int,
    window_right: int,
    softcap: float,
    dropout_p: float,
    deterministic: bool,
    return_softmax: bool,
    alibi_shift: int = 0,
) -> Tuple[Tensor, Tensor, Tensor]:
    """Attention forward. q (b, s_q, h, d), k (b, s_k, h_k, d), v (b, s_k, h_k, d_v).

    Returns out (b, s_q, h, d_v) in q's dtype, lse float32 (b, h, s_q), and S_dmask
    (b, h, s_q, s_k) in q's dtype when ``return_softmax`` else an empty (0,) tensor; all
    contiguous. ``alibi_shift``: :class:`~flashattn.params.AttnParams`' (context parallelism's
    blocks; 0 otherwise).
    """
    params = AttnParams(softmax_scale, causal, window_left, window_right, softcap, alibi_slopes,
                        dropout_p, _seed_value(philox_seed), deterministic,
                        alibi_shift=alibi_shift)
    out, lse, s_dmask = _dense.forward(q, k, v, params, return_softmax)
    if s_dmask is None:
        s_dmask = _empty_dmask(q)
    return _fresh(out, lse, s_dmask)  # type: ignore[return-value]


fwd = torch.library.custom_op("flashattn::fwd", _fwd_impl, mutates_args=())


@fwd.register_fake
def _fwd_fake(q, k, v, alibi_slopes, philox_seed, softmax_scale, causal, window_left,
              window_right, softcap, dropout_p, deterministic, return_softmax, alibi_shift=0):
    b, s_q, h, _ = q.shape
    s_k, d_v = k.shape[1], v.shape[-1]
    out = q.new_empty((b, s_q, h, d_v))
    lse = q.new_empty((b, h, s_q), dtype=torch.float32)
    s_dmask = q.new_empty((b, h, s_q, s_k)) if return_softmax else _empty_dmask(q)
    return out, lse, s_dmask


def _bwd_impl(
    dout: Tensor,
    q: Tensor,
    k: Tensor,
    v: Tensor,
    out: Tensor,
    lse: Tensor,
    alibi_slopes: Optional[Tensor],
    philox_seed: Optional[Tensor],
    softmax_scale: float,
    causal: bool,
    window_left: int,
    window_right: int,
    softcap: float,
    dropout_p: float,
    deterministic: bool,
    alibi_shift: int = 0,
) -> Tuple[Tensor, Tensor, Tensor]:
    """Attention backward: (dq, dk, dv), contiguous, shaped and typed like q, k, v.

    dout (b, s_q, h, d_v) with unit last-dim stride; out, lse as ``fwd`` returned them; the
    same ``philox_seed`` and ``alibi_shift`` as the forward (the seed replays the dropout mask).
    """
    params = AttnParams(softmax_scale, causal, window_left, window_right, softcap, alibi_slopes,
                        dropout_p, _seed_value(philox_seed), deterministic,
                        alibi_shift=alibi_shift)
    dq, dk, dv = _dense.backward(dout, q, k, v, out, lse, params)
    return _fresh(dq, dk, dv)  # type: ignore[return-value]


bwd = torch.library.custom_op("flashattn::bwd", _bwd_impl, mutates_args=())


@bwd.register_fake
def _bwd_fake(dout, q, k, v, out, lse, alibi_slopes, philox_seed, softmax_scale, causal,
              window_left, window_right, softcap, dropout_p, deterministic, alibi_shift=0):
    return (torch.empty(q.shape, dtype=q.dtype, device=q.device),
            torch.empty(k.shape, dtype=k.dtype, device=k.device),
            torch.empty(v.shape, dtype=v.dtype, device=v.device))


def _fwd_setup_context(ctx, inputs, output) -> None:
    # (alibi_shift, the last input, may be left to its default by the caller)
    (q, k, v, alibi_slopes, philox_seed, softmax_scale, causal, window_left, window_right,
     softcap, dropout_p, deterministic, _return_softmax, *shift) = inputs
    out, lse, s_dmask = output
    ctx.save_for_backward(q, k, v, out, lse, alibi_slopes, philox_seed)
    # The seed is saved, not redrawn: backward replays forward's dropout mask.
    ctx.params = (softmax_scale, causal, window_left, window_right, softcap, dropout_p,
                  deterministic, shift[0] if shift else 0)
    ctx.n_inputs = len(inputs)
    ctx.mark_non_differentiable(lse, s_dmask)


def _fwd_backward(ctx, dout, _dlse, _ds_dmask, backward_fn=bwd):
    q, k, v, out, lse, alibi_slopes, philox_seed = ctx.saved_tensors
    dq, dk, dv = backward_fn(_dense.unit_last_stride(dout), q, k, v, out, lse, alibi_slopes,
                             philox_seed, *ctx.params)
    return (dq, dk, dv) + (None,) * (ctx.n_inputs - 3)


fwd.register_autograd(_fwd_backward, setup_context=_fwd_setup_context)
_EagerAttention = _eager_autograd("_EagerAttention", _fwd_impl, _fwd_setup_context, _fwd_backward,
                                  _bwd_impl)


def attention(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    alibi_slopes: Optional[Tensor],
    philox_seed: Optional[Tensor],
    softmax_scale: float,
    causal: bool,
    window_left: int,
    window_right: int,
    softcap: float,
    dropout_p: float,
    deterministic: bool,
    return_softmax: bool,
) -> Tuple[Tensor, Tensor, Optional[Tensor]]:
    """``fwd`` with flash-attn's return convention: S_dmask None unless ``return_softmax``.

    Plain eager tensors skip the op dispatch (same bodies, same autograd formula:
    :class:`_EagerAttention`); everything else goes through the registered op.
    """
    inputs = (q, k, v, alibi_slopes, philox_seed, softmax_scale, causal, window_left,
              window_right, softcap, dropout_p, deterministic, return_softmax)
    out, lse, s_dmask = _run(fwd, _EagerAttention, _fwd_impl, inputs,
                             (q, k, v, alibi_slopes, philox_seed), (q, k, v))
    return out, lse, (s_dmask if return_softmax else None)


# ---------------------------------------------------------------------------------------------
# Variable-length (packed) attention: flash_attn_varlen_func and its packed variants
# ---------------------------------------------------------------------------------------------
def _varlen_fwd_impl(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    cu_seqlens_q: Tensor,
    cu_seqlens_k: Tensor,
    seqused_k: Optional[Tensor],
    block_table: Optional[Tensor],
    alibi_slopes: Optional[Tensor],
    philox_seed: Optional[Tensor],
    max_seqlen_q: int,
    max_seqlen_k: int,
    softmax_scale: float,
    causal: bool,
    window_left: int,
    window_right: int,
    softcap: float,
    dropout_p: float,
    deterministic: bool,
    return_softmax: bool,
) -> Tuple[Tensor, Tensor, Tensor]:
    """Varlen forward. q (total_q, h, d); k, v (total_k, h_k, d / d_v), or the paged caches
    (num_blocks, page_size, h_k, d / d_v) with ``block_table``.

    Returns out (total_q, h, d_v), lse float32 (h, total_q), S_dmask
    (b, h, max_seqlen_q, max_seqlen_k) or an empty (0,) tensor; all contiguous.
    """
    params = AttnParams(softmax_scale, causal, window_left, window_right, softcap, alibi_slopes,
                        dropout_p, _seed_value(philox_seed), deterministic)
    out, lse, s_dmask = _varlen.varlen_forward(q, k, v, cu_seqlens_q, cu_seqlens_k, seqused_k,
                                                block_table, max_seqlen_q, max_seqlen_k, params,
                                                return_softmax)
    if s_dmask is None:
        s_dmask = _empty_dmask(q)
    return _fresh(out, lse, s_dmask)  # type: ignore[return-value]


varlen_fwd = torch.library.custom_op("flashattn::varlen_fwd", _varlen_fwd_impl, mutates_args=())


@varlen_fwd.register_fake
def _varlen_fwd_fake(q, k, v, cu_seqlens_q, cu_seqlens_k, seqused_k, block_table, alibi_slopes,
                     philox_seed, max_seqlen_q, max_seqlen_k, softmax_scale, causal,
                     window_left, window_right, softcap, dropout_p, deterministic,
                     return_softmax):
    total_q, h, _ = q.shape
    batch = cu_seqlens_q.shape[0] - 1
    out = q.new_empty((total_q, h, v.shape[-1]))
    lse = q.new_empty((h, total_q), dtype=torch.float32)
    s_dmask = (q.new_empty((batch, h, max_seqlen_q, max_seqlen_k)) if return_softmax
               else _empty_dmask(q))
    return out, lse, s_dmask


def _varlen_bwd_impl(
    dout: Tensor,
    q: Tensor,
    k: Tensor,
    v: Tensor,
    out: Tensor,
    lse: Tensor,
    cu_seqlens_q: Tensor,
    cu_seqlens_k: Tensor,
    seqused_k: Optional[Tensor],
    alibi_slopes: Optional[Tensor],
    philox_seed: Optional[Tensor],
    max_seqlen_q: int,
    max_seqlen_k: int,
    softmax_scale: float,
    causal: bool,
    window_left: int,
    window_right: int,
    softcap: float,
    dropout_p: float,
    deterministic: bool,
) -> Tuple[Tensor, Tensor, Tensor]:
    """Varlen backward: (dq, dk, dv), contiguous, shaped and typed like q, k, v."""
    params = AttnParams(softmax_scale, causal, window_left, window_right, softcap, alibi_slopes,
                        dropout_p, _seed_value(philox_seed), deterministic)
    dq, dk, dv = _varlen.varlen_backward(dout, q, k, v, out, lse, cu_seqlens_q, cu_seqlens_k,
                                          seqused_k, max_seqlen_q, max_seqlen_k, params)
    return _fresh(dq, dk, dv)  # type: ignore[return-value]


varlen_bwd = torch.library.custom_op("flashattn::varlen_bwd", _varlen_bwd_impl, mutates_args=())


@varlen_bwd.register_fake
def _varlen_bwd_fake(dout, q, k, v, out, lse, cu_seqlens_q, cu_seqlens_k, seqused_k,
                     alibi_slopes, philox_seed, max_seqlen_q, max_seqlen_k, softmax_scale,
                     causal, window_left, window_right, softcap, dropout_p, deterministic):
    return (torch.empty(q.shape, dtype=q.dtype, device=q.device),
            torch.empty(k.shape, dtype=k.dtype, device=k.device),
            torch.empty(v.shape, dtype=v.dtype, device=v.device))


def _varlen_setup_context(ctx, inputs, output) -> None:
    (q, k, v, cu_seqlens_q, cu_seqlens_k, seqused_k, block_table, alibi_slopes, philox_seed,
     max_seqlen_q, max_seqlen_k, softmax_scale, causal, window_left, window_right, softcap,
     dropout_p, deterministic, _return_softmax) = inputs
    out, lse, s_dmask = output
    ctx.paged = block_table is not None
    ctx.save_for_backward(q, k, v, out, lse, cu_seqlens_q, cu_seqlens_k, seqused_k,
                          alibi_slopes, philox_seed)
    ctx.params = (max_seqlen_q, max_seqlen_k, softmax_scale, causal, window_left, window_right,
                  softcap, dropout_p, deterministic)
    ctx.mark_non_differentiable(lse, s_dmask)


def _varlen_backward(ctx, dout, _dlse, _ds_dmask, backward_fn=varlen_bwd):
    if ctx.paged:
        raise NotImplementedError(
            "flash_attn_varlen_func: gradients through the paged KV cache path "
            "(block_table given) are not supported; it is for inference. Call it under "
            "torch.no_grad(), or pass contiguous k/v without block_table to train."
        )
    (q, k, v, out, lse, cu_seqlens_q, cu_seqlens_k, seqused_k, alibi_slopes,
     philox_seed) = ctx.saved_tensors
    dq, dk, dv = backward_fn(_dense.unit_last_stride(dout), q, k, v, out, lse, cu_seqlens_q,
                             cu_seqlens_k, seqused_k, alibi_slopes, philox_seed, *ctx.params)
    return (dq, dk, dv) + (None,) * 16


varlen_fwd.register_autograd(_varlen_backward, setup_context=_varlen_setup_context)
_EagerVarlenAttention = _eager_autograd("_EagerVarlenAttention", _varlen_fwd_impl,
                                        _varlen_setup_context, _varlen_backward, _varlen_bwd_impl)


def varlen_attention(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    cu_seqlens_q: Tensor,
    cu_seqlens_k: Tensor,
    seqused_k: Optional[Tensor],
    block_table: Optional[Tensor],
    alibi_slopes: Optional[Tensor],
    max_seqlen_q: int,
    max_seqlen_k: int,
    softmax_scale: float,
    causal: bool,
    window_left: int,
    window_right: int,
    softcap: float,
    dropout_p: float,
    philox_seed: Union[int, Tensor, None],
    deterministic: bool,
    return_softmax: bool,
) -> Tuple[Tensor, Tensor, Optional[Tensor]]:
    """``varlen_fwd`` with flash-attn's return convention: S_dmask None unless
    ``return_softmax``. Plain eager tensors skip the op dispatch (:class:`_EagerVarlenAttention`).

    ``philox_seed``: an int64 CPU tensor of one element (``api.normalise.draw_philox_seed``: a
    random op of a compiled graph, so every call of a compiled function draws a fresh seed), an
    int (wrapped in a CPU tensor), or None / ignored when ``dropout_p == 0``.
    """
    if dropout_p <= 0.0:
        philox_seed = None
    elif not isinstance(philox_seed, Tensor):
        philox_seed = torch.tensor([int(philox_seed or 0)], dtype=torch.int64)
    inputs = (q, k, v, cu_seqlens_q, cu_seqlens_k, seqused_k, block_table, alibi_slopes,
              philox_seed, max_seqlen_q, max_seqlen_k, softmax_scale, causal, window_left,
              window_right, softcap, dropout_p, deterministic, return_softmax)
    tensors = (q, k, v, cu_seqlens_q, cu_seqlens_k, seqused_k, block_table, alibi_slopes,
               philox_seed)
    out, lse, s_dmask = _run(varlen_fwd, _EagerVarlenAttention, _varlen_fwd_impl, inputs,
                             tensors, (q, k, v))
    return out, lse, (s_dmask if return_softmax else None)


# ---------------------------------------------------------------------------------------------
# KV cache (flash_attn_with_kvcache) and the split combine (flash_attn_combine): forward-only
# ops, so a compiled decode step traces through.
# ---------------------------------------------------------------------------------------------
def _fwd_kvcache_impl(
    q: Tensor,
    k_cache: Tensor,
    v_cache: Tensor,
    k: Optional[Tensor],
    v: Optional[Tensor],
    rotary_cos: Optional[Tensor],
    rotary_sin: Optional[Tensor],
    cache_seqlens: Optional[Tensor],
    cache_batch_idx: Optional[Tensor],
    cache_leftpad: Optional[Tensor],
    block_table: Optional[Tensor],
    alibi_slopes: Optional[Tensor],
    softmax_scale: float,
    causal: bool,
    window_left: int,
    window_right: int,
    softcap: float,
    rotary_interleaved: bool,
    num_splits: int,
    attention_chunk: int = 0,
    cu_seqlens_q: Optional[Tensor] = None,
    max_seqlen_q: int = 0,
    cu_seqlens_k_new: Optional[Tensor] = None,
    rotary_seqlens: Optional[Tensor] = None,
    k_descale: Optional[Tensor] = None,
    v_descale: Optional[Tensor] = None,
    q_descale: Optional[Tensor] = None,
    qv: Optional[Tensor] = None,
    learnable_sink: Optional[Tensor] = None,
) -> Tuple[Tensor, Tensor]:
    """``flash_attn_with_kvcache`` as an op: k / v (if given) are written into k_cache /
    v_cache in place (attention_chunk: 0 or FA3's chunked local attention; FA3's packed
    queries / new keys (q (total_q, h, d): out (total_q, h, d_v), lse (h, total_q)) and
    rotary_seqlens). Returns out (b, s_q, h, d_v) in q's dtype and lse float32 (b, h, s_q),
    contiguous. Arguments as checked and normalised by the api (softmax_scale resolved, the
    window against the cache capacity with causal folded in, alibi_slopes (b, h),
    cache_seqlens a (b,) int32 tensor or None). float8_e4m3fn caches take k_descale /
    v_descale float32 (b, h_k) (None: 1.0); with a 16/32-bit q, out is in q's dtype; a
    float8_e4m3fn q takes q_descale float32 (b, h_k) (None: 1.0) and gives a bfloat16 out.
    ``qv`` (FlashAttention-3's latent query): q's shape with d_v, scores ``qv . v`` added.
    ``learnable_sink`` float (h,): one more softmax logit per head (gpt-oss's sinks), in out and
    lse (no gradient: the call is forward-only)."""
    params = AttnParams(softmax_scale, causal, window_left, window_right, softcap, alibi_slopes,
                        0.0, 0, False, attention_chunk)
    out, lse = _kvcache.kvcache(q, k_cache, v_cache, k, v, rotary_cos, rotary_sin, cache_seqlens,
                                cache_batch_idx, cache_leftpad, block_table, params,
                                rotary_interleaved, num_splits, cu_seqlens_q, max_seqlen_q,
                                cu_seqlens_k_new, rotary_seqlens, k_descale, v_descale,
                                q_descale, qv=qv, sink=learnable_sink)
    return _fresh(out, lse)  # type: ignore[return-value]


fwd_kvcache = torch.library.custom_op("flashattn::fwd_kvcache", _fwd_kvcache_impl,
                                      mutates_args=("k_cache", "v_cache"))


@fwd_kvcache.register_fake
def _fwd_kvcache_fake(q, k_cache, v_cache, k, v, rotary_cos, rotary_sin, cache_seqlens,
                      cache_batch_idx, cache_leftpad, block_table, alibi_slopes, softmax_scale,
                      causal, window_left, window_right, softcap, rotary_interleaved,
                      num_splits, attention_chunk=0, cu_seqlens_q=None, max_seqlen_q=0,
                      cu_seqlens_k_new=None, rotary_seqlens=None, k_descale=None,
                      v_descale=None, q_descale=None, qv=None, learnable_sink=None):
    out_dtype = torch.bfloat16 if q.dtype == torch.float8_e4m3fn else q.dtype
    if cu_seqlens_q is not None:
        total_q, h, _ = q.shape
        return (q.new_empty((total_q, h, v_cache.shape[-1]), dtype=out_dtype),
                q.new_empty((h, total_q), dtype=torch.float32))
    b, s_q, h, _ = q.shape
    return (q.new_empty((b, s_q, h, v_cache.shape[-1]), dtype=out_dtype),
            q.new_empty((b, h, s_q), dtype=torch.float32))


def kvcache_attention(*args: Any) -> Tuple[Tensor, Tensor]:
    """``fwd_kvcache(*args)`` (the op's argument order), or its body for plain eager tensors
    (the first 12 arguments and the packed-length ones after the scalars are the tensors)."""
    if eager_call(*args[:12], *(a for a in args[12:] if isinstance(a, Tensor))):
        return _fwd_kvcache_impl(*args)
    return fwd_kvcache(*args)


def _combine_impl(out_partial: Tensor, lse_partial: Tensor,
                  out_dtype: Optional[torch.dtype]) -> Tuple[Tensor, Tensor]:
    """``flash_attn_combine`` without ``out=``: out_partial (splits, b, s_q, h, d_v) and
    lse_partial (splits, b, h, s_q) float32 -> out (b, s_q, h, d_v) in ``out_dtype`` (default
    float32) and lse float32 (b, h, s_q), contiguous."""
    out, lse = _merge.combine(out_partial, lse_partial, None,
                                out_dtype if out_dtype is not None else torch.float32)
    return _fresh(out, lse)  # type: ignore[return-value]


combine = torch.library.custom_op("flashattn::combine", _combine_impl, mutates_args=())


@combine.register_fake
def _combine_fake(out_partial, lse_partial, out_dtype):
    _, b, s_q, h, d_v = out_partial.shape
    dtype = out_dtype if out_dtype is not None else torch.float32
    return (out_partial.new_empty((b, s_q, h, d_v), dtype=dtype),
            out_partial.new_empty((b, h, s_q), dtype=torch.float32))


def combine_splits(out_partial: Tensor, lse_partial: Tensor, out: Optional[Tensor] = None,
                   out_dtype: Optional[torch.dtype] = None) -> Tuple[Tensor, Tensor]:
    """``flash_attn_combine`` (same arguments and returns, validated by the api): plain eager
    tensors run the body, writing into ``out`` directly; otherwise the ``combine`` op, whose
    result is copied into ``out`` (a traced copy_: an op's output cannot alias its input)."""
    dtype = out_dtype if out_dtype is not None else (out.dtype if out is not None
                                                     else torch.float32)
    if eager_call(out_partial, lse_partial, out):
        return _merge.combine(out_partial, lse_partial, out, dtype)
    res, lse = combine(out_partial, lse_partial, dtype)
    if out is not None:
        out.copy_(res)
        res = out
    return res, lse


def lse_merge(out_a: Tensor, lse_a: Tensor, out_b: Tensor, lse_b: Tensor,
              dest: Tensor) -> None:
    """Two partial attention results over disjoint keys merged through their lse, in place:
    ``lse_a`` (b, h, s) float32 becomes the merged lse and ``dest`` (b, s, h, d_v, any float
    dtype; may be ``out_a``) the merged output of ``out_a`` / ``out_b`` (b, s, h, d_v).
    Eager only, not an op: it mutates its arguments, and its caller (context parallelism's
    ring, inside its own autograd.Function) runs eagerly."""
    _merge.lse_merge(out_a, lse_a, out_b, lse_b, dest)


def sum_rows(parts, starts, n_rows: int, row_dim: int, out_dtype: torch.dtype) -> Tensor:
    """The float32 sum of ``parts`` (one float dtype), part ``i`` covering rows ``[starts[i],
    starts[i] + parts[i].shape[row_dim])`` of an output with ``n_rows`` rows along ``row_dim``,
    added in the order given and rounded once to ``out_dtype``; uncovered rows are 0. One pass
    of the device's kernel (Triton on GPUs, torch ops on CPUs). Eager only, not an op: its
    caller (context parallelism's ring backward, inside its own autograd.Function) runs
    eagerly."""
    return _merge.sum_rows(parts, starts, n_rows, row_dim, out_dtype)


# ---------------------------------------------------------------------------------------------
# FP8 block quantization (flashattn.fp8.quantize): not differentiable
# ---------------------------------------------------------------------------------------------
def _fp8_quantize_impl(q: Tensor, k: Tensor, v: Tensor, signs: Optional[Tensor], block_m: int,
                       block_n: int, v_wgmma: bool = False
                       ) -> Tuple[Tensor, Tensor, Tensor, Tensor, Tensor, Tensor]:
    """(q8, k8, v8) float8_e4m3fn shaped like q, k, v and (q_descale (b, h, cdiv(s_q,
    block_m)), k_descale, v_descale (b, h_k, cdiv(s_k, block_n))) float32; all contiguous but
    v8, whose storage is (b, h_k, d_v, s_k padded to 16): keys contiguous. ``v_wgmma``: v8 in
    wgmma key order instead, (b, s_pad, h_k, d_v) (fp8_format.wgmma_vt_empty)."""
    q8, k8, v8, qs, ks, vs = _fp8.fp8_quantize(q, k, v, signs, block_m, block_n, v_wgmma)
    # v8 keeps its keys-contiguous layout (fp8_format.keys_contiguous_empty): the FP8 kernels'
    return (*_fresh(q8, k8), v8, *_fresh(qs, ks, vs))  # type: ignore[return-value]


fp8_quantize = torch.library.custom_op("flashattn::fp8_quantize", _fp8_quantize_impl,
                                       mutates_args=())


@fp8_quantize.register_fake
def _fp8_quantize_fake(q, k, v, signs, block_m, block_n, v_wgmma=False):
    return quantized_empty(q.shape, k.shape, v.shape, block_m, block_n, v_wgmma, q.device)


def quantize_fp8(q: Tensor, k: Tensor, v: Tensor, signs: Optional[Tensor], block_m: int,
                 block_n: int, v_wgmma: bool = False) -> Tuple[Tensor, ...]:
    """``fp8_quantize``, or its body for plain eager tensors."""
    if eager_call(q, k, v, signs):
        return _fp8_quantize_impl(q, k, v, signs, block_m, block_n, v_wgmma)
    return fp8_quantize(q, k, v, signs, block_m, block_n, v_wgmma)


def fp8_v_wgmma(q: Tensor, k: Tensor, v: Tensor, params: AttnParams, block_m: int,
                block_n: int) -> bool:
    """Whether a quantize pass feeding FP8 attention should write V in the Hopper kernel's key
    order (dispatch.fp8.fp8_v_wgmma: exactly when that kernel will run on its outputs)."""
    return _fp8.fp8_v_wgmma(q, k, v, params, block_m, block_n)


# ---------------------------------------------------------------------------------------------
# Learnable attention sinks (gpt-oss's ``sinks``, transformers' ``s_aux``): one extra logit per
# head in every row's softmax denominator, attending to nothing. Exact on every backend by
# composition: with S the scores and s_h the sink,
#     out = sum_j exp(S_j) v_j / (L + exp(s_h)) = out_core * exp(lse - lse'),
#     lse' = logaddexp(lse, s_h),
# and the backward of attention with a sink is the plain backward evaluated at (out, lse')
# (P = exp(S - lse') and delta = rowsum(dout * out) are exactly its terms), plus
#     d s_h = -sum over rows of exp(s_h - lse') * delta.
# ---------------------------------------------------------------------------------------------
def _sink_apply_impl(out: Tensor, lse: Tensor, sink: Tensor, packed: bool
                     ) -> Tuple[Tensor, Tensor]:
    return _fresh(*_merge.sink_apply(out, lse, sink, packed))  # type: ignore[return-value]


sink_apply_op = torch.library.custom_op("flashattn::sink_apply", _sink_apply_impl,
                                        mutates_args=())


@sink_apply_op.register_fake
def _sink_apply_fake(out, lse, sink, packed):
    return torch.empty_like(out), torch.empty_like(lse)


def sink_apply(out: Tensor, lse: Tensor, sink: Tensor, packed: bool) -> Tuple[Tensor, Tensor]:
    """(out, lse) with the sink: out (b, s, h, d) / lse (b, h, s), or packed: out (t, h, d) /
    lse (h, t); sink float (h,). A row that sees no key gets out 0 and lse = its sink. One
    fused pass on the Triton backend (no gradient here: the sink autograd functions below
    own the backward)."""
    sink = sink.detach()
    if eager_call(out, lse, sink):
        return _sink_apply_impl(out, lse, sink, packed)
    return sink_apply_op(out, lse, sink, packed)


def _sink_grad_impl(dout: Tensor, out: Tensor, lse: Tensor, sink: Tensor,
                    packed: bool) -> Tensor:
    return _merge.sink_grad(dout, out, lse, sink, packed)


sink_grad_op = torch.library.custom_op("flashattn::sink_grad", _sink_grad_impl, mutates_args=())


@sink_grad_op.register_fake
def _sink_grad_fake(dout, out, lse, sink, packed):
    return torch.empty_like(sink)


def _sink_grad(dout: Tensor, out: Tensor, lse: Tensor, sink: Tensor, packed: bool) -> Tensor:
    """d sink (h,): -sum over rows of exp(sink - lse) * rowsum(dout * out) (one fused pass on
    the Triton backend)."""
    sink = sink.detach()
    if eager_call(dout, out, lse, sink):
        return _sink_grad_impl(dout, out, lse, sink, packed)
    return sink_grad_op(dout, out, lse, sink, packed)


def _fwd_sink_impl(q: Tensor, k: Tensor, v: Tensor, sink: Tensor,
                   alibi_slopes: Optional[Tensor], softmax_scale: float, causal: bool,
                   window_left: int, window_right: int, softcap: float
                   ) -> Tuple[Tensor, Tensor]:
    params = AttnParams(softmax_scale, causal, window_left, window_right, softcap, alibi_slopes,
                        0.0, 0, False)
    return _fresh(*_dense.forward_with_sink(q, k, v, params, sink))  # type: ignore


fwd_sink = torch.library.custom_op("flashattn::fwd_sink", _fwd_sink_impl, mutates_args=())


@fwd_sink.register_fake
def _fwd_sink_fake(q, k, v, sink, alibi_slopes, softmax_scale, causal, window_left,
                   window_right, softcap):
    b, s_q, h, _ = q.shape
    return (q.new_empty((b, s_q, h, v.shape[-1])),
            q.new_empty((b, h, s_q), dtype=torch.float32))


def _attention_sink_forward(q: Tensor, k: Tensor, v: Tensor, sink: Tensor, *rest
                            ) -> Tuple[Tensor, Tensor]:
    """The dense forward with sinks (``fwd_sink``'s argument order after sink), or its body
    for plain eager tensors."""
    sink = sink.detach()
    if eager_call(q, k, v, sink, rest[0]):
        return _fwd_sink_impl(q, k, v, sink, *rest)
    return fwd_sink(q, k, v, sink, *rest)


class _SinkAttention(torch.autograd.Function):
    """Dense attention with a learnable sink (see above): (out, lse with the sink)."""

    @staticmethod
    def forward(ctx, q, k, v, sink, alibi_slopes, softmax_scale, causal, window_left,
                window_right, softcap, deterministic):
        out, lse = _attention_sink_forward(q, k, v, sink, alibi_slopes, softmax_scale, causal,
                                           window_left, window_right, softcap)
        ctx.save_for_backward(q, k, v, out, lse, sink, alibi_slopes)
        ctx.params = (softmax_scale, causal, window_left, window_right, softcap, 0.0,
                      deterministic)
        ctx.mark_non_differentiable(lse)
        return out, lse

    @staticmethod
    def backward(ctx, dout, _dlse):
        q, k, v, out, lse, sink, alibi_slopes = ctx.saved_tensors
        dout = _dense.unit_last_stride(dout)
        run = _bwd_impl if eager_call(dout, q, k, v, out, lse, alibi_slopes) else bwd
        dq, dk, dv = run(dout, q, k, v, out, lse, alibi_slopes, None, *ctx.params)
        dsink = _sink_grad(dout, out, lse, sink, False) if ctx.needs_input_grad[3] else None
        return (dq, dk, dv, dsink) + (None,) * 7


def _varlen_fwd_sink_impl(q: Tensor, k: Tensor, v: Tensor, sink: Tensor, cu_seqlens_q: Tensor,
                          cu_seqlens_k: Tensor, seqused_k: Optional[Tensor],
                          alibi_slopes: Optional[Tensor], max_seqlen_q: int, max_seqlen_k: int,
                          softmax_scale: float, causal: bool, window_left: int,
                          window_right: int, softcap: float) -> Tuple[Tensor, Tensor]:
    params = AttnParams(softmax_scale, causal, window_left, window_right, softcap, alibi_slopes,
                        0.0, 0, False)
    return _fresh(*_varlen.varlen_forward_with_sink(  # type: ignore
        q, k, v, cu_seqlens_q, cu_seqlens_k, seqused_k, max_seqlen_q, max_seqlen_k, params,
        sink))


varlen_fwd_sink = torch.library.custom_op("flashattn::varlen_fwd_sink", _varlen_fwd_sink_impl,
                                          mutates_args=())


@varlen_fwd_sink.register_fake
def _varlen_fwd_sink_fake(q, k, v, sink, cu_seqlens_q, cu_seqlens_k, seqused_k, alibi_slopes,
                          max_seqlen_q, max_seqlen_k, softmax_scale, causal, window_left,
                          window_right, softcap):
    total_q, h, _ = q.shape
    return (q.new_empty((total_q, h, v.shape[-1])),
            q.new_empty((h, total_q), dtype=torch.float32))


class _SinkVarlenAttention(torch.autograd.Function):
    """Packed variable-length attention with a learnable sink: (out, lse with the sink)."""

    @staticmethod
    def forward(ctx, q, k, v, sink, cu_seqlens_q, cu_seqlens_k, seqused_k, alibi_slopes,
                max_seqlen_q, max_seqlen_k, softmax_scale, causal, window_left, window_right,
                softcap, deterministic):
        detached = sink.detach()
        args = (q, k, v, detached, cu_seqlens_q, cu_seqlens_k, seqused_k, alibi_slopes,
                max_seqlen_q, max_seqlen_k, softmax_scale, causal, window_left, window_right,
                softcap)
        run = (_varlen_fwd_sink_impl
               if eager_call(q, k, v, detached, cu_seqlens_q, cu_seqlens_k, seqused_k,
                             alibi_slopes)
               else varlen_fwd_sink)
        out, lse = run(*args)
        ctx.save_for_backward(q, k, v, out, lse, sink, cu_seqlens_q, cu_seqlens_k, seqused_k,
                              alibi_slopes)
        ctx.params = (max_seqlen_q, max_seqlen_k, softmax_scale, causal, window_left,
                      window_right, softcap, 0.0, deterministic)
        ctx.mark_non_differentiable(lse)
        return out, lse

    @staticmethod
    def backward(ctx, dout, _dlse):
        (q, k, v, out, lse, sink, cu_seqlens_q, cu_seqlens_k, seqused_k,
         alibi_slopes) = ctx.saved_tensors
        dout = _dense.unit_last_stride(dout)
        tensors = (dout, q, k, v, out, lse, cu_seqlens_q, cu_seqlens_k, seqused_k, alibi_slopes)
        run = _varlen_bwd_impl if eager_call(*tensors) else varlen_bwd
        dq, dk, dv = run(*tensors, None, *ctx.params)
        dsink = _sink_grad(dout, out, lse, sink, True) if ctx.needs_input_grad[3] else None
        return (dq, dk, dv, dsink) + (None,) * 12


def attention_with_sink(q: Tensor, k: Tensor, v: Tensor, sink: Tensor,
                        alibi_slopes: Optional[Tensor], softmax_scale: float, causal: bool,
                        window_left: int, window_right: int, softcap: float,
                        deterministic: bool) -> Tuple[Tensor, Tensor]:
    """Dense attention with a learnable sink (h,): (out, lse), differentiable in q, k, v and
    the sink (no dropout)."""
    return _SinkAttention.apply(q, k, v, sink, alibi_slopes, softmax_scale, causal,
                                window_left, window_right, softcap, deterministic)


def varlen_attention_with_sink(q: Tensor, k: Tensor, v: Tensor, sink: Tensor,
                               cu_seqlens_q: Tensor, cu_seqlens_k: Tensor,
                               seqused_k: Optional[Tensor], alibi_slopes: Optional[Tensor],
                               max_seqlen_q: int, max_seqlen_k: int, softmax_scale: float,
                               causal: bool, window_left: int, window_right: int,
                               softcap: float, deterministic: bool) -> Tuple[Tensor, Tensor]:
    """Packed varlen attention with a learnable sink (h,): (out (t, h, d_v), lse (h, t))."""
    return _SinkVarlenAttention.apply(q, k, v, sink, cu_seqlens_q, cu_seqlens_k, seqused_k,
                                      alibi_slopes, max_seqlen_q, max_seqlen_k, softmax_scale,
                                      causal, window_left, window_right, softcap,
                                      deterministic)


# ---------------------------------------------------------------------------------------------
# FP8 attention (float8_e4m3fn q, k, v with descales): forward only
# ---------------------------------------------------------------------------------------------
def _fp8_fwd_impl(q8: Tensor, k8: Tensor, v8: Tensor, q_descale: Tensor, k_descale: Tensor,
                  v_descale: Tensor, q_block_shift: int, kv_block_shift: int,
                  softmax_scale: float, causal: bool, window_left: int, window_right: int,
                  softcap: float, out_dtype: torch.dtype, v_wgmma: bool = False
                  ) -> Tuple[Tensor, Tensor]:
    """FP8 attention forward: q8 (b, s_q, h, d), k8 (b, s_k, h_k, d), v8 (b, s_k, h_k, d_v)
    float8_e4m3fn (with ``v_wgmma``: (b, s_pad, h_k, d_v) in wgmma key order, as
    fp8_quantize's ``v_wgmma`` writes it); descales float32 in params.Fp8Scales' block form.
    Returns out (b, s_q, h, d_v) in ``out_dtype`` and lse float32 (b, h, s_q), contiguous."""
    params = AttnParams(softmax_scale, causal, window_left, window_right, softcap, None, 0.0, 0)
    scales = Fp8Scales(q_descale, k_descale, v_descale, q_block_shift, kv_block_shift)
    out, lse = _fp8.fp8_forward(q8, k8, v8, scales, params, out_dtype, v_wgmma)
    return _fresh(out, lse)  # type: ignore[return-value]


fp8_fwd = torch.library.custom_op("flashattn::fp8_fwd", _fp8_fwd_impl, mutates_args=())


@fp8_fwd.register_fake
def _fp8_fwd_fake(q8, k8, v8, q_descale, k_descale, v_descale, q_block_shift, kv_block_shift,
                  softmax_scale, causal, window_left, window_right, softcap, out_dtype,
                  v_wgmma=False):
    b, s_q, h, _ = q8.shape
    return (q8.new_empty((b, s_q, h, v8.shape[-1]), dtype=out_dtype),
            q8.new_empty((b, h, s_q), dtype=torch.float32))


def _fp8_varlen_fwd_impl(q8: Tensor, k8: Tensor, v8: Tensor, cu_seqlens_q: Tensor,
                         cu_seqlens_k: Tensor, seqused_k: Optional[Tensor], max_seqlen_q: int,
                         max_seqlen_k: int, q_descale: Tensor, k_descale: Tensor,
                         v_descale: Tensor, softmax_scale: float, causal: bool,
                         window_left: int, window_right: int, softcap: float,
                         out_dtype: torch.dtype) -> Tuple[Tensor, Tensor]:
    """Packed varlen FP8 forward: q8 (total_q, h, d), k8 / v8 (total_k, h_k, d / d_v); descales
    (b, h, 1) / (b, h_k, 1) float32. Returns out (total_q, h, d_v) in ``out_dtype`` and lse
    float32 (h, total_q), contiguous."""
    params = AttnParams(softmax_scale, causal, window_left, window_right, softcap, None, 0.0, 0)
    scales = Fp8Scales(q_descale, k_descale, v_descale, ONE_BLOCK_SHIFT, ONE_BLOCK_SHIFT)
    out, lse = _fp8.fp8_varlen_forward(q8, k8, v8, cu_seqlens_q, cu_seqlens_k, seqused_k,
                                           max_seqlen_q, max_seqlen_k, scales, params,
                                           out_dtype)
    return _fresh(out, lse)  # type: ignore[return-value]


fp8_varlen_fwd = torch.library.custom_op("flashattn::fp8_varlen_fwd", _fp8_varlen_fwd_impl,
                                         mutates_args=())


@fp8_varlen_fwd.register_fake
def _fp8_varlen_fwd_fake(q8, k8, v8, cu_seqlens_q, cu_seqlens_k, seqused_k, max_seqlen_q,
                         max_seqlen_k, q_descale, k_descale, v_descale, softmax_scale, causal,
                         window_left, window_right, softcap, out_dtype):
    total_q, h, _ = q8.shape
    return (q8.new_empty((total_q, h, v8.shape[-1]), dtype=out_dtype),
            q8.new_empty((h, total_q), dtype=torch.float32))


def fp8_attention(*args: Any) -> Tuple[Tensor, Tensor]:
    """``fp8_fwd(*args)`` (the op's argument order), or its body for plain eager tensors."""
    if eager_call(*args[:6]):
        return _fp8_fwd_impl(*args)
    return fp8_fwd(*args)


def fp8_varlen_attention(*args: Any) -> Tuple[Tensor, Tensor]:
    """``fp8_varlen_fwd(*args)``, or its body for plain eager tensors."""
    if eager_call(*args[:6], *args[8:11]):
        return _fp8_varlen_fwd_impl(*args)
    return fp8_varlen_fwd(*args)


__all__ = [
    "attention",
    "eager_call",
    "tracing",
    "attention_with_sink",
    "sink_apply",
    "varlen_attention_with_sink",
    "fp8_attention",
    "fp8_fwd",
    "fp8_varlen_attention",
    "fp8_varlen_fwd",
    "combine",
    "combine_splits",
    "fwd_kvcache",
    "fp8_quantize",
    "fp8_v_wgmma",
    "quantize_fp8",
    "kvcache_attention",
    "fwd",
    "bwd",
    "varlen_attention",
    "varlen_fwd",
    "varlen_bwd",
]
