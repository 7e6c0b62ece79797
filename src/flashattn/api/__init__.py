"""The public functions: flash-attn 2 signatures, validation, normalisation (no tensor math
beyond views); everything below runs through the torch.library ops of :mod:`flashattn.ops`.

    dense.py     flash_attn_func, flash_attn_qkvpacked_func, flash_attn_kvpacked_func
    varlen.py    flash_attn_varlen_func and its packed variants
    kvcache.py   flash_attn_with_kvcache
    combine.py   flash_attn_combine
    fp8.py       flashattn.fp8.quantize (block scales + incoherent processing)
    fp8_attention.py   FP8 inputs of flash_attn_func / varlen (FA3's descales),
                 flashattn.fp8.attention, flash_attn_fp8_func
    params.py    normalisation, once: softmax scale, window rule, ALiBi, dropout seed
    validation.py, kvcache_validation.py   argument checks (errors name the argument)
    padding.py   flash-attn's bert_padding helpers (unpad_input / pad_input ...)
    backend.py   use_backend: force a backend at run time
"""
