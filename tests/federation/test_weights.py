"""`flsuite.federation.weights.is_finite`: a client result's weights are checked for NaN and Inf."""

from __future__ import annotations

import pytest
import torch

from flsuite.federation.weights import is_finite

BIG = torch.finfo(torch.float32).max


@pytest.mark.parametrize(
    ("tensor", "finite"),
    [
        (torch.ones(4, 3), True),
        (torch.tensor([1.0, float("nan"), 2.0]), False),
        (torch.tensor([1.0, float("inf")]), False),
        (torch.tensor([float("-inf"), float("inf")]), False),  # the sum is NaN
        (torch.tensor([BIG, BIG, -1.0]), True),  # the sum overflows; every entry is finite
        (torch.tensor([65504.0, 65504.0], dtype=torch.float16), True),  # the same in half precision
        (torch.tensor([1.0, float("nan")], dtype=torch.bfloat16), False),
        (torch.empty(0), True),
    ],
)
def test_is_finite_is_true_exactly_when_every_floating_entry_is(tensor, finite):
    weights = {"w": tensor, "steps": torch.tensor([3, -1])}  # integer tensors are not checked
    assert is_finite(weights) is finite
    assert is_finite({"a": torch.zeros(2), **weights}) is finite
