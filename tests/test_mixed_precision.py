"""Contract 1 and 5 in mixed precision: an update equals one full-batch step at the same precision.

The reference is plain PyTorch on the trainer's device: each window's samples
collated into one batch, its mean loss under ``torch.autocast`` in the same
dtype, the gradient subtracted from float32 weights (SGD, lr=1). For fp16 the
reference scales the loss by the GradScaler's starting scale and divides the
gradient back, as the trainer's scaler does (a power of two, so exact).

Tolerance: under autocast a micro-batch's weight gradient is a bf16 (or fp16)
matmul result, rounded before it is summed into the float32 ``.grad``, while
the reference rounds the whole window's gradient once. That costs up to a few
1e-3 of the update (bf16 keeps 8 bits of mantissa); a wrongly weighted
micro-batch is off by O(1). Hence ``UPDATE_TOLERANCE`` below, against 1e-4 in
float32 (tests/test_exactness.py).

Runs on the CPU in bf16; ``FINETUNE_TEST_DEVICE=cuda`` runs bf16 and fp16 on a
GPU (``tools/gpu_bench.sh`` does). fp16 autocast with a GradScaler is a CUDA
path: on the CPU that case skips.
"""

from __future__ import annotations

import copy

import pytest
import torch
from helpers import TEST_ON_CPU, flat_parameters, review_dataset, sgd_args
from transformers import BertForSequenceClassification, DataCollatorWithPadding, Trainer

from finetune import ReviewTrainer

DEVICE = "cpu" if TEST_ON_CPU else "cuda"
DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}
# Error relative to how far the reference moved the weights (see the module docstring).
UPDATE_TOLERANCE = 2e-2
# The GradScaler's starting scale (torch's and Accelerate's default).
FP16_LOSS_SCALE = 2.0**16


@pytest.fixture(scope="module")
def initial_model(tiny_model_dir):
    return BertForSequenceClassification.from_pretrained(tiny_model_dir)


def reference_steps(model, dataset, collator, window_samples: int, precision: str) -> torch.Tensor:
    """One SGD(lr=1) step per window on its concatenated samples, the loss under autocast in ``precision``."""
    model = copy.deepcopy(model).to(DEVICE)
    model.train()
    parameters = list(model.parameters())
    scale = FP16_LOSS_SCALE if precision == "fp16" else 1.0
    for start in range(0, len(dataset), window_samples):
        rows = range(start, min(start + window_samples, len(dataset)))
        batch = {key: value.to(DEVICE) for key, value in collator([dataset[row] for row in rows]).items()}
        with torch.autocast(DEVICE, dtype=DTYPES[precision], enabled=precision != "fp32"):
            loss = model(**batch).loss
        gradients = torch.autograd.grad(loss.float() * scale, parameters, allow_unused=True)
        with torch.no_grad():
            for parameter, gradient in zip(parameters, gradients):
                if gradient is not None:
                    assert torch.isfinite(gradient).all(), "the reference overflowed: pick another seed"
                    parameter -= gradient / scale
    return flat_parameters(model)


def trained(trainer_class, model, dataset, collator, output_dir, micro_batch, n, precision) -> torch.Tensor:
    model = copy.deepcopy(model)
    args = sgd_args(output_dir, micro_batch, n, **{precision: True})
    trainer = trainer_class(model=model, args=args, train_dataset=dataset, data_collator=collator)
    trainer.train()
    if trainer_class is ReviewTrainer:
        assert trainer.skipped_updates == 0, "an update was skipped: the comparison would say nothing"
    return flat_parameters(model)


def update_error(result: torch.Tensor, reference: torch.Tensor, initial: torch.Tensor) -> float:
    return float((result - reference).norm() / (reference - initial).norm())


def _skip_unsupported(precision: str) -> None:
    if precision == "fp16" and DEVICE == "cpu":
        pytest.skip("fp16 with a GradScaler is checked on CUDA (FINETUNE_TEST_DEVICE=cuda)")


@pytest.mark.parametrize("precision", ["bf16", "fp16"])
@pytest.mark.parametrize(
    ("samples", "micro_batch", "n"),
    [(12, 3, 2), (10, 3, 2), (10, 4, 4)],
    ids=["divisible", "short-last-micro-batch", "partial-window"],
)
def test_mixed_precision_update_equals_full_batch_step(
    initial_model, tokenizer, tmp_path, precision, samples, micro_batch, n
):
    _skip_unsupported(precision)
    dataset = review_dataset(tokenizer, samples)
    collator = DataCollatorWithPadding(tokenizer)
    initial = flat_parameters(initial_model)
    reference = reference_steps(initial_model, dataset, collator, micro_batch * n, precision)
    result = trained(ReviewTrainer, initial_model, dataset, collator, tmp_path, micro_batch, n, precision)
    error = update_error(result, reference, initial)
    print(f"{precision} on {DEVICE}: error relative to the update {error:.3g}")  # shown with -s
    assert error < UPDATE_TOLERANCE
    # And the run really was in reduced precision: a float32 run would sit within float32 rounding
    # (1e-4, tests/test_exactness.py) of the float32 reference.
    float32_reference = reference_steps(initial_model, dataset, collator, micro_batch * n, "fp32")
    assert update_error(result, float32_reference, initial) > 1e-4


@pytest.mark.parametrize("precision", ["bf16", "fp16"])
def test_stock_trainer_fails_the_mixed_precision_check(initial_model, tokenizer, tmp_path, precision):
    """The tolerance has teeth: stock Trainer's 2x update on the divisible case is far outside it."""
    _skip_unsupported(precision)
    dataset = review_dataset(tokenizer, 12)
    collator = DataCollatorWithPadding(tokenizer)
    initial = flat_parameters(initial_model)
    reference = reference_steps(initial_model, dataset, collator, 6, precision)
    result = trained(Trainer, initial_model, dataset, collator, tmp_path, 3, 2, precision)
    assert update_error(result, reference, initial) > 10 * UPDATE_TOLERANCE
