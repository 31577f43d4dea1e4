"""An int8 copy of a model for CPU prediction: ONNX export, then ONNX Runtime's dynamic quantization.

The default backend of ``finetune export --int8`` is OpenVINO's static int8
(:mod:`.openvino`), the faster one here (README, "Fast prediction");
this one, ``--backend onnxruntime``, needs neither OpenVINO nor calibration reviews.

torch 2.13 still ships ``torch.ao.quantization.quantize_dynamic``, but its
quantized tensors are deprecated and to be removed; torchao's int8 dynamic
quantization ran 2.4x slower than fp32 here in eager mode on CPU. ONNX
Runtime is maintained, quantizes the weights of every MatMul (the Linear
layers) to int8 per channel and quantizes activations on the fly, and runs
them with integer matrix products. Its blockwise alternative (8-bit
MatMulNBits, a scale per block of 32 input channels) changed far fewer
labels but ran slower than fp32 PyTorch here, so it is not the default;
the README's "Fast prediction" compares both.

The folder it writes holds ``model_int8.onnx``, the model's ``config.json``
(labels), its tokenizer and the run's ``finetune_run.json``, so
``finetune predict`` and ``finetune evaluate`` read it like any model folder
(:class:`OnnxClassifier` stands in for the PyTorch model).
"""

from __future__ import annotations

import contextlib
import io
import json
import tempfile
import warnings
from pathlib import Path
from typing import Any

import numpy as np

from ..config.output_files import write_output_text
from ..errors import FinetuneError
from .common import EXPORT_RECORD, quiet_loggers

ONNX_FILE = "model_int8.onnx"
_INSTALL_HINT = "finetune export --int8 needs ONNX Runtime; install it with: pip install 'finetune[export]'"


def require_onnx_runtime() -> None:
    """Raise a one-line FinetuneError unless onnxruntime, onnx and onnxscript can be imported."""
    import importlib.util

    missing = [name for name in ("onnxruntime", "onnx", "onnxscript") if importlib.util.find_spec(name) is None]
    if missing:
        raise FinetuneError(f"{_INSTALL_HINT} (missing: {', '.join(missing)})")


def is_onnx_folder(folder: Path) -> bool:
    """True when ``folder`` holds a model written by :func:`export_int8`."""
    return (folder / ONNX_FILE).is_file() and (folder / "config.json").is_file()


def quantize_per_channel(fp32_path: Path, int8_path: Path) -> None:
    """Write ``fp32_path``'s ONNX model with int8 weights (one scale per output channel) to ``int8_path``.

    Activations are quantized per batch at run time ("dynamic"). With one weight
    scale per tensor the quickstart's test accuracy fell 3.6 points; per channel 0.9
    (one of 111 reviews).
    """
    from onnxruntime.quantization import QuantType, quantize_dynamic

    quantize_dynamic(str(fp32_path), str(int8_path), weight_type=QuantType.QInt8, per_channel=True)


def export_int8(
    model: Any,
    tokenizer: Any,
    output_dir: Path,
    source: str,
) -> Path:
    """Export ``model`` to ONNX, quantize it into ``output_dir``, with its config and tokenizer."""
    require_onnx_runtime()
    import torch

    model = model.float().eval().cpu()
    sample = tokenizer(["a short review", "a longer review of a product that broke"], padding=True, return_tensors="pt")
    inputs = {name: sample[name] for name in ("input_ids", "attention_mask", "token_type_ids") if name in sample}
    batch, length = torch.export.Dim("batch"), torch.export.Dim("length")
    output_dir.mkdir(parents=True)
    # The exporter prints its steps and both libraries warn about things that do not apply to a
    # BERT classifier (torchvision ops, image pre-processing): a successful export says one line.
    with (
        tempfile.TemporaryDirectory(prefix="finetune-export-") as scratch,
        contextlib.redirect_stdout(io.StringIO()),
        warnings.catch_warnings(),
        quiet_loggers("torch.onnx", "torch._export", ""),
    ):
        warnings.simplefilter("ignore")
        fp32_path = Path(scratch) / "model.onnx"
        torch.onnx.export(
            model,
            (),
            str(fp32_path),
            kwargs=inputs,
            input_names=list(inputs),
            output_names=["logits"],
            dynamic_shapes={name: {0: batch, 1: length} for name in inputs},
            dynamo=True,
            optimize=True,
            verbose=False,
        )
        quantize_per_channel(fp32_path, output_dir / ONNX_FILE)
    model.config.save_pretrained(output_dir)
    tokenizer.save_pretrained(output_dir)
    record = {
        "source": source,
        "format": "ONNX",
        "backend": "onnxruntime",
        "quantization": "ONNX Runtime quantize_dynamic: int8 weights (QInt8, per channel), activations at run time",
        "onnx_file": ONNX_FILE,
    }
    write_output_text(output_dir / EXPORT_RECORD, json.dumps(record, indent=2) + "\n")
    return output_dir / ONNX_FILE


class OnnxClassifier:
    """An exported model run by ONNX Runtime, with the ``config`` that :func:`predict_probabilities` reads."""

    def __init__(self, folder: Path, threads: int | None = None) -> None:
        import onnxruntime
        import torch
        from transformers import AutoConfig

        self.config = AutoConfig.from_pretrained(folder)
        options = onnxruntime.SessionOptions()
        # As many threads as torch would use, so fp32 and int8 are compared on the same cores.
        options.intra_op_num_threads = threads or torch.get_num_threads()
        options.inter_op_num_threads = 1
        self.session = onnxruntime.InferenceSession(
            str(folder / ONNX_FILE), options, providers=["CPUExecutionProvider"]
        )
        self.input_names = [node.name for node in self.session.get_inputs()]

    def logits(self, batch: dict[str, Any]) -> np.ndarray:
        """Logits for one padded batch (tensors or arrays keyed by input name)."""
        feed = {name: np.asarray(batch[name], dtype=np.int64) for name in self.input_names}
        return self.session.run(["logits"], feed)[0]
