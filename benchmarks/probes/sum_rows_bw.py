"""The bandwidth of ``ops.sum_rows`` (the ring backward's one-pass sum of dK / dV partials)
beside ``torch.add`` of two tensors of the same size, on one GPU.

    PYTHONPATH=src python benchmarks/probes/sum_rows_bw.py [--rows 131072 --heads 32 --parts 5]

Prints each one's median time (``do_bench``) and bytes moved per second (every partial read
once and the bf16 sum written once; torch.add reads two and writes one), and the time of a
mix of half-block and whole-block pieces (the dense causal ring's shapes).
"""
from __future__ import annotations

import argparse

import torch
import triton

from flashattn import ops


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", type=int, default=131072)
    ap.add_argument("--heads", type=int, default=32)
    ap.add_argument("--dim", type=int, default=128)
    ap.add_argument("--parts", type=int, default=5)
    args = ap.parse_args()
    rows = args.rows
    parts = [torch.randn(rows, args.heads, args.dim, device="cuda").bfloat16()
             for _ in range(args.parts)]
    starts = [0] * len(parts)
    size = parts[0].numel() * parts[0].element_size()
    ms = triton.testing.do_bench(lambda: ops.sum_rows(parts, starts, rows, 0, torch.bfloat16))
    a, b = parts[0], parts[1]
    ms_add = triton.testing.do_bench(lambda: torch.add(a, b))
    print("sum_rows %d pieces %.3f ms %.0f GB/s; torch.add %.3f ms %.0f GB/s" % (
        len(parts), ms, (len(parts) + 1) * size / ms / 1e6, ms_add, 3 * size / ms_add / 1e6))
    mixed = [p[: rows // 2] for p in parts[:2]] + parts[2:]
    mixed_starts = [0, rows // 2] + [0] * (len(parts) - 2)
    ms = triton.testing.do_bench(lambda: ops.sum_rows(mixed, mixed_starts, rows, 0,
                                                      torch.bfloat16))
    print("two half pieces and %d whole ones %.3f ms" % (len(parts) - 2, ms))


if __name__ == "__main__":
    main()
