"""The multi-process cases of flashattn.parallel (run by tests/parallel/test_parallel.py on
gloo / CPU, and test_parallel_gpu.py on NCCL / GPUs). Each runs on every rank of the default
group with the same seed, builds the full inputs, shards them, runs the parallel call and
checks this rank's shard against the float64 oracle on the whole sequence (flash-attn's
rule: 2x PyTorch's own low-precision error for out and lse, 3x for the gradients)."""
from __future__ import annotations

import math
from typing import Optional, Tuple

import torch
import torch.distributed as dist

import flashattn.parallel as fp
from flashattn.reference import attention_ref
from tests.accuracy import assert_close_rule


def _device() -> torch.device:
    if dist.get_backend() == "nccl":
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def _inputs(b, s, h, hk, d, dtype, dv=None):
    dev = _device()
    g = torch.Generator(device="cpu").manual_seed(torch.initial_seed())
    mk = lambda *shape: torch.randn(*shape, generator=g, dtype=torch.float32).to(dev, dtype)
    q, k, v = mk(b, s, h, d), mk(b, s, hk, d), mk(b, s, hk, dv or d)
    dout = mk(b, s, h, dv or d)
    return q, k, v, dout


def _oracle(q, k, v, dout, **kw):
    """(out, lse, grads) in float64 and in the inputs' precision (the rule's baseline)."""
    x64 = [x.detach().double().requires_grad_() for x in (q, k, v)]
    out, lse = attention_ref(*x64, **kw)
    grads = torch.autograd.grad(out, x64, dout.double())
    xlp = [x.detach().clone().requires_grad_() for x in (q, k, v)]
    out_lp, lse_lp = attention_ref(*xlp, upcast=False, **kw)
    grads_lp = torch.autograd.grad(out_lp, xlp, dout)
    return (out, lse, grads), (out_lp, lse_lp, grads_lp)


def _check(got, ref, lp, shard, names=("out", "lse", "dq", "dk", "dv"), lse_shard=None,
           merged=False):
    """flash-attn's rule for out, lse and the gradients. ``merged``: out is a ring's, whose
    16-bit output is rounded twice, once per key block by the kernel and once by the lse merge
    (as ring-flash-attention's is), so its bound holds half a unit in the last place more at
    the output's magnitude (one seed of the 2-rank varlen ring in bf16 was 0.75 of a unit off,
    against 0.35 for the one-GPU oracle; benchmarks/NOTES.md 2026-11-28)."""
    out, lse, grads = got
    ref_out, ref_lse, ref_grads = ref
    lp_out, lp_lse, lp_grads = lp
    atol = 1e-5
    top = ref_out.abs().max().item()
    if merged and out.dtype in (torch.bfloat16, torch.float16) and top > 0:
        # a unit in the last place at |out| <= top: eps * 2^floor(log2 top)
        atol += 0.5 * torch.finfo(out.dtype).eps * 2.0 ** math.floor(math.log2(top))
    assert_close_rule(out, shard(ref_out), shard(lp_out), atol=atol, name=names[0])
    if lse is not None:
        ls = lse_shard or shard
        assert_close_rule(lse, ls(ref_lse), ls(lp_lse), name=names[1])
    for name, g, r, l in zip(names[2:], grads, ref_grads, lp_grads):
        assert_close_rule(g, shard(r), shard(l), factor=3.0, name=name)


def ring_dense(rank, world, *, b=2, s_per_rank=8, h=4, hk=2, d=16, dtype=torch.float32,
               causal=True, window_size=(-1, -1), softcap=0.0, layout="zigzag",
               alibi=False, deterministic=False):
    s = s_per_rank * world
    q, k, v, dout = _inputs(b, s, h, hk, d, dtype)
    slopes = (torch.rand(h, generator=torch.Generator().manual_seed(1)) * 0.5).to(q.device) \
        if alibi else None
    kw = dict(causal=causal, window_size=window_size, softcap=softcap, alibi_slopes=slopes)
    ref, lp = _oracle(q, k, v, dout, **kw)
    shard_fn = fp.zigzag_shard if layout == "zigzag" else fp.contiguous_shard
    shard = lambda x, dim=1: shard_fn(x.to(q.device), None, dim)
    local = [shard(x).requires_grad_() for x in (q, k, v)]
    out, lse, _ = fp.ring_flash_attn_func(*local, causal=causal, window_size=window_size,
                                          softcap=softcap, alibi_slopes=slopes,
                                          deterministic=deterministic, layout=layout,
                                          return_attn_probs=True)
    grads = torch.autograd.grad(out, local, shard(dout))
    # every collective first, the rank-local checks after: a rank that fails a check must not
    # leave the others waiting in a collective
    if deterministic:
        local2 = [x.detach().clone().requires_grad_() for x in local]
        out2 = fp.ring_flash_attn_func(*local2, causal=causal, window_size=window_size,
                                       softcap=softcap, alibi_slopes=slopes,
                                       deterministic=True, layout=layout)
        grads2 = torch.autograd.grad(out2, local2, shard(dout))
    unshard = fp.zigzag_unshard if layout == "zigzag" else fp.contiguous_unshard
    whole = unshard(local[0].detach(), None, 1)
    _check((out, lse, grads), ref, lp, shard, lse_shard=lambda x: shard(x, 2), merged=world > 1)
    if deterministic:
        assert torch.equal(out, out2)
        for g1, g2 in zip(grads, grads2):
            assert torch.equal(g1, g2)
    assert torch.equal(whole, q)  # the unshard helper gives back the whole tensor


def _varlen_inputs(lengths, h, hk, d, dtype):
    cu = torch.tensor([0] + list(lengths), dtype=torch.int64).cumsum(0).to(torch.int32)
    total = int(cu[-1])
    q, k, v, dout = _inputs(1, total, h, hk, d, dtype)
    return [x[0] for x in (q, k, v, dout)], cu


def _varlen_oracle(q, k, v, dout, cu, alibi_slopes=None, **kw):
    """Per-document oracle, packed back: ((out, lse, grads), (lowprec...)). ``alibi_slopes``
    (nheads,) or (n_docs, nheads): document i's are row i of the latter."""
    bounds = cu.tolist()
    res = []
    for upcast in (True, False):
        xs = [(x.detach().double() if upcast else x.detach().clone()).requires_grad_()
              for x in (q, k, v)]
        outs, lses = [], []
        for i, (a, e) in enumerate(zip(bounds[:-1], bounds[1:])):
            if a == e:  # an empty document: no rows
                continue
            if alibi_slopes is not None:
                kw["alibi_slopes"] = (alibi_slopes if alibi_slopes.dim() == 1
                                      else alibi_slopes[i:i + 1])
            o, l = attention_ref(*(x[a:e].unsqueeze(0) for x in xs), upcast=upcast, **kw)
            outs.append(o[0])
            lses.append(l[0])
        out, lse = torch.cat(outs), torch.cat(lses, dim=1)
        grads = torch.autograd.grad(out, xs, dout.double() if upcast else dout)
        res.append((out, lse, grads))
    return res


def ring_varlen(rank, world, *, lengths=(8, 16, 24), h=4, hk=2, d=16, dtype=torch.float32,
                causal=True, softcap=0.0, window_size=(-1, -1), alibi=None,
                deterministic=False):
    """``lengths``: the documents' local lengths (even: global length = world * local);
    ``alibi``: None, "heads" (one (nheads,) vector) or "docs" ((n_docs, nheads))."""
    lengths = [n * world for n in lengths]
    (q, k, v, dout), cu = _varlen_inputs(lengths, h, hk, d, dtype)
    g = torch.Generator().manual_seed(3)
    slopes = (None if alibi is None else
              (torch.rand(*((h,) if alibi == "heads" else (len(lengths), h)), generator=g)
               * 0.5).to(q.device))
    kw = dict(causal=causal, softcap=softcap, window_size=window_size, alibi_slopes=slopes,
              deterministic=deterministic)
    ref, lp = _varlen_oracle(q, k, v, dout, cu, causal=causal, softcap=softcap,
                             window_size=window_size, alibi_slopes=slopes)
    cu_d = cu.to(q.device)
    shard = lambda x, dim=0: (fp.zigzag_varlen_shard(x.to(q.device), cu_d) if dim == 0 else
                              fp.zigzag_varlen_shard(x.transpose(0, 1).to(q.device),
                                                     cu_d).transpose(0, 1))
    local = [shard(x).requires_grad_() for x in (q, k, v)]
    out, lse, _ = fp.ring_flash_attn_varlen_func(*local, cu_d, max(lengths),
                                                 return_attn_probs=True, **kw)
    grads = torch.autograd.grad(out, local, shard(dout))
    if deterministic:
        local2 = [x.detach().clone().requires_grad_() for x in local]
        out2 = fp.ring_flash_attn_varlen_func(*local2, cu_d, max(lengths), **kw)
        grads2 = torch.autograd.grad(out2, local2, shard(dout))
    whole = fp.zigzag_varlen_unshard(local[0].detach(), cu_d)  # collectives before checks
    _check((out, lse, grads), ref, lp, shard, lse_shard=lambda x: shard(x, 1),
           merged=world > 1)
    if deterministic:
        assert torch.equal(out, out2)
        for g1, g2 in zip(grads, grads2):
            assert torch.equal(g1, g2)
    assert torch.equal(whole, q)


def ulysses_dense(rank, world, *, b=2, s_per_rank=6, hk=None, d=16, dtype=torch.float32,
                  causal=True, window_size=(-1, -1), softcap=0.0, alibi=False):
    """2 * world query heads; world KV heads unless ``hk`` (1: replicated to every rank)."""
    s = s_per_rank * world
    h, hk = 2 * world, hk or world
    q, k, v, dout = _inputs(b, s, h, hk, d, dtype)
    slopes = (torch.rand(h, generator=torch.Generator().manual_seed(1)) * 0.5).to(q.device) \
        if alibi else None
    kw = dict(causal=causal, window_size=window_size, softcap=softcap, alibi_slopes=slopes)
    ref, lp = _oracle(q, k, v, dout, **kw)
    shard = lambda x, dim=1: fp.contiguous_shard(x.to(q.device), None, dim)
    local = [shard(x).requires_grad_() for x in (q, k, v)]
    out, lse, _ = fp.ulysses_flash_attn_func(*local, causal=causal, window_size=window_size,
                                             softcap=softcap, alibi_slopes=slopes,
                                             return_attn_probs=True)
    grads = torch.autograd.grad(out, local, shard(dout))
    _check((out, lse, grads), ref, lp, shard, lse_shard=lambda x: shard(x, 2))


def ulysses_varlen(rank, world, *, lengths=(5, 11, 8), hk=None, d=16, dtype=torch.float32,
                   causal=True, window_size=(-1, -1)):
    h, hk = 2 * world, hk or world
    lengths = list(lengths)
    lengths[-1] += (-sum(lengths)) % world
    (q, k, v, dout), cu = _varlen_inputs(lengths, h, hk, d, dtype)
    ref, lp = _varlen_oracle(q, k, v, dout, cu, causal=causal, window_size=window_size)
    shard = lambda x, dim=0: fp.contiguous_shard(x.to(q.device), None, dim)
    local = [shard(x).requires_grad_() for x in (q, k, v)]
    out, lse, _ = fp.ulysses_flash_attn_varlen_func(*local, cu.to(q.device), max(lengths),
                                                    causal=causal, window_size=window_size,
                                                    return_attn_probs=True)
    grads = torch.autograd.grad(out, local, shard(dout))
    _check((out, lse, grads), ref, lp, shard, lse_shard=lambda x: shard(x, 1))


def usp(rank, world, *, ulysses=2, b=1, s_per_rank=4, h=4, hk=2, d=16, dtype=torch.float32,
        causal=True, window_size=(-1, -1), alibi=False):
    from torch.distributed.device_mesh import init_device_mesh
    mesh = init_device_mesh(_device().type, (ulysses, world // ulysses),
                            mesh_dim_names=("ulysses", "ring"))
    s = s_per_rank * world
    q, k, v, dout = _inputs(b, s, h, hk, d, dtype)
    slopes = (torch.rand(b, h, generator=torch.Generator().manual_seed(2)) * 0.5).to(q.device) \
        if alibi else None
    ref, lp = _oracle(q, k, v, dout, causal=causal, window_size=window_size,
                      alibi_slopes=slopes)
    shard = lambda x, dim=1: fp.usp_shard(x.to(q.device), mesh, dim)
    local = [shard(x).requires_grad_() for x in (q, k, v)]
    out, lse, _ = fp.usp_flash_attn_func(*local, mesh=mesh, causal=causal,
                                         window_size=window_size, alibi_slopes=slopes,
                                         return_attn_probs=True)
    grads = torch.autograd.grad(out, local, shard(dout))
    whole = fp.usp_unshard(local[0].detach(), mesh, 1)  # collectives before checks
    _check((out, lse, grads), ref, lp, shard, lse_shard=lambda x: shard(x, 2), merged=True)
    assert torch.equal(whole, q)


def _expect_value_error(fn, words):
    try:
        fn()
    except ValueError as e:
        for w in words:
            assert w in str(e), f"{w!r} not in {e}"
    else:
        raise AssertionError(f"no ValueError (expected one naming {words})")


def bad_inputs(rank, world):
    q, k, v, _ = _inputs(1, 8 * world, 4, 2, 16, torch.float32)
    local = [fp.zigzag_shard(x) for x in (q, k, v)]
    if world > 1:  # a local length that differs on the last rank: every rank raises
        cut = [x[:, :-2] if rank == world - 1 else x for x in local]
        _expect_value_error(lambda: fp.ring_flash_attn_func(*cut, causal=True),
                            ["local sequence length", "differs between ranks"])
        heads = [x[:, :, :2] if rank == 0 else x for x in local[:1]] + local[1:]
        _expect_value_error(lambda: fp.ring_flash_attn_func(*heads), ["differs between ranks"])
    odd = [x[:, :-1] for x in local]
    _expect_value_error(lambda: fp.ring_flash_attn_func(*odd, causal=True), ["q", "odd"])
    _expect_value_error(lambda: fp.zigzag_shard(q[:, :-1]), ["x", "divisible"])
    _expect_value_error(lambda: fp.ring_flash_attn_func(*local, layout="stripe"), ["layout"])
    cu = torch.tensor([0, 8 * world], dtype=torch.int32, device=q.device)
    flat = [x[0] for x in local]
    bad_cu = torch.tensor([0, 8 * world + 2 * world], dtype=torch.int32, device=q.device)
    _expect_value_error(lambda: fp.ring_flash_attn_varlen_func(*flat, bad_cu, 10 * world),
                        ["cu_seqlens", "global token count"])
    _expect_value_error(lambda: fp.zigzag_varlen_shard(q[0], torch.tensor(
        [0, 2 * world + 1, 8 * world], dtype=torch.int32)), ["cu_seqlens", "divisible"])
    fp.ring_flash_attn_varlen_func(*flat, cu, 8 * world, causal=True)  # the good call runs
    if world > 1:
        three = [local[0][:, :, :3], local[1][:, :, :1], local[2][:, :, :1]]
        bad = lambda: fp.ulysses_flash_attn_func(*three)
        if 3 % world:
            _expect_value_error(bad, ["q", "nheads", "divisible"])


def training_loop(rank, world, *, steps=3):
    """A tiny Llama trained with its sequence split over the group (the example script):
    loss and every parameter gradient equal the one-process run at every step."""
    from examples.train_context_parallel import train

    history = train(rank, world, steps=steps, seq_per_rank=16)
    if rank == 0:
        for row in history:
            assert row["loss_diff"] <= 1e-5 * max(1.0, row["loss"]), row
            assert row["grad_rel_diff"] <= 1e-4, row
        assert history[-1]["loss"] < history[0]["loss"] + 1.0  # it trains, it does not blow up
