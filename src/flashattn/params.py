"""The normalised attention parameters, one object below the op boundary.

The api layer validates and normalises the public arguments (flash-attn 2 semantics:
``softmax_scale`` defaulted, window sides past the keys made unbounded, causal folded into
``window_right = 0``, ALiBi slopes as (b, h), the dropout seed drawn); the torch.library ops
take them as flat arguments (op schemas have no structs) and build one :class:`AttnParams` that
dispatch and every backend adapter receive. See docs/internals.md for the meaning of each field.
"""
from __future__ import annotations

from typing import Any, Dict, NamedTuple, Optional

import torch


class AttnParams(NamedTuple):
    """Normalised attention parameters (a NamedTuple: built on every call, ~0.3 us).

    softmax_scale: float, already defaulted to ``head_dim ** -0.5``.
    causal: bool, informational: already folded into ``window_right = 0``.
    window_left, window_right: int, -1 = unbounded (bottom-right aligned).
    softcap: float, 0.0 = off.
    alibi_slopes: float32 Tensor (b, h) (a (h,) input expanded with batch stride 0) or None.
    dropout_p: float in [0, 1).
    philox_seed: int in [0, 2**63), the dropout RNG key (0 when dropout_p == 0).
    deterministic: bool, bitwise-repeatable backward.
    attention_chunk: int, 0 = off, else chunked local attention (FlashAttention-3's
        ``attention_chunk``): a query at key position p sees only keys j with
        ``j // C == floor(p / C)``. The KV-cache kernels take it; dense / varlen calls are
        rewritten into segments by the api (``api/segments.py``) and never carry it.
    alibi_shift: int, 0 = flash-attn's ALiBi: the bias of query row i and key j is
        ``-slope * |i + s_k - s_q + alibi_shift - j|``. Only context parallelism sets it (a
        block of a longer sequence whose query and key positions are offset otherwise than
        the block's bottom-right alignment says); dense calls on the portable and cpu
        backends take it (dispatch keeps such calls off the other routes); the mask is not
        moved by it.
    """

    softmax_scale: float
    causal: bool
    window_left: int
    window_right: int
    softcap: float
    alibi_slopes: Optional[torch.Tensor]
    dropout_p: float
    philox_seed: int
    deterministic: bool = False
    attention_chunk: int = 0
    alibi_shift: int = 0

    @property
    def masked(self) -> bool:
        """Whether a causal / window / chunk mask hides some keys ("local" in FA3's sense)."""
        return self.window_left >= 0 or self.window_right >= 0 or self.attention_chunk > 0

    def kernel_kwargs(self) -> Dict[str, Any]:
        """The keyword arguments of the kernels' wrappers (every field but deterministic and
        attention_chunk; alibi_shift only when set, for the dense wrappers that take it)."""
        kwargs = dict(softmax_scale=self.softmax_scale, causal=self.causal,
                      window_left=self.window_left, window_right=self.window_right,
                      softcap=self.softcap, alibi_slopes=self.alibi_slopes,
                      dropout_p=self.dropout_p, philox_seed=self.philox_seed)
        if self.alibi_shift:
            kwargs["alibi_shift"] = self.alibi_shift
        return kwargs


class Fp8Scales(NamedTuple):
    """The descales of FP8 inputs (the real value is fp8 × descale; FlashAttention-3's
    convention), in the kernels' block form.

    q_descale: float32 (b, h, n_q_blocks); row i of q uses ``[..., min(i >> q_block_shift,
        n_q_blocks - 1)]``.
    k_descale, v_descale: float32 (b, h_k, n_kv_blocks), key j uses ``[..., min(j >>
        kv_block_shift, n_kv_blocks - 1)]``.
    A shift of 31 means one descale per (batch, head) (FA3's API: (b, h_k) descales). In varlen
    calls b is the sequence index and positions are local to the sequence.
    """

    q_descale: torch.Tensor
    k_descale: torch.Tensor
    v_descale: torch.Tensor
    q_block_shift: int
    kv_block_shift: int


ONE_BLOCK_SHIFT = 31  # Fp8Scales: one descale for every position of a (batch, head)

__all__ = ["AttnParams", "Fp8Scales", "ONE_BLOCK_SHIFT"]
