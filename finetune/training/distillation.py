"""Knowledge distillation: a student learns from a teacher's softened class probabilities and the true labels.

Each training review carries the teacher's log-probabilities (computed once,
before training, by ``finetune distill``). A review's loss is

    alpha * T^2 * KL(teacher_T || student_T) + (1 - alpha) * w[label] * cross_entropy(student, label)

where ``_T`` is a softmax at temperature T (Hinton et al., 2015; the T^2 keeps
the soft term's gradient on the scale of the hard one's), ``w`` the class
weights (1 without class weighting), and the hard term is 0 for an unlabelled
review (label -100), which learns from the teacher alone.

The batch's loss is the plain mean of its reviews' losses, so a micro-batch's
share of its window is its reviews over the window's reviews: the same
arithmetic as the plain loss, and the accumulation contract holds unchanged.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from torch import nn

from ..data.class_weights import class_weights_for
from ..data.columns import column_values
from .accumulation import weighted_share
from .trainer import ReviewTrainer

# The dataset column (and batch key) holding the teacher's log-probabilities for a review.
TEACHER_COLUMN = "teacher_log_probs"
# The label of a review known only through the teacher (from unlabeled_file).
NO_LABEL = -100


def distillation_losses(
    student_logits: torch.Tensor,
    teacher_log_probs: torch.Tensor,
    labels: torch.Tensor,
    alpha: float,
    temperature: float,
    class_weights: torch.Tensor | None = None,
    label_smoothing: float = 0.0,
) -> torch.Tensor:
    """Each review's distillation loss (shape ``[batch]``): the soft term plus the weighted hard term.

    ``teacher_log_probs`` may be any log-softmax (or logits): dividing by T and
    taking a softmax again removes the per-row constant.
    """
    student_logits = student_logits.float()
    student_soft = torch.log_softmax(student_logits / temperature, dim=-1)
    teacher_soft = torch.log_softmax(teacher_log_probs.float().to(student_logits.device) / temperature, dim=-1)
    soft = (teacher_soft.exp() * (teacher_soft - student_soft)).sum(dim=-1) * temperature**2
    labelled = labels != NO_LABEL
    hard = nn.functional.cross_entropy(
        student_logits,
        torch.where(labelled, labels, torch.zeros_like(labels)),
        reduction="none",
        label_smoothing=label_smoothing,
    )
    if class_weights is not None:
        hard = hard * class_weights.to(student_logits.device)[torch.where(labelled, labels, 0)]
    hard = torch.where(labelled, hard, torch.zeros_like(hard))
    return alpha * soft + (1.0 - alpha) * hard


class DistillationTrainer(ReviewTrainer):
    """``ReviewTrainer`` whose training loss is :func:`distillation_losses`, averaged over each batch's reviews.

    Evaluation batches (no teacher column) keep the plain loss, so validation
    losses compare with an ordinary run's. Class weights (``class_weighting``)
    weigh the hard term only and are counted from the labelled reviews.
    """

    def __init__(
        self,
        *args: Any,
        distill_alpha: float = 0.5,
        distill_temperature: float = 2.0,
        class_weights: Sequence[float] | torch.Tensor | None = None,
        **kwargs: Any,
    ) -> None:
        train_dataset = kwargs.get("train_dataset")
        arguments = kwargs.get("args")
        strategy = getattr(arguments, "class_weighting", "none")
        if class_weights is None and strategy != "none" and train_dataset is not None:
            # Unlabelled reviews (-100) have no class to count.
            labels = [label for label in column_values(train_dataset, "labels") if label != NO_LABEL]
            model = kwargs.get("model")
            class_weights = class_weights_for(strategy, labels, model.config.num_labels)
        super().__init__(*args, class_weights=class_weights, **kwargs)
        self.distill_alpha = distill_alpha
        self.distill_temperature = distill_temperature

    def _set_signature_columns_if_needed(self) -> None:
        # Trainer drops every dataset column the model's forward() does not take; the teacher's must stay.
        super()._set_signature_columns_if_needed()
        if TEACHER_COLUMN not in self._signature_columns:
            self._signature_columns = [*self._signature_columns, TEACHER_COLUMN]

    def compute_loss(
        self,
        model: nn.Module,
        inputs: dict[str, Any],
        return_outputs: bool = False,
        num_items_in_batch: Any = None,
    ) -> Any:
        """The batch's mean distillation loss where the batch has teacher probabilities, else the plain loss.

        With ``num_items_in_batch`` (the window's reviews), the batch's share of the window's mean, as the plain loss.
        """
        if TEACHER_COLUMN not in inputs:
            return super().compute_loss(model, inputs, return_outputs, num_items_in_batch)
        inputs = dict(inputs)
        teacher_log_probs = inputs.pop(TEACHER_COLUMN)
        labels = inputs.pop("labels")
        outputs = model(**inputs)
        logits = outputs["logits"] if isinstance(outputs, dict) else outputs[0]
        losses = distillation_losses(
            logits,
            teacher_log_probs,
            labels.view(-1),
            self.distill_alpha,
            self.distill_temperature,
            # Copied to the device once per run (a copy per micro-batch would be a host sync on a GPU).
            None if self.class_weights is None else self._class_weights_on(logits.device),
            self.args.label_smoothing_factor,
        )
        loss = losses.mean()
        if num_items_in_batch is not None:
            loss = weighted_share(loss, float(len(losses)), num_items_in_batch)
        return (loss, outputs) if return_outputs else loss

    def _loss_items(self, inputs: dict[str, Any]) -> float | torch.Tensor:
        # The distillation loss is a plain mean over the batch's reviews, labelled or not, class weights or not.
        if TEACHER_COLUMN in inputs:
            return float(self._count_samples(inputs))
        return super()._loss_items(inputs)
