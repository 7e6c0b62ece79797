"""Host time of the b = 1 decode step, layer by layer: how much of a
``flash_attn_with_kvcache`` call each layer below the public function costs, measured by
calling each layer directly (no profiler: cProfile inflates the many small calls).

Rows, µs per call (min / median of 7 batches of 200, GPU work ~25 µs, host-bound):
public function; dispatch's runner (the api's key and cache skipped); the recorded
DecodeCall (the runner's own checks skipped); its replay (two allocations + two launches);
two allocations alone; the two launches alone (addresses precomputed); cuDNN SDPA (its
backend selected once, outside the timed calls).

    python benchmarks/probes/host_peel.py --json $OUT/host_peel.json
"""
from __future__ import annotations

import argparse
import json
import os
import sys

import torch

sys.path.append(os.path.join(os.path.dirname(__file__), "..", "..", "src"))
import flashattn  # noqa: E402
from flashattn.api import fastpath  # noqa: E402
from plan_probe import per_call_us  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--json", default="")
    ap.add_argument("--points", default="1x16384,8x8192")
    args = ap.parse_args()
    rows = []
    h, h_k, d, dt = 32, 8, 128, torch.bfloat16
    for point in args.points.split(","):
        b, L = (int(x) for x in point.split("x"))
        q = torch.randn(b, 1, h, d, device="cuda", dtype=dt)
        kc = torch.randn(b, L, h_k, d, device="cuda", dtype=dt)
        vc = torch.randn_like(kc)
        lens = torch.full((b,), L, dtype=torch.int32, device="cuda")
        fastpath.KVCACHE.clear()
        flashattn.flash_attn_with_kvcache(q, kc, vc, cache_seqlens=lens, causal=True)
        flashattn.flash_attn_with_kvcache(q, kc, vc, cache_seqlens=lens, causal=True)
        (_, (_, runner)), = fastpath.KVCACHE._entries.values()
        call = next(c.cell_contents[0] for c in runner.__closure__
                    if isinstance(c.cell_contents, list) and c.cell_contents)
        ws_numel, out_shape = call.ws_numel, call.out_shape
        base = torch.empty((ws_numel,), dtype=torch.float32, device="cuda")
        out = torch.empty(out_shape, dtype=dt, device="cuda")
        o_k = base.data_ptr() + 4 * call.offsets[0]
        l_k = base.data_ptr() + 4 * call.offsets[1]
        slots = (q.data_ptr(), kc.data_ptr(), vc.data_ptr(), o_k, l_k, lens.data_ptr(),
                 lens.data_ptr(), lens.data_ptr(), lens.data_ptr(), base.data_ptr(),
                 lens.data_ptr())

        def launches():
            call._decode.replay(slots)
            if call.num_splits > 1:
                call._combine.replay((o_k, l_k, out.data_ptr(), base.data_ptr()))

        def allocs():
            torch.empty((ws_numel,), dtype=torch.float32, device="cuda")
            torch.empty(out_shape, dtype=dt, device="cuda")

        from torch.nn.attention import SDPBackend, sdpa_kernel
        qt, kt, vt = q.transpose(1, 2), kc.transpose(1, 2), vc.transpose(1, 2)

        def cudnn():
            torch.nn.functional.scaled_dot_product_attention(qt, kt, vt, enable_gqa=True)

        layers = {
            "public": lambda: flashattn.flash_attn_with_kvcache(q, kc, vc, cache_seqlens=lens,
                                                                causal=True),
            "runner": lambda: runner(q, kc, vc, None, None, None, None, lens, None, None, None),
            "decode_call": lambda: call(q, kc, vc, lens, None, None, None, None),
            "replay": lambda: call._replay(q, kc, vc, lens, None, None, None, None, None),
            "allocs": allocs,
            "launches": launches,
            "cudnn": cudnn,
        }
        row = dict(b=b, L=L, splits=call.num_splits, tma=call.use_tma)
        for _ in range(2):  # two interleaved rounds, min kept
            for name, fn in layers.items():
                # (SDPA's backend selected outside the timed calls: entering sdpa_kernel per call
                # costs tens of µs, which a first version of the cuDNN row included)
                with sdpa_kernel([SDPBackend.CUDNN_ATTENTION]):
                    us = per_call_us(fn)
                row[name] = round(min(row.get(name, (1e9,))[0], us[0]), 1), round(us[1], 1)
        rows.append(row)
        print(json.dumps(row), flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(dict(rows=rows, gpu=torch.cuda.get_device_name()), f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
