"""Bad input, model: base models and model folders that are incomplete, damaged or do not fit the data.

Each is refused in one line naming the fix, exit status 2, with nothing on disk touched.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from finetune.cli import main

from .common import GOOD_ROWS, damage, recipe_with, run_cli, snapshot, write_csv


def test_base_model_with_only_pickled_weights_names_allow_pickle_weights(tmp_path, tiny_model_dir, capsys):
    import torch
    from safetensors.torch import load_file

    pickled = tmp_path / "pickled"
    shutil.copytree(tiny_model_dir, pickled)
    torch.save(load_file(pickled / "model.safetensors"), pickled / "pytorch_model.bin")
    (pickled / "model.safetensors").unlink()
    write_csv(tmp_path / "train.csv", GOOD_ROWS)
    error = run_cli(["train", recipe_with(tmp_path, pickled)], capsys)
    assert "pass --allow_pickle_weights if you trust where they came from" in error


def test_truncated_base_model_weights(tmp_path, tiny_model_dir, capsys):
    cut = tmp_path / "cut"
    shutil.copytree(tiny_model_dir, cut)
    weights = cut / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[: weights.stat().st_size // 2])
    write_csv(tmp_path / "train.csv", GOOD_ROWS)
    error = run_cli(["train", recipe_with(tmp_path, cut)], capsys)
    assert f"error: {weights} is damaged or cut short (" in error and error.endswith("copy or save it again")


def test_classifier_head_for_another_number_of_classes(tmp_path, tiny_model_dir, capsys):
    write_csv(tmp_path / "train.csv", GOOD_ROWS)
    recipe = recipe_with(tmp_path, tiny_model_dir, label_bins="negative=1-2,positive=3-5")
    error = run_cli(["train", recipe], capsys)
    assert error == (
        f"error: model '{tiny_model_dir}' has a classification head for 3 classes and this recipe has 2; "
        "pass --ignore_mismatched_sizes to replace the head with a new one, or check label_bins / class_names"
    )
    assert not (tmp_path / "run").exists()


def _drop_tokenizer(folder: Path) -> None:
    for name in ("tokenizer.json", "tokenizer_config.json", "vocab.txt", "special_tokens_map.json"):
        (folder / name).unlink(missing_ok=True)


MODEL_FOLDER_FAULTS = {
    # Without its tokenizer files transformers once built an empty tokenizer (every word [UNK]): exit 0, garbage.
    "no-tokenizer": (_drop_tokenizer, "has no tokenizer (no tokenizer.json or vocabulary file, so every word would"),
    "config-cut-short": (
        lambda folder: damage(folder / "config.json"),
        "config.json is damaged or cut short (not JSON",
    ),
    "tokenizer-cut-short": (
        lambda folder: damage(folder / "tokenizer.json"),
        "tokenizer.json is damaged or cut short (not JSON",
    ),
    "weights-cut-short": (lambda folder: damage(folder / "model.safetensors"), "model.safetensors is damaged or cut"),
}


@pytest.mark.parametrize("command", ["predict", "evaluate", "export", "train"])
@pytest.mark.parametrize(("fault", "message"), MODEL_FOLDER_FAULTS.values(), ids=MODEL_FOLDER_FAULTS.keys())
def test_incomplete_or_damaged_model_folder_is_refused(tmp_path, tiny_model_dir, capsys, command, fault, message):
    model = tmp_path / "model"
    shutil.copytree(tiny_model_dir, model)
    fault(model)
    before = snapshot(tmp_path)
    write_csv(tmp_path / "train.csv", GOOD_ROWS)
    # A model that is not a run is scored on a "text" column, its labels its class ids.
    write_csv(tmp_path / "scored.csv", "text,label\ngreat,2\nawful,0\nfine,1\n")
    argv = {
        "predict": ["predict", model, "--input", tmp_path / "train.csv"],
        "evaluate": ["evaluate", model, "--data", tmp_path / "scored.csv"],
        "export": ["export", model, "--int8", "--backend", "onnxruntime"],
        "train": ["train", recipe_with(tmp_path, model)],
    }[command]
    error = run_cli(argv, capsys)
    assert message in error, error
    assert {path: data for path, data in snapshot(tmp_path).items() if path in before} == before
    assert not (tmp_path / "model-int8").exists() and not (tmp_path / "run").exists()


def test_model_folder_with_only_a_vocabulary_file_is_not_refused(tmp_path, tiny_model_dir, capsys):
    # The check is on the loaded tokenizer, not on file names: a slow tokenizer's vocab.txt (or a
    # SentencePiece spm.model) without tokenizer.json still loads a whole vocabulary.
    from transformers import AutoTokenizer

    model = tmp_path / "model"
    shutil.copytree(tiny_model_dir, model)
    vocabulary = AutoTokenizer.from_pretrained(tiny_model_dir).get_vocab()
    _drop_tokenizer(model)
    (model / "vocab.txt").write_text("".join(f"{token}\n" for token in sorted(vocabulary, key=vocabulary.get)))
    write_csv(tmp_path / "in.csv", "review\ngreat\n")
    assert main(["predict", str(model), "--input", str(tmp_path / "in.csv")]) == 0
    assert "great," in capsys.readouterr().out
