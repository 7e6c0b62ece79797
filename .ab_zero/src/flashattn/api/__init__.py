"""The public functions: flash-attn 2 signatures, validation, normalisation (no tensor math
beyond views); everything below runs through the torch.library ops of :mod:`flashattn.ops`.

    dense.py     flash_attn_func, flash_attn_qkvpacked_func, flash_attn_kvpacked_func
    varlen.py    flash_attn_varlen_func and its packed variants
    kvcache.py   flash_attn_with_kvcache
    combine.py   flash_attn_combine
    plan.py      plan_decode / DecodePlan (a decode step planned once)
    fa3_interface.py   FlashAttention-3's signatures (``flashattn.fa3``)
    fp8_quantize.py  flashattn.fp8.quantize (block scales + incoherent processing)
    fp8_attention.py   FP8 inputs of flash_attn_func / varlen (FA3's descales),
                 flashattn.fp8.attention, flash_attn_fp8_func
    normalise.py normalisation, once: softmax scale, window rule, ALiBi, dropout seed
    validation.py, kvcache_validation.py   argument checks (errors name the argument)
    checks.py    the checked mode (``flashattn.checks``)
    out.py       the out= keyword of every public function
    segments.py, chunked.py   attention_chunk and seqused_q as a re-packed varlen call
    fastpath.py  the eager fast path: per entry function, its key (from flashattn.replay.keys'
                 pieces), its cache and what its first call records (flashattn.replay)
    bert_padding.py   flash-attn's bert_padding helpers (unpad_input / pad_input ...),
                 public as ``flashattn.padding``
    backend_override.py   use_backend: force a backend at run time

The module names differ from the public top-level ones (``flashattn.fa3``, ``flashattn.fp8``,
``flashattn.padding``) and from the leaf ``flashattn.params`` so that a name says one thing in
the package.
"""
