"""One recipe trained end to end as named stages: check, read, build, fit, score, report.

Each stage is a function of plain inputs and outputs in a module of its own
(:mod:`.arguments`, :mod:`.reading`, :mod:`.baseline`, :mod:`.building`,
:mod:`.fitting`, :mod:`.scoring`, :mod:`.reporting`); :func:`train` reads as
the story of a run. ``finetune train`` is this; ``--seeds``, ``--folds``,
``check`` and ``distill`` repeat it (:mod:`.repeats`).
"""

from __future__ import annotations

import contextlib
from typing import TYPE_CHECKING, Any

from .arguments import checked_arguments, checked_start, held_output_dir
from .baseline import collect_baseline, fit_baseline_inline
from .building import build_model, build_trainer
from .fitting import fit
from .reading import add_teacher, read_data, say_data_report
from .reporting import write_report
from .request import RunRequest
from .scoring import score_test

if TYPE_CHECKING:
    from ..config.recipes import Recipe
    from ..training.run_clock import RunClock


def train(
    recipe: str | None,
    overrides: list[str] | None = None,
    callbacks: list[Any] | None = None,
    distillation: Any = None,
) -> dict[str, Any]:
    """Run one recipe end to end and return its metrics (also written to ``output_dir``).

    ``overrides`` are flags such as ``["--learning_rate", "3e-5"]``; they win
    over the recipe's values. ``callbacks`` are extra ``TrainerCallback``s.
    ``distillation`` (a :class:`finetune.pipeline.teacher.Distillation`) makes
    the run a student of a teacher run: ``finetune distill``.
    """
    from ..training.run_clock import RunClock

    clock = RunClock()  # the run's wall-clock breakdown, printed at its end and kept in report/metrics.json
    request = RunRequest(recipe, list(overrides or []), list(callbacks or []), distillation)
    # Arguments: recipe, then flags. Everything that can be checked is checked before anything is
    # written, and nothing of an earlier run is deleted before training has started.
    run = checked_arguments(recipe, overrides, distilling=distillation is not None)
    with held_output_dir(run.training):
        resume = checked_start(run)
        # Work started beside the run (the baseline's process) ends with it, however it ends.
        with contextlib.ExitStack() as beside_the_run:
            return train_checked(request, run, resume, clock, beside_the_run)


def train_checked(
    request: RunRequest,
    run: Recipe,
    resume: str | None,
    clock: RunClock,
    beside_the_run: contextlib.ExitStack | None = None,
) -> dict[str, Any]:
    """Read the data, train, save, evaluate and report a recipe whose arguments have passed every check.

    ``clock`` is lapped at each part's end. ``beside_the_run`` ends what the run starts beside itself
    (the baseline's process) when the run ends; without it, the baseline is fitted inline.
    """
    import transformers

    args = run.training
    if args.process_index != 0:
        transformers.utils.logging.disable_progress_bar()  # one "Loading weights" bar, not one per process
    clock.lap("startup")

    # Data: read, split and tokenize (the baseline's process starts here), a teacher's labels, the report.
    inputs, baseline_job = read_data(run, clock, beside_the_run)
    if request.distillation is not None:
        add_teacher(inputs, request.distillation, args, clock)
    say_data_report(inputs, request.distillation, args)
    clock.lap("tokenize")
    # The baseline inline, where no process fits it beside the training.
    baseline = fit_baseline_inline(inputs.data, args) if baseline_job is None else None
    if baseline_job is None and args.baseline and args.process_index == 0:
        clock.lap("baseline")

    # Model and Trainer, then train: the final model saved whole, calibrated first if asked.
    model = build_model(run, inputs.data)
    clock.lap("load")
    trainer, update_recorder, stopper = build_trainer(request, run, inputs, model, resume)
    clock.lap("other")  # building the Trainer
    metrics = fit(trainer, stopper, request, resume, inputs, clock)

    # Evaluate on the test split with the model that training ended with (the best, if asked).
    report = score_test(trainer, inputs)
    if report is not None:
        metrics["test"] = report
        clock.lap("test_scoring")
    # The baseline's process has fitted beside the training (and the test scoring); the run waits
    # for what is left of it, if anything.
    if baseline_job is not None:
        baseline = collect_baseline(baseline_job)
        clock.lap("baseline")
    if baseline is not None:
        metrics["baseline"] = baseline.to_dict()

    # Report: pictures and their numbers in report/, then the model card, then the time breakdown.
    write_report(trainer, request.recipe, update_recorder, metrics, clock)
    return metrics
