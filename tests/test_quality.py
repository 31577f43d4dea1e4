"""What makes the models better than the obvious alternative: the baseline, long reviews, scoring in windows."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from transformers import AutoModelForSequenceClassification, AutoTokenizer

from finetune.data.cleaning import clean_texts
from finetune.data.encoding import ReviewEncoding, encode_windows
from finetune.evaluation.baseline import TfidfBaseline, compare, run_baseline
from finetune.evaluation.inference import predict_probabilities

LABELS = ["negative", "positive"]


# ------------------------------------------------------------- the baseline


def test_baseline_learns_a_tiny_set_and_reports_what_it_scored():
    train = ["awful broke refund", "terrible awful", "broke cracked refund", "great love perfect", "love it great"]
    train += ["perfect great works"]
    labels = [0, 0, 0, 1, 1, 1]
    test = ["awful refund", "great perfect", "cracked broke", "love works"]
    result = run_baseline(train, labels, {"test": (test, [0, 1, 0, 1])}, LABELS)
    assert result.scores["test"]["accuracy"] == 1.0 and result.scores["test"]["macro_f1"] == 1.0
    assert result.train_reviews == 6 and result.features > 0 and result.note is None
    assert result.scores["test"]["confusion_matrix"] == [[2, 0], [0, 2]]


def test_baseline_is_independent_of_a_hand_built_scikit_learn_pipeline():
    from sklearn.feature_extraction.text import TfidfVectorizer
    from sklearn.linear_model import LogisticRegression
    from sklearn.pipeline import make_pipeline, make_union

    rng = np.random.default_rng(0)
    words = ["good", "bad", "fine", "awful", "great", "meh", "works", "broke", "slow", "fast"]
    texts = [" ".join(rng.choice(words, size=rng.integers(2, 9))) for _ in range(80)]
    labels = [
        int(sum(w in ("good", "great", "works", "fast", "fine") for w in t.split()) * 2 > len(t.split())) for t in texts
    ]
    reference = make_pipeline(
        make_union(
            TfidfVectorizer(ngram_range=(1, 2), sublinear_tf=True),
            TfidfVectorizer(analyzer="char_wb", ngram_range=(2, 5), sublinear_tf=True, min_df=2),
        ),
        LogisticRegression(C=4, max_iter=3000, class_weight="balanced"),
    ).fit(texts[:60], labels[:60])
    ours = TfidfBaseline(2).fit(texts[:60], labels[:60])
    np.testing.assert_allclose(ours.probabilities(texts[60:]), reference.predict_proba(texts[60:]), atol=1e-9)


def test_baseline_gives_absent_classes_zero_probability():
    baseline = TfidfBaseline(3).fit(["good", "bad", "good one", "bad one"], [0, 2, 0, 2])
    probabilities = baseline.probabilities(["good"])
    assert probabilities.shape == (1, 3) and probabilities[0, 1] == 0.0


def test_comparison_is_model_minus_baseline():
    assert compare({"accuracy": 0.8, "macro_f1": 0.6}, {"accuracy": 0.75, "macro_f1": 0.65}) == {
        "accuracy": 0.05,
        "macro_f1": -0.05,
    }


# ------------------------------------------------------ scoring in windows


@pytest.fixture(scope="module")
def tiny_model(tiny_model_dir):
    from transformers import AutoModelForSequenceClassification

    return AutoModelForSequenceClassification.from_pretrained(tiny_model_dir).eval()


def test_windows_equal_a_single_pass_on_short_reviews(tiny_model, tokenizer):
    texts = ["great battery", "broke after a week and the refund took a month", "okay"]
    single = predict_probabilities(tiny_model, tokenizer, texts, encoding=ReviewEncoding(max_length=32))
    windowed = predict_probabilities(
        tiny_model, tokenizer, texts, encoding=ReviewEncoding(max_length=32, sliding_window=True, window_stride=8)
    )
    np.testing.assert_array_equal(windowed, single)


def test_a_long_review_scores_as_the_mean_of_its_windows_logits(tiny_model, tokenizer):
    long_review = " ".join(["great battery lasted", "broke cracked refund", "okay"] * 30)
    texts = ["short one", long_review]
    encoding = ReviewEncoding(max_length=40, sliding_window=True, window_stride=10)
    windowed = predict_probabilities(tiny_model, tokenizer, texts, batch_size=3, encoding=encoding)

    # Reference: each window alone through the model, its logits averaged by hand.
    rows, owners = encode_windows(tokenizer, texts, encoding)
    assert owners.count(1) > 3
    with torch.no_grad():
        logits = [
            tiny_model(**{name: torch.tensor([rows[name][index]]) for name in rows}).logits[0].double()
            for index in range(len(owners))
        ]
    expected = [
        torch.softmax(torch.stack([row for row, owner in zip(logits, owners) if owner == review]).mean(0), -1)
        for review in (0, 1)
    ]
    np.testing.assert_allclose(windowed, torch.stack(expected).numpy(), rtol=1e-5, atol=1e-6)


# -------------------------------------------- layer-wise rates, head warm-up


@pytest.fixture
def fresh_tiny_model(tiny_model_dir):
    from transformers import AutoModelForSequenceClassification

    return AutoModelForSequenceClassification.from_pretrained(tiny_model_dir)


def _trainer(model, tokenizer, tmp_path, **overrides):
    from helpers import quiet_args, review_dataset
    from transformers import DataCollatorWithPadding

    from finetune import ReviewTrainer

    values = dict(per_device_train_batch_size=4, gradient_accumulation_steps=2, num_train_epochs=1, weight_decay=0.01)
    values.update(overrides)
    return ReviewTrainer(
        model=model,
        args=quiet_args(tmp_path, **values),
        train_dataset=review_dataset(tokenizer, 24),
        data_collator=DataCollatorWithPadding(tokenizer),
    )


def test_layerwise_decay_gives_each_depth_its_rate(fresh_tiny_model, tokenizer, tmp_path):
    trainer = _trainer(fresh_tiny_model, tokenizer, tmp_path, learning_rate=1e-3, layerwise_lr_decay=0.5)
    optimizer = trainer.create_optimizer()
    rate_of = {id(parameter): group["lr"] for group in optimizer.param_groups for parameter in group["params"]}
    decay_of = {
        id(parameter): group["weight_decay"] for group in optimizer.param_groups for parameter in group["params"]
    }
    named = dict(fresh_tiny_model.named_parameters())
    # 2 layers: head 1e-3, layer 1 5e-4, layer 0 2.5e-4, embeddings 1.25e-4.
    assert rate_of[id(named["classifier.weight"])] == pytest.approx(1e-3)
    assert rate_of[id(named["bert.pooler.dense.weight"])] == pytest.approx(1e-3)
    assert rate_of[id(named["bert.encoder.layer.1.output.dense.weight"])] == pytest.approx(5e-4)
    assert rate_of[id(named["bert.encoder.layer.0.attention.self.query.weight"])] == pytest.approx(2.5e-4)
    assert rate_of[id(named["bert.embeddings.word_embeddings.weight"])] == pytest.approx(1.25e-4)
    assert decay_of[id(named["classifier.weight"])] == 0.01 and decay_of[id(named["classifier.bias"])] == 0.0
    assert sum(len(group["params"]) for group in optimizer.param_groups) == len(named)
    assert optimizer.param_groups[0]["lr"] == pytest.approx(1e-3)  # the rate Trainer logs is the recipe's


def test_head_learning_rate_alone(fresh_tiny_model, tokenizer, tmp_path):
    trainer = _trainer(fresh_tiny_model, tokenizer, tmp_path, learning_rate=1e-4, head_learning_rate=1e-2)
    optimizer = trainer.create_optimizer()
    rates = {group["depth"]: group["lr"] for group in optimizer.param_groups}
    assert rates == {3: pytest.approx(1e-2), 2: pytest.approx(1e-4), 1: pytest.approx(1e-4), 0: pytest.approx(1e-4)}


def test_with_a_head_rate_the_logs_show_the_encoders_rate_as_scheduled(fresh_tiny_model, tokenizer, tmp_path):
    from transformers import TrainerCallback

    logged, used = [], []  # the logged rate; the top encoder layer's rate in the optimizer as each update steps

    class Rates(TrainerCallback):
        def on_optimizer_step(self, args, state, control, optimizer=None, **kwargs):
            used.append(next(group["lr"] for group in optimizer.param_groups if group["depth"] == 2))

        def on_log(self, args, state, control, logs=None, **kwargs):
            if "learning_rate" in logs:
                logged.append(logs["learning_rate"])

    trainer = _trainer(
        fresh_tiny_model,
        tokenizer,
        tmp_path,
        learning_rate=1e-4,
        head_learning_rate=1e-2,
        num_train_epochs=2,
        logging_strategy="steps",
        logging_steps=1,
    )
    trainer.add_callback(Rates())
    trainer.train()
    assert len(used) == 6 and len(set(used)) == 6  # 3 updates an epoch, a decaying rate
    assert logged == pytest.approx(used) and max(used) <= 1e-4


def test_head_warm_up_leaves_the_encoder_untouched_then_trains_it(fresh_tiny_model, tokenizer, tmp_path):
    from transformers import TrainerCallback

    from finetune.training.layers import encoder_parameters, head_parameters

    snapshots = []

    class Snapshot(TrainerCallback):
        def on_step_end(self, args, state, control, model=None, **kwargs):
            snapshots.append(
                (
                    torch.cat([p.detach().flatten() for p in encoder_parameters(model)]).clone(),
                    torch.cat([p.detach().flatten() for p in head_parameters(model)]).clone(),
                )
            )

    start_encoder = torch.cat([p.detach().flatten() for p in encoder_parameters(fresh_tiny_model)]).clone()
    start_head = torch.cat([p.detach().flatten() for p in head_parameters(fresh_tiny_model)]).clone()
    trainer = _trainer(fresh_tiny_model, tokenizer, tmp_path, learning_rate=1e-2, freeze_encoder_updates=2)
    trainer.add_callback(Snapshot())
    trainer.train()
    assert len(snapshots) == 3  # 24 reviews, 4 x 2 per update
    for encoder, head in snapshots[:2]:
        assert torch.equal(encoder, start_encoder)
        assert not torch.equal(head, start_head)
    assert not torch.equal(snapshots[2][0], start_encoder)


def test_trainable_layers_trains_only_the_top_layers_and_the_head(fresh_tiny_model, tokenizer, tmp_path):
    start = {name: parameter.detach().clone() for name, parameter in fresh_tiny_model.named_parameters()}
    trainer = _trainer(fresh_tiny_model, tokenizer, tmp_path, learning_rate=1e-2, trainable_layers=1)
    trainer.train()
    # 2 layers: layer 1 and the head learn; layer 0 and the embeddings keep their pretrained values.
    for name, parameter in fresh_tiny_model.named_parameters():
        frozen = name.startswith(("bert.embeddings.", "bert.encoder.layer.0."))
        assert torch.equal(parameter, start[name]) == frozen, name
        assert parameter.requires_grad != frozen, name
    optimized = {id(parameter) for group in trainer.optimizer.param_groups for parameter in group["params"]}
    assert optimized == {id(p) for p in fresh_tiny_model.parameters() if p.requires_grad}


def test_early_stopping_needs_the_best_model_kept(tmp_path):
    from helpers import quiet_args

    from finetune import FinetuneError

    with pytest.raises(FinetuneError, match="early_stopping_patience needs an eval_strategy"):
        quiet_args(tmp_path, early_stopping_patience=2)
    with pytest.raises(FinetuneError, match="layerwise_lr_decay must be in"):
        quiet_args(tmp_path, layerwise_lr_decay=1.5)
    with pytest.raises(FinetuneError, match="trainable_layers must be >= 1"):
        quiet_args(tmp_path, trainable_layers=0)


# ------------------------------------------------------------------ seeds


def test_seeds_train_once_per_seed_and_summarise(tmp_path, tiny_model_dir, capsys):
    import json
    import statistics

    from helpers import tiny_recipe

    from finetune.cli import main

    recipe = tiny_recipe(tmp_path, tiny_model_dir, tmp_path / "runs", num_train_epochs=1, seed=7)
    flags = ["--max_train_samples", "64", "--max_test_samples", "40", "--save_strategy", "no"]
    flags += ["--load_best_model_at_end", "false"]
    assert main(["train", str(recipe), "--seeds", "2", *flags]) == 0
    summary = json.loads((tmp_path / "runs" / "seeds.json").read_text())
    assert summary["seeds"] == [7, 8]
    accuracies = []
    for seed in (7, 8):
        report = json.loads((tmp_path / "runs" / f"seed-{seed}" / "test_report.json").read_text())
        run = json.loads((tmp_path / "runs" / f"seed-{seed}" / "finetune_run.json").read_text())
        assert run["seed"] == seed
        accuracies.append(report["accuracy"])
    assert [entry["test accuracy"] for entry in summary["runs"]] == accuracies
    assert summary["mean"]["test accuracy"] == pytest.approx(statistics.fmean(accuracies))
    assert summary["sd"]["test accuracy"] == pytest.approx(statistics.stdev(accuracies))
    assert summary["mean"]["baseline accuracy"] is not None
    # The lead over the baseline is taken run by run, then averaged.
    for entry in summary["runs"]:
        assert entry["accuracy vs baseline"] == pytest.approx(entry["test accuracy"] - entry["baseline accuracy"])
        assert entry["macro-F1 vs baseline"] == pytest.approx(entry["test macro-F1"] - entry["baseline macro-F1"])
    leads = [entry["accuracy vs baseline"] for entry in summary["runs"]]
    assert summary["mean"]["accuracy vs baseline"] == pytest.approx(statistics.fmean(leads))
    table = (tmp_path / "runs" / "seeds.md").read_text()
    assert "| mean ± sd |" in table and table in capsys.readouterr().out
    assert "± +" not in table and "± -" not in table  # a spread has no sign
    # A second time the summary is not overwritten without the flag.
    assert main(["train", str(recipe), "--seeds", "2", *flags]) == 2
    assert "pass --resume_from_checkpoint auto to reuse the finished seeds" in capsys.readouterr().err
    # With "auto", more seeds are added: 7 and 8 are read back, 9 trains, the summary covers all three.
    assert main(["train", str(recipe), "--seeds", "3", *flags, "--resume_from_checkpoint", "auto"]) == 0
    said = capsys.readouterr().err
    assert "seed 7 (1 of 3): finished before in" in said and "seed 8 (2 of 3): finished before in" in said
    grown = json.loads((tmp_path / "runs" / "seeds.json").read_text())
    assert grown["seeds"] == [7, 8, 9] and grown["runs"][:2] == summary["runs"]


def test_stopped_seeds_go_on_with_the_finished_ones_reused(tmp_path, tiny_model_dir, capsys, monkeypatch):
    import json
    import os
    import shutil

    from helpers import PROJECT, tiny_recipe

    import finetune.pipeline.run as train_module
    from finetune.cli import main
    from finetune.errors import TrainingInterrupted

    # A copy of the data, edited in place at the end.
    reviews = shutil.copytree(PROJECT / "data" / "reviews", tmp_path / "reviews")
    recipe = tiny_recipe(tmp_path, tiny_model_dir, tmp_path / "runs", num_train_epochs=1, seed=7, dataset_dir=reviews)
    flags = ["--max_train_samples", "48", "--max_test_samples", "24", "--save_strategy", "no"]
    flags += ["--load_best_model_at_end", "false"]
    real_train, trained = train_module.train, []

    def train_then_stop_at_seed_8(recipe_path, overrides):
        trained.append(overrides[overrides.index("--seed") + 1])
        if trained[-1] == "8":
            raise TrainingInterrupted("stopped by SIGINT at update 1 (epoch 0.50); resume with: (one run)", 130)
        return real_train(recipe_path, overrides)

    monkeypatch.setattr(train_module, "train", train_then_stop_at_seed_8)
    assert main(["train", str(recipe), "--seeds", "2", *flags]) == 130
    advice = capsys.readouterr().err.strip().splitlines()[-1]
    assert advice.endswith(
        f"the seeds finished so far are kept; go on with: finetune train {recipe} {' '.join(flags)} --seeds 2 "
        "--resume_from_checkpoint auto"
    )
    seed_7 = tmp_path / "runs" / "seed-7"
    model_bytes = (seed_7 / "model.safetensors").read_bytes()

    # Going on: seed 7 is read back, not trained again; seed 8, never begun, starts without a checkpoint.
    calls = []
    monkeypatch.setattr(train_module, "train", lambda r, o: calls.append(o) or real_train(r, o))
    assert main(["train", str(recipe), "--seeds", "2", *flags, "--resume_from_checkpoint", "auto"]) == 0
    assert [call[call.index("--seed") + 1] for call in calls] == ["8"]
    assert "--resume_from_checkpoint" not in calls[0]
    assert "seed 7 (1 of 2): finished before in" in capsys.readouterr().err
    assert (seed_7 / "model.safetensors").read_bytes() == model_bytes
    summary = json.loads((tmp_path / "runs" / "seeds.json").read_text())
    report = json.loads((seed_7 / "test_report.json").read_text())
    assert summary["seeds"] == [7, 8] and summary["runs"][0]["test accuracy"] == report["accuracy"]

    # A run begun again over it (--overwrite_output_dir keeps the old report until the new one ends)
    # is not finished: finetune_run.json, written at the start, is newer than the report.
    from finetune.pipeline.repeats import finished_run_metrics

    flags_7 = [*flags, "--seed", "7", "--output_dir", str(seed_7)]
    assert finished_run_metrics(str(recipe), flags_7, seed_7)["test"]["accuracy"] == report["accuracy"]
    later = (seed_7 / "report" / "metrics.json").stat().st_mtime_ns + 10**9
    os.utime(seed_7 / "finetune_run.json", ns=(later, later))
    assert finished_run_metrics(str(recipe), flags_7, seed_7) is None
    os.utime(seed_7 / "report" / "metrics.json", ns=(later + 10**9, later + 10**9))
    assert finished_run_metrics(str(recipe), flags_7, seed_7) is not None
    # Moved or copied elsewhere, the folder holds the same run: where it is is not what it trained.
    moved = shutil.copytree(seed_7, tmp_path / "moved" / "seed-7")
    assert finished_run_metrics(str(recipe), [*flags, "--seed", "7", "--output_dir", str(moved)], moved) is not None
    # The flags' settings written into a recipe (48 read from YAML where "48" was typed; false for "false"):
    # the same run. Another value is another run.
    import yaml

    fields = yaml.safe_load(recipe.read_text(encoding="utf-8"))
    fields.update(max_train_samples=48, max_test_samples=24, save_strategy="no", load_best_model_at_end=False)
    written_out = tmp_path / "written-out.yaml"
    written_out.write_text(yaml.safe_dump(fields), encoding="utf-8")
    where = ["--seed", "7", "--output_dir", str(seed_7)]
    assert finished_run_metrics(str(written_out), where, seed_7) is not None
    written_out.write_text(yaml.safe_dump({**fields, "max_train_samples": 47}), encoding="utf-8")
    assert finished_run_metrics(str(written_out), where, seed_7) is None

    # A data file edited in place (same path, other reviews) is other data: going on is refused, not
    # "resumed" from the finished run's last state, and seed 7 is left as it was.
    train_csv = reviews / "train.csv"
    original = train_csv.read_text(encoding="utf-8")
    train_csv.write_text(original.replace("great", "grand", 1), encoding="utf-8")
    assert finished_run_metrics(str(recipe), flags_7, seed_7) is None
    (tmp_path / "runs" / "seeds.json").unlink()
    calls.clear()
    assert main(["train", str(recipe), "--seeds", "2", *flags, "--resume_from_checkpoint", "auto"]) == 2
    assert (
        capsys.readouterr()
        .err.strip()
        .endswith(
            f"error: {seed_7} already holds a run finished with other recipe values, flags or data files; "
            "pass --overwrite_output_dir to run the seeds again, or choose another output_dir"
        )
    )
    assert calls == [] and (seed_7 / "model.safetensors").read_bytes() == model_bytes
    train_csv.write_text(original, encoding="utf-8")
    os.utime(seed_7 / "report" / "metrics.json", ns=(later + 10**9, later + 10**9))

    # Other values (another learning rate) are another run: seed 7's folder is not taken as finished.
    assert main(["train", str(recipe), "--seeds", "2", *flags, "--learning_rate", "0.01"]) == 2
    assert "already holds a run finished with other recipe values" in capsys.readouterr().err and calls == []
    # Every folder is checked before any seed trains: with seed 7's folder gone, seed 8's refusal still
    # comes before seed 7 would have trained for nothing.
    shutil.rmtree(seed_7)
    assert main(["train", str(recipe), "--seeds", "2", *flags, "--learning_rate", "0.01"]) == 2
    assert f"error: {tmp_path / 'runs' / 'seed-8'} already holds a run" in capsys.readouterr().err and calls == []


# ------------------------------------------------------------------ folds


def test_folds_cross_validate_on_train_and_never_read_the_test_split(tmp_path, tiny_model_dir, capsys):
    import json
    import statistics

    from helpers import tiny_recipe

    from finetune.cli import main
    from finetune.training.runs import load_run_data

    recipe = tiny_recipe(tmp_path, tiny_model_dir, tmp_path / "runs", num_train_epochs=1, seed=7)
    flags = ["--max_train_samples", "60", "--save_strategy", "no", "--load_best_model_at_end", "false"]
    flags += ["--eval_strategy", "no"]
    assert main(["train", str(recipe), "--folds", "3", *flags]) == 0
    summary = json.loads((tmp_path / "runs" / "folds.json").read_text())
    assert summary["folds"] == [0, 1, 2] and summary["scored_on"] == "fold"

    held_out, scores = [], []
    for fold in range(3):
        run_dir = tmp_path / "runs" / f"fold-{fold}"
        run = json.loads((run_dir / "finetune_run.json").read_text())
        splits = load_run_data(run).splits
        train, test = list(splits["train"]["text"]), list(splits["test"]["text"])
        assert len(train) == 40 and len(test) == 20
        # A fold trains on the rest of the 60: none of its held-out reviews.
        assert not set(test) & set(train)
        if fold == 0:
            sixty = set(train) | set(test)
        assert set(train) | set(test) == sixty
        held_out += test
        report = json.loads((run_dir / "test_report.json").read_text())
        assert report["num_samples"] == 20
        scores.append(report["accuracy"])
        # Stratified: each fold holds a third of each class, give or take one review.
        labels = list(splits["train"]["labels"]) + list(splits["test"]["labels"])
        held_out_labels = list(splits["test"]["labels"])
        assert all(abs(held_out_labels.count(c) - labels.count(c) / 3) <= 1 for c in range(3))
    # Together the folds score each of the 60 training reviews once ...
    assert len(held_out) == 60 and set(held_out) == sixty
    # ... and never a review of the recipe's test split.
    without_folds = {**run["data"], "cross_validation_folds": None, "cross_validation_fold": None}
    test_split = load_run_data({**run, "data": without_folds}).splits["test"]
    assert len(test_split) == 111 and not set(held_out) & set(test_split["text"])

    assert [entry["fold accuracy"] for entry in summary["runs"]] == scores
    assert summary["mean"]["fold accuracy"] == pytest.approx(statistics.fmean(scores))
    for entry in summary["runs"]:
        assert entry["accuracy vs baseline"] == pytest.approx(entry["fold accuracy"] - entry["baseline accuracy"])
    table = (tmp_path / "runs" / "folds.md").read_text()
    assert table.startswith("| fold | fold accuracy |") and table in capsys.readouterr().out


def test_folds_leave_out_a_test_split_drawn_from_train():
    """A source with no test split: the test split a normal run draws is set aside before the folds are cut."""
    from helpers import PROJECT

    from finetune.config.arguments import DataArguments
    from finetune.data.splits import load_review_data

    fields = dict(
        train_file=str(PROJECT / "data" / "reviews" / "train.csv"),
        text_column="review",
        label_column="stars",
        label_bins="negative=1-2,neutral=3,positive=4-5",
        test_split_percentage=20,
        validation_split_percentage=0,
    )
    normal = load_review_data(DataArguments(**fields), seed=5).splits
    held_out = []
    for fold in range(3):
        folded = load_review_data(
            DataArguments(**fields, cross_validation_folds=3, cross_validation_fold=fold), seed=5
        ).splits
        assert set(folded) == {"train", "test"}
        assert not set(folded["test"]["text"]) & set(normal["test"]["text"])
        assert not set(folded["train"]["text"]) & set(normal["test"]["text"])
        held_out += list(folded["test"]["text"])
    assert sorted(held_out) == sorted(normal["train"]["text"])


# ------------------------------------------------------------------- tune


def test_tune_runs_trials_and_writes_a_loadable_recipe(tmp_path, tiny_model_dir, monkeypatch):
    pytest.importorskip("optuna")
    import csv
    import json

    from helpers import tiny_recipe

    from finetune import FinetuneError
    from finetune.cli import main
    from finetune.commands.tune import tune
    from finetune.config.recipes import load_recipe

    monkeypatch.chdir(tmp_path)
    recipe = tiny_recipe(tmp_path, tiny_model_dir, tmp_path / "run", num_train_epochs=1)
    flags = ["--max_train_samples", "48", "--max_eval_samples", "24"]
    assert main(["tune", str(recipe), "--trials", "2", "--output", "search", *flags]) == 0
    rows = list(csv.DictReader((tmp_path / "search" / "trials.csv").read_text().splitlines()))
    assert [row["state"] for row in rows] == ["complete", "complete"]
    assert all(0.0 <= float(row["validation_macro_f1"]) <= 1.0 for row in rows)
    best = load_recipe(str(tmp_path / "search" / "best_recipe.yaml"))
    best_row = max(rows, key=lambda row: float(row["validation_macro_f1"]))
    assert best.training.learning_rate == pytest.approx(float(best_row["learning_rate"]))
    assert best.training.gradient_accumulation_steps == int(best_row["gradient_accumulation_steps"])
    assert best.data.max_train_samples is None  # the recipe's own values, not the search's flags

    # Asked for 3 in all, a second call runs only the one still missing.
    assert main(["tune", str(recipe), "--trials", "3", "--output", "search", *flags]) == 0
    assert len(list(csv.DictReader((tmp_path / "search" / "trials.csv").read_text().splitlines()))) == 3

    # A search killed while optuna wrote a journal line leaves it cut short; resuming sets it aside, keeps
    # every whole line and goes on (it once gave a JSONDecodeError traceback and appended after the cut).
    journal_path = tmp_path / "search" / "trials.journal"
    whole = journal_path.read_bytes()
    journal_path.write_bytes(whole[:-20])
    assert main(["tune", str(recipe), "--trials", "4", "--output", "search", *flags]) == 0
    cut_at = whole[:-20].rindex(b"\n") + 1
    assert journal_path.read_bytes().startswith(whole[:cut_at])
    assert (tmp_path / "search" / "trials.journal.cut-short").read_bytes() == whole[cut_at:-20] + b"\n"
    assert all(json.loads(line) for line in journal_path.read_bytes().splitlines())

    # Trials of another recipe or other flags are not mixed into this search.
    journal = (tmp_path / "search" / "trials.journal").read_bytes()
    with pytest.raises(FinetuneError, match=r"searched with the flags --max_train_samples 48 --max_eval_samples 24;"):
        tune(str(recipe), ["--max_train_samples", "40"], trials=4, output="search")
    recipe.write_text(recipe.read_text() + "weight_decay: 0.5\n")
    with pytest.raises(FinetuneError, match=r"searched with other recipe values \(weight_decay\); resume with the"):
        tune(str(recipe), flags, trials=4, output="search")
    assert (tmp_path / "search" / "trials.journal").read_bytes() == journal


# ------------------------------------------- training on all of train


def test_no_validation_split_trains_on_all_of_train_and_keeps_the_final_model(tmp_path, tiny_model_dir, capsys):
    import json

    from helpers import PROJECT, tiny_recipe

    from finetune.cli import main

    reviews = PROJECT / "data" / "reviews"
    recipe = tiny_recipe(
        tmp_path,
        tiny_model_dir,
        tmp_path / "run",
        dataset_dir="null",
        train_file=reviews / "train.csv",
        test_file=reviews / "test.csv",
        validation_split_percentage=0,
        num_train_epochs=1,
    )
    # Evaluating every epoch needs a validation split: said before any model loads.
    assert main(["train", str(recipe)]) == 2
    assert "the data has no validation split (validation_split_percentage 0)" in capsys.readouterr().err
    assert not (tmp_path / "run" / "finetune_run.json").exists()

    flags = ["--eval_strategy", "no", "--save_strategy", "no", "--load_best_model_at_end", "false"]
    assert main(["train", str(recipe), *flags]) == 0
    run = json.loads((tmp_path / "run" / "finetune_run.json").read_text())
    assert run["data_report"]["rows"] == {"train": 458, "test": 111}


def test_a_recipe_seed_is_not_read_as_seeds():
    """``--seed 43`` is the recipe's seed: argparse must not expand it to ``--seeds 43`` (43 runs)."""
    from finetune.cli import build_cli

    options, extra = build_cli().parse_known_args(["train", "recipes/drugscom.yaml", "--seed", "43"])
    # The recipe travels with the flags: the first word that is not a flag is it (see cli._train).
    assert options.seeds is None
    assert extra == ["recipes/drugscom.yaml", "--seed", "43"]
    options, extra = build_cli().parse_known_args(["train", "recipes/drugscom.yaml", "--seeds", "3", "--seed", "7"])
    assert options.seeds == 3
    assert extra == ["recipes/drugscom.yaml", "--seed", "7"]


def test_training_with_sliding_window_scores_the_test_split_in_windows(tmp_path, tiny_model_dir):
    """The test figures at the end of training read long reviews in windows, as evaluate does."""
    import json

    import pandas as pd
    from helpers import PROJECT, tiny_recipe

    from finetune.cli import main

    recipe = tiny_recipe(
        tmp_path,
        tiny_model_dir,
        tmp_path / "run",
        num_train_epochs=1,
        max_length=32,
        truncation_side="head_tail",
        sliding_window="true",
        window_stride=8,
    )
    assert main(["train", str(recipe)]) == 0
    report = json.loads((tmp_path / "run" / "test_report.json").read_text())

    # Independently: the saved model's logits averaged over windows of 30 tokens stepping by 22, review by review.
    saved = AutoModelForSequenceClassification.from_pretrained(tmp_path / "run").eval()
    saved_tokenizer = AutoTokenizer.from_pretrained(tmp_path / "run")
    test = pd.read_csv(PROJECT / "data" / "reviews" / "test.csv", keep_default_na=False)
    titles, reviews = clean_texts(list(test["title"])), clean_texts(list(test["review"]))
    bins = {1: 0, 2: 0, 3: 1, 4: 2, 5: 2}
    cls, sep = saved_tokenizer.cls_token_id, saved_tokenizer.sep_token_id
    correct = 0
    for title, review, stars in zip(titles, reviews, test["stars"]):
        text = f"{title.strip()}. {review.strip()}" if title.strip() else review.strip()
        ids = saved_tokenizer(text, add_special_tokens=False)["input_ids"]
        windows, start = [], 0
        while True:
            windows.append(ids[start : start + 30])
            if start + 30 >= len(ids):
                break
            start += 22
        with torch.no_grad():
            logits = [saved(input_ids=torch.tensor([[cls, *window, sep]])).logits[0] for window in windows]
        correct += int(torch.stack(logits).mean(0).argmax()) == bins[int(stars)]
    assert report["accuracy"] == pytest.approx(correct / len(test))


# ------------------------------------------------------------- mean pooling


def _mean_pooled_classifier(model_dir):
    from finetune.config.arguments import ModelArguments
    from finetune.training.modeling import load_classifier

    return load_classifier(ModelArguments(model_name_or_path=str(model_dir), pooling="mean"), ["a", "b", "c"]).eval()


def test_mean_pooling_reads_the_masked_mean_of_the_token_vectors(tiny_model_dir, tokenizer):
    from transformers import BertModel

    model = _mean_pooled_classifier(tiny_model_dir)
    encoder = BertModel.from_pretrained(tiny_model_dir, add_pooling_layer=False).eval()
    texts = ["great", "the hinge snapped after two days and support never answered my emails"]
    batch = tokenizer(texts, padding=True, return_tensors="pt")
    with torch.no_grad():
        hidden = encoder(**batch).last_hidden_state
        mask = batch["attention_mask"].unsqueeze(-1).float()
        mean = (hidden * mask).sum(1) / mask.sum(1)
        # Independently: layer-normed mean, tanh, then the model's own (new) classifier.
        expected = model.classifier(torch.tanh(torch.nn.functional.layer_norm(mean, mean.shape[-1:], eps=1e-12)))
        logits = model(**batch).logits
        alone = torch.cat([model(**tokenizer([text], return_tensors="pt")).logits for text in texts])
    assert model.config.num_hidden_layers == encoder.config.num_hidden_layers + 1
    pooled = model.bert(**batch).last_hidden_state[:, 0]
    reference = torch.nn.functional.layer_norm(mean, mean.shape[-1:], eps=1e-12)
    assert torch.nn.functional.cosine_similarity(pooled, reference).min() > 0.999
    torch.testing.assert_close(logits, expected, atol=0.02, rtol=0.0)
    # Padding takes no part in the mean: a review scores the same alone as in a padded batch.
    torch.testing.assert_close(alone, logits, atol=1e-5, rtol=0.0)


def test_a_mean_pooled_run_loads_in_pipeline_without_remote_code(tmp_path, tiny_model_dir):
    from helpers import tiny_recipe
    from transformers import pipeline

    from finetune.cli import main

    recipe = tiny_recipe(tmp_path, tiny_model_dir, tmp_path / "run", num_train_epochs=1, pooling="mean")
    assert main(["train", str(recipe)]) == 0
    saved = AutoModelForSequenceClassification.from_pretrained(tmp_path / "run").eval()
    assert saved.config.num_hidden_layers == 3
    classify = pipeline("text-classification", model=str(tmp_path / "run"), trust_remote_code=False)
    text = "Stopped working after a week."
    with torch.no_grad():
        logits = saved(**AutoTokenizer.from_pretrained(tmp_path / "run")(text, return_tensors="pt")).logits[0]
    assert classify(text)[0]["label"] == saved.config.id2label[int(logits.argmax())]
    # Fine-tuning a mean-pooled model again keeps its one pooling layer.
    assert _mean_pooled_classifier(tmp_path / "run").config.num_hidden_layers == 3


def test_mean_pooling_on_a_model_without_a_bert_pooler_is_one_line_with_the_fix(tmp_path, tokenizer):
    from transformers import DistilBertConfig, DistilBertForSequenceClassification

    from finetune.errors import FinetuneError

    config = DistilBertConfig(
        vocab_size=tokenizer.vocab_size, dim=32, n_layers=1, n_heads=2, hidden_dim=64, num_labels=3
    )
    DistilBertForSequenceClassification(config).save_pretrained(tmp_path / "distilbert")
    tokenizer.save_pretrained(tmp_path / "distilbert")
    with pytest.raises(FinetuneError, match=r"pooling: mean works on BERT classifiers .* use pooling: cls"):
        _mean_pooled_classifier(tmp_path / "distilbert")
