"""End to end: Hugging Face ``generate()`` (greedy, bf16) with ``attn_implementation="fa_triton"``
vs ``"sdpa"`` on a randomly initialised Llama-style model (no weights are downloaded).

Default model: 0.85 B parameters, 16 layers, hidden 2048, 32 query / 8 KV heads (d 128),
intermediate 5632. Tokens per second of the new tokens (prefill included in the time, as a
user sees it), batch 1 and 8, no padding; the prompt lengths are the issue's (512 and 16k).

    python benchmarks/probes/generate_probe.py --prompts 512,16384 --new 128 --out gen.json
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time

import torch

sys.path.append(os.path.join(os.path.dirname(__file__), "..", "..", "src"))
import flashattn.integrations.transformers as fa_hf  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--prompts", default="512,16384")
    ap.add_argument("--batches", default="1,8")
    ap.add_argument("--new", type=int, default=128)
    ap.add_argument("--layers", type=int, default=16)
    ap.add_argument("--impls", default="fa_triton,sdpa")
    ap.add_argument("--max-tokens", type=int, default=140000,
                    help="skip points with batch x (prompt + new) above this (memory)")
    ap.add_argument("--padding", default="none",
                    help="none,left: left padding gives rows 1.. of a batch 10%% pad tokens")
    ap.add_argument("--out", default="")
    args = ap.parse_args()
    from transformers import LlamaConfig, LlamaForCausalLM

    fa_hf.register()
    cfg = LlamaConfig(hidden_size=2048, intermediate_size=5632, num_hidden_layers=args.layers,
                      num_attention_heads=32, num_key_value_heads=8, vocab_size=32000,
                      max_position_embeddings=65536, torch_dtype=torch.bfloat16)
    torch.manual_seed(0)
    model = LlamaForCausalLM(cfg).to(device="cuda", dtype=torch.bfloat16).eval()
    n_params = sum(p.numel() for p in model.parameters())
    print(f"model: {n_params / 1e9:.2f} B parameters, {args.layers} layers", flush=True)
    rows = []
    for prompt in (int(x) for x in args.prompts.split(",")):
        for batch in (int(x) for x in args.batches.split(",")):
            if batch * (prompt + args.new) > args.max_tokens:
                continue
            for padding in args.padding.split(","):
                ids = torch.randint(0, cfg.vocab_size, (batch, prompt), device="cuda")
                mask = torch.ones_like(ids)
                if padding == "left":  # rows 1.. start with prompt // 10 pad tokens
                    mask[1:, :prompt // 10] = 0
                row = dict(prompt=prompt, batch=batch, new=args.new, padding=padding)
                outs = {}
                for impl in args.impls.split(","):
                    model.set_attn_implementation(impl)
                    kw = dict(max_new_tokens=args.new, min_new_tokens=args.new, do_sample=False,
                              attention_mask=mask)
                    with torch.no_grad():
                        model.generate(ids, max_new_tokens=4, min_new_tokens=4, do_sample=False,
                                       attention_mask=mask)
                        torch.cuda.synchronize()
                        t0 = time.perf_counter()
                        out = model.generate(ids, **kw)
                        torch.cuda.synchronize()
                    seconds = time.perf_counter() - t0
                    outs[impl] = out[:, prompt:]
                    row[f"{impl}_tok_s"] = batch * args.new / seconds
                    row[f"{impl}_s"] = seconds
                if "fa_triton" in outs and "sdpa" in outs:
                    row["same_tokens"] = float((outs["fa_triton"] == outs["sdpa"]).float().mean())
                    row["fa_triton_over_sdpa"] = row["fa_triton_tok_s"] / row["sdpa_tok_s"]
                rows.append(row)
                print(json.dumps({k: (round(v, 3) if isinstance(v, float) else v)
                                  for k, v in row.items()}), flush=True)
                del ids
                torch.cuda.empty_cache()
    if args.out:
        import transformers

        with open(args.out, "w") as f:
            json.dump(dict(rows=rows, params=n_params, transformers=transformers.__version__,
                           torch=torch.__version__, gpu=torch.cuda.get_device_name()), f,
                      indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
