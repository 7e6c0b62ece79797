"""``flashattn.fp8``: FP8 attention (FlashAttention-3's block quantization + incoherent
processing).

    from flashattn import fp8
    qkv8 = fp8.quantize(q, k, v, incoherent=True, seed=0)   # one fused pass on the GPU
    out = fp8.attention(qkv8, causal=True)                  # bf16 out
    out = fp8.flash_attn_fp8_func(q, k, v, causal=True)     # both in one call

See :mod:`flashattn.api.fp8_quantize` (quantize) and :mod:`flashattn.api.fp8_attention`.
"""
from flashattn.api.fp8_quantize import QuantizedQKV, quantize, random_signs
from flashattn.api.fp8_attention import attention_quantized as attention
from flashattn.api.fp8_attention import flash_attn_fp8_func
from flashattn.fp8_format import dequantize, hadamard, hadamard_block

__all__ = ["QuantizedQKV", "attention", "dequantize", "flash_attn_fp8_func", "hadamard",
           "hadamard_block", "quantize", "random_signs"]
