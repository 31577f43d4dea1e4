"""``finetune train RECIPE --seeds N``: the recipe once per seed, then the mean and spread of its test scores.

Fine-tuning on a few hundred reviews varies a lot with the seed (the new
head's initialisation, dropout, the order, the held-out validation reviews),
so one run's score says little. Seeds ``seed, seed + 1, ...`` each train into
``OUTPUT_DIR/seed-<seed>``; ``OUTPUT_DIR/seeds.json`` and ``seeds.md`` hold
every run's test scores beside the baseline's (see :mod:`.repeats`).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ..config.arguments import MAX_SEED
from ..errors import FinetuneError
from ..pipeline.repeats import Repeat, run_repeats


def train_seeds(recipe: str | None, overrides: list[str] | None, seeds: int, teacher: Any = None) -> dict[str, Any]:
    """Train ``recipe`` with ``seeds`` consecutive seeds; returns (and writes) the per-run figures and their summary.

    With ``teacher`` (a :class:`finetune.pipeline.teacher.TeacherRun`), each seed is a student of it.
    """
    from ..config.recipes import load_recipe

    if seeds < 1:
        raise FinetuneError(f"--seeds must be >= 1 (got {seeds}); e.g. --seeds 3")
    overrides = list(overrides or [])
    run = load_recipe(recipe, overrides)  # every flag checked before the first run starts
    folder = Path(run.training.output_dir)
    first_seed = run.training.seed
    if first_seed + seeds - 1 > MAX_SEED:
        raise FinetuneError(
            f"--seeds {seeds} from seed {first_seed} passes the largest seed, {MAX_SEED}; pass a smaller --seed"
        )
    repeats = [
        Repeat(seed, ["--seed", str(seed)], folder / f"seed-{seed}") for seed in range(first_seed, first_seed + seeds)
    ]
    return run_repeats(
        recipe,
        overrides,
        repeats,
        folder,
        "seed",
        "test",
        run.training.overwrite_output_dir,
        ["--seeds", str(seeds)],
        teacher=teacher,
    )
