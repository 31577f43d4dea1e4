"""Which layers cost int8 its agreement with fp32? Export a model with some MatMuls kept in fp32 and compare labels.

    python scripts/int8_variants.py runs/drugscom/seed-42 reviews.csv --label_column rating --work /tmp/int8

``reviews.csv`` holds the reviews in the model's text column and, optionally, their true labels
(``--label_column``). Each variant is ``finetune export --int8`` with ONNX Runtime's
``quantize_dynamic`` told to leave some nodes in fp32 (or to quantize only MatMul/Gemm, not the
embedding Gather); every variant's labels are compared with the fp32 PyTorch model's, each review
scored alone (batch 1, so padding plays no part). Prints one row per variant: labels that differ,
agreement, accuracy, and the largest change of a class probability.
"""

from __future__ import annotations

import argparse
import contextlib
import sys
from pathlib import Path

import numpy as np
import pandas as pd

from finetune.cli import main as finetune_main

# Hidden size 384, FFN width 1536 in the packaged MiniLM: a MatMul whose weight has a 1536 side is FFN.
FFN_WIDTH = "1536"
VARIANTS = {
    "all (as shipped)": dict(exclude=lambda nodes: [], matmul_only=False),
    "MatMul only (embeddings fp32)": dict(exclude=lambda nodes: [], matmul_only=True),
    # The FFN's second MatMul reads the GELU's output, the widest range of activations in BERT.
    "FFN output fp32": dict(exclude=lambda nodes: [n for n, key in nodes if key.startswith("gelu")], matmul_only=True),
    "FFN fp32 (attention int8)": dict(
        exclude=lambda nodes: [n for n, key in nodes if FFN_WIDTH in key], matmul_only=True
    ),
    "attention fp32 (FFN int8)": dict(
        exclude=lambda nodes: [n for n, key in nodes if FFN_WIDTH not in key], matmul_only=True
    ),
}


def matmul_nodes(onnx_path: str) -> list[tuple[str, str]]:
    """(name, inputs and weight shapes) of every MatMul/Gemm: the dynamo exporter's names say nothing of the layer."""
    import onnx

    graph = onnx.load(onnx_path).graph
    shapes = {tensor.name: list(tensor.dims) for tensor in graph.initializer}
    return [
        (node.name, " ".join(node.input) + " " + str([shapes.get(name) for name in node.input]))
        for node in graph.node
        if node.op_type in ("MatMul", "Gemm")
    ]


def finetune(argv: list[str]) -> None:
    """Run a finetune command; stop here if it failed (it has printed why)."""
    status = finetune_main(argv)
    if status:
        raise SystemExit(status)


@contextlib.contextmanager
def quantizing_as(variant: dict):
    """Make ``finetune export`` quantize as ``variant`` says (its quantize_dynamic is looked up at call time)."""
    import onnxruntime.quantization as quantization

    original = quantization.quantize_dynamic

    def quantize(source, destination, **options):
        options["nodes_to_exclude"] = variant["exclude"](matmul_nodes(str(source)))
        if variant["matmul_only"]:
            options["op_types_to_quantize"] = ["MatMul", "Gemm"]
        return original(source, destination, **options)

    quantization.quantize_dynamic = quantize
    try:
        yield
    finally:
        quantization.quantize_dynamic = original


def predictions(model: Path, reviews: Path, output: Path) -> pd.DataFrame:
    """``finetune predict`` one review at a time (batch 1) into ``output``."""
    finetune(["predict", str(model), "--input", str(reviews), "--output", str(output), "--batch_size", "1"])
    return pd.read_csv(output)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("model", type=Path)
    parser.add_argument("reviews", type=Path)
    parser.add_argument("--label_column", help="the true labels, to report accuracy")
    parser.add_argument("--work", type=Path, required=True, help="a new folder for the exports and predictions")
    options = parser.parse_args()
    options.work.mkdir(parents=True)
    reference = predictions(options.model, options.reviews, options.work / "fp32.csv")
    probability_columns = [column for column in reference.columns if column.startswith("prob_")]

    def accuracy(frame: pd.DataFrame) -> str:
        if not options.label_column:
            return "-"
        return f"{(frame['label'] == frame[options.label_column]).mean():.4f}"

    print(
        "| variant | labels differing from fp32 | agreement "
        f"| accuracy (fp32 {accuracy(reference)}) | largest probability change |"
    )
    print("| --- | --- | --- | --- | --- |")
    for number, (name, variant) in enumerate(VARIANTS.items()):
        folder = options.work / f"int8-{number}"
        with quantizing_as(variant):
            finetune(["export", str(options.model), "--int8", "--output", str(folder)])
        result = predictions(folder, options.reviews, options.work / f"int8-{number}.csv")
        differ = int((result["label"] != reference["label"]).sum())
        change = np.abs(result[probability_columns].to_numpy() - reference[probability_columns].to_numpy()).max()
        print(
            f"| {name} | {differ} of {len(result)} | {1 - differ / len(result):.1%} "
            f"| {accuracy(result)} | {change:.3f} |",
            flush=True,
        )


if __name__ == "__main__":
    sys.exit(main())
