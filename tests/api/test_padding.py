"""flashattn.padding: flash-attn's bert_padding conventions (flash-attn >= 2.7 return values)."""
from __future__ import annotations

import pytest
import torch

from flashattn import flash_attn_func, flash_attn_varlen_func
from flashattn.padding import (index_first_axis, index_put_first_axis, pad_input, unpad_input,
                               unpad_input_for_concatenated_sequences)


def _mask(lengths, seqlen, left=False):
    pos = torch.arange(seqlen).unsqueeze(0)
    lens = torch.tensor(lengths).unsqueeze(1)
    return (pos >= seqlen - lens) if left else (pos < lens)


@pytest.mark.parametrize("left", [False, True])
def test_unpad_returns_flash_attn_conventions(left):
    lengths, seqlen = [3, 0, 5, 1], 5
    mask = _mask(lengths, seqlen, left).to(torch.int64)  # int masks are accepted too
    x = torch.randn(4, seqlen, 2, 3)
    packed, indices, cu_seqlens, max_seqlen, seqused = unpad_input(x, mask)
    assert packed.shape == (sum(lengths), 2, 3)
    assert indices.dtype == torch.int64 and cu_seqlens.dtype == torch.int32
    assert seqused.dtype == torch.int32 and isinstance(max_seqlen, int)
    assert cu_seqlens.tolist() == [0, 3, 3, 8, 9] and max_seqlen == 5
    assert seqused.tolist() == lengths
    assert torch.equal(packed, x.reshape(-1, 2, 3)[mask.flatten().bool()])
    assert torch.equal(indices, mask.flatten().nonzero().flatten())
    back = pad_input(packed, indices, 4, seqlen)
    assert torch.equal(back, x * mask[:, :, None, None])


def test_unused_mask_is_packed_but_not_counted_in_seqused():
    used = _mask([2, 1], 4)
    unused = _mask([3, 3], 4) & ~used  # allocated slots after the used tokens
    x = torch.randn(2, 4, 5)
    packed, indices, cu_seqlens, max_seqlen, seqused = unpad_input(x, used, unused)
    assert cu_seqlens.tolist() == [0, 3, 6] and max_seqlen == 3
    assert seqused.tolist() == [2, 1]
    assert torch.equal(packed, x[:, :3].reshape(6, 5))


def test_concatenated_sequences():
    lengths_in_row = torch.tensor([[2, 3, 0, 0, 0, 0], [3, 2, 0, 0, 0, 0], [6, 0, 0, 0, 0, 0]])
    x = torch.randn(3, 6, 4)
    packed, indices, cu_seqlens, max_seqlen = unpad_input_for_concatenated_sequences(
        x, lengths_in_row)
    assert cu_seqlens.tolist() == [0, 2, 5, 8, 10, 16] and max_seqlen == 6
    assert indices.tolist() == [0, 1, 2, 3, 4, 6, 7, 8, 9, 10] + list(range(12, 18))
    assert torch.equal(packed, x.reshape(18, 4)[indices])


def test_gradients_flow_through_unpad_and_pad():
    x = torch.randn(2, 5, 3, requires_grad=True)
    mask = _mask([4, 2], 5)
    packed, indices, *_ = unpad_input(x, mask)
    w = torch.randn_like(packed)
    (pad_input(packed * w, indices, 2, 5).sum()).backward()
    expected = torch.zeros(2, 5, 3)
    expected[mask] = w
    assert torch.equal(x.grad, expected)
    # the index helpers alone, both directions
    src = torch.randn(6, 2, requires_grad=True)
    idx = torch.tensor([4, 0, 2])
    gathered = index_first_axis(src, idx)
    scattered = index_put_first_axis(gathered, idx, 6)
    assert torch.equal(scattered[idx], src[idx]) and scattered[[1, 3, 5]].abs().sum() == 0
    scattered.sum().backward()
    assert src.grad[idx].eq(1).all() and src.grad[[1, 3, 5]].eq(0).all()


def test_unpad_varlen_pad_equals_dense_per_row(backend):
    """The migration recipe: unpad -> flash_attn_varlen_func -> pad equals running each row's
    real tokens through flash_attn_func alone (right and left padding)."""
    b, s, h, d = 3, 9, 2, 16
    lengths = [9, 4, 6]
    for left in (False, True):
        mask = _mask(lengths, s, left)
        q, k, v = (torch.randn(b, s, h, d) for _ in range(3))
        q_u, idx, cu, max_s, _ = unpad_input(q, mask)
        k_u, _, _, _, _ = unpad_input(k, mask)
        v_u, _, _, _, _ = unpad_input(v, mask)
        out = pad_input(flash_attn_varlen_func(q_u, k_u, v_u, cu, cu, max_s, max_s, causal=True),
                        idx, b, s)
        for row, n in enumerate(lengths):
            sl = slice(s - n, s) if left else slice(0, n)
            ref = flash_attn_func(q[row:row + 1, sl], k[row:row + 1, sl], v[row:row + 1, sl],
                                  causal=True)
            torch.testing.assert_close(out[row:row + 1, sl], ref, rtol=1e-5, atol=1e-6)
            pad = torch.ones(s, dtype=torch.bool)
            pad[sl] = False
            assert out[row, pad].abs().sum() == 0


def test_bad_arguments_name_the_argument():
    x = torch.randn(2, 4, 3)
    with pytest.raises(ValueError, match="attention_mask must have shape"):
        unpad_input(x, torch.ones(2, 5, dtype=torch.bool))
    with pytest.raises(TypeError, match="attention_mask must be a bool or integer"):
        unpad_input(x, torch.ones(2, 4))
    with pytest.raises(TypeError, match="unused_mask must be a torch.Tensor"):
        unpad_input(x, torch.ones(2, 4, dtype=torch.bool), [[1]])
    with pytest.raises(ValueError, match="hidden_states must be a tensor"):
        unpad_input(torch.randn(3), torch.ones(3, dtype=torch.bool))
    with pytest.raises(ValueError, match="indices must be a 1-d"):
        pad_input(torch.randn(3, 2), torch.tensor([0, 1]), 1, 4)
