"""What a caller asks one run for: a recipe, its flags, extra callbacks, a teacher; and the command that says so."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass
class RunRequest:
    """The plain inputs of ``finetune train`` (or ``finetune distill``) for one run."""

    recipe: str | None
    overrides: list[str] = field(default_factory=list)
    callbacks: list[Any] = field(default_factory=list)  # extra ``TrainerCallback``s
    distillation: Any = None  # a :class:`finetune.pipeline.teacher.Distillation`: a teacher's student

    @property
    def command(self) -> list[str]:
        """The command that runs this request, as ``finetune_run.json`` records it."""
        if self.distillation is not None:
            return ["finetune", "distill", str(self.distillation.teacher.folder), *self._recipe_and_flags]
        return ["finetune", "train", *self._recipe_and_flags]

    @property
    def command_head(self) -> list[str]:
        """The command without its flags: ``finetune train RECIPE`` (or ``finetune distill TEACHER RECIPE``)."""
        return self.command[: len(self.command) - len(self.overrides)]

    @property
    def _recipe_and_flags(self) -> list[str]:
        return [*([self.recipe] if self.recipe else []), *self.overrides]
