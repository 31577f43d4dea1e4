"""What a run folder holds and how to find things in it.

A run folder (``output_dir``) is a Hugging Face model folder (config,
safetensors weights, tokenizer) with ``checkpoint-*`` folders beside the
final model and ``finetune_run.json``, the recipe that made it.
"""

from __future__ import annotations

import json
import re
import shutil
from dataclasses import asdict
from pathlib import Path
from typing import Any

from transformers.trainer_utils import sort_checkpoints

from ..errors import FinetuneError
from .checkpointing import require_safe_weights

RUN_CONFIG = "finetune_run.json"
_CHECKPOINT = re.compile(r"^checkpoint-(\d+)$")
# Files whose presence means a folder already holds a run worth keeping.
_RUN_MARKERS = ("config.json", "model.safetensors", "trainer_state.json", RUN_CONFIG, "all_results.json")


def checkpoints(run_dir: Path) -> list[Path]:
    """The ``checkpoint-<step>`` folders of a run, in step order (Trainer's own listing)."""
    if not run_dir.is_dir():
        return []
    return [Path(path) for path in sort_checkpoints(str(run_dir))]


def checkpoint_step(path: Path) -> int | None:
    """The update step a checkpoint folder was saved at, or None for a final model."""
    match = _CHECKPOINT.match(path.name)
    return int(match.group(1)) if match else None


def holds_run(folder: Path) -> bool:
    """True when ``folder`` has a model, checkpoints or results of an earlier run."""
    return folder.is_dir() and (any((folder / name).exists() for name in _RUN_MARKERS) or bool(checkpoints(folder)))


def prepare_output_dir(output_dir: str, overwrite: bool, resuming: bool, clear: bool = True) -> None:
    """Refuse to train over an earlier run unless asked to; clear its checkpoints when asked (and ``clear``).

    On several processes every one checks, and only the main one clears (``clear``).
    """
    folder = Path(output_dir)
    if not holds_run(folder) or resuming:
        return
    if not overwrite:
        raise FinetuneError(
            f"output_dir {output_dir} already holds a run; pass --overwrite_output_dir to replace it, "
            "--resume_from_checkpoint auto to continue it, or choose another --output_dir"
        )
    # Stale checkpoints would be mistaken for this run's by rotation and by `finetune evaluate`.
    if clear:
        for checkpoint in checkpoints(folder):
            shutil.rmtree(checkpoint)


def save_run_config(
    output_dir: str,
    recipe: Any,
    command: list[str],
    data_report: dict[str, Any] | None = None,
    class_weights: list[float] | None = None,
) -> None:
    """Write what is needed to evaluate, predict with or reproduce the run, and what its data held."""
    folder = Path(output_dir)
    folder.mkdir(parents=True, exist_ok=True)
    config = {
        "recipe": recipe.source,
        "command": command,
        "recipe_values": recipe.values,
        "model": asdict(recipe.model),
        "data": _with_absolute_paths(asdict(recipe.data)),
        # Hold-out splits and subsets are drawn with it; evaluate redraws the same ones.
        "seed": recipe.training.seed,
        "data_report": data_report,
        "class_weights": class_weights,
    }
    (folder / RUN_CONFIG).write_text(json.dumps(config, indent=2, default=str) + "\n", encoding="utf-8")


def _with_absolute_paths(data_fields: dict[str, Any]) -> dict[str, Any]:
    # `finetune evaluate` may run from another folder than training did.
    for key in ("dataset_dir", "train_file", "validation_file", "test_file"):
        if data_fields.get(key):
            data_fields[key] = str(Path(data_fields[key]).resolve())
    return data_fields


def find_run_config(model_dir: Path) -> dict[str, Any] | None:
    """The run config of a model folder or of the run a checkpoint belongs to."""
    for folder in (model_dir, model_dir.parent):
        path = folder / RUN_CONFIG
        if path.is_file():
            return json.loads(path.read_text(encoding="utf-8"))
    return None


def require_model_folder(path: Path) -> None:
    """Raise unless ``path`` holds a loadable model (config and weights)."""
    if not (path / "config.json").is_file():
        raise FinetuneError(f"{path} holds no model (no config.json); pass a run folder or a checkpoint-* folder")
    weights = list(path.glob("*.safetensors")) + list(path.glob("pytorch_model*.bin"))
    if not weights:
        raise FinetuneError(f"{path} has a config.json but no weights (*.safetensors); the save may have been cut off")
    require_safe_weights(path)
