"""The operator counter: each ATen call counted while on, none while off, and no dispatch mode left behind.

With ``FINETUNE_TEST_DEVICE=cuda`` the backward's operators are counted on the GPU, where autograd runs
them on its own thread (``tools/gpu_bench.sh``).
"""

from __future__ import annotations

import torch
from helpers import TEST_ON_CPU
from torch.utils._python_dispatch import _get_current_dispatch_mode

from finetune.bench.dispatched_ops import DispatchedOps


def test_counts_each_operator_while_counting_and_leaves_no_mode_behind():
    left, right = torch.ones(3), torch.full((3,), 2.0)
    ops = DispatchedOps()
    _ = left + right  # not counting yet
    ops.counting = True
    assert ops.counting and _get_current_dispatch_mode() is not None
    product = left * right  # aten.mul
    total = product.sum()  # aten.sum
    product.add_(1.0)  # aten.add_
    ops.counting = False
    _ = left - right  # not counted
    assert ops.count == 3
    assert not ops.counting and _get_current_dispatch_mode() is None
    assert total.item() == 6.0 and product.tolist() == [3.0, 3.0, 3.0]  # the operators ran unchanged
    ops.counting = False  # switching off twice is harmless
    assert ops.count == 3


def test_backward_operators_are_counted_too():
    weight = torch.ones(4, requires_grad=True, device="cpu" if TEST_ON_CPU else "cuda")
    ops = DispatchedOps()
    ops.counting = True
    (weight * 3.0).sum().backward()
    ops.counting = False
    forward_only = DispatchedOps()
    forward_only.counting = True
    with torch.no_grad():
        (weight * 3.0).sum()
    forward_only.counting = False
    assert forward_only.count == 2
    assert ops.count > forward_only.count  # the backward's operators (expand, mul, the gradient's copy)
    assert weight.grad.tolist() == [3.0] * 4
