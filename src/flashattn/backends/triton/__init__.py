"""Portable Triton kernels, one file per job: fwd.py, bwd.py (dense and varlen), decode.py
(split-KV attention against a KV cache), combine.py (merge of splits), rotary.py (rotary + cache
append); shared @triton.jit helpers in mask.py; launch configurations in config.py;
backend.py is the interface dispatch calls. Host-side launching lives in flashattn.runtime."""
