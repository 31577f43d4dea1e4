"""What a run leaves for people: the report pictures and numbers, the model card, the evaluate pictures."""

from __future__ import annotations

import csv
import itertools
import json
from pathlib import Path

import pytest
import yaml
from helpers import tiny_recipe
from PIL import Image

from finetune.cli import main
from finetune.evaluation.report import history_rows

# A small slice of the quickstart data: 96 training reviews in micro-batches of 8, two per update,
# so 6 updates an epoch and 12 in all; the loss is logged every 5, so most updates are not.
SMALL_RUN_FLAGS = [
    "--per_device_train_batch_size", "8",
    "--max_train_samples", "96",
    "--max_eval_samples", "32",
    "--max_test_samples", "48",
    "--warmup_steps", "3",
]  # fmt: skip
UPDATES = 12
WIDE = (800, 500)  # loss, lr, grad_norm, checkpoints: 8 x 5 in at 100 dpi
SQUARE = (700, 600)  # confusion matrices: 7 x 6 in at 100 dpi


@pytest.fixture(scope="module")
def small_run(tmp_path_factory, tiny_model_dir):
    folder = tmp_path_factory.mktemp("report")
    run_dir = folder / "run"
    recipe = tiny_recipe(folder, tiny_model_dir, run_dir)
    assert main(["train", str(recipe), *SMALL_RUN_FLAGS]) == 0
    return run_dir


def png_size(path: Path) -> tuple[int, int]:
    """The pixel size of a PNG, after a full decode (a truncated file fails here)."""
    with Image.open(path) as image:
        assert image.format == "PNG"
        image.load()
        return image.size


def test_run_writes_pictures_of_the_expected_size(small_run):
    report = small_run / "report"
    for name in ("loss.png", "lr.png", "grad_norm.png"):
        assert png_size(report / name) == WIDE, name
    assert png_size(report / "confusion_matrix_test.png") == SQUARE

    metrics = json.loads((report / "metrics.json").read_text())
    assert metrics["recipe_name"] == "recipe"
    assert metrics["batch"] == {
        "effective_batch": 16,
        "per_device_train_batch_size": 8,
        "gradient_accumulation_steps": 2,
        "world_size": 1,
    }
    assert metrics["updates"] == UPDATES
    assert metrics["test"]["num_samples"] == 48
    assert set(metrics["pictures"]) == {"loss.png", "lr.png", "grad_norm.png", "confusion_matrix_test.png"}


def test_history_has_every_update_and_the_logged_numbers(small_run):
    rows = list(csv.DictReader((small_run / "report" / "history.csv").open()))
    state = json.loads((small_run / "trainer_state.json").read_text())
    updates = [row for row in rows if row["kind"] == "update"]
    assert [int(row["step"]) for row in updates] == list(range(1, state["global_step"] + 1))
    assert state["global_step"] == UPDATES

    by_step = {int(row["step"]): row for row in updates}
    logged = [entry for entry in state["log_history"] if "loss" in entry]
    assert [entry["step"] for entry in logged] == [5, 10]
    for entry in logged:
        row = by_step[entry["step"]]
        assert float(row["loss"]) == pytest.approx(entry["loss"])
        assert float(row["grad_norm"]) == pytest.approx(entry["grad_norm"])
        # Recorded by the callback, independently of the log: the two must agree.
        assert float(row["learning_rate"]) == pytest.approx(entry["learning_rate"])
    assert sum(1 for row in updates if row["loss"]) == len(logged)

    # Linear warmup over 3 updates as stepped: 0, 1/3, 2/3 of the peak, then the peak, then decay to the end.
    rates = [float(row["learning_rate"]) for row in updates]
    assert rates[:4] == pytest.approx([0.0, 1e-3 / 3, 2e-3 / 3, 1e-3])
    assert all(later < earlier for earlier, later in itertools.pairwise(rates[3:]))

    evaluations = [row for row in rows if row["kind"] == "evaluation"]
    assert [int(row["step"]) for row in evaluations] == [6, 12]
    assert all(float(row["eval_loss"]) > 0 and 0 <= float(row["eval_macro_f1"]) <= 1 for row in evaluations)


def test_model_card_is_ours_with_hub_metadata(small_run):
    text = (small_run / "README.md").read_text()
    assert text.startswith("---\n")
    front_matter, body = text[4:].split("\n---\n", 1)
    metadata = yaml.safe_load(front_matter)
    assert metadata["library_name"] == "transformers"
    assert metadata["pipeline_tag"] == "text-classification"
    assert metadata["metrics"] == ["accuracy", "f1"]
    assert metadata["datasets"] == ["reviews"]
    assert Path(metadata["base_model"]).name.startswith("tiny-bert")
    assert "finetune" in metadata["tags"]

    test = json.loads((small_run / "test_report.json").read_text())
    assert f"accuracy **{test['accuracy']:.3f}**" in body
    for name, scores in test["per_class"].items():
        assert f"| {name} | {scores['precision']:.3f} | {scores['recall']:.3f} | {scores['f1']:.3f} |" in body
    assert "effective batch 16 = 8 x 2 x 1" in body
    assert "exact full-batch equivalent" in body
    assert "--max_train_samples 96" in body  # the command to reproduce it
    assert "Small test set: 48 reviews" in body
    assert "data/reviews/README.md" in body  # the dataset card of the catalog entry
    assert "![learning rate per update](report/lr.png)" in body


def test_evaluate_writes_its_table_and_pictures(small_run):
    assert main(["evaluate", str(small_run)]) == 0
    assert "| checkpoint-6 | 6 |" in (small_run / "evaluation_test.md").read_text()
    assert png_size(small_run / "confusion_matrix_test.png") == SQUARE
    assert png_size(small_run / "checkpoints_test.png") == WIDE


def test_tensorboard_missing_is_one_line(tmp_path, tiny_model_dir, monkeypatch, capsys):
    # Whether or not TensorBoard is installed here, the check must see it missing.
    monkeypatch.setattr("transformers.integrations.is_tensorboard_available", lambda: False)
    recipe = tiny_recipe(tmp_path, tiny_model_dir, tmp_path / "run", report_to="tensorboard")
    assert main(["train", str(recipe)]) == 2
    err = capsys.readouterr().err
    assert err == (
        "error: report_to tensorboard needs TensorBoard, which is not installed; "
        "pip install tensorboard, or set report_to: none\n"
    )
    assert not (tmp_path / "run").exists()


def test_history_rows_skip_the_summary_and_keep_logged_updates_from_before_a_resume():
    log_history = [
        {"loss": 1.1, "grad_norm": 0.5, "learning_rate": 1e-4, "epoch": 0.5, "step": 2},
        {"eval_loss": 1.0, "eval_accuracy": 0.5, "epoch": 1.0, "step": 4},
        {"loss": 0.9, "grad_norm": 0.4, "learning_rate": 5e-5, "epoch": 1.5, "step": 6},
        {"train_runtime": 3.0, "train_loss": 1.0, "epoch": 2.0, "step": 8},
    ]
    # Resumed at update 4: the recorder saw updates 5 to 8 only.
    recorded = [{"step": step, "epoch": step / 4, "learning_rate": 1e-4 * (8 - step) / 8} for step in range(5, 9)]
    rows = history_rows(log_history, recorded)
    assert [(row["kind"], row["step"]) for row in rows] == [
        ("update", 2),
        ("evaluation", 4),
        *(("update", step) for step in range(5, 9)),
    ]
    assert rows[0]["loss"] == 1.1 and rows[3]["loss"] == 0.9 and "loss" not in rows[2]
    # The recorded rate is kept over the logged one at the same step.
    assert rows[3]["learning_rate"] == pytest.approx(1e-4 * 2 / 8)


def test_model_card_names_the_class_weighting_the_run_used(small_run, tmp_path):
    import shutil

    from finetune.evaluation.model_card import write_model_card

    copy = tmp_path / "run"
    shutil.copytree(small_run, copy)
    run = json.loads((copy / "finetune_run.json").read_text())
    run["recipe_values"]["class_weighting"] = "sqrt"
    run["class_weights"] = [1.115, 1.925, 0.721]
    (copy / "finetune_run.json").write_text(json.dumps(run))
    card = write_model_card(copy).read_text()
    assert "- class weighting `sqrt`: loss weights 1.115, 1.925, 0.721 (in class order)" in card
    assert "`balanced`" not in card.split("## Known limits")[0]


def test_the_baseline_stands_beside_the_run(small_run):
    from finetune.evaluation.baseline import TfidfBaseline

    metrics = json.loads((small_run / "report" / "metrics.json").read_text())
    baseline = metrics["baseline"]
    assert baseline["train_reviews"] == 96 and baseline["fit_seconds"] < 60
    assert set(baseline["scores"]) == {"validation", "test"}
    assert baseline["scores"]["test"]["num_samples"] == metrics["test"]["num_samples"] == 48
    assert metrics["vs_baseline"]["accuracy"] == pytest.approx(
        metrics["test"]["accuracy"] - baseline["scores"]["test"]["accuracy"], abs=1e-4
    )
    card = (small_run / "README.md").read_text()
    assert "| TF-IDF baseline |" in card and "| difference |" in card

    # The same figures from a baseline fit by hand on the run's own train split.
    from finetune.config.arguments import DataArguments
    from finetune.data.splits import load_review_data

    run = json.loads((small_run / "finetune_run.json").read_text())
    splits = load_review_data(DataArguments(**run["data"]), seed=run["seed"]).splits
    again = TfidfBaseline(3).fit(splits["train"]["text"], splits["train"]["labels"])
    predictions = again.predict(splits["test"]["text"])
    correct = sum(int(p == y) for p, y in zip(predictions, splits["test"]["labels"]))
    assert baseline["scores"]["test"]["accuracy"] == pytest.approx(correct / 48)
