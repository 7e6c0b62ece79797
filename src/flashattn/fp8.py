"""``flashattn.fp8``: FP8 quantization for attention (block scales + incoherent processing).

    from flashattn import fp8
    qkv8 = fp8.quantize(q, k, v, incoherent=True, seed=0)

See :mod:`flashattn.api.fp8`. The FP8 attention kernels are not built yet (issue 18).
"""
from flashattn.api.fp8 import QuantizedQKV, quantize, random_signs
from flashattn.cpu.fp8 import dequantize, hadamard, hadamard_block

__all__ = ["QuantizedQKV", "dequantize", "hadamard", "hadamard_block", "quantize",
           "random_signs"]
