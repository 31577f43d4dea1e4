"""Fixtures of the bad-input tests: one finished 2-update run that each test copies."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from finetune.cli import main

from .common import run_recipe


# Session-wide: resuming, faults and evaluate tests all start from copies of this one run.
@pytest.fixture(scope="session")
def finished_run(tmp_path_factory, tiny_model_dir):
    """A finished 2-update run with checkpoint-1 and checkpoint-2 (each test works on a copy)."""
    folder = tmp_path_factory.mktemp("finished")
    assert main(["train", str(run_recipe(folder, tiny_model_dir))]) == 0
    return folder


@pytest.fixture
def run_copy(finished_run, tmp_path) -> Path:
    """A copy of ``finished_run``'s folder (recipe, data and run) in ``tmp_path``."""
    shutil.copytree(finished_run, tmp_path, dirs_exist_ok=True)
    recipe = tmp_path / "recipe.yaml"
    recipe.write_text(recipe.read_text().replace(str(finished_run), str(tmp_path)), encoding="utf-8")
    return tmp_path
