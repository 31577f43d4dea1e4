"""How far does each int8 quantization move a model's labels from fp32? Export it several ways and compare.

    python scripts/int8_variants.py runs/drugscom/seed-42 reviews.csv --label_column rating --work /tmp/int8

``reviews.csv`` holds the reviews in the model's text column and, optionally, their true labels
(``--label_column``). Each variant is ``finetune export --int8`` with another quantization:
the shipped ``quantize_dynamic`` (int8 weights per channel, one activation scale per tensor),
the same with the FFN's second MatMul kept in fp32, and ONNX Runtime's blockwise MatMulNBits
(8-bit weights and int8 products with scales per row and block of 32 or 128 input channels),
which changes fewer labels but ran slower than fp32 PyTorch on this project's CPU. Every variant's
labels are compared with the fp32 PyTorch model's, each review scored alone (batch 1, so
padding plays no part). Prints one row per variant: labels that differ, agreement, accuracy,
the largest change of a class probability, and the file size.
"""

from __future__ import annotations

import argparse
import functools
import sys
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pandas as pd

from finetune.cli import main as finetune_main
from finetune.commands.export import export
from finetune.export.onnxruntime import quantize_per_channel


def matmul_nodes(onnx_path: Path) -> list[tuple[str, str]]:
    """(name, inputs) of every MatMul/Gemm: the dynamo exporter's node names say nothing of the layer."""
    import onnx

    graph = onnx.load(str(onnx_path)).graph
    return [(node.name, " ".join(node.input)) for node in graph.node if node.op_type in ("MatMul", "Gemm")]


def quantize_dynamic_except(fp32_path: Path, int8_path: Path, keep_fp32: Callable[[str], bool]) -> None:
    """The shipped quantize_dynamic, leaving in fp32 the MatMuls whose inputs ``keep_fp32`` picks."""
    from onnxruntime.quantization import QuantType, quantize_dynamic

    excluded = [name for name, inputs in matmul_nodes(fp32_path) if keep_fp32(inputs)]
    quantize_dynamic(
        str(fp32_path), str(int8_path), weight_type=QuantType.QInt8, per_channel=True, nodes_to_exclude=excluded
    )


def quantize_blockwise(fp32_path: Path, int8_path: Path, block_size: int = 32) -> None:
    """ONNX Runtime's 8-bit MatMulNBits: weight scales per block of input channels; with accuracy_level 4
    the products run in int8 with activations quantized per row and block at run time."""
    import onnx
    from onnxruntime.quantization.matmul_nbits_quantizer import MatMulNBitsQuantizer

    quantizer = MatMulNBitsQuantizer(
        onnx.load(str(fp32_path)), bits=8, block_size=block_size, is_symmetric=True, accuracy_level=4
    )
    quantizer.process()
    quantizer.model.save_model_to_file(str(int8_path), use_external_data_format=False)


VARIANTS = {
    "quantize_dynamic per channel (shipped)": quantize_per_channel,
    # The FFN's second MatMul reads the GELU's output, the widest range of activations in BERT.
    "quantize_dynamic, FFN output fp32": functools.partial(
        quantize_dynamic_except, keep_fp32=lambda inputs: inputs.startswith("gelu")
    ),
    "MatMulNBits 8-bit, blocks of 32": quantize_blockwise,
    "MatMulNBits 8-bit, blocks of 128": functools.partial(quantize_blockwise, block_size=128),
}


def predictions(model: Path, reviews: Path, output: Path) -> pd.DataFrame:
    """``finetune predict`` one review at a time (batch 1) into ``output``."""
    argv = ["predict", str(model), "--input", str(reviews), "--output", str(output), "--batch_size", "1"]
    status = finetune_main(argv)
    if status:
        raise SystemExit(status)
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
        "| int8 variant | labels differing from fp32 | agreement "
        f"| accuracy (fp32 {accuracy(reference)}) | largest probability change | MiB |"
    )
    print("| --- | --- | --- | --- | --- | --- |")
    for number, (name, quantize) in enumerate(VARIANTS.items()):
        folder = export(str(options.model), str(options.work / f"int8-{number}"), quantize=quantize)
        result = predictions(folder, options.reviews, options.work / f"int8-{number}.csv")
        differ = int((result["label"] != reference["label"]).sum())
        change = np.abs(result[probability_columns].to_numpy() - reference[probability_columns].to_numpy()).max()
        size = (folder / "model_int8.onnx").stat().st_size / 2**20
        print(
            f"| {name} | {differ} of {len(result)} | {1 - differ / len(result):.1%} "
            f"| {accuracy(result)} | {change:.3f} | {size:.0f} |",
            flush=True,
        )


if __name__ == "__main__":
    sys.exit(main())
