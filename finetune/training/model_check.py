"""One check of a model folder before it is used: a folder that loads is not yet a model that works.

transformers loads a folder whose weights do not fit its ``config.json``
with a warning on stderr: a missing classification head (a base model) or
missing layers are initialised at random, surplus layers are dropped, and
the model answers, differently on every load. A NaN in ``config.json`` makes
every probability NaN; class names reordered in ``id2label`` misname every
label. :func:`check_model_folder` refuses each of these in one line naming
the fix, before predict, evaluate, export or a resumed run writes anything,
and returns the model it loaded so the caller need not load it again.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from transformers import PreTrainedModel, PreTrainedTokenizerBase

from ..config.tasks import MULTI_LABEL, ORDERED_TASKS, task_of_folder, task_of_model
from ..errors import FinetuneError, first_line
from .model_files import read_json_object
from .ordered_heads import head_labels
from .runs import find_run_config, recorded_class_names, require_model_folder

# The forward pass that shows a model answers with numbers: short, so the check stays cheap.
SAMPLE_REVIEW = "Great value, it works as described."
# How many weight names a message lists before it says "and N more".
_NAMES_SHOWN = 3


def refuse_tag_model(folder: str | Path, readers: str, fix: str | None = None) -> None:
    """Refuse a model with several tags per review (a multi_label run) where ``readers`` read one label per review.

    ``readers`` names them with their verb, e.g. ``"finetune distill reads"``; ``fix`` replaces the
    message's default advice (score it with transformers' pipeline, or label reviews with predict).

    Such a folder is a plain Hugging Face folder that transformers scores with a
    sigmoid per tag; the commands that read runs (predict, evaluate, serve,
    export, distill) read a softmax over classes, and would give one tag per review.
    """
    if task_of_folder(folder) == MULTI_LABEL:
        raise FinetuneError(
            f"{folder} holds a model with several tags per review (a multi_label run), and {readers} one label "
            "per review for now; "
            + (
                fix
                or "score it with transformers.pipeline('text-classification', model=FOLDER, top_k=None) and the "
                "thresholds in its tag_thresholds.json, or label reviews with finetune predict"
            )
        )


def refuse_rating_model(folder: str | Path, readers: str) -> None:
    """Refuse a star-rating model (a regression or ordinal run) where ``readers`` read a softmax over classes.

    ``readers`` names them with their verb, e.g. ``"finetune evaluate, serve and export read"``.
    """
    task = task_of_folder(folder)
    if task in ORDERED_TASKS:
        raise FinetuneError(
            f"{folder} holds a star-rating model (a {task} run), and {readers} one class per review for now; "
            "rate reviews with finetune predict (its config.json's rating_decoding says how outputs become stars)"
        )


def check_model_folder(
    path: str | Path,
    expected_class_names: list[str] | None = None,
    tokenizer: PreTrainedTokenizerBase | None = None,
) -> PreTrainedModel:
    """Load the classifier in ``path``, refusing it (a ``FinetuneError``) unless it is the model its files describe.

    Refused, each in one line with the fix: a folder without config or
    weights (or with either cut short); a ``config.json`` value that is NaN or
    infinite; an ``id2label`` whose classes are not ``expected_class_names`` in
    order (by default the order the run's ``finetune_run.json`` recorded; no
    check for a folder that is no run); weights missing from the file, surplus
    to the model, or of another shape (a base model without its head, a config
    edited to another size or architecture); probabilities that are not finite
    on one short review (read with ``tokenizer``, or the folder's own).

    Returns the loaded model in eval mode, so callers use it rather than load the folder twice.
    """
    folder = Path(path)
    require_model_folder(folder)
    check_model_config(folder, expected_class_names)
    model, loading_info = _load_with_loading_info(folder)
    _refuse_weights_that_do_not_fit(folder, model, loading_info)
    _refuse_non_finite_answers(folder, model, tokenizer)
    return model


def check_model_config(path: str | Path, expected_class_names: list[str] | None = None) -> None:
    """Refuse a ``config.json`` with a NaN or infinite value, or whose ``id2label`` is not the run's classes in order.

    The part of :func:`check_model_folder` that needs no weights, so an int8 export is checked too.
    ``expected_class_names`` defaults to the order the run's ``finetune_run.json`` recorded.
    """
    folder = Path(path)
    config = read_json_object(folder / "config.json", "copy or save the model again")
    _refuse_non_finite_values(folder, config)
    if expected_class_names is None:
        expected_class_names = recorded_class_names(find_run_config(folder) or {})
    if expected_class_names is not None:
        task = task_of_model(config)
        if task in ORDERED_TASKS:  # the run recorded its rating levels; the head names its outputs after them
            expected_class_names = list(head_labels(task, list(expected_class_names)).values())
        _refuse_other_classes(folder, config, list(expected_class_names))


def _refuse_non_finite_values(folder: Path, config: dict[str, Any]) -> None:
    # Python's json reads NaN and Infinity; no model computes with them (every probability becomes NaN).
    for name, value in _numbers(config):
        if not math.isfinite(value):
            raise FinetuneError(
                f"{folder / 'config.json'} has {name}: {value}, which no model can compute with; "
                "restore config.json from a copy of the run or one of its checkpoint-* folders"
            )


def _numbers(value: Any, name: str = "") -> list[tuple[str, float]]:
    """Every float in a JSON value, with its dotted key."""
    if isinstance(value, float):
        return [(name, value)]
    if isinstance(value, dict):
        return [found for key, item in value.items() for found in _numbers(item, f"{name}.{key}" if name else key)]
    if isinstance(value, list):
        return [found for index, item in enumerate(value) for found in _numbers(item, f"{name}[{index}]")]
    return []


def _refuse_other_classes(folder: Path, config: dict[str, Any], expected: list[str]) -> None:
    """Refuse an ``id2label`` that is not the run's classes in the run's order: every label would be misnamed."""
    id2label = config.get("id2label") or {}
    names = [id2label.get(str(index)) for index in range(len(id2label))]
    if names == expected:
        return
    shown = ", ".join(str(name) for name in names) or "none"
    raise FinetuneError(
        f"{folder / 'config.json'} names the classes {shown} (id2label), but the run was trained on "
        f"{', '.join(expected)} in that order (finetune_run.json), so labels would be misnamed; restore config.json "
        "from a copy of the run or one of its checkpoint-* folders"
    )


def _load_with_loading_info(folder: Path) -> tuple[PreTrainedModel, dict[str, Any]]:
    """The model and transformers' account of its loading, with no progress bar nor load report printed.

    Sizes that do not fit are loaded anyway (``ignore_mismatched_sizes``) so that they are
    reported here in one line, not raised as a traceback that suggests the option.
    """
    from transformers import AutoModelForSequenceClassification
    from transformers.utils import logging as hf_logging

    showing_bars, verbosity = hf_logging.is_progress_bar_enabled(), hf_logging.get_verbosity()
    # The bar would interleave with predictions on stderr; the report is replaced by this check's message.
    hf_logging.disable_progress_bar()
    hf_logging.set_verbosity_error()
    try:
        model, loading_info = AutoModelForSequenceClassification.from_pretrained(
            folder, use_safetensors=True, output_loading_info=True, ignore_mismatched_sizes=True
        )
    except (OSError, ValueError, KeyError, RuntimeError) as error:
        # An unknown model_type, or weights transformers cannot convert to this architecture.
        raise FinetuneError(
            f"cannot load the model in {folder} ({first_line(error)}); config.json may have been edited: restore it "
            "from a copy of the run or one of its checkpoint-* folders"
        ) from error
    finally:
        hf_logging.set_verbosity(verbosity)
        if showing_bars:
            hf_logging.enable_progress_bar()
    return model.eval(), loading_info


def _refuse_weights_that_do_not_fit(folder: Path, model: PreTrainedModel, loading_info: dict[str, Any]) -> None:
    """Refuse a model any of whose weights were not in the file as they are: those are random, or dropped."""
    weights = _weights_file(folder)
    mismatched = sorted(loading_info.get("mismatched_keys") or [])
    if mismatched:
        name, saved_shape, wanted_shape = mismatched[0]
        raise FinetuneError(
            f"{weights} holds {name} of shape {list(saved_shape)} where config.json asks for "
            f"{list(wanted_shape)}{_and_more(len(mismatched))}: config.json does not describe these weights "
            "(edited, or copied from another model); restore config.json from a copy of the run or one of its "
            "checkpoint-* folders"
        )
    missing = sorted(loading_info.get("missing_keys") or [])
    unexpected = sorted(loading_info.get("unexpected_keys") or [])
    if not missing and not unexpected:
        return
    prefix = f"{model.base_model_prefix}."
    if missing and not unexpected and not any(name.startswith(prefix) for name in missing):
        # Only the layers above the encoder are missing: the pretrained encoder without its trained head.
        raise FinetuneError(
            f"{weights} lacks {_names(missing)}: this folder holds a base model, not a trained run; "
            f"pass a run folder that finetune train wrote, or train one from it (model_name_or_path: {folder})"
        )
    parts = []
    if missing:
        parts.append(f"lacks {len(missing)} weights the model needs ({_names(missing)})")
    if unexpected:
        parts.append(f"holds {len(unexpected)} the model has no place for ({_names(unexpected)})")
    shape_keys = [key for key in ("model_type", "num_hidden_layers") if hasattr(model.config, key)]
    described = ", ".join(f"{key} {getattr(model.config, key)}" for key in shape_keys)
    raise FinetuneError(
        f"{weights} {' and '.join(parts)}: config.json ({described}) does not describe these weights "
        "(edited, or copied from another model); restore config.json and the weights from a copy of the run or "
        "one of its checkpoint-* folders"
    )


def _refuse_non_finite_answers(folder: Path, model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase | None) -> None:
    """Refuse a model whose probabilities on one short review are NaN or infinite."""
    import torch

    if tokenizer is None:
        from transformers import AutoTokenizer

        from .model_files import require_vocabulary

        tokenizer = AutoTokenizer.from_pretrained(folder)
        require_vocabulary(tokenizer, folder)
    # One review of a few tokens: more threads only add hand-offs, which on a busy machine (2 cores,
    # other jobs) took the pass from 0.01 s to 1 s.
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        with torch.inference_mode():
            logits = model(**tokenizer([SAMPLE_REVIEW], return_tensors="pt")).logits
    finally:
        torch.set_num_threads(threads)
    if not bool(torch.softmax(logits.double(), dim=-1).isfinite().all()):
        raise FinetuneError(
            f"the model in {folder} gives NaN or infinite probabilities on a short review (its weights hold "
            "NaN or inf); restore the folder from a copy of the run or one of its checkpoint-* folders"
        )


def _weights_file(folder: Path) -> str:
    """The weights file the messages name: the one file, or the folder's shards together."""
    files = sorted(folder.glob("*.safetensors"))
    return str(files[0]) if len(files) == 1 else f"the weights in {folder}"


def _names(keys: list[str]) -> str:
    more = len(keys) - _NAMES_SHOWN
    return ", ".join(keys[:_NAMES_SHOWN]) + (f" and {more} more" if more > 0 else "")


def _and_more(count: int) -> str:
    return f" (and {count - 1} more weights of another size)" if count > 1 else ""
