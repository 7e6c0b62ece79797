"""flashattn.testing: the public float64 oracle and flash-attn's accuracy rule, as a user
checks a call of their own (the README's example)."""
from __future__ import annotations

import pytest
import torch

import flashattn
from flashattn.testing import assert_close_rule, attention_ref, max_abs_err


def test_a_users_check_passes_and_a_wrong_output_fails(cpu_backend):
    torch.manual_seed(0)
    q, k, v = (torch.randn(2, 33, 4, 32, dtype=torch.bfloat16) for _ in range(3))
    out = flashattn.flash_attn_func(q, k, v, causal=True)
    ref = attention_ref(q, k, v, causal=True)[0]
    low = attention_ref(q, k, v, causal=True, upcast=False)[0]
    assert ref.dtype == torch.float64 and low.dtype == torch.bfloat16
    assert_close_rule(out, ref, low)
    wrong = out.clone()
    wrong[0, 5, 1, 3] += 0.25  # one entry off by far more than bf16's error
    with pytest.raises(AssertionError, match=r"out: max\|out - ref\| = .* at \[0, 5, 1, 3\]"):
        assert_close_rule(wrong, ref, low)


def test_nonfinite_entries_must_coincide():
    ref = torch.tensor([1.0, float("-inf")], dtype=torch.float64)
    assert max_abs_err(torch.tensor([1.5, float("-inf")]), ref) == 0.5
    with pytest.raises(AssertionError, match="-inf pattern differs"):
        assert_close_rule(torch.tensor([1.0, 0.0]), ref, torch.tensor([1.0, float("-inf")]))
