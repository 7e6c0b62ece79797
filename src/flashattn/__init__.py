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
from flashattn.varlen import (  # noqa: E402  (packed variable-length sequences)
    flash_attn_varlen_func,
    flash_attn_varlen_kvpacked_func,
    flash_attn_varlen_qkvpacked_func,
)

__all__ += ["flash_attn_varlen_func", "flash_attn_varlen_kvpacked_func",
            "flash_attn_varlen_qkvpacked_func"]
__version__ = "0.1.0"
from flashattn.kvcache import flash_attn_combine, flash_attn_with_kvcache  # noqa: E402  (KV cache)

__all__ += ["flash_attn_with_kvcache", "flash_attn_combine"]
# torch.library ops (torch.ops.flashattn.*) and flash-attn's bert_padding helpers, as modules
from flashattn import ops, padding  # noqa: E402,F401
