"""``finetune distill TEACHER_RUN RECIPE``: train big, ship small.

A trained run (the teacher, e.g. MPNet) labels the recipe's training reviews,
and any ``unlabeled_file`` reviews, with its class probabilities; a student
(the recipe's model, the packaged MiniLM by default) then trains on them and
on the true labels (:mod:`finetune.training.distillation`). The teacher's
probabilities are computed once per teacher, text and encoding and cached, so
a second student (another seed, another alpha) starts at once. Everything else
is ``finetune train``: the same checks, saves, test scores, baseline and
report, and the model card names teacher and student with both scores.
"""

from __future__ import annotations

from typing import Any

from ..pipeline.teacher import TeacherRun


def distill(
    teacher_run: str, recipe: str | None, overrides: list[str] | None = None, seeds: int | None = None
) -> dict[str, Any]:
    """Train the recipe's model as a student of ``teacher_run``; returns its metrics, as ``train`` does.

    With ``seeds``, one student per seed (as ``finetune train --seeds``), the
    soft labels computed once for all; returns the seeds' summary.
    """
    # Every check that needs no data runs before anything is written.
    teacher = TeacherRun.open(teacher_run)
    if seeds is not None:
        from ..pipeline.repeats import run_repeats, seed_repeats

        overrides = list(overrides or [])
        return run_repeats(recipe, overrides, seed_repeats(recipe, overrides, seeds), teacher=teacher)
    return teacher.train_student(recipe, overrides)
