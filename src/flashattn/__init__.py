"""flashattn: exact attention (FlashAttention-2 algorithm) for PyTorch, in Triton.

Public API mirrors flash-attn 2: see :mod:`flashattn.interface`.
"""
from flashattn.interface import (
    flash_attn_func,
    flash_attn_kvpacked_func,
    flash_attn_qkvpacked_func,
)

__all__ = [
    "flash_attn_func",
    "flash_attn_kvpacked_func",
    "flash_attn_qkvpacked_func",
]
__version__ = "0.1.0"
