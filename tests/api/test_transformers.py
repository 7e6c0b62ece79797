"""Hugging Face transformers backend: attn_implementation="fa_triton" (fa_hf.NAME).

Tiny randomly initialised Llama (GQA), Mistral (sliding window) and Gemma-2 (softcap,
sliding layers, query_pre_attn_scalar scaling) models built with ``from_config`` (no
download). Each is compared with the same weights under transformers' own attention
("sdpa"; "eager" for Gemma-2, whose softcap sdpa lacks): logits and parameter gradients on
padded batches (left and right padding), greedy ``generate()`` with the KV cache and
left-padded prompts, packed sequences (position_ids / cu_seq_lens kwargs), dropout in
training, and the varlen fallback. The configs use a large init range so that windows,
softcap and scaling change the result visibly.
"""
from __future__ import annotations

import copy

import pytest
import torch

transformers = pytest.importorskip("transformers")

import flashattn  # noqa: E402
from tests.accuracy import assert_close_rule  # noqa: E402
import flashattn.integrations.transformers as fa_hf  # noqa: E402
from flashattn.api import varlen as varlen_mod  # noqa: E402
from tests.settings import set_env

fa_hf.register()

_COMMON = dict(vocab_size=96, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
               num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
               initializer_range=0.1)


def _config(family: str):
    if family == "llama":
        return transformers.LlamaConfig(**_COMMON)
    if family == "mistral":
        return transformers.MistralConfig(**_COMMON, sliding_window=4)
    if family == "gpt_oss":  # learnable sinks (s_aux), alternating sliding / full layers, MoE
        return transformers.GptOssConfig(**_COMMON, head_dim=16, num_local_experts=4,
                                         num_experts_per_tok=2, sliding_window=4,
                                         rope_scaling=None)
    return transformers.Gemma2Config(**_COMMON, head_dim=16, sliding_window=4,
                                     attn_logit_softcapping=2.0, final_logit_softcapping=30.0,
                                     query_pre_attn_scalar=24)


def _reference_impl(family: str) -> str:
    return "eager" if family in ("gemma2", "gpt_oss") else "sdpa"


def _pair(family: str, device: str = "cpu", dtype=torch.float32):
    """(reference model, flashattn model) with identical weights, eval mode. Each model gets
    its own config copy: from_config writes the attention choice into the config."""
    cfg = _config(family)
    ref = transformers.AutoModelForCausalLM.from_config(
        copy.deepcopy(cfg), attn_implementation=_reference_impl(family), dtype=dtype)
    if family == "gpt_oss":  # sinks large enough to change the softmax visibly
        with torch.no_grad():
            for name, p in ref.named_parameters():
                if name.endswith("sinks"):
                    p.copy_(torch.randn(p.shape) * 2.0)
    ours = transformers.AutoModelForCausalLM.from_config(
        copy.deepcopy(cfg), attn_implementation=fa_hf.NAME, dtype=dtype)
    ours.load_state_dict(ref.state_dict())
    assert ours.config._attn_implementation == fa_hf.NAME
    return ref.to(device).eval(), ours.to(device).eval()


def _padding_mask(lengths, seqlen, left):
    pos = torch.arange(seqlen).unsqueeze(0)
    lens = torch.tensor(lengths).unsqueeze(1)
    return ((pos >= seqlen - lens) if left else (pos < lens)).long()


def _logits_and_grads(model, ids, mask, weight, **kwargs):
    """Logits of the kept tokens (b * s rows when mask is None) and the parameter gradients
    of ``sum(logits[kept] * weight)``."""
    model.zero_grad(set_to_none=True)
    logits = model(ids, attention_mask=mask, **kwargs).logits
    keep = mask.bool() if mask is not None else torch.ones(ids.shape, dtype=torch.bool)
    (logits[keep] * weight).sum().backward()
    grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
    return logits.detach()[keep], grads


def _exact_logits_and_grads(model64, ids, mask, weight):
    """The same in float64 with every row's real tokens run alone (no padding, so no masked
    rows; positions as in the padded batch), gradients summed over rows."""
    model64.zero_grad(set_to_none=True)
    keep = mask.bool() if mask is not None else torch.ones(ids.shape, dtype=torch.bool)
    logits, start = [], 0
    for row in range(ids.shape[0]):
        real = keep[row].nonzero().flatten()
        out = model64(ids[row:row + 1, real], position_ids=real.unsqueeze(0)).logits[0]
        (out * weight[start:start + len(real)]).sum().backward()
        logits.append(out.detach())
        start += len(real)
    grads = {n: p.grad.clone() for n, p in model64.named_parameters() if p.grad is not None}
    return torch.cat(logits), grads


@pytest.mark.parametrize("family", ["llama", "mistral", "gemma2", "gpt_oss"])
def test_logits_and_grads_match_reference_with_padding(family):
    """flash-attn's accuracy rule against the reference implementation run in float64 (each
    row's real tokens alone): the fp32 flashattn model's error is at most 2x (logits) / 3x
    (gradients) the error of the reference implementation in fp32 on the padded batch."""
    ref, ours = _pair(family)
    ref64 = copy.deepcopy(ref).double()
    seqlen = 10
    ids = torch.randint(0, 96, (3, seqlen))
    for mask in (_padding_mask([10, 6, 8], seqlen, left=False),
                 _padding_mask([10, 6, 8], seqlen, left=True),
                 None):  # no padding: the dense path (attention_mask None inside the model)
        n_keep = int(mask.sum()) if mask is not None else ids.numel()
        weight = torch.randn(n_keep, 96, dtype=torch.float64)
        exact = _exact_logits_and_grads(ref64, ids, mask, weight)
        lowprec = _logits_and_grads(ref, ids, mask, weight.float())
        got = _logits_and_grads(ours, ids, mask, weight.float())
        assert_close_rule(got[0], exact[0], lowprec[0], factor=2.0, name="logits")
        assert got[1].keys() == exact[1].keys()
        for name, g in got[1].items():
            assert_close_rule(g, exact[1][name], lowprec[1][name], factor=3.0, name=name)


@pytest.mark.parametrize("family", ["llama", "mistral", "gemma2"])
def test_greedy_generate_with_kv_cache_matches(family):
    """Left-padded prompts, then one token at a time from the KV cache: the sliding window
    (4) is shorter than prompt + new tokens, so cached decoding exercises it."""
    ref, ours = _pair(family)
    ids = torch.randint(3, 96, (2, 7))
    mask = _padding_mask([7, 4], 7, left=True)
    kwargs = dict(attention_mask=mask, max_new_tokens=6, do_sample=False, pad_token_id=0)
    with torch.no_grad():
        expected = ref.generate(ids, **kwargs)
        got = ours.generate(ids, **kwargs)
    assert got.tolist() == expected.tolist()


def test_packed_sequences_match_separate_sequences():
    """Three sequences packed in one row: position_ids restarts and explicit cu_seq_lens kwargs
    (DataCollatorWithFlattening) both keep the sequences apart (and the window per sequence)."""
    ref, ours = _pair("mistral")
    lengths = [3, 6, 4]
    seqs = [torch.randint(0, 96, (1, n)) for n in lengths]
    ids = torch.cat(seqs, dim=1)
    position_ids = torch.cat([torch.arange(n) for n in lengths]).unsqueeze(0)
    cu = torch.tensor([0, 3, 9, 13], dtype=torch.int32)
    with torch.no_grad():
        expected = torch.cat([ref(s).logits for s in seqs], dim=1)
        by_positions = ours(ids, position_ids=position_ids).logits
        by_cu = ours(ids, position_ids=position_ids, cu_seq_lens_q=cu, cu_seq_lens_k=cu,
                     max_length_q=6, max_length_k=6).logits
    # (transformers' own sdpa path does not separate packed sequences for Mistral's
    # sliding-window mask in 4.57, so the reference is each sequence run on its own)
    for got in (by_positions, by_cu):
        torch.testing.assert_close(got, expected, rtol=1e-4, atol=2e-5)


def test_dropout_in_training_follows_the_seed(monkeypatch):
    cfg = _config("llama")
    cfg.attention_dropout = 0.3
    model = transformers.AutoModelForCausalLM.from_config(cfg, attn_implementation=fa_hf.NAME)
    seen = []
    real = flashattn.api.dense.flash_attn_func

    def spy(*args, **kwargs):
        seen.append(kwargs["dropout_p"])
        return real(*args, **kwargs)

    monkeypatch.setattr(fa_hf, "flash_attn_func", spy)
    ids = torch.randint(0, 96, (2, 8))
    model.train()
    torch.manual_seed(3)
    a = model(ids).logits
    torch.manual_seed(3)
    b = model(ids).logits
    c = model(ids).logits
    model.eval()
    d = model(ids).logits
    assert seen == [0.3] * 6 + [0.0] * 2
    assert torch.equal(a, b) and not torch.allclose(a, c) and not torch.allclose(a, d)
    a.sum().backward()
    assert all(torch.isfinite(p.grad).all() for p in model.parameters() if p.grad is not None)


def test_varlen_path_is_used_and_fallback_is_exact(monkeypatch):
    """Padding goes through flashattn.api.varlen.flash_attn_varlen_func (looked up at call time);
    without it the exact per-sequence fallback gives the same logits."""
    _, ours = _pair("llama")
    ids = torch.randint(0, 96, (3, 9))
    mask = _padding_mask([9, 5, 7], 9, left=False)
    calls = []
    real = varlen_mod.flash_attn_varlen_func

    def spy(*args, **kwargs):
        calls.append(1)
        return real(*args, **kwargs)

    monkeypatch.setattr(varlen_mod, "flash_attn_varlen_func", spy)
    with torch.no_grad():
        with_varlen = ours(ids, attention_mask=mask).logits
    assert len(calls) == ours.config.num_hidden_layers
    monkeypatch.setattr(fa_hf, "_varlen_function", lambda: None)
    with torch.no_grad():
        fallback = ours(ids, attention_mask=mask).logits
    keep = mask.bool()
    # two exact fp32 algorithms (the chunked varlen path, PyTorch's CPU flash kernel per
    # sequence) round differently: unseeded ids gave a 1.2e-6 difference once (CI, 2026-11-24)
    torch.testing.assert_close(fallback[keep], with_varlen[keep], rtol=1e-4, atol=1e-5)


def test_compiled_model_fullgraph():
    """A whole Llama forward + backward under torch.compile(fullgraph=True) on the flashattn
    ops (no padding, no cache), equal to eager."""
    import torch._dynamo

    _, ours = _pair("llama")
    ids = torch.randint(0, 96, (2, 9))
    torch._dynamo.reset()
    compiled = torch.compile(ours, fullgraph=True, backend="aot_eager")
    weight = torch.randn(ids.numel(), 96)
    got = _logits_and_grads(compiled, ids, None, weight, use_cache=False)
    expected = _logits_and_grads(ours, ids, None, weight, use_cache=False)
    torch._dynamo.reset()
    torch.testing.assert_close(got[0], expected[0], rtol=1e-5, atol=1e-6)
    assert len(got[1]) == len(expected[1])
    for name, g in got[1].items():
        name = name.removeprefix("_orig_mod.")  # the compiled wrapper's parameter names
        torch.testing.assert_close(g, expected[1][name], rtol=1e-5, atol=1e-6, msg=name)


def test_register_name_rules():
    """The default name works on every supported transformers; on releases that reserve
    names containing "flash" (5.x) such a name is refused with a clear error, on 4.x the
    legacy alias "flashattn" is registered too."""
    from transformers import AttentionInterface

    assert fa_hf.register() == fa_hf.NAME == "fa_triton"
    assert "flash" not in fa_hf.NAME
    assert AttentionInterface._global_mapping[fa_hf.NAME] is fa_hf.attention_forward
    if fa_hf._flash_in_name_is_reserved():
        with pytest.raises(ValueError, match="name='my_flash'"):
            fa_hf.register("my_flash")
    else:
        assert AttentionInterface._global_mapping[fa_hf.LEGACY_NAME] is fa_hf.attention_forward


def test_unsupported_inputs_raise_clear_errors():
    _, ours = _pair("llama")
    attn = ours.model.layers[0].self_attn
    q = torch.randn(1, 4, 5, 16)
    k = v = torch.randn(1, 2, 5, 16)
    with pytest.raises(ValueError, match="2D padding mask"):
        fa_hf.attention_forward(attn, q, k, v, torch.ones(1, 1, 5, 5, dtype=torch.bool))



def test_attention_sinks_s_aux():
    """gpt-oss's sinks reach flashattn as learnable_sink: one extra logit per head in the
    softmax denominator (the eager formula: softmax over [scores, sink], sink column dropped)."""
    _, ours = _pair("llama")
    attn = ours.model.layers[0].self_attn
    torch.manual_seed(0)
    q = torch.randn(1, 4, 5, 16)
    k = v = torch.randn(1, 4, 5, 16)
    sinks = torch.randn(4)
    out, _ = fa_hf.attention_forward(attn, q, k, v, None, s_aux=sinks, scaling=0.25)
    scores = (q @ k.transpose(-1, -2)).double() * 0.25
    scores = scores.masked_fill(torch.ones(5, 5).triu(1).bool(), float("-inf"))
    full = torch.cat([scores, sinks.double().view(1, 4, 1, 1).expand(1, 4, 5, 1)], dim=-1)
    probs = torch.softmax(full, dim=-1)[..., :-1]
    ref = (probs @ v.double()).transpose(1, 2)
    torch.testing.assert_close(out.double(), ref, atol=1e-5, rtol=1e-5)


@pytest.mark.gpu
@pytest.mark.parametrize("family", ["llama", "mistral", "gemma2"])
def test_models_on_gpu_bf16(family, monkeypatch):
    """bf16 on the GPU: logits close to the reference at bf16 resolution, generate agrees."""
    set_env(monkeypatch, FLASHATTN_AUTOTUNE="0")
    torch.manual_seed(0)
    ref, ours = _pair(family, device="cuda", dtype=torch.bfloat16)
    ids = torch.randint(3, 96, (4, 200), device="cuda")
    mask = _padding_mask([200, 120, 77, 199], 200, left=True).cuda()
    with torch.no_grad():
        ref_logits = ref(ids, attention_mask=mask).logits.float()
        logits = ours(ids, attention_mask=mask).logits.float()
        keep = mask.bool()
        scale = ref_logits[keep].abs().max()
        assert (logits[keep] - ref_logits[keep]).abs().max() <= 0.05 * scale
        kwargs = dict(attention_mask=mask[:, -16:], max_new_tokens=8, do_sample=False,
                      pad_token_id=0)
        # fp32 models for the token comparison: bf16 argmax ties would make it flaky
        ref32, ours32 = _pair(family, device="cuda", dtype=torch.float32)
        assert (ours32.generate(ids[:, -16:], **kwargs).tolist()
                == ref32.generate(ids[:, -16:], **kwargs).tolist())


def test_left_padded_decode_step_takes_the_kvcache_kernel(monkeypatch):
    """One new token against a left-padded cache runs the decode kernel with cache_leftpad
    (no packing of the whole cache per step); the result equals the varlen path's, and a mask
    with a hole in the middle still takes the varlen path."""
    _, ours = _pair("llama")
    attn = ours.model.layers[0].self_attn
    torch.manual_seed(2)
    q = torch.randn(3, 4, 1, 16)
    k, v = torch.randn(3, 2, 9, 16), torch.randn(3, 2, 9, 16)
    mask = _padding_mask([9, 5, 7], 9, left=True).bool()
    fast, _ = fa_hf.attention_forward(attn, q, k, v, mask, scaling=0.25)
    monkeypatch.setattr(fa_hf, "_decode_left_padded", lambda *a: None)
    slow, _ = fa_hf.attention_forward(attn, q, k, v, mask, scaling=0.25)
    monkeypatch.undo()
    torch.testing.assert_close(fast, slow, atol=1e-6, rtol=1e-6)
    calls = []
    real = fa_hf.flash_attn_with_kvcache
    monkeypatch.setattr(fa_hf, "flash_attn_with_kvcache",
                        lambda *a, **kw: calls.append(1) or real(*a, **kw))
    fa_hf.attention_forward(attn, q, k, v, mask, scaling=0.25)
    assert calls
    holed = mask.clone()
    holed[0, 4] = False
    calls.clear()
    fa_hf.attention_forward(attn, q, k, v, holed, scaling=0.25)
    assert not calls
