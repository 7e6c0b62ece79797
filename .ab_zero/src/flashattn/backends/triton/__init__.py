"""Portable Triton kernels, one file per job: fwd.py, bwd.py (dense and varlen), decode.py
(split-KV attention against a KV cache), combine.py (merge of splits), rotary.py (rotary + cache
append); shared @triton.jit helpers in prologue.py (each kernel's start: program ids, sequence
bounds, row offsets, LSE bases, TMA views) and mask.py (masks, score mods, block ranges); launch
configurations in config.py; backend.py is the interface dispatch calls. Host-side launching lives in flashattn.runtime."""
