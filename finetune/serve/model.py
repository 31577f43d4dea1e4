"""The model a server answers with: loaded and checked once, scoring reviews as ``finetune predict`` does."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from ..data.cleaning import clean_texts
from ..data.encoding import ReviewEncoding
from ..errors import FinetuneError
from ..evaluation.inference import (
    is_exported_folder,
    load_inference_model,
    predict_probabilities,
    require_inference_folder,
    warn_if_model_changed,
)
from ..evaluation.tag_thresholds import check_threshold, is_tag_model, tag_thresholds
from ..export.fallback import Int8WithFallback
from ..export.onnxruntime import is_onnx_folder
from ..export.openvino import is_openvino_folder
from ..training.ordered_heads import StarReader
from ..training.runs import find_run_config, run_folder

# Reviews per forward pass inside one model call, as finetune predict's default --batch_size.
INFERENCE_BATCH_SIZE = 32


@dataclass
class ServedModel:
    """A loaded classifier with what it needs to read reviews as in training, and what ``/info`` tells of it."""

    model_dir: Path
    model: Any
    tokenizer: Any
    encoding: ReviewEncoding
    clean: bool
    class_names: list[str]
    base_model: str | None
    backend: str
    test_scores: dict[str, Any] | None
    # A multi_label run's threshold per tag, in class_names order (None: one label per review).
    tag_thresholds: Any = None
    # The --threshold the server was started with (None: the run's tuned ones), kept for a reload.
    threshold: float | None = None
    # A regression or ordinal run's decoding into stars (None: classes or tags); class_names are then its levels.
    stars: StarReader | None = None

    @property
    def tags(self) -> bool:
        """Whether the model gives several tags per review (a multi_label run) rather than one label."""
        return self.tag_thresholds is not None

    @property
    def task(self) -> str:
        """What the model predicts: ``single_label``, ``multi_label``, ``regression`` or ``ordinal``."""
        if self.stars is not None:
            return self.stars.task
        return "multi_label" if self.tags else "single_label"

    def model_inputs(self, reviews: list[str]) -> list[str]:
        """The reviews as the model reads them: cleaned as in training (HTML entities, ``<br>``, spaces)."""
        return clean_texts(list(reviews)) if self.clean else [review.strip() for review in reviews]

    def predict(self, texts: list[str]) -> list[dict[str, Any]]:
        """A label and the class probabilities for each text (already passed through :meth:`model_inputs`).

        With tags: ``labels``, the tags whose probability reaches their threshold, and ``scores``, every tag's
        probability, as ``finetune predict`` gives them. With stars: ``rating`` and ``label`` (the level), and
        for ordinal ``prob_above``, each P(rating > level), decoded as ``finetune predict`` decodes them.
        """
        probabilities = predict_probabilities(self.model, self.tokenizer, texts, INFERENCE_BATCH_SIZE, self.encoding)
        if self.stars is not None:
            return [_star_answer(stars) for stars in self.stars.rate(probabilities)]
        if self.tags:
            given = probabilities >= self.tag_thresholds
            return [
                {
                    "labels": [name for name, is_given in zip(self.class_names, row_given) if is_given],
                    "scores": {name: round(float(p), 6) for name, p in zip(self.class_names, row)},
                }
                for row, row_given in zip(probabilities, given)
            ]
        return [
            {
                "label": self.class_names[int(row.argmax())],
                "probabilities": {name: round(float(p), 6) for name, p in zip(self.class_names, row)},
            }
            for row in probabilities
        ]

    @property
    def explainable(self) -> Any | None:
        """The PyTorch model that attributions take gradients of: the model, an export's fp32 fallback, or None."""
        if isinstance(self.model, Int8WithFallback):
            return self.model.fp32
        return None if is_exported_folder(self.model_dir) else self.model

    @property
    def why_not_explainable(self) -> str | None:
        """Why ``/explain`` cannot answer with this model, or None when it can."""
        if self.stars is not None:
            return (
                f"{self.model_dir} rates stars (a {self.stars.task} run), and /explain gives the words behind a "
                "class's probability; ask /predict for the ratings"
            )
        if self.explainable is None:
            return (
                f"{self.model_dir} is an int8 export without its fp32 model, which explanations need; serve the run "
                "folder it was exported from, or export with --fp32_fallback"
            )
        return None

    def explain(self, texts: list[str]) -> list[Any]:
        """A :class:`~finetune.evaluation.explain.ReviewExplanation` for each text (word spans index the text).

        With tags, a :class:`~finetune.evaluation.explain.TagExplanation`: the words behind each tag given.
        """
        from ..evaluation.explain import explain_reviews, explain_tag_predictions

        problem = self.why_not_explainable
        if problem:
            raise FinetuneError(problem)
        if self.tags:
            probabilities = predict_probabilities(
                self.model, self.tokenizer, texts, INFERENCE_BATCH_SIZE, self.encoding
            )
            return explain_tag_predictions(
                self.model,
                self.tokenizer,
                texts,
                probabilities,
                self.tag_thresholds,
                batch_size=INFERENCE_BATCH_SIZE,
                max_length=self.encoding.max_length,
            )
        # The loaded model itself, an export's fallback wrapper included: the labels explained are the ones
        # /predict gives, and explain_reviews takes the gradients of the fp32 model inside it.
        return explain_reviews(
            self.model,
            self.tokenizer,
            texts,
            batch_size=INFERENCE_BATCH_SIZE,
            max_length=self.encoding.max_length,
        )


def require_served_folder(model_path: str | Path) -> None:
    """Refuse, before anything loads, a path that is no folder or holds no model (a ``FinetuneError``)."""
    model_dir = Path(model_path)
    if not model_dir.is_dir():
        raise FinetuneError(f"{model_dir} is not a folder; pass a run folder (a train output_dir) or an int8 export")
    require_inference_folder(model_dir)


def load_served_model(model_path: str | Path, threshold: float | None = None) -> ServedModel:
    """Load and check the model in ``model_path``: a run folder, a checkpoint, or an int8 export folder.

    Refused in one line (a ``FinetuneError``) as ``finetune predict`` refuses it: a folder with no
    model, weights that do not fit the config, classes not the run's, answers that are not numbers.
    A multi_label run's tags are given at its tuned thresholds (``tag_thresholds.json``), or at
    ``threshold`` for every tag.
    """
    check_threshold(threshold)
    model_dir = Path(model_path)
    require_served_folder(model_dir)
    model, tokenizer = load_inference_model(model_dir, tags_read=True, threshold=threshold, ratings_read=True)
    own_weights(model)
    warn_if_model_changed(model_dir, "its answers")
    run_config = find_run_config(model_dir) or {}
    data_fields = run_config.get("data", {})
    if is_openvino_folder(model_dir):
        backend = "openvino int8"
    elif is_onnx_folder(model_dir):
        backend = "onnxruntime int8"
    else:
        backend = "pytorch"
    stars = StarReader.of_config(model.config, model_dir)
    # A ratings model's outputs are named "above 1", ...; what it gives a review is one of its levels.
    class_names = (
        list(stars.level_names) if stars else [model.config.id2label[index] for index in range(model.config.num_labels)]
    )
    return ServedModel(
        model_dir=model_dir,
        model=model,
        tokenizer=tokenizer,
        encoding=ReviewEncoding.from_fields(data_fields),
        clean=bool(data_fields.get("clean_text", True)),
        class_names=class_names,
        base_model=(run_config.get("model") or {}).get("model_name_or_path"),
        backend=backend + (" with fp32 fallback" if isinstance(model, Int8WithFallback) else ""),
        test_scores=_test_scores(model_dir),
        tag_thresholds=tag_thresholds(model_dir, class_names, threshold) if is_tag_model(model) else None,
        threshold=threshold,
        stars=stars,
    )


def _star_answer(stars: Any) -> dict[str, Any]:
    """A review's stars as ``/predict`` answers them (``prob_above`` for ordinal only)."""
    answer: dict[str, Any] = {"rating": stars.rating, "label": stars.label}
    if stars.prob_above is not None:
        answer["prob_above"] = stars.prob_above
    return answer


def own_weights(model: Any) -> None:
    """Copy every parameter and buffer of a PyTorch ``model`` (or an export's fp32 fallback) into memory of its own.

    transformers maps a safetensors file into memory instead of reading it. The server
    watches that file, and a page of the map read after the file was cut short under it
    (training saving into the folder, a copy, ``truncate``) kills the process with SIGBUS,
    which no Python code can catch. Copied, the weights no longer depend on the file, and
    the map is released with the last tensor that used it. An int8 export's runtime reads
    its files itself.
    """
    module = model.fp32 if isinstance(model, Int8WithFallback) else model
    if not isinstance(module, torch.nn.Module):
        return
    with torch.no_grad():
        for tensor in [*module.parameters(), *module.buffers()]:
            # Assigned in place of .data: tied weights are one Parameter object, so they stay tied.
            tensor.data = tensor.data.clone()


def _test_scores(model_dir: Path) -> dict[str, Any] | None:
    """The run's test scores from ``report/metrics.json`` (None for a folder with no report, such as an export)."""
    folder = run_folder(model_dir)
    path = folder / "report" / "metrics.json" if folder else None
    if path is None or not path.is_file():
        return None
    try:
        test = json.loads(path.read_text(encoding="utf-8")).get("test")
    except (OSError, ValueError, AttributeError):
        return None  # a damaged report costs /info its scores, not the server its start
    if not isinstance(test, dict):
        return None
    # The scores a reader compares, not the confusion matrix's raw counts.
    shown = ("task", "micro_f1", "accuracy", "macro_f1", "mae", "quadratic_weighted_kappa", "off_by_one_accuracy")
    shown += ("per_class", "num_samples", "intervals")
    return {key: test[key] for key in shown if key in test}
