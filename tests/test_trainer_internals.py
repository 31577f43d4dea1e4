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
