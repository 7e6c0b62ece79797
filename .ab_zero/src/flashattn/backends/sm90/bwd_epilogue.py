"""The backward kernels' dK / dV epilogue (both bwd_kernel.py and bwd_wide_kernel.py)."""
from __future__ import annotations

from triton.experimental import gluon
from triton.experimental.gluon import language as gl


@gluon.jit
def store_kv_grads(dk, dv, dk_ptr, dv_ptr, key0, col0, seqlen_k, b, h_k, n_heads_k, sm_scale,
                   HEAD_DIM: gl.constexpr):
    """dK * softmax_scale and dV, fp32 [ROWS, COLS] tiles in one register layout, into
    (b, s_k, h_k, HEAD_DIM) tensors at keys key0 + [0, ROWS) and head-dim columns
    col0 + [0, COLS) of KV head h_k, in the tensors' dtype; keys past s_k and columns past
    HEAD_DIM are not written."""
    ROWS: gl.constexpr = dk.shape[0]
    COLS: gl.constexpr = dk.shape[1]
    LAYOUT: gl.constexpr = dk.type.layout
    keys = key0 + gl.arange(0, ROWS, layout=gl.SliceLayout(1, LAYOUT))
    cols = col0 + gl.arange(0, COLS, layout=gl.SliceLayout(0, LAYOUT))
    kv_stride_row = n_heads_k * HEAD_DIM
    base = (b.to(gl.int64) * seqlen_k * n_heads_k + h_k) * HEAD_DIM
    offs = gl.expand_dims((keys - key0) * kv_stride_row, 1) + gl.expand_dims(cols, 0)
    row0 = key0.to(gl.int64) * kv_stride_row
    ok = gl.expand_dims(keys < seqlen_k, 1) & gl.expand_dims(cols < HEAD_DIM, 0)
    gl.store(dk_ptr + base + row0 + offs, (dk * sm_scale).to(dk_ptr.dtype.element_ty), mask=ok)
    gl.store(dv_ptr + base + row0 + offs, dv.to(dv_ptr.dtype.element_ty), mask=ok)
