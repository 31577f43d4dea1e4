"""Dropout masks that are cheap to draw on a CPU, for packed rows' attention and their other dropouts.

``bernoulli_`` draws a float per entry; a comparison of random bits with the
rate is the same Bernoulli draw several times cheaper (docs/benchmarks/speed.md).
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn


def dropout_keep(shape: torch.Size, rate: float, device: torch.device) -> torch.Tensor:
    """Which entries dropout keeps (True); each is dropped independently with probability ``rate``.

    31 random bits per entry compared with ``rate`` x 2^31: the rate is kept
    to within 3e-10 (``bernoulli_`` compares a 24-bit uniform float). Drawn
    from the default generator, so a seeded (or resumed) run draws the same masks.
    """
    bits = torch.empty(shape, dtype=torch.int32, device=device).random_()  # uniform on [0, 2^31)
    return bits >= round(rate * 2**31)


def cheaper_dropout(module: nn.Dropout) -> Any:
    """``module``'s forward with its mask drawn by ``dropout_keep`` on the CPU (the stock kernel elsewhere)."""

    def forward(hidden: torch.Tensor) -> torch.Tensor:
        if not module.training or module.p == 0 or hidden.device.type != "cpu":
            return nn.functional.dropout(hidden, module.p, module.training, module.inplace)
        kept = dropout_keep(hidden.shape, module.p, hidden.device).to(hidden.dtype).mul_(1.0 / (1.0 - module.p))
        return hidden * kept

    return forward
