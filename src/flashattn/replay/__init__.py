"""Recorded calls: one call signature's decisions made once, then replayed.

The api's eager fast path (``api/fastpath.py``) keys a call once (shapes, strides, dtypes,
device, alignment, scalars, settings) and keeps what these factories return; a later call of
the same signature runs it, skipping argument checks, normalisation and :mod:`flashattn.dispatch`'s
choices. They are built from dispatch's own bodies and the backends' recorded-call factories
(``*_call``, declared optional in ``backends/interface.py``), so a call decides as the full path
would.

    dense.py      forward_runner, backward_runner (dense calls, with a gradient to record too)
    varlen.py     VarlenRunner (packed calls, forward and backward)
    kvcache.py    kvcache_runner (a decode step), kvcache_planned / decode_splits
                  (``flashattn.plan_decode``'s run and FA3's get_scheduler_metadata)
    fp8.py        the FP8 calls: Fp8Call (quantize + Hopper forward), Fp8QuantizeCall,
                  Fp8DescaleCall (FA3's descale API, fp8.attention), Fp8VarlenCall
    workspace.py  the per-stream workspace of named regions the FP8 calls share

Layering: below the api and ops, above dispatch; it never imports the api or ops.
"""
