"""What the bad-input tests share: a recipe on the tiny model, the CLI run to its one-line error, folder snapshots."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from finetune.cli import main

# The project root (tests/bad_input/common.py is three levels down), where a real `python -m finetune` runs.
PROJECT = Path(__file__).parent.parent.parent


def recipe_with(tmp_path: Path, model_dir: Path, **fields) -> Path:
    """A recipe on ``model_dir`` reading ``tmp_path/train.csv`` (review, stars), ``fields`` replacing its values."""
    values = {
        "model_name_or_path": str(model_dir),
        "train_file": str(tmp_path / "train.csv"),
        "text_column": "review",
        "label_column": "stars",
        "label_bins": "negative=1-2,neutral=3,positive=4-5",
        "max_length": 64,  # the tiny model reads 128 positions
        "output_dir": str(tmp_path / "run"),
        "use_cpu": "true",
    }
    values.update(fields)
    path = tmp_path / "recipe.yaml"
    path.write_text("".join(f"{key}: {value}\n" for key, value in values.items()), encoding="utf-8")
    return path


def write_csv(path: Path, text: str) -> None:
    """Write ``text`` to ``path`` as UTF-8."""
    path.write_text(text, encoding="utf-8")


GOOD_ROWS = "review,stars\ngreat,5\nawful,1\nfine,3\nlovely,4\nbad,2\nokay,3\n"


def run_cli(argv, capsys) -> str:
    """Run ``finetune argv``; check it exits 2 with one ``error:`` line on stderr, and return that line."""
    status = main([str(arg) for arg in argv])
    err = capsys.readouterr().err.strip().splitlines()
    assert status == 2
    assert len(err) == 1 and err[0].startswith("error: "), err
    return err[0]


def snapshot(folder: Path) -> dict[str, bytes]:
    """Every file under ``folder`` and its bytes, to show that nothing was touched."""
    return {str(path): path.read_bytes() for path in sorted(folder.rglob("*")) if path.is_file()}


def unwritable_folder(tmp_path: Path) -> Path:
    """A folder in which nothing can be created: read-only for a user, a sysfs folder for root."""
    if os.geteuid() != 0:
        folder = tmp_path / "read-only"
        folder.mkdir()
        folder.chmod(0o555)
        return folder
    try:
        (Path("/sys") / "finetune-probe").mkdir()
    except OSError:
        return Path("/sys")
    pytest.skip("no unwritable folder on this machine")


TRAIN_ROWS = "review,stars\n" + "".join(
    f"review {index} was {word},{stars}\n"
    for index, (word, stars) in enumerate(
        [("great", 5), ("awful", 1), ("fine", 3), ("lovely", 4), ("bad", 2), ("okay", 3)] * 5
    )
)


def run_recipe(folder: Path, model_dir: Path, **fields) -> Path:
    """A recipe for 2 updates of 4 reviews, a checkpoint after each, on 30 reviews of ``folder/train.csv``."""
    write_csv(folder / "train.csv", TRAIN_ROWS)
    values = dict(
        max_length=32,
        per_device_train_batch_size=4,
        max_steps=2,
        save_strategy="steps",
        save_steps=1,
        eval_strategy="no",
        logging_strategy="no",
        baseline="false",
        disable_tqdm="true",
        report_to="none",
    )
    values.update(fields)
    return recipe_with(folder, model_dir, **values)


def damage(path: Path) -> None:
    """Cut ``path`` to half its length, as a kill part-way through a write would."""
    path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])


EARLIER_RUN = {
    "checkpoint-5/model.safetensors": b"weights",
    "checkpoint-5/optimizer.pt": b"moments",
    "config.json": b"{}",
    "model.safetensors": b"final weights",
    "finetune_run.json": b'{"recipe": "earlier"}',
}


def earlier_run(run_dir: Path) -> dict[str, bytes]:
    """Lay an earlier run's files (EARLIER_RUN) into ``run_dir`` and return their snapshot."""
    for name, data in EARLIER_RUN.items():
        (run_dir / name).parent.mkdir(parents=True, exist_ok=True)
        (run_dir / name).write_bytes(data)
    return snapshot(run_dir)
