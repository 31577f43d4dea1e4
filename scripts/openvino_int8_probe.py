"""Would OpenVINO + NNCF give int8 prediction 2x as fast as fp32 PyTorch and 99% faithful? Measure it on one model.

    pip install openvino nncf
    python scripts/openvino_int8_probe.py runs/quickstart data/reviews/test.csv data/reviews/train.csv \
        --title_column title

This probe decided that ``finetune export --int8`` should use OpenVINO (it now does:
``finetune/evaluation/openvino_export.py``, measured by ``finetune bench``). It converts the
saved model with OpenVINO (``ov.convert_model`` on the PyTorch module) and times, in one
process, batches of 32 length-sorted test reviews (one warm-up pass, then one timed pass,
two rounds) through:

- PyTorch fp32 (the reference: ``finetune predict``'s model);
- OpenVINO fp32;
- OpenVINO with int8 weights (``nncf.compress_weights``, INT8_SYM) and activations quantized
  at run time in groups of 32 (``DYNAMIC_QUANTIZATION_GROUP_SIZE``);
- OpenVINO static int8 (``nncf.quantize`` with ``ModelType.TRANSFORMER``, which applies
  SmoothQuant), calibrated on ``--calibration_reviews`` reviews drawn from the train file.

For each: reviews/s, the ratio to PyTorch, and the share of test labels equal to PyTorch's.
"""

from __future__ import annotations

import argparse
import time
import warnings
from collections.abc import Callable

import numpy as np
import pandas as pd
import torch

INPUTS = ("input_ids", "attention_mask", "token_type_ids")


def read_texts(path: str, text_column: str, title_column: str | None) -> list[str]:
    """The reviews as the model saw them in training: ``Title. Body`` where there is a title."""
    frame = pd.read_csv(path, sep="\t" if path.endswith(".tsv") else ",", keep_default_na=False)
    if title_column:
        return [f"{title}. {text}" if title else text for title, text in zip(frame[title_column], frame[text_column])]
    return list(frame[text_column])


def batches_of(tokenizer, texts: list[str], size: int = 32) -> list[dict[str, np.ndarray]]:
    """Length-sorted padded batches, as ``finetune predict`` makes them."""
    order = np.argsort([len(text) for text in texts], kind="stable")
    batches = []
    for start in range(0, len(texts), size):
        chosen = [texts[index] for index in order[start : start + size]]
        encoded = tokenizer(chosen, padding=True, truncation=True, max_length=256, return_tensors="np")
        batches.append({name: encoded[name].astype(np.int64) for name in INPUTS if name in encoded})
    return batches


def timed(run: Callable[[], list[np.ndarray]]) -> tuple[float, np.ndarray]:
    """Seconds for one pass after a warm-up pass, and the logits of that pass."""
    run()
    started = time.perf_counter()
    logits = run()
    return time.perf_counter() - started, np.concatenate(logits)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("model")
    parser.add_argument("test_file")
    parser.add_argument("train_file", help="calibration reviews are drawn from it")
    parser.add_argument("--text_column", default="review")
    parser.add_argument("--title_column")
    parser.add_argument("--calibration_reviews", type=int, default=96)
    parser.add_argument("--threads", type=int, default=2)
    options = parser.parse_args()
    warnings.simplefilter("ignore")

    import nncf
    import openvino as ov
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    torch.set_num_threads(options.threads)
    model = AutoModelForSequenceClassification.from_pretrained(options.model).eval()
    tokenizer = AutoTokenizer.from_pretrained(options.model)
    test = batches_of(tokenizer, read_texts(options.test_file, options.text_column, options.title_column))
    train_texts = read_texts(options.train_file, options.text_column, options.title_column)
    drawn = np.random.default_rng(0).choice(len(train_texts), options.calibration_reviews, replace=False)
    calibration = batches_of(tokenizer, [train_texts[index] for index in drawn])
    reviews = sum(len(batch["input_ids"]) for batch in test)

    def convert():
        return ov.convert_model(model, example_input={name: torch.from_numpy(value) for name, value in test[0].items()})

    core = ov.Core()
    fp32 = {"INFERENCE_PRECISION_HINT": "f32", "INFERENCE_NUM_THREADS": options.threads}
    variants = {
        "OpenVINO fp32": (convert(), fp32),
        "OpenVINO int8 weights, activations in groups of 32": (
            nncf.compress_weights(convert(), mode=nncf.CompressWeightsMode.INT8_SYM),
            {**fp32, "DYNAMIC_QUANTIZATION_GROUP_SIZE": 32},
        ),
        "OpenVINO static int8 (NNCF, transformer)": (
            nncf.quantize(
                convert(),
                nncf.Dataset(calibration),
                model_type=nncf.ModelType.TRANSFORMER,
                subset_size=len(calibration),
            ),
            fp32,
        ),
    }

    def run_torch() -> list[np.ndarray]:
        with torch.inference_mode():
            return [model(**{k: torch.from_numpy(v) for k, v in batch.items()}).logits.numpy() for batch in test]

    print("| round | variant | reviews/s | vs PyTorch fp32 | labels as PyTorch fp32 |")
    print("| --- | --- | --- | --- | --- |")
    for round_number in (1, 2):
        torch_seconds, reference = timed(run_torch)
        print(f"| {round_number} | PyTorch fp32 | {reviews / torch_seconds:.0f} | 1.00x | - |", flush=True)
        for name, (ov_model, config) in variants.items():
            compiled = core.compile_model(ov_model, "CPU", config)
            request = compiled.create_infer_request()

            def run_openvino(request=request, compiled=compiled) -> list[np.ndarray]:
                return [request.infer(batch)[compiled.outputs[0]].copy() for batch in test]

            seconds, logits = timed(run_openvino)
            agreement = (logits.argmax(1) == reference.argmax(1)).mean()
            print(
                f"| {round_number} | {name} | {reviews / seconds:.0f} | {torch_seconds / seconds:.2f}x "
                f"| {agreement:.1%} |",
                flush=True,
            )


if __name__ == "__main__":
    main()
