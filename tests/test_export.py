"""``finetune export --int8`` on the tiny model: the folder round-trips through predict and evaluate."""

from __future__ import annotations

import csv
import json

import numpy as np
import pytest

from finetune.cli import main

pytest.importorskip("onnxruntime", reason="finetune export needs the [export] extra")


def test_int8_export_round_trip(tiny_model_dir, tmp_path, capsys):
    from finetune.evaluation.inference import load_inference_model, predict_probabilities

    exported = tmp_path / "tiny-int8"
    assert main(["export", str(tiny_model_dir), "--int8", "--output", str(exported)]) == 0
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
    assert main(["export", str(tiny_model_dir), "--int8", "--output", str(exported)]) == 2
    assert "already exists" in capsys.readouterr().err
    assert (exported / "model_int8.onnx").read_bytes() == before

    # The int8 model gives nearly the fp32 model's probabilities.
    texts = ["great value, works perfectly", "broke after a week", "it is fine", "awful, returned it"] * 8
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
    report = json.loads((exported / "evaluation_labelled.json").read_text())[0]
    assert report["num_samples"] == 3 and len(report["intervals"]["accuracy"]) == 2
