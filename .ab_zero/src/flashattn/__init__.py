"""flashattn: exact attention (the FlashAttention family) for PyTorch, in Triton and Gluon.

Public API mirrors flash-attn 2 (:mod:`flashattn.api`); layers and contracts in
docs/internals.md.
"""
from flashattn.api.backend_override import use_backend
from flashattn.api.checks import checks
from flashattn.api.combine import flash_attn_combine
from flashattn.api.fp8_attention import flash_attn_fp8_func
from flashattn.api.dense import flash_attn_func, flash_attn_kvpacked_func, flash_attn_qkvpacked_func
from flashattn.api.kvcache import flash_attn_with_kvcache
from flashattn.api.plan import DecodePlan, plan_decode
from flashattn.api.varlen import (
    flash_attn_varlen_func,
    flash_attn_varlen_kvpacked_func,
    flash_attn_varlen_qkvpacked_func,
)

# torch.library ops (torch.ops.flashattn.*) and flash-attn's bert_padding helpers, as modules
from flashattn import ops  # noqa: E402,F401
from flashattn import padding  # noqa: E402,F401

__version__ = "0.1.0"
__all__ = [
    "DecodePlan",
    "checks",
    "flash_attn_combine",
    "flash_attn_fp8_func",
    "flash_attn_func",
    "flash_attn_kvpacked_func",
    "flash_attn_qkvpacked_func",
    "flash_attn_varlen_func",
    "flash_attn_varlen_kvpacked_func",
    "flash_attn_varlen_qkvpacked_func",
    "flash_attn_with_kvcache",
    "plan_decode",
    "use_backend",
]
