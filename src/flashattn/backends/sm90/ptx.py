"""Inline PTX for what Gluon 3.6 has no op for (named barriers, proxy fences, bulk-group
waits that include the writes), run once by every thread of a partition; and the widening
of e4m3 values without the conversion unit."""
from __future__ import annotations

from triton.experimental import gluon
from triton.experimental.gluon import language as gl

from flashattn.fp8_format import e4m3x4_widen_ptx


@gluon.jit
def per_thread_ptx(ASM: gl.constexpr, NUM_WARPS: gl.constexpr = 4):
    """Run PTX ``ASM`` (a constexpr string) once in every thread of a NUM_WARPS-warp partition:
    inline asm over a 32 * NUM_WARPS-element tensor, one element per thread. Not pure, so it
    is neither dropped nor reordered with the other side-effecting asm (the TMA and wgmma
    ops)."""
    layout: gl.constexpr = gl.BlockedLayout([1], [32], [NUM_WARPS], [0])
    gl.inline_asm_elementwise("mov.b32 $0, $1;\n\t" + ASM, "=r,r",
                              [gl.zeros([32 * NUM_WARPS], gl.int32, layout)], dtype=gl.int32,
                              is_pure=False, pack=1)


_WIDEN_BF16 = gl.constexpr(e4m3x4_widen_ptx("bf16"))
_WIDEN_FP16 = gl.constexpr(e4m3x4_widen_ptx("fp16"))


@gluon.jit
def widen_e4m3(x, DST: gl.constexpr):
    """A float8_e4m3fn tensor widened to DST (bfloat16 or float16), exactly, on the integer ALU
    instead of the conversion unit (fp8_format.e4m3x4_widen_ptx: 8 instructions per pair of
    values against Triton's three conversions to bf16). Four values at a time: x's layout
    should give each thread runs of 4 (or more) consecutive values."""
    if DST == gl.bfloat16:
        return gl.inline_asm_elementwise(_WIDEN_BF16, "=r,=r,r", [x], dtype=gl.bfloat16,
                                         is_pure=True, pack=4)
    else:
        return gl.inline_asm_elementwise(_WIDEN_FP16, "=r,=r,r", [x], dtype=gl.float16,
                                         is_pure=True, pack=4)
