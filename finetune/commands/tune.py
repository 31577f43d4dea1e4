"""``finetune tune RECIPE --trials N``: search a recipe's hyper-parameters with Optuna, through ReviewTrainer.

Each trial trains the recipe's model from the same seed with other values of
``learning_rate``, ``num_train_epochs``, ``warmup_steps`` (a ratio),
``weight_decay`` and ``gradient_accumulation_steps`` (n_accumulate), through
``Trainer.hyperparameter_search`` (Optuna's TPE sampler, seeded with the
recipe's seed; its median pruner stops a trial whose validation score lags the
others' at the same update). The objective is the trial's best validation
macro-F1, the model ``load_best_model_at_end`` would keep. Trials save no
checkpoints. A multi_label recipe's trials train tags (a sigmoid each) and
are compared on validation macro-F1 over tags, each tag given at 0.5 (the
thresholds a run tunes after training are not tuned per trial).

Everything lands in ``OUTPUT`` (default ``runs/<recipe>-tune``):
``trials.journal`` (Optuna's log: a stopped search resumes from it with the
same command, keeping every finished trial; another recipe or other flags are
refused rather than mixed in), ``trials.csv`` / ``trials.md``
(one row per trial) and ``best_recipe.yaml`` (the recipe with the best
trial's values, ready for ``finetune train``).
"""

from __future__ import annotations

import csv
import json
import math
import os
import sys
from pathlib import Path
from typing import Any

import yaml
from transformers import TrainerCallback

from ..config.output_files import output_file, write_output_text
from ..errors import FinetuneError

STUDY_NAME = "finetune-tune"
JOURNAL = "trials.journal"
BEST_RECIPE = "best_recipe.yaml"
OBJECTIVE = "eval_macro_f1"
# The study's record of the recipe values and flags it searches with (see _check_same_search).
SEARCH_ATTRIBUTE = "finetune_search"


def search_space(trial: Any, recipe_epochs: float) -> dict[str, Any]:
    """The values one trial tries. Epochs range from half to twice the recipe's."""
    low_epochs = max(1, math.floor(recipe_epochs / 2))
    return {
        "learning_rate": trial.suggest_float("learning_rate", 1e-5, 2e-4, log=True),
        "num_train_epochs": trial.suggest_int(
            "num_train_epochs", low_epochs, max(low_epochs + 1, round(recipe_epochs * 2))
        ),
        "warmup_steps": trial.suggest_float("warmup_steps", 0.0, 0.2),
        "weight_decay": trial.suggest_float("weight_decay", 0.0, 0.1),
        "gradient_accumulation_steps": trial.suggest_categorical("gradient_accumulation_steps", [1, 2, 4]),
    }


def tune(
    recipe: str, overrides: list[str] | None = None, trials: int = 10, output: str | None = None
) -> dict[str, Any]:
    """Run (or resume) the search; returns the best trial's number, objective and values."""
    try:
        import optuna  # noqa: F401  # the error names the fix before any data is read
    except ImportError:
        raise FinetuneError("finetune tune needs Optuna, which is not installed; pip install optuna (or '.[tune]')")
    from ..config.recipes import load_recipe

    if trials < 1:
        raise FinetuneError(f"--trials must be >= 1 (got {trials}); e.g. --trials 10")
    run = load_recipe(recipe, overrides)
    # Trainer writes each trial's values into args; the space is sized on the recipe's own epochs.
    recipe_epochs = run.training.num_train_epochs
    folder = _checked_folder(recipe, output)
    searched = _searched(recipe, overrides or [])
    if (folder / JOURNAL).is_file():  # checked before the data is read and the journal opened for writing
        _mend_cut_short_journal(folder / JOURNAL)
        _check_same_search(_recorded_study(folder), folder, searched)
    _set_trial_arguments(run.training, folder)
    trainer_inputs = _read_for_trials(run)
    folder.mkdir(parents=True, exist_ok=True)
    storage, finished = _open_study(folder, run.training.seed, searched)
    best_so_far = _BestOfTrial()
    trainer = _trials_trainer(run, trainer_inputs, [best_so_far, _TrialAnnouncer(trials, len(finished))])
    study = _search(trainer, storage, folder, best_so_far, trials - len(finished), recipe_epochs, len(finished))
    best = study.best_trial
    best_path = write_best_recipe(folder / BEST_RECIPE, recipe, overrides or [], best.params, best.value, best.number)
    print(f"best: trial {best.number}, validation macro-F1 {best.value:.4f}, {best.params}")
    print(f"trials in {folder / 'trials.md'}; best recipe {best_path}: finetune train {best_path}", file=sys.stderr)
    return {"number": best.number, "objective": best.value, "params": best.params}


def _checked_folder(recipe: str, output: str | None) -> Path:
    """Where the trials go (``runs/<recipe>-tune`` by default): a new folder, or a search's to resume."""
    folder = Path(output) if output else Path("runs") / f"{Path(recipe).stem}-tune"
    if folder.exists() and not folder.is_dir():
        raise FinetuneError(f"--output {folder} is a file; give a folder for the trials")
    # A folder of trials resumes; any other folder with files in it (a trained run, say) is not
    # written into.
    if folder.is_dir() and any(folder.iterdir()) and not (folder / JOURNAL).is_file():
        raise FinetuneError(
            f"--output {folder} already holds files and no {JOURNAL}, so it is not a search to resume; "
            "choose another --output"
        )
    return folder


def _set_trial_arguments(args: Any, folder: Path) -> None:
    """Trials compare hyper-parameters on validation; they keep no checkpoints."""
    args.output_dir = str(folder / "trainer")
    args.save_strategy = "no"
    args.load_best_model_at_end = False
    args.early_stopping_patience = None
    if args.eval_strategy == "no":
        args.eval_strategy = "epoch"
    args.metric_for_best_model = "macro_f1"
    args.warmup_steps = float(args.warmup_steps)  # Trainer casts a trial's value to the recipe's type


def _read_for_trials(run: Any) -> tuple[Any, Any, Any]:
    """The recipe's data (which must have a validation split), its tokenizer, and the tokenized splits."""
    from ..data.encoding import ReviewEncoding
    from ..data.splits import load_review_data, tokenize_splits
    from ..training.modeling import load_tokenizer

    data = load_review_data(run.data, seed=run.training.seed)
    if data.scale is not None:
        # Trials build a classifier's head and compare macro-F1: a ratings run would be tuned as classes.
        raise FinetuneError(
            f"finetune tune searches a classifier's settings, and this recipe rates stars (task: {data.task}); "
            "train it with --seeds 3 to compare settings by MAE, or tune it as task: single_label"
        )
    if "validation" not in data.splits:
        raise FinetuneError(
            "finetune tune needs a validation split; set validation_file or validation_split_percentage"
        )
    tokenizer = load_tokenizer(run.model, run.data.truncation_side)
    encoding = ReviewEncoding.from_fields(vars(run.data))
    encoded, _ = tokenize_splits(data.splits, tokenizer, encoding)
    print("\n".join(data.report.summary_lines()), file=sys.stderr)
    return data, tokenizer, encoded


def _open_study(folder: Path, seed: int, searched: dict[str, Any]) -> tuple[Any, list[Any]]:
    """The study's storage (made, or opened to resume) and its finished trials; a new one records its search."""
    import optuna

    storage = _storage(folder)
    study = optuna.create_study(
        study_name=STUDY_NAME,
        storage=storage,
        load_if_exists=True,
        direction="maximize",
        sampler=optuna.samplers.TPESampler(seed=seed),
    )
    if not study.trials and SEARCH_ATTRIBUTE not in study.user_attrs:
        study.set_user_attr(SEARCH_ATTRIBUTE, searched)
    finished = [trial for trial in study.trials if trial.state.is_finished()]
    if finished:
        print(f"resuming: {len(finished)} trials already finished in {folder / JOURNAL}", file=sys.stderr)
    return storage, finished


def _trials_trainer(run: Any, trainer_inputs: tuple[Any, Any, Any], callbacks: list[Any]) -> Any:
    """A ReviewTrainer whose model is made anew for each trial."""
    from transformers import DataCollatorWithPadding

    from ..evaluation.metrics import build_compute_metrics
    from ..training.modeling import load_classifier
    from ..training.trainer import ReviewTrainer

    data, tokenizer, encoded = trainer_inputs
    return ReviewTrainer(
        # A multi_label recipe's trials train and score tags (a sigmoid each), as its run would.
        model_init=lambda trial: load_classifier(run.model, data.label_names, data.task, data.scale),
        args=run.training,
        train_dataset=encoded["train"],
        eval_dataset=encoded["validation"],
        data_collator=DataCollatorWithPadding(tokenizer, pad_to_multiple_of=run.training.pad_to_multiple_of),
        processing_class=tokenizer,
        compute_metrics=build_compute_metrics(data.label_names, data.task),
        callbacks=callbacks,
    )


def _search(
    trainer: Any,
    storage: Any,
    folder: Path,
    best_so_far: _BestOfTrial,
    remaining: int,
    recipe_epochs: float,
    finished: int,
) -> Any:
    """Run the ``remaining`` trials; the study, with every finished trial written out however the search ends."""
    import optuna

    seed = trainer.args.seed
    try:
        if remaining > 0:
            trainer.hyperparameter_search(
                hp_space=lambda trial: search_space(trial, recipe_epochs),
                compute_objective=best_so_far.objective,
                n_trials=remaining,
                direction="maximize",
                backend="optuna",
                study_name=STUDY_NAME,
                storage=storage,
                load_if_exists=True,
                sampler=optuna.samplers.TPESampler(seed=seed + finished),
            )
    except KeyboardInterrupt:
        print(
            f"stopped; the finished trials are kept in {folder / JOURNAL}. Resume with the same command.",
            file=sys.stderr,
        )
        raise
    finally:
        study = optuna.load_study(study_name=STUDY_NAME, storage=storage)
        _write_trials(folder, study)
    return study


def _storage(folder: Path) -> Any:
    """Optuna's journal of the search in ``folder``."""
    import optuna

    return optuna.storages.JournalStorage(optuna.storages.journal.JournalFileBackend(str(folder / JOURNAL)))


def _mend_cut_short_journal(journal: Path) -> None:
    """Set aside a last line cut short by a kill, so the search resumes; refuse a journal damaged elsewhere.

    Optuna appends one JSON line per change; a search killed while writing one
    leaves it without its end, and optuna's reader then fails with a traceback.
    That unfinished change never happened, so the line is moved (not deleted)
    to ``trials.journal.cut-short`` and the journal kept up to its last whole
    line. A bad line anywhere else is not a kill's mark: the journal is left
    as it is and the search refused.
    """
    content = journal.read_bytes()
    whole, _, cut = content.rpartition(b"\n")
    lines = whole.split(b"\n") if whole else []
    for number, line in enumerate(lines, start=1):
        try:
            json.loads(line)
        except ValueError:
            raise FinetuneError(
                f"{journal} line {number} is damaged (not JSON), so the search cannot resume from it; "
                "choose another --output to search afresh"
            ) from None
    if not cut:
        return
    kept = journal.with_name(journal.name + ".cut-short")
    with kept.open("ab") as handle:
        handle.write(cut + b"\n")
        handle.flush()
        os.fsync(handle.fileno())
    with journal.open("r+b") as handle:
        handle.truncate(len(content) - len(cut))
    print(
        f"{journal} ended in a line cut short (the search was stopped while writing it); "
        f"it is set aside in {kept.name} and the search resumes from the whole lines",
        file=sys.stderr,
    )


def _recorded_study(folder: Path) -> Any:
    """The study in ``folder``'s journal; None when the journal holds none (a search stopped before it began)."""
    import optuna

    try:
        return optuna.load_study(study_name=STUDY_NAME, storage=_storage(folder))
    except KeyError:  # optuna's "Record does not exist."
        return None


def _searched(recipe: str, overrides: list[str]) -> dict[str, Any]:
    """What a search is made with: the recipe file's values and the flags, as the journal stores them (JSON)."""
    from ..config.recipes import read_recipe_file

    return json.loads(json.dumps({"recipe": read_recipe_file(recipe), "flags": list(overrides)}, default=str))


def _check_same_search(study: Any, folder: Path, searched: dict[str, Any]) -> None:
    """Refuse to resume a study made with other recipe values or flags.

    Trials of another recipe (other data, another model) would be ranked with
    this one's, and the best recipe could come from either. A journal written
    before the record was kept resumes unchecked.
    """
    recorded = None if study is None else study.user_attrs.get(SEARCH_ATTRIBUTE)
    if recorded is None or recorded == searched:
        return
    if recorded["flags"] != searched["flags"]:
        what = f"the flags {' '.join(recorded['flags']) or '(none)'}"
    else:
        keys = sorted(set(recorded["recipe"]) | set(searched["recipe"]))
        changed = [key for key in keys if recorded["recipe"].get(key) != searched["recipe"].get(key)]
        what = f"other recipe values ({', '.join(changed)})"
    raise FinetuneError(
        f"the trials in {folder / JOURNAL} were searched with {what}; "
        "resume with the same recipe and flags, or choose another --output"
    )


def write_best_recipe(
    path: Path, recipe: str, overrides: list[str], params: dict[str, Any], objective: float, number: int
) -> Path:
    """The recipe's own values, with the best trial's on top, as a YAML recipe headed by how it was found."""
    from ..config.recipes import read_recipe_file

    values = read_recipe_file(recipe)
    values.pop("n_accumulate", None)  # the search sets gradient_accumulation_steps
    values.update(params)
    stem = path.parent.name
    values["output_dir"] = f"runs/{stem.removesuffix('-tune')}-tuned"
    command = " ".join(["finetune", "tune", recipe, *overrides])
    header = [
        f"# {recipe} with the values of trial {number} of '{command}',",
        f"# the best validation macro-F1 ({objective:.4f}) of the trials in {path.parent / 'trials.md'}.",
        "#",
        f"#   finetune train {path}",
        "",
    ]
    write_output_text(path, "\n".join(header) + yaml.safe_dump(values, sort_keys=False))
    return path


def _write_trials(folder: Path, study: Any) -> None:
    """``trials.csv`` and ``trials.md``: number, state, objective, seconds and values of every trial."""
    names = sorted({name for trial in study.trials for name in trial.params})
    rows = []
    for trial in study.trials:
        seconds = trial.duration.total_seconds() if trial.duration else None
        rows.append(
            {
                "trial": trial.number,
                "state": trial.state.name.lower(),
                "validation_macro_f1": trial.value,
                "seconds": round(seconds) if seconds is not None else None,
                **{name: trial.params.get(name) for name in names},
            }
        )
    if not rows:
        return
    with output_file(folder / "trials.csv") as handle:
        writer = csv.DictWriter(handle, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
    header = list(rows[0])
    lines = ["| " + " | ".join(header) + " |", "|" + " --- |" * len(header)]
    for row in rows:
        lines.append("| " + " | ".join(_cell(row[name]) for name in header) + " |")
    write_output_text(folder / "trials.md", "\n".join(lines) + "\n")


def _cell(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:.4g}"
    return str(value)


class _BestOfTrial(TrainerCallback):
    """A callback and a ``compute_objective`` in one: the best validation macro-F1 so far in this trial."""

    def __init__(self) -> None:
        self.best = -math.inf

    def objective(self, metrics: dict[str, float]) -> float:
        """Called after each evaluation; the trial's score is the best one, the model it would keep."""
        self.best = max(self.best, metrics[OBJECTIVE])
        return self.best

    def on_train_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        """A new trial starts from nothing."""
        self.best = -math.inf


class _TrialAnnouncer(TrainerCallback):
    """Prints which trial starts, with its values, so the epoch bars below it can be told apart."""

    def __init__(self, trials: int, finished: int) -> None:
        self.trials = trials
        self.number = finished

    def on_train_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        """One line per trial."""
        self.number += 1
        values = ", ".join(
            f"{name} {getattr(args, name):g}"
            for name in ("learning_rate", "num_train_epochs", "warmup_steps", "weight_decay")
        )
        print(
            f"trial {self.number} of {self.trials}: {values}, n_accumulate {args.gradient_accumulation_steps}",
            file=sys.stderr,
        )
