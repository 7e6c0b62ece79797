"""Recorded calls: one call signature's decisions made once, then replayed.

The one owner of recorded calls: their keys and the cache that holds them, the recorded calls
themselves and the autograd functions that run them. The api's eager fast path
(``api/fastpath.py``: which entry function records what) keys a call once from
:mod:`~flashattn.replay.keys`' pieces (shapes, strides, dtypes, device, alignment, scalars,
settings) and keeps what these factories return; a later call of the same signature runs it,
skipping argument checks, normalisation and :mod:`flashattn.dispatch`'s choices. They are
built from dispatch's own bodies and the backends' recorded-call factories (``*_call``,
declared optional in ``backends/interface.py``, reached through ``dispatch.select``), so a
call decides as the full path would.

    keys.py       what a key holds: tensor_key, the scalar types, the descale and FP8 scalar
                  parts; CallCache (bounded entries, tagged with the settings object)
    autograd.py   the recorded dense and packed calls as autograd functions (dense_recorded,
                  varlen_recorded): the ops' autograd formula over recorded runners
    dense.py      forward_runner, backward_runner, dense_runner, DenseTrainEntry (dense
                  calls, with a gradient to record too)
    varlen.py     VarlenRunner (packed calls, forward and backward)
    kvcache.py    kvcache_runner (a decode step), kvcache_planned / decode_splits
                  (``flashattn.plan_decode``'s run and FA3's get_scheduler_metadata)
    fp8.py        the FP8 calls: Fp8Call (quantize + Hopper forward), Fp8QuantizeCall,
                  Fp8DescaleCall (FA3's descale API, fp8.attention), Fp8VarlenCall
    workspace.py  the per-stream workspace of named regions the FP8 calls share

Layering: below the api and ops, above dispatch; it never imports the api or ops (so the
test whether a call is traced, ``ops.eager_call``, is the api's to make before it keys a
call), and ops never imports it (pyproject.toml's contracts).
"""
