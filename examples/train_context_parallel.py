"""Train a small Llama-style model with its sequence split over several processes.

    torchrun --nproc-per-node 2 examples/train_context_parallel.py            # CPU, gloo
    torchrun --nproc-per-node 4 examples/train_context_parallel.py --cuda     # GPUs, NCCL

Every rank holds the same model (random initialisation from one seed) and its zigzag shard of
each training sequence (``flashattn.parallel.zigzag_shard``, with the matching global
position ids); attention runs over the whole sequence through the Hugging Face integration
inside ``context_parallel(group)``. The loss is summed over every rank's tokens and the
parameter gradients are all-reduced, as data parallelism would. With ``--check`` rank 0 also
trains the same model on the whole sequence in one process and compares the loss and every
gradient at every step (the two must agree within float32 rounding of the summation order).
"""
from __future__ import annotations

import argparse
import os
from typing import Dict, List, Tuple

import torch
import torch.distributed as dist
import torch.nn.functional as F

import flashattn.integrations.transformers as fa_hf
from flashattn import parallel


def tiny_llama(seed: int, device: torch.device, dtype: torch.dtype):
    """A 2-layer Llama (GQA 4 / 2 heads, head dim 16), random weights from ``seed``."""
    from transformers import LlamaConfig, LlamaForCausalLM

    fa_hf.register()
    cfg = LlamaConfig(vocab_size=128, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=4096,
                      attn_implementation=fa_hf.NAME)
    torch.manual_seed(seed)
    return LlamaForCausalLM(cfg).to(device=device, dtype=dtype)


def _batch(step: int, seq: int, device: torch.device) -> Tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(1000 + step)
    ids = torch.randint(0, 128, (1, seq), generator=g)
    targets = torch.cat([ids[:, 1:], torch.full((1, 1), -100)], dim=1)  # shifted globally
    return ids.to(device), targets.to(device)


def _loss_sum(model, ids, targets, positions) -> torch.Tensor:
    logits = model(input_ids=ids, position_ids=positions).logits.float()
    return F.cross_entropy(logits.flatten(0, 1), targets.flatten(), ignore_index=-100,
                           reduction="sum")


def train(rank: int, world: int, *, steps: int = 3, seq_per_rank: int = 32, lr: float = 1e-2,
          device: str = "cpu", check: bool = True) -> List[Dict[str, float]]:
    """``steps`` SGD steps with the sequence split over the default group; returns per step the
    loss and (rank 0, ``check``) the largest difference to the one-process run."""
    dev = torch.device(device, rank) if device == "cuda" else torch.device("cpu")
    model = tiny_llama(0, dev, torch.float32)
    reference = tiny_llama(0, dev, torch.float32) if check and rank == 0 else None
    seq = seq_per_rank * world
    history = []
    for step in range(steps):
        ids, targets = _batch(step, seq, dev)
        positions = torch.arange(seq, device=dev).unsqueeze(0)
        local = [parallel.zigzag_shard(x) for x in (ids, targets, positions)]
        n_tokens = int((targets != -100).sum())
        with fa_hf.context_parallel():
            loss = _loss_sum(model, *local) / n_tokens
        loss.backward()
        total = loss.detach().clone()
        dist.all_reduce(total)
        for p in model.parameters():
            dist.all_reduce(p.grad)
        row = dict(step=step, loss=float(total))
        if reference is not None:
            ref_loss = _loss_sum(reference, ids, targets, positions) / n_tokens
            ref_loss.backward()
            row["loss_diff"] = abs(float(ref_loss.detach()) - float(total))
            row["grad_rel_diff"] = max(
                float((p.grad - r.grad).abs().max() / r.grad.abs().max().clamp_min(1e-30))
                for p, r in zip(model.parameters(), reference.parameters()))
            with torch.no_grad():
                for r in reference.parameters():
                    r -= lr * r.grad
                    r.grad = None
        with torch.no_grad():
            for p in model.parameters():
                p -= lr * p.grad
                p.grad = None
        history.append(row)
    return history


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--seq-per-rank", type=int, default=256)
    ap.add_argument("--cuda", action="store_true")
    ap.add_argument("--check", action="store_true")
    args = ap.parse_args()
    dist.init_process_group("nccl" if args.cuda else "gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    if args.cuda:
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", rank)))
    for row in train(rank, world, steps=args.steps, seq_per_rank=args.seq_per_rank,
                     device="cuda" if args.cuda else "cpu", check=args.check):
        if rank == 0:
            print(row, flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
