"""Batched inference: class probabilities for a list of texts."""

from __future__ import annotations

import contextlib
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from ..config.tasks import MULTI_LABEL, ORDERED_TASKS, task_of_model
from ..data.bad_text import describe_bad_text, first_bad_character
from ..data.collation import PaddingCollator
from ..data.encoding import ReviewEncoding, encode_reviews, encode_windows
from ..data.length_batches import CPU_PASS_COST_TOKENS, length_batches
from ..errors import FinetuneError
from ..export.fallback import Int8WithFallback, read_fallback
from ..export.onnxruntime import OnnxClassifier, is_onnx_folder, require_onnx_runtime
from ..export.openvino import OpenVinoClassifier, is_openvino_folder, require_openvino
from ..fast_path.readings import reading_for_scores
from ..training.ordered_heads import rating_outputs

# Exported int8 models: each takes a padded batch of arrays and returns logits, on CPU.
EXPORTED_CLASSIFIERS = (OnnxClassifier, OpenVinoClassifier)


def check_batch_size(batch_size: int) -> None:
    """Refuse a batch of fewer than one review: ``range(0, n, -1)`` would silently score nothing."""
    if not isinstance(batch_size, int) or isinstance(batch_size, bool) or batch_size < 1:
        raise FinetuneError(f"batch_size must be a whole number >= 1 (got {batch_size!r}); pass --batch_size 32")


def is_exported_folder(folder: Path) -> bool:
    """True when ``folder`` holds an int8 export (OpenVINO or ONNX) rather than PyTorch weights."""
    return is_openvino_folder(folder) or is_onnx_folder(folder)


def require_inference_folder(model_dir: Path) -> None:
    """Raise unless ``model_dir`` holds a model to predict with: PyTorch weights, or an int8 export."""
    from ..training.model_files import require_loadable_model_files
    from ..training.runs import require_model_folder

    if is_openvino_folder(model_dir):
        require_openvino()
        require_loadable_model_files(model_dir)
        return
    if is_onnx_folder(model_dir):
        require_onnx_runtime()
        require_loadable_model_files(model_dir)
        return
    require_model_folder(model_dir)


def load_inference_model(
    model_dir: Path, tags_read: bool = False, threshold: float | None = None, ratings_read: bool = False
) -> tuple[Any, PreTrainedTokenizerBase]:
    """The classifier in ``model_dir`` (PyTorch, or OpenVINO / ONNX Runtime for an int8 export) and its tokenizer.

    A PyTorch model is loaded by :func:`~finetune.training.model_check.check_model_folder`, so one
    whose weights do not fit its config, whose classes are not the run's or whose answers are not
    numbers is refused in one line. An int8 export made with ``--fp32_fallback`` comes wrapped with
    its fp32 model (:mod:`.fallback`). A model with several tags per review is refused unless the
    caller reads tags (``tags_read``: ``predict``, ``serve``, ``export``); a tags export's fallback
    judges close calls at the caller's ``threshold`` for every tag, or else at the run's thresholds.
    A star-rating model is refused unless the caller reads ratings (``ratings_read``: ``predict``,
    ``serve``, ``export``, ``evaluate``); a ratings export's fallback judges close calls where a level changes.
    """
    from transformers import AutoTokenizer

    from ..training.model_check import check_model_config, check_model_folder, refuse_rating_model, refuse_tag_model
    from ..training.model_files import require_vocabulary
    from ..training.ordered_heads import StarReader
    from .tag_thresholds import is_tag_model, tag_thresholds

    require_inference_folder(model_dir)
    if not tags_read:
        refuse_tag_model(model_dir, "finetune distill and bench read")
    if not ratings_read:
        refuse_rating_model(model_dir, "finetune distill and bench read")
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    require_vocabulary(tokenizer, model_dir)
    if not is_exported_folder(model_dir):
        return check_model_folder(model_dir, tokenizer=tokenizer), tokenizer
    check_model_config(model_dir)
    int8 = OpenVinoClassifier(model_dir) if is_openvino_folder(model_dir) else OnnxClassifier(model_dir)
    fallback = read_fallback(model_dir)
    if fallback is None:
        return int8, tokenizer
    fp32_dir, margin = fallback
    fp32 = check_model_folder(fp32_dir, tokenizer=tokenizer)
    # A tags export's close calls are tags near the thresholds it carries (the run's tuned ones).
    names = [int8.config.id2label[index] for index in range(int8.config.num_labels)]
    thresholds = tag_thresholds(model_dir, names, threshold) if is_tag_model(int8) else None
    # A ratings export's close calls are reviews near a change of level.
    return Int8WithFallback(int8, fp32, margin, thresholds, StarReader.of_config(int8.config, model_dir)), tokenizer


def warn_if_model_changed(model_dir: Path, what: str) -> None:
    """Print a warning when the run's model files are not those training saved (``finetune_run.json``'s fingerprint).

    ``what`` is what the command makes of the model (``"the scores"``, ``"the predictions"``).
    """
    import sys

    from ..training.runs import changed_model_files

    if is_exported_folder(model_dir):
        return  # its finetune_run.json is a copy of the run's: the fingerprint is of the fp32 files
    changed = changed_model_files(model_dir)
    if changed:
        print(
            f"warning: {', '.join(changed)} in {model_dir} changed since training saved them (other bytes than "
            f"finetune_run.json records); {what} are from the files as they are now",
            file=sys.stderr,
        )


def predict_probabilities(
    model: PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase,
    texts: Sequence[str],
    batch_size: int = 32,
    encoding: ReviewEncoding | None = None,
) -> np.ndarray:
    """Softmax probabilities, one row per text, in the order given (a sigmoid per tag for a multi_label model).

    A star-rating model gives :func:`~finetune.training.ordered_heads.rating_outputs` instead (an ordinal
    model's P(rating > level k), a regression model's one output), for ``from_outputs`` to make stars of.

    Each text is encoded as ``encoding`` says (cut to ``max_length``, or with
    ``sliding_window`` as overlapping windows whose logits are averaged).
    Rows are sorted by length and, for a PyTorch model on a CPU, cut into
    batches (at most ``batch_size``) where padding would cost more than another pass
    (:mod:`.length_batches`), and run under ``inference_mode``.
    An int8 export with an fp32 fallback scores every text in int8, then its
    close calls again in fp32 (:mod:`.fallback`).
    """
    check_batch_size(batch_size)
    encoding = encoding or ReviewEncoding()
    if isinstance(model, Int8WithFallback):
        return _with_fallback(model, tokenizer, list(texts), batch_size, encoding)
    # A datasets Column or a pandas Series is not a list, and tokenizers take only lists.
    texts = list(texts)
    for index, text in enumerate(texts):
        # The tokenizer would raise a TypeError on a lone surrogate; the commands refuse it earlier, by line.
        if isinstance(text, str) and first_bad_character(text) is not None:
            raise FinetuneError(f"review {index} {describe_bad_text(text)}; remove it, or repair it with U+FFFD")
    if encoding.sliding_window:
        rows, owners = encode_windows(tokenizer, texts, encoding)
    else:
        rows, owners = encode_reviews(tokenizer, texts, encoding), list(range(len(texts)))
    logits = _logits(model, tokenizer, rows, batch_size)
    # A review's logits are the mean of its windows' (one window: its own logits, unchanged).
    summed = np.zeros((len(texts), logits.shape[1]), dtype=np.float64)
    np.add.at(summed, owners, logits)
    counts = np.bincount(owners, minlength=len(texts))[:, None]
    review_logits = torch.from_numpy(summed / counts)
    task = task_of_model(model.config)
    if task in ORDERED_TASKS:  # P(rating > level k) per output, or a regression's standardised rating
        return rating_outputs(review_logits.numpy(), task).astype(np.float32)
    if task == MULTI_LABEL:
        return torch.sigmoid(review_logits).numpy().astype(np.float32)  # each tag a yes/no of its own
    return torch.softmax(review_logits, dim=-1).numpy().astype(np.float32)


def _with_fallback(
    model: Int8WithFallback,
    tokenizer: PreTrainedTokenizerBase,
    texts: list[str],
    batch_size: int,
    encoding: ReviewEncoding,
) -> np.ndarray:
    """Int8 probabilities, with the close calls' rows replaced by the fp32 model's."""
    probabilities = predict_probabilities(model.int8, tokenizer, texts, batch_size, encoding)
    close = model.close_calls(probabilities)
    if close.size:
        # Whole reviews are scored again, so a sliding-window review's windows are averaged in fp32 too.
        rescored = [texts[index] for index in close]
        probabilities[close] = predict_probabilities(model.fp32, tokenizer, rescored, batch_size, encoding)
        model.rescored += int(close.size)
    return probabilities


def _logits(
    model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase, rows: dict[str, list], batch_size: int
) -> np.ndarray:
    """The model's logits for every encoded row, in row order (float64)."""
    exported = isinstance(model, EXPORTED_CLASSIFIERS)
    device = torch.device("cuda" if torch.cuda.is_available() and not exported else "cpu")
    if not exported:
        model.to(device).eval()
    inputs = [name for name in ("input_ids", "attention_mask", "token_type_ids") if name in rows]
    # On a GPU a padded token costs next to nothing against a pass: plain runs of batch_size. An int8
    # export too: its pass cost was not measured, and OpenVINO prepares each new batch shape on first use.
    pass_cost = CPU_PASS_COST_TOKENS if device.type == "cpu" and not exported else None
    batches = length_batches([len(ids) for ids in rows["input_ids"]], batch_size, pass_cost)
    collator = PaddingCollator(tokenizer, return_tensors="np" if exported else "pt")
    logits = np.zeros((len(rows["input_ids"]), model.config.num_labels), dtype=np.float64)
    # The last layer computes only the first tokens the head reads, MPNet's attention goes through SDPA:
    # the same logits (docs/speed.md).
    reading = contextlib.nullcontext() if exported else reading_for_scores(model)
    with torch.inference_mode(), reading:
        for chosen in batches:
            batch = collator([{name: rows[name][row] for name in inputs} for row in chosen])
            if exported:
                logits[chosen] = model.logits(batch)
                continue
            output = model(**{name: value.to(device) for name, value in batch.items()}).logits
            logits[chosen] = output.double().cpu().numpy()
    return logits
