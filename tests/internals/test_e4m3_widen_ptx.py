"""The integer widening of e4m3 values (``fp8_format.e4m3x4_widen_ptx``), checked on the CPU by
executing its PTX text with a small interpreter of the instructions it uses, over every e4m3
code in every byte position: the result must be the code's value exactly (NaN for NaN).
The GPU test (tests/backends/test_e4m3_widen_gpu.py) runs the same text on the hardware."""
from __future__ import annotations

import re

import pytest
import torch

from flashattn.fp8_format import e4m3x4_widen_ptx

MASK = 0xFFFFFFFF
_FLOAT16 = {"bf16x2": torch.bfloat16, "f16x2": torch.float16}


def _halves_to_float(word: int, kind: str):
    """The two 16-bit floats of a packed pair, as Python floats (low half first)."""
    pair = torch.tensor([word & 0xFFFF, word >> 16], dtype=torch.int32).to(torch.int16)
    return pair.view(_FLOAT16[kind]).double().tolist()


def _float_to_halves(values, kind: str) -> int:
    """Round a pair of floats to the 16-bit type and pack them (low half first)."""
    pair = torch.tensor(values, dtype=torch.float64).to(_FLOAT16[kind]).view(torch.int16)
    lo, hi = (int(x) & 0xFFFF for x in pair.tolist())
    return lo | (hi << 16)


def _prmt(a: int, b: int, sel: int) -> int:
    """PTX prmt.b32 (default mode): result byte i is byte (sel >> 4i) & 7 of {b, a}, or that
    byte's sign bit replicated when bit 3 of the selector nibble is set."""
    src = a | (b << 32)
    out = 0
    for i in range(4):
        nib = (sel >> (4 * i)) & 0xF
        byte = (src >> (8 * (nib & 7))) & 0xFF
        if nib & 8:
            byte = 0xFF if byte & 0x80 else 0
        out |= byte << (8 * i)
    return out


def run_ptx(ptx: str, word: int):
    """Execute the widening PTX on one 32-bit input; returns ($0, $1) as 32-bit words."""
    regs = {"$2": word}

    def val(tok: str) -> int:
        tok = tok.strip()
        return regs[tok] if tok in regs else int(tok, 0)

    for line in ptx.splitlines():
        line = line.strip().rstrip(";")
        if not line or line in "{}" or line.startswith(".reg"):
            continue
        op, args = line.split(None, 1)
        dst, *src = [x.strip() for x in args.split(",")]
        if op == "and.b32":
            regs[dst] = val(src[0]) & val(src[1])
        elif op == "or.b32":
            regs[dst] = val(src[0]) | val(src[1])
        elif op == "add.u32":
            regs[dst] = (val(src[0]) + val(src[1])) & MASK
        elif op == "shr.b32":
            regs[dst] = val(src[0]) >> val(src[1])
        elif op == "mov.b32":
            regs[dst] = val(src[0])
        elif op == "prmt.b32":
            regs[dst] = _prmt(val(src[0]), val(src[1]), val(src[2]))
        elif op.startswith("mul.rn."):
            kind = op.split(".")[-1]
            a = _halves_to_float(val(src[0]), kind)
            b = _halves_to_float(val(src[1]), kind)
            regs[dst] = _float_to_halves([x * y for x, y in zip(a, b)], kind)
        else:
            raise AssertionError(f"instruction not covered by the interpreter: {op}")
    return regs["$0"], regs["$1"]


@pytest.mark.parametrize("dst,kind", [("bf16", "bf16x2"), ("fp16", "f16x2")])
def test_every_e4m3_code_widens_exactly(dst, kind):
    ptx = e4m3x4_widen_ptx(dst)
    assert set(re.findall(r"^\s*([a-z][\w.]*)", ptx, re.M)) <= {
        "and.b32", "or.b32", "add.u32", "shr.b32", "mov.b32", "prmt.b32", f"mul.rn.{kind}"}
    codes = torch.arange(256, dtype=torch.int32)
    expect = codes.to(torch.uint8).view(torch.float8_e4m3fn).double()
    gen = torch.Generator().manual_seed(0)
    for pos in range(4):  # every code in every byte, beside random neighbours
        others = torch.randint(0, 256, (256, 4), generator=gen, dtype=torch.int32)
        others[:, pos] = codes
        for row, byte_vals in enumerate(others.tolist()):
            word = sum(v << (8 * i) for i, v in enumerate(byte_vals))
            lo, hi = run_ptx(ptx, word)
            got = _halves_to_float(lo, kind) + _halves_to_float(hi, kind)
            want = torch.tensor(byte_vals, dtype=torch.int32).to(torch.uint8).view(
                torch.float8_e4m3fn).double().tolist()
            for g, w in zip(got, want):
                assert (g != g and w != w) or (g == w and str(g)[0] == str(w)[0]), \
                    (dst, hex(word), got, want)
            assert got[pos] == expect[row].item() or (got[pos] != got[pos]
                                                       and expect[row] != expect[row])
