"""Int8 for fast CPU prediction: OpenVINO runs the model, NNCF quantizes it.

ONNX Runtime's dynamic int8 (:mod:`.onnxruntime`) measures each batch's activations
at run time and ran only 1.1-1.3x as fast as fp32 PyTorch on 2 cores here.
Static int8 (the default) measures the activations' ranges once, on a few
hundred calibration reviews, so the matrix products run in integers with no
per-batch work; NNCF's transformer mode also applies SmoothQuant (moving
activation outliers into the weights), without which 5% of drugscom's test
labels changed. Weight-only int8 quantizes activations at run time in small
groups instead: no calibration, closer to fp32, slower. In ``finetune bench``
on 2 cores, static int8 ran 2.38-2.82x fp32 PyTorch's reviews/s on the three
drugscom seed models with 97.4-99.2% of labels unchanged, and 2.63x with 99.1%
on the quickstart; weight-only 1.98-2.29x with 98.4-99.5% (README, "Fast
prediction"). The labels it changes are near ties, which an fp32 fallback
(:mod:`.fallback`) scores again.

The folder it writes holds ``openvino_model.xml`` / ``.bin``, the model's
``config.json`` (labels), its tokenizer, ``export.json`` (how it was made) and
the run's ``finetune_run.json`` (and ``fp32/`` with a fallback), so ``finetune predict`` and ``finetune
evaluate`` read it like any model folder (:class:`OpenVinoClassifier` stands
in for the PyTorch model).
"""

from __future__ import annotations

import contextlib
import io
import json
import logging
import warnings
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from ..config.output_files import write_output_text
from ..data.encoding import ReviewEncoding, encode_reviews, encode_windows
from ..errors import FinetuneError
from .common import EXPORT_RECORD, quiet_loggers, read_export_record

OPENVINO_FILE = "openvino_model.xml"
CALIBRATION_SEED = 0
# Weight-only int8: activations are quantized at run time with one scale per this many input channels.
DYNAMIC_GROUP = 32
# The first layer's feed-forward output (BERT, RoBERTa: layer.0.output.dense; DistilBERT:
# layer.0.ffn.lin2) stays in fp32 in static int8. Of the encoder's matrix products, keeping that one
# in fp32 cut the int8 logits' error the most, on drugscom (mean 0.048 -> 0.038, 99th percentile
# 0.46 -> 0.26) and on the quickstart (0.039 -> 0.031, 0.48 -> 0.26), for about a tenth of the
# speed-up; any other encoder layer's did next to nothing (README, "Fast prediction").
FP32_MATMULS = (r".*\.layer\.0\.(output\.dense|ffn\.lin2)/.*",)
# The head (pooler, classifier) stays in fp32 in both int8 modes: well under 1% of the work.
FP32_HEAD = (r".*\.(pooler|pre_classifier|classifier)[./].*",)
MODEL_INPUTS = ("input_ids", "attention_mask", "token_type_ids")
_INSTALL_HINT = (
    "finetune export --int8 needs OpenVINO and NNCF; install them with: pip install 'finetune[export]' "
    "(or pass --backend onnxruntime)"
)


def require_openvino() -> None:
    """Raise a one-line FinetuneError unless openvino and nncf can be imported."""
    import importlib.util

    missing = [name for name in ("openvino", "nncf") if importlib.util.find_spec(name) is None]
    if missing:
        raise FinetuneError(f"{_INSTALL_HINT} (missing: {', '.join(missing)})")


def fp32_scope(model: Any, static: bool) -> list[str]:
    """Name patterns of the matrix products an int8 export of ``model`` leaves in fp32.

    Besides the head (and, in static int8, the first feed-forward output), the
    mean-pooling layer of a ``pooling: mean`` model: its residual sum scales the
    token mean by 64 (:mod:`finetune.training.pooling`), and quantizing its inputs
    was the largest error left. On the three drugscom seed models, keeping it in
    fp32 cut the mean change in a test review's probabilities from 0.037-0.044 to
    0.008-0.010 (static) and to 0.006 (weight-only).
    """
    from ..training.pooling import has_mean_pooling

    patterns = [*FP32_HEAD, *(FP32_MATMULS if static else ())]
    if has_mean_pooling(model):
        patterns.append(rf".*\.layer\.{model.config.num_hidden_layers - 1}\..*")
    return patterns


def is_openvino_folder(folder: Path) -> bool:
    """True when ``folder`` holds a model written by :func:`export_openvino_int8`."""
    return (folder / OPENVINO_FILE).is_file() and (folder / "config.json").is_file()


def sample_calibration_texts(texts: Sequence[str], count: int, seed: int = CALIBRATION_SEED) -> list[str]:
    """``count`` of ``texts`` drawn without replacement, seeded, in their order (all of them when fewer)."""
    if len(texts) <= count:
        return list(texts)
    drawn = np.random.default_rng(seed).choice(len(texts), count, replace=False)
    return [texts[index] for index in sorted(drawn)]


def export_openvino_int8(
    model: Any,
    tokenizer: Any,
    output_dir: Path,
    source: str,
    calibration_texts: Sequence[str],
    encoding: ReviewEncoding,
    calibration_source: str,
) -> Path:
    """Convert ``model`` with OpenVINO, quantize it to static int8 on ``calibration_texts``, write ``output_dir``.

    The texts are encoded as predict encodes them (``encoding``: cut, head and
    tail, or windows), and each is fed alone so no padding skews the measured ranges.
    """
    require_openvino()
    if not calibration_texts:
        raise FinetuneError("int8 calibration needs at least one review; pass --calibration FILE with reviews in it")
    samples = _calibration_samples(tokenizer, list(calibration_texts), encoding)

    def quantize(converted: Any) -> Any:
        import nncf

        return nncf.quantize(
            converted,
            nncf.Dataset(samples),
            model_type=nncf.ModelType.TRANSFORMER,
            subset_size=len(samples),
            # validate=False: a model without such a layer is quantized whole rather than refused.
            ignored_scope=nncf.IgnoredScope(patterns=fp32_scope(model, static=True), validate=False),
        )

    record = {
        "quantization": "NNCF static int8 (ModelType.TRANSFORMER: SmoothQuant, int8 weights per channel, "
        "int8 activations with ranges measured on the calibration reviews)",
        "fp32_matmuls": fp32_scope(model, static=True),
        "calibration_reviews": len(calibration_texts),
        "calibration_source": calibration_source,
    }
    return _write_openvino(model, tokenizer, output_dir, source, samples[0], quantize, record)


def export_openvino_weights_int8(model: Any, tokenizer: Any, output_dir: Path, source: str) -> Path:
    """Convert ``model`` with OpenVINO, store its Linear weights in int8, write ``output_dir``; no calibration.

    Activations are quantized at run time per group of ``DYNAMIC_GROUP`` input
    channels (OpenVINO's dynamic quantization), so each keeps its own scale:
    slower than static int8, closer to fp32.
    """
    require_openvino()
    encoded = tokenizer(["a short review"], return_tensors="np")
    example = {name: np.asarray(value, dtype=np.int64) for name, value in encoded.items()}

    def quantize(converted: Any) -> Any:
        import nncf

        return nncf.compress_weights(
            converted,
            mode=nncf.CompressWeightsMode.INT8_SYM,
            ignored_scope=nncf.IgnoredScope(patterns=fp32_scope(model, static=False), validate=False),
        )

    record = {
        "quantization": "NNCF int8 weights (INT8_SYM, per output channel); activations quantized at run time "
        f"in groups of {DYNAMIC_GROUP} input channels",
        "fp32_matmuls": fp32_scope(model, static=False),
        "runtime_settings": {"DYNAMIC_QUANTIZATION_GROUP_SIZE": DYNAMIC_GROUP},
    }
    return _write_openvino(model, tokenizer, output_dir, source, example, quantize, record)


def _write_openvino(
    model: Any,
    tokenizer: Any,
    output_dir: Path,
    source: str,
    example: dict[str, np.ndarray],
    quantize: Callable[[Any], Any],
    record: dict[str, Any],
) -> Path:
    """Convert ``model`` (traced on ``example``), ``quantize`` it, save it with config, tokenizer and export.json."""
    import torch

    model = model.float().eval().cpu()
    names = [name for name in MODEL_INPUTS if name in example]
    output_dir.mkdir(parents=True)
    # NNCF prints a progress table per step and warns about its own internals; a successful
    # export says one line.
    with (
        contextlib.redirect_stdout(io.StringIO()),
        warnings.catch_warnings(),
        quiet_loggers("nncf", "openvino", "transformers", ""),
    ):
        warnings.simplefilter("ignore")
        import nncf
        import openvino as ov

        nncf.set_log_level(logging.ERROR)
        converted = ov.convert_model(model, example_input={name: torch.from_numpy(example[name]) for name in names})
        ov.save_model(quantize(converted), output_dir / OPENVINO_FILE, compress_to_fp16=False)
    model.config.save_pretrained(output_dir)
    tokenizer.save_pretrained(output_dir)
    record = {"source": source, "format": "OpenVINO IR", "backend": "openvino", **record, "model_file": OPENVINO_FILE}
    write_output_text(output_dir / EXPORT_RECORD, json.dumps(record, indent=2) + "\n")
    return output_dir / OPENVINO_FILE


def _calibration_samples(tokenizer: Any, texts: list[str], encoding: ReviewEncoding) -> list[dict[str, np.ndarray]]:
    """One batch of one encoded row per text (per window, in sliding-window mode), keyed by model input."""
    if encoding.sliding_window:
        rows = encode_windows(tokenizer, texts, encoding)[0]
    else:
        rows = encode_reviews(tokenizer, texts, encoding)
    names = [name for name in MODEL_INPUTS if name in rows]
    return [
        {name: np.asarray([rows[name][index]], dtype=np.int64) for name in names}
        for index in range(len(rows["input_ids"]))
    ]


class OpenVinoClassifier:
    """An exported model run by OpenVINO, with the ``config`` that :func:`predict_probabilities` reads."""

    def __init__(self, folder: Path, threads: int | None = None) -> None:
        import openvino as ov
        import torch
        from transformers import AutoConfig

        self.config = AutoConfig.from_pretrained(folder)
        # As many threads as torch would use, so fp32 and int8 are compared on the same cores. The
        # layers left in floating point run in fp32: a CPU with bf16 units would otherwise pick bf16
        # and move labels further from the fp32 model's.
        settings = {"INFERENCE_NUM_THREADS": threads or torch.get_num_threads(), "INFERENCE_PRECISION_HINT": "f32"}
        # A weight-only export's run-time quantization is a setting of the compiled model, kept in export.json.
        settings.update(read_export_record(folder).get("runtime_settings", {}))
        self.compiled = ov.Core().compile_model(str(folder / OPENVINO_FILE), "CPU", settings)
        self.request = self.compiled.create_infer_request()
        self.input_names = [port.get_any_name() for port in self.compiled.inputs]

    def logits(self, batch: dict[str, Any]) -> np.ndarray:
        """Logits for one padded batch (tensors or arrays keyed by input name)."""
        feed = {name: np.asarray(batch[name], dtype=np.int64) for name in self.input_names}
        return self.request.infer(feed)[self.compiled.outputs[0]].copy()
