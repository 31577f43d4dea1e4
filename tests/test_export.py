"""``finetune export --int8`` on the tiny model: both backends' folders round-trip through predict and evaluate."""

from __future__ import annotations

import csv
import json

import numpy as np
import pytest
from helpers import tiny_recipe

from finetune.cli import main

pytest.importorskip("onnxruntime", reason="finetune export needs the [export] extra")
pytest.importorskip("openvino", reason="finetune export needs the [export] extra")
pytest.importorskip("nncf", reason="finetune export needs the [export] extra")

TEXTS = ["great value, works perfectly", "broke after a week", "it is fine", "awful, returned it"] * 8


def test_onnxruntime_int8_export_round_trip(tiny_model_dir, tmp_path, capsys):
    from finetune.evaluation.inference import load_inference_model, predict_probabilities

    exported = tmp_path / "tiny-int8"
    assert main(["export", str(tiny_model_dir), "--int8", "--backend", "onnxruntime", "--output", str(exported)]) == 0
    assert (exported / "model_int8.onnx").is_file() and (exported / "tokenizer.json").is_file()
    assert json.loads((exported / "export.json").read_text())["format"] == "ONNX"
    # Every MatMul was quantized: none is left reading an fp32 weight.
    import onnx

    graph = onnx.load(str(exported / "model_int8.onnx")).graph
    weights = {tensor.name for tensor in graph.initializer if tensor.data_type == onnx.TensorProto.FLOAT}
    assert any(node.op_type == "MatMulInteger" for node in graph.node)
    assert not [node for node in graph.node if node.op_type == "MatMul" and weights & set(node.input)]
    # Exporting again over it is refused, and the folder is left as it was.
    before = (exported / "model_int8.onnx").read_bytes()
    assert main(["export", str(tiny_model_dir), "--int8", "--backend", "onnxruntime", "--output", str(exported)]) == 2
    assert "already exists" in capsys.readouterr().err
    assert (exported / "model_int8.onnx").read_bytes() == before

    # The int8 model gives nearly the fp32 model's probabilities.
    texts = TEXTS
    fp32 = predict_probabilities(*load_inference_model(tiny_model_dir), texts, batch_size=8)
    int8 = predict_probabilities(*load_inference_model(exported), texts, batch_size=8)
    assert int8.shape == fp32.shape and np.allclose(int8.sum(1), 1, atol=1e-5)
    assert np.abs(int8 - fp32).max() < 0.02

    # predict and evaluate take the folder like any model folder.
    reviews = tmp_path / "reviews.csv"
    reviews.write_text('review\n"great value, works perfectly"\nbroke after a week\nit is fine\n', encoding="utf-8")
    output = tmp_path / "out.csv"
    assert main(["predict", str(exported), "--input", str(reviews), "--output", str(output)]) == 0
    rows = list(csv.DictReader(output.read_text(encoding="utf-8").splitlines()))
    assert [row["review"] for row in rows] == texts[:3]
    assert [row["label"] for row in rows] == [f"LABEL_{index}" for index in int8[[0, 1, 2]].argmax(1)]
    labelled = tmp_path / "labelled.csv"
    labelled.write_text("text,label\ngreat value,LABEL_0\nbroke after a week,LABEL_1\nit is fine,LABEL_2\n")
    assert main(["evaluate", str(exported), "--data", str(labelled), "--resamples", "50"]) == 0
    report = json.loads((exported / "evaluation_data-labelled.json").read_text())[0]
    assert report["num_samples"] == 3 and len(report["intervals"]["accuracy"]) == 2


def _weight_source(node):
    """The node a MatMul's weight input comes from, through the conversions int8 weights are stored with."""
    while node.get_type_name() in ("Convert", "Multiply", "Subtract", "Reshape", "Transpose"):
        node = node.input_value(0).get_node()
    return node


def _weighted_matmuls(model):
    """The model's MatMuls whose second input is a stored weight (not attention's scores)."""
    return [
        op
        for op in model.get_ordered_ops()
        if op.get_type_name() == "MatMul" and _weight_source(op.input_value(1).get_node()).get_type_name() == "Constant"
    ]


def _assert_int8_except(weighted, kept, static=True):
    """Every MatMul in ``weighted`` reads int8 weights (and, static, FakeQuantized inputs) unless it is in ``kept``."""
    kept_names = {op.get_friendly_name() for op in kept}
    for op in weighted:
        weight_type = str(_weight_source(op.input_value(1).get_node()).get_element_type())
        quantized_input = op.input_value(0).get_node().get_type_name() == "FakeQuantize"
        if op.get_friendly_name() in kept_names:
            assert weight_type == "<Type: 'float32'>" and not quantized_input, op.get_friendly_name()
        else:
            assert weight_type == "<Type: 'int8_t'>" and quantized_input == static, op.get_friendly_name()


def test_openvino_int8_export_round_trip(tiny_model_dir, tmp_path, capsys):
    import openvino as ov

    from finetune.evaluation.inference import load_inference_model, predict_probabilities

    calibration = tmp_path / "calibration.csv"
    calibration.write_text("text\n" + "".join(f'"{text}"\n' for text in TEXTS[:4]) + "unused review\n")
    exported = tmp_path / "tiny-int8"
    command = ["export", str(tiny_model_dir), "--int8", "--calibration", str(calibration), "--output", str(exported)]
    assert main([*command, "--calibration_reviews", "4"]) == 0
    assert "openvino" in capsys.readouterr().err
    record = json.loads((exported / "export.json").read_text())
    assert record["backend"] == "openvino" and record["calibration_reviews"] == 4
    assert (exported / "openvino_model.bin").is_file() and (exported / "tokenizer.json").is_file()

    # Static int8: every MatMul with a weight reads int8 weights, and its activations pass a
    # FakeQuantize whose range was measured in calibration; all but the first layer's
    # feed-forward output and the head (pooler, classifier), which stay fp32.
    model = ov.Core().read_model(str(exported / "openvino_model.xml"))
    weighted = _weighted_matmuls(model)
    assert len(weighted) == 2 * 6 + 2  # 2 layers of Q, K, V, attention output, FFN in and out; pooler, classifier
    kept_names = ("layer.0.output.dense/", "bert.pooler.dense/", "__module.classifier/")
    kept = [op for op in weighted if any(name in op.get_friendly_name() for name in kept_names)]
    assert len(kept) == 3
    _assert_int8_except(weighted, kept)

    # Exporting again over it is refused, and the folder is left as it was.
    before = (exported / "openvino_model.bin").read_bytes()
    assert main(command) == 2
    assert "already exists" in capsys.readouterr().err
    assert (exported / "openvino_model.bin").read_bytes() == before

    # The int8 model gives nearly the fp32 model's probabilities, and predict takes its folder.
    fp32 = predict_probabilities(*load_inference_model(tiny_model_dir), TEXTS, batch_size=8)
    int8 = predict_probabilities(*load_inference_model(exported), TEXTS, batch_size=8)
    assert int8.shape == fp32.shape and np.allclose(int8.sum(1), 1, atol=1e-5)
    assert np.abs(int8 - fp32).max() < 0.02
    output = tmp_path / "out.csv"
    assert main(["predict", str(exported), "--input", str(calibration), "--output", str(output)]) == 0
    rows = list(csv.DictReader(output.read_text(encoding="utf-8").splitlines()))
    assert [row["label"] for row in rows[:4]] == [f"LABEL_{index}" for index in int8[:4].argmax(1)]


@pytest.mark.parametrize("backend", ["openvino", "onnxruntime"])
def test_fp32_fallback_export_round_trip(tiny_model_dir, tmp_path, capsys, backend):
    from finetune.evaluation.inference import load_inference_model, predict_probabilities
    from finetune.export.fallback import Int8WithFallback

    exported = tmp_path / "tiny-int8"
    command = ["export", str(tiny_model_dir), "--int8", "--backend", backend, "--output", str(exported)]
    if backend == "openvino":
        calibration = tmp_path / "calibration.csv"
        calibration.write_text("text\n" + "".join(f'"{text}"\n' for text in TEXTS[:4]))
        command += ["--calibration", str(calibration)]
    # A margin of 1 makes every review a close call: the fp32 model scores them all.
    assert main([*command, "--fp32_fallback", "1"]) == 0
    assert "fp32 for reviews whose top two are within 1" in capsys.readouterr().err
    record = json.loads((exported / "export.json").read_text())
    assert record["fp32_fallback"]["margin"] == 1.0 and (exported / "fp32" / "model.safetensors").is_file()
    model, tokenizer = load_inference_model(exported)
    assert isinstance(model, Int8WithFallback)
    fp32 = predict_probabilities(*load_inference_model(tiny_model_dir), TEXTS, batch_size=8)
    np.testing.assert_allclose(predict_probabilities(model, tokenizer, TEXTS, batch_size=8), fp32, atol=1e-6)
    assert model.rescored == len(TEXTS)

    # predict takes the folder; without its fp32 model, it says what is missing and what to do.
    reviews = tmp_path / "reviews.csv"
    reviews.write_text("text\ngreat value\nbroke after a week\n", encoding="utf-8")
    assert main(["predict", str(exported), "--input", str(reviews), "--output", str(tmp_path / "out.csv")]) == 0
    (exported / "fp32" / "model.safetensors").unlink()
    capsys.readouterr()
    assert main(["predict", str(exported), "--input", str(reviews), "--output", str(tmp_path / "again.csv")]) == 2
    error = capsys.readouterr().err.strip()
    assert "fp32/model.safetensors is missing" in error and "export again with --fp32_fallback" in error
    assert len(error.splitlines()) == 1 and not (tmp_path / "again.csv").exists()


def test_openvino_weights_only_export_needs_no_reviews(tiny_model_dir, tmp_path):
    import openvino as ov

    from finetune.evaluation.inference import load_inference_model, predict_probabilities

    exported = tmp_path / "tiny-weights"
    # The tiny model folder has no run on record: weight-only int8 needs no calibration reviews.
    assert main(["export", str(tiny_model_dir), "--int8", "--weights_only", "--output", str(exported)]) == 0
    record = json.loads((exported / "export.json").read_text())
    assert record["runtime_settings"] == {"DYNAMIC_QUANTIZATION_GROUP_SIZE": 32} and "calibration_reviews" not in record
    model = ov.Core().read_model(str(exported / "openvino_model.xml"))
    # Every layer's weights in int8; the head (pooler, classifier) in fp32.
    weighted = _weighted_matmuls(model)
    head = [op for op in weighted if "pooler" in op.get_friendly_name() or "classifier" in op.get_friendly_name()]
    assert len(weighted) == 2 * 6 + 2 and len(head) == 2
    _assert_int8_except(weighted, head, static=False)
    assert not [op for op in model.get_ordered_ops() if op.get_type_name() == "FakeQuantize"]
    fp32 = predict_probabilities(*load_inference_model(tiny_model_dir), TEXTS, batch_size=8)
    int8_probabilities = predict_probabilities(*load_inference_model(exported), TEXTS, batch_size=8)
    assert np.abs(int8_probabilities - fp32).max() < 0.02


@pytest.mark.parametrize("weights_only", [False, True])
def test_the_mean_pooling_layer_stays_fp32(tiny_model_dir, tmp_path, weights_only):
    """A pooling: mean model's appended layer is left whole in fp32; the layers below are int8."""
    import openvino as ov
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    from finetune.evaluation.inference import load_inference_model, predict_probabilities
    from finetune.training.pooling import add_mean_pooling_layer

    pooled = tmp_path / "tiny-mean"
    add_mean_pooling_layer(AutoModelForSequenceClassification.from_pretrained(tiny_model_dir)).save_pretrained(pooled)
    AutoTokenizer.from_pretrained(tiny_model_dir).save_pretrained(pooled)
    calibration = tmp_path / "calibration.csv"
    calibration.write_text("text\n" + "".join(f'"{text}"\n' for text in TEXTS[:4]))
    exported = tmp_path / "tiny-mean-int8"
    mode = ["--weights_only"] if weights_only else ["--calibration", str(calibration)]
    assert main(["export", str(pooled), "--int8", *mode, "--output", str(exported)]) == 0

    weighted = _weighted_matmuls(ov.Core().read_model(str(exported / "openvino_model.xml")))
    # The fresh pooling layer's all-zero products (query, feed-forward output) are folded away.
    assert len([op for op in weighted if "layer.2." in op.get_friendly_name()]) >= 4
    kept_names = ["layer.2.", "pooler", "classifier"] + ([] if weights_only else ["layer.0.output.dense/"])
    kept = [op for op in weighted if any(name in op.get_friendly_name() for name in kept_names)]
    assert len(weighted) - len(kept) == 2 * 6 - (0 if weights_only else 1)
    _assert_int8_except(weighted, kept, static=not weights_only)
    fp32 = predict_probabilities(*load_inference_model(pooled), TEXTS, batch_size=8)
    int8 = predict_probabilities(*load_inference_model(exported), TEXTS, batch_size=8)
    assert np.abs(int8 - fp32).max() < 0.02


@pytest.fixture(scope="module")
def small_run(tmp_path_factory, tiny_model_dir):
    """A tiny run trained for one epoch, with its ``finetune_run.json``: its train split calibrates."""
    folder = tmp_path_factory.mktemp("export-run")
    recipe = tiny_recipe(
        folder,
        tiny_model_dir,
        folder / "run",
        num_train_epochs=1,
        eval_strategy='"no"',
        save_strategy='"no"',
        load_best_model_at_end="false",
    )
    assert main(["train", str(recipe)]) == 0
    return folder / "run"


def test_openvino_export_calibrates_on_the_run_train_split(small_run, tmp_path):
    exported = tmp_path / "run-int8"
    assert main(["export", str(small_run), "--int8", "--calibration_reviews", "40", "--output", str(exported)]) == 0
    record = json.loads((exported / "export.json").read_text())
    assert record["calibration_source"] == "the run's train split" and record["calibration_reviews"] == 40
    # The run's record comes along, so predict reads reviews (title, cleaning) as the run trained.
    assert (exported / "finetune_run.json").read_bytes() == (small_run / "finetune_run.json").read_bytes()
    assert main(["evaluate", str(exported), "--resamples", "50"]) == 0
    fp32 = json.loads((small_run / "test_report.json").read_text())
    int8 = json.loads((exported / "evaluation_test.json").read_text())[0]
    assert int8["num_samples"] == fp32["num_samples"] == 111
    assert abs(int8["accuracy"] - fp32["accuracy"]) <= 2 / 111


def test_calibration_samples_are_the_windows_predict_scores(tokenizer):
    from finetune.data.encoding import ReviewEncoding, encode_windows
    from finetune.export.openvino import _calibration_samples

    texts = ["short review", " ".join(["long"] * 100)]
    encoding = ReviewEncoding(max_length=32, sliding_window=True, window_stride=8)
    samples = _calibration_samples(tokenizer, texts, encoding)
    windows = encode_windows(tokenizer, texts, encoding)[0]
    assert len(samples) == len(windows["input_ids"]) > len(texts)
    assert [sample["input_ids"][0].tolist() for sample in samples] == windows["input_ids"]
    assert all(sample["input_ids"].shape == (1, len(sample["input_ids"][0])) for sample in samples)


@pytest.mark.parametrize(
    ("extra", "says"),
    [
        ([], "pass --calibration FILE"),  # a model folder with no run on record
        (["--calibration", "missing.csv"], "input file not found: missing.csv"),
        (["--backend", "onnxruntime", "--calibration", "x.csv"], "--calibration is for --backend openvino"),
        (["--calibration_reviews", "0"], "--calibration_reviews"),
        (["--weights_only", "--calibration", "x.csv"], "--weights_only needs no calibration reviews"),
        (["--weights_only", "--backend", "onnxruntime"], "--weights_only is for --backend openvino"),
        (["--backend", "tensorrt"], "--backend"),
        (["--fp32_fallback", "0"], "--fp32_fallback must be a probability gap in (0, 1]"),
        (["--fp32_fallback", "1.5"], "pass e.g. --fp32_fallback 0.1"),
    ],
)
def test_export_refusals_say_the_fix_and_write_nothing(tiny_model_dir, tmp_path, capsys, monkeypatch, extra, says):
    monkeypatch.chdir(tmp_path)
    exported = tmp_path / "out"
    assert main(["export", str(tiny_model_dir), "--int8", "--output", str(exported), *extra]) == 2
    error = capsys.readouterr().err.strip()
    assert says in error and len(error.splitlines()) == 1 and "Traceback" not in error
    assert not exported.exists()
