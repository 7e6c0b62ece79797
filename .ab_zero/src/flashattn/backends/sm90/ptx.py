"""Inline PTX for what Gluon 3.6 has no op for (named barriers, proxy fences, bulk-group
waits that include the writes), run once by every thread of a partition."""
from __future__ import annotations

from triton.experimental import gluon
from triton.experimental.gluon import language as gl


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
