"""The integer e4m3 widening (fp8_format.e4m3x4_widen_ptx) on the hardware: every e4m3 code, in
every position of its 4-byte group, through the Hopper kernels' helper (sm90/ptx.widen_e4m3,
Gluon), bitwise equal to torch's conversion (NaN for NaN, signed zeros and subnormals
included). The CPU twin (tests/internals/test_e4m3_widen_ptx.py) executes the same PTX text
with an interpreter.

Run on the device machine: ``python3 -m pytest -q -m gpu tests/backends/test_e4m3_widen_gpu.py``.
"""
from __future__ import annotations

import pytest
import torch
from triton.experimental import gluon
from triton.experimental.gluon import language as gl

from flashattn.backends.sm90.ptx import widen_e4m3

pytestmark = pytest.mark.gpu


def _codes(device) -> torch.Tensor:
    """4096 e4m3 values in 1024 groups of 4: group g holds code g // 4 at byte g % 4 (every
    code at every position), random codes beside it."""
    gen = torch.Generator().manual_seed(0)
    groups = torch.randint(0, 256, (256 * 4, 4), generator=gen, dtype=torch.int32)
    idx = torch.arange(256 * 4)
    groups[idx, idx % 4] = (idx // 4).to(torch.int32)
    return groups.flatten().to(torch.uint8).view(torch.float8_e4m3fn).to(device)


def _same(got: torch.Tensor, want: torch.Tensor) -> bool:
    """Bitwise equal, except that any NaN matches any NaN."""
    nan = torch.isnan(want)
    return bool(torch.equal(torch.isnan(got), nan)
                and torch.equal(got[~nan].view(torch.int16), want[~nan].view(torch.int16)))


@gluon.jit
def _gluon_widen_kernel(x_ptr, out_ptr, DST: gl.constexpr):
    layout: gl.constexpr = gl.BlockedLayout([16], [32], [4], [0])
    offs = gl.program_id(0) * 2048 + gl.arange(0, 2048, layout=layout)
    gl.store(out_ptr + offs, widen_e4m3(gl.load(x_ptr + offs), DST))


def _hopper() -> bool:
    return torch.cuda.is_available() and torch.cuda.get_device_capability()[0] == 9


@pytest.mark.skipif(not _hopper(), reason="the Gluon helper is the Hopper kernels' (sm_90)")
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_gluon_widen_matches_torch(dtype):
    x = _codes("cuda")
    out = torch.empty(x.shape, dtype=dtype, device="cuda")
    dst = gl.bfloat16 if dtype == torch.bfloat16 else gl.float16
    _gluon_widen_kernel[(x.numel() // 2048,)](x, out, dst, num_warps=4)
    assert _same(out, x.to(dtype))
