"""``flashattn.fa3``: FlashAttention-3's interface (``flash_attn_interface``) over flashattn's
kernels. See :mod:`flashattn.api.fa3_interface` for what is supported: among it multi-head
latent attention (``qv``, headdim_v up to 512) in ``flash_attn_with_kvcache`` and, forward
only as in FA3, in ``flash_attn_func`` / ``flash_attn_varlen_func``.

    import flashattn.fa3 as flash_attn_interface
"""
from flashattn.api.fa3_interface import (flash_attn_combine, flash_attn_func,
                                         flash_attn_varlen_func, flash_attn_with_kvcache,
                                         get_scheduler_metadata)

__all__ = ["flash_attn_combine", "flash_attn_func", "flash_attn_varlen_func",
           "flash_attn_with_kvcache", "get_scheduler_metadata"]
