"""The private ``Trainer`` members ReviewTrainer relies on are all listed, and all still there as listed.

A transformers upgrade that renames one of them, or changes its parameters,
fails ``test_every_private_trainer_member_is_as_listed`` with one line per
member, rather than a run failing mid-training (docs/development.md,
"Upgrading transformers").
"""

from __future__ import annotations

import inspect
import re
from pathlib import Path

import transformers.trainer
from transformers import Trainer

from finetune.training.distillation import DistillationTrainer
from finetune.training.trainer import ReviewTrainer
from finetune.training.trainer_internals import TRAINER_MEMBERS, parameter_names, trainer_member_problems

PACKAGE = Path(__file__).parent.parent / "finetune"


def test_every_private_trainer_member_is_as_listed():
    assert trainer_member_problems(Trainer) == []


def test_our_overrides_take_what_trainer_passes():
    for member in TRAINER_MEMBERS:
        if member.use == "overridden":
            ours = next(cls for cls in (ReviewTrainer, DistillationTrainer) if member.name in dir(cls))
            assert parameter_names(getattr(ours, member.name)) == member.parameters, member.name


def test_a_changed_or_missing_member_is_named():
    class Upgraded(Trainer):
        def _evaluate(self, trial, ignore_keys_for_eval):  # skip_scheduler gone
            return {}

    problems = trainer_member_problems(Upgraded)
    assert problems == [
        "Trainer._evaluate now takes ('trial', 'ignore_keys_for_eval'), expected "
        "('trial', 'ignore_keys_for_eval', 'skip_scheduler') (called in training/trainer.py)"
    ]
    gone = trainer_member_problems(object, TRAINER_MEMBERS[:1])
    assert gone == [
        "Trainer._inner_training_loop is gone (overridden in training/trainer.py: the accumulation loop "
        "replaces Trainer's)"
    ]


def test_every_private_trainer_member_the_package_touches_is_listed():
    # A private name of Trainer's (method, or attribute it sets) used in the training layer, where the
    # Trainer subclasses and their mixins live, must be in the list.
    trainer_source = inspect.getsource(transformers.trainer)
    listed = {member.name for member in TRAINER_MEMBERS}
    unlisted = set()
    for path in (PACKAGE / "training").glob("*.py"):
        text = path.read_text(encoding="utf-8")
        for name in set(re.findall(r"(?:self\.|super\(\)\.|def )(_[a-z]\w*)", text)):
            if (hasattr(Trainer, name) or f"self.{name} =" in trainer_source) and name not in listed:
                unlisted.add(f"{path.relative_to(PACKAGE)}: {name}")
    assert unlisted == set()


def _package_trainer_classes() -> list[type]:
    """ReviewTrainer, DistillationTrainer and the mixins of this package they are made of."""
    classes = [klass for trainer in (ReviewTrainer, DistillationTrainer) for klass in trainer.__mro__]
    return [klass for klass in dict.fromkeys(classes) if klass.__module__.startswith("finetune.")]


def test_overridden_and_called_say_what_the_package_does():
    # "called" is Trainer's own method used as it is; a method we define is "overridden" even where it
    # calls Trainer's through super() (_get_learning_rate), since Trainer then calls ours.
    ours = {name for klass in _package_trainer_classes() for name in vars(klass)}
    wrong = []
    for member in TRAINER_MEMBERS:
        if member.use == "called" and member.name in ours:
            wrong.append(f"{member.name} is listed as called, but the package overrides it")
        if member.use == "overridden" and member.name not in ours:
            wrong.append(f"{member.name} is listed as overridden, but no class of the package defines it")
    assert wrong == []


def test_every_private_trainer_member_used_anywhere_in_the_package_is_listed_with_where():
    # The whole package, not only the training layer: pipeline/fitting.py calls trainer._save_checkpoint.
    # A use outside training/ (where the Trainer classes live) is named in the member's "where".
    trainer_source = inspect.getsource(transformers.trainer)
    members = {member.name: member for member in TRAINER_MEMBERS}
    problems = set()
    for path in PACKAGE.rglob("*.py"):
        text = path.read_text(encoding="utf-8")
        where = str(path.relative_to(PACKAGE))
        # Attribute uses (self._x, trainer._x, super()._x); the methods we define are checked above, by class.
        for name in set(re.findall(r"\.(_[a-z]\w*)\b", text)):
            if not (hasattr(Trainer, name) or f"self.{name} =" in trainer_source):
                continue
            if name not in members:
                problems.add(f"{where}: {name} is not listed")
            elif not where.startswith("training/") and where not in members[name].where:
                problems.add(f"{where}: {name} is used here, and its entry does not say so")
    assert problems == set()


def test_a_use_outside_the_training_layer_must_be_named():
    # The check above, run on a listing that leaves pipeline/fitting.py out of _save_checkpoint's entry.
    (entry,) = [member for member in TRAINER_MEMBERS if member.name == "_save_checkpoint"]
    assert "pipeline/fitting.py" in entry.where
    assert "trainer._save_checkpoint(" in (PACKAGE / "pipeline" / "fitting.py").read_text(encoding="utf-8")
