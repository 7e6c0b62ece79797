"""Dispatch: which backend runs a call, and the ops' bodies that run it (the backends and
their declared interface live in :mod:`flashattn.backends`).

    select.py     which backend covers which call, for every op: the one place that decides
    dense.py      dense forward / backward (+ sinks): empty shapes, few query rows on the
                  decode kernel, the rest on the selected backend
    varlen.py     packed forward / backward, paged varlen
    kvcache.py    ``flash_attn_with_kvcache``'s body: metadata value checks, append, attend
    fp8.py        the FP8 quantize pass and the dense / packed FP8 forwards
    merge.py      ops on finished (out, lse): split combine, learnable sinks

:mod:`flashattn.ops` calls the bodies (one module per op family); the recorded calls built on
the same decisions live one layer up, in :mod:`flashattn.replay`. Nothing here holds state
across calls except the backend modules once imported and fp8's per-signature V-order answer.
"""
