"""How much arithmetic training a BERT encoder costs, and how much this machine can do.

The FLOP count is the usual transformer estimate (Kaplan et al. 2020, and
PaLM's appendix B for attention), written out so the bench's MFU can be checked
by hand:

- forward, per sequence of ``s`` real tokens: ``2 * N * s`` for the weight
  matrices (``N`` = parameters outside the embedding tables, which are lookups)
  plus ``4 * L * d * s**2`` for attention scores and their weighted sum
  (``L`` layers, hidden size ``d``);
- backward costs twice the forward, so training is 3x the forward.

Only real tokens are counted: padding is work the model does but should not.
"""

from __future__ import annotations

import time

import torch
from torch import nn


def non_embedding_parameters(model: nn.Module) -> int:
    """Parameters that take part in matrix products (everything but the embedding tables)."""
    return sum(parameter.numel() for name, parameter in model.named_parameters() if ".embeddings." not in f".{name}")


def training_flops(lengths: list[int], non_embedding: int, num_layers: int, hidden_size: int) -> float:
    """Forward + backward FLOPs for sequences of the given real lengths."""
    forward = sum(2 * non_embedding * length + 4 * num_layers * hidden_size * length**2 for length in lengths)
    return 3.0 * forward


def measure_gemm_peak(
    size: int = 2048,
    repeats: int = 8,
    rounds: int = 3,
    device: str = "cpu",
    dtype: torch.dtype = torch.float32,
    round_seconds: float = 5.0,
) -> float:
    """The best matrix-multiply rate this process reaches on ``device`` in ``dtype``, in GFLOP/s.

    On the CPU with the current thread settings; on a GPU the kernels are
    waited for before the clock stops (they run asynchronously). The products
    are ``size`` x ``size``, or smaller where a round of ``repeats`` of them
    would take over ``round_seconds``: a CPU without native kernels for
    ``dtype`` (bf16 or fp16 on one without AVX-512) multiplies at a few
    GFLOP/s, where a round at 2048 takes minutes and says nothing more.
    """
    wait = torch.cuda.synchronize if torch.device(device).type == "cuda" else (lambda: None)
    measured = min(size, 256)
    while True:
        left, right = _gemm_operands(measured, device, dtype)
        left @ right  # warm-up: the first call pays for allocation and kernel selection
        wait()
        started = time.perf_counter()
        left @ right
        wait()
        rate = 2 * measured**3 / max(time.perf_counter() - started, 1e-9)
        if measured >= size or 2 * (2 * measured) ** 3 * repeats / rate > round_seconds:
            break
        measured = min(size, 2 * measured)
    best = 0.0
    for _ in range(rounds):
        started = time.perf_counter()
        for _ in range(repeats):
            left @ right
        wait()
        seconds = time.perf_counter() - started
        best = max(best, 2 * measured**3 * repeats / seconds / 1e9)
    return best


def _gemm_operands(size: int, device: str, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """Two seeded ``size`` x ``size`` matrices on ``device`` in ``dtype``."""
    generator = torch.Generator().manual_seed(0)
    left = torch.randn(size, size, generator=generator).to(device, dtype)
    right = torch.randn(size, size, generator=generator).to(device, dtype)
    return left, right
