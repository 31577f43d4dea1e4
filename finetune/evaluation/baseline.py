"""The obvious alternative every run is measured against: TF-IDF + logistic regression.

Word 1-2-grams and character 2-5-grams (within words), sublinear TF, into a
class-balanced logistic regression (scikit-learn). On a few hundred reviews it
fits in about two seconds and is often hard to beat; a fine-tuned model that
does not beat it is not worth its CPU time. The settings are those measured
in the project's ``BASELINES.md``.

It must cost seconds, never minutes: the vocabulary is capped
(``MAX_WORD_FEATURES``, ``MAX_CHAR_FEATURES``) and at most
``MAX_TRAIN_REVIEWS`` seeded training reviews are used (said in the result).
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np

MAX_TRAIN_REVIEWS = 20_000
MAX_WORD_FEATURES = 200_000
MAX_CHAR_FEATURES = 300_000
# Character n-grams of a 10,000-character review add nothing a 4,000-character opening does not.
MAX_CHARS_PER_REVIEW = 4_000
DESCRIPTION = "TF-IDF (word 1-2 + char 2-5 grams) + logistic regression, class-balanced"


@dataclass
class BaselineResult:
    """The baseline's scores on each split it was asked to score, and what it cost."""

    description: str
    train_reviews: int
    features: int
    fit_seconds: float
    scores: dict[str, dict[str, Any]] = field(default_factory=dict)
    note: str | None = None

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready."""
        return asdict(self)


class TfidfBaseline:
    """Fit on training texts and labels, then predict or score any texts."""

    def __init__(self, num_labels: int, seed: int = 42, multi_label: bool = False) -> None:
        self.num_labels = num_labels
        self.seed = seed
        # Several tags per review: one class-balanced logistic regression per tag (one-vs-rest).
        self.multi_label = multi_label
        self.pipeline: Any = None
        self.train_reviews = 0
        self.note: str | None = None

    def fit(self, texts: Sequence[str], labels: Sequence[int]) -> TfidfBaseline:
        """Fit the vectorizers and the classifier (on a seeded subset when there are too many reviews)."""
        from sklearn.feature_extraction.text import TfidfVectorizer
        from sklearn.pipeline import make_pipeline, make_union

        texts, labels = list(texts), np.asarray(labels)
        if len(texts) > MAX_TRAIN_REVIEWS:
            chosen = np.random.default_rng(self.seed).choice(len(texts), MAX_TRAIN_REVIEWS, replace=False)
            texts = [texts[index] for index in chosen]
            labels = labels[chosen]
            self.note = f"fit on a seeded {MAX_TRAIN_REVIEWS:,} of the training reviews, to stay within seconds"
        self.pipeline = make_pipeline(
            make_union(
                TfidfVectorizer(ngram_range=(1, 2), sublinear_tf=True, max_features=MAX_WORD_FEATURES),
                TfidfVectorizer(
                    analyzer="char_wb",
                    ngram_range=(2, 5),
                    sublinear_tf=True,
                    min_df=2,
                    max_features=MAX_CHAR_FEATURES,
                    preprocessor=_lowercase_opening,
                ),
            ),
            self._classifier(),
        )
        self.pipeline.fit(texts, labels)
        self.train_reviews = len(texts)
        return self

    def _classifier(self) -> Any:
        from sklearn.linear_model import LogisticRegression
        from sklearn.multiclass import OneVsRestClassifier

        classifier = LogisticRegression(C=4.0, max_iter=3000, class_weight="balanced")
        return OneVsRestClassifier(classifier) if self.multi_label else classifier

    @property
    def features(self) -> int:
        """How many TF-IDF features the fitted vectorizers kept."""
        union = self.pipeline.steps[0][1]
        return sum(len(vectorizer.vocabulary_) for _, vectorizer in union.transformer_list)

    def probabilities(self, texts: Sequence[str]) -> np.ndarray:
        """Class probabilities, one row per text, one column per class id (absent classes get 0).

        With several tags per review, each tag's own probability (the rows do not sum to 1).
        """
        if self.multi_label:
            return np.asarray(self.pipeline.predict_proba(list(texts)), dtype=np.float64)
        classifier = self.pipeline.steps[-1][1]
        seen = self.pipeline.predict_proba(list(texts))
        full = np.zeros((len(texts), self.num_labels), dtype=np.float64)
        full[:, classifier.classes_] = seen
        return full

    def predict(self, texts: Sequence[str]) -> np.ndarray:
        """Class ids."""
        return self.probabilities(texts).argmax(axis=-1)


@dataclass
class BaselinePredictions:
    """A fitted baseline's class ids for each split it was given, and what fitting it cost."""

    train_reviews: int
    features: int
    fit_seconds: float
    predictions: dict[str, list[int]]
    note: str | None = None


def fit_and_predict(
    train_texts: Sequence[str],
    train_labels: Sequence[int],
    to_predict: dict[str, Sequence[str]],
    num_labels: int,
    seed: int = 42,
) -> BaselinePredictions:
    """Fit the baseline on the training split and predict each of ``to_predict`` (split -> texts).

    Needs scikit-learn and numpy only: what the baseline's own process
    imports (scoring, through ``evaluate``, would bring transformers in).
    """
    started = time.perf_counter()
    baseline = TfidfBaseline(num_labels, seed=seed).fit(train_texts, train_labels)
    fit_seconds = time.perf_counter() - started
    return BaselinePredictions(
        train_reviews=baseline.train_reviews,
        features=baseline.features,
        fit_seconds=round(fit_seconds, 2),
        predictions={split: baseline.predict(texts).tolist() for split, texts in to_predict.items() if len(texts)},
        note=baseline.note,
    )


def score_predictions(
    fitted: BaselinePredictions, references: dict[str, Sequence[int]], label_names: list[str]
) -> BaselineResult:
    """The baseline's scores: each split's predictions against its labels, with the model's own metrics."""
    from .metrics import classification_report

    return BaselineResult(
        description=DESCRIPTION,
        train_reviews=fitted.train_reviews,
        features=fitted.features,
        fit_seconds=fitted.fit_seconds,
        scores={
            split: classification_report(predictions, references[split], label_names)
            for split, predictions in fitted.predictions.items()
        },
        note=fitted.note,
    )


def run_baseline(
    train_texts: Sequence[str],
    train_labels: Sequence[int],
    to_score: dict[str, tuple[Sequence[str], Sequence[int]]],
    label_names: list[str],
    seed: int = 42,
    multi_label: bool = False,
) -> BaselineResult:
    """Fit the baseline on the training split and score it on each of ``to_score`` (split -> texts, labels).

    With ``multi_label`` (tag rows) the baseline is one-vs-rest, its thresholds tuned on the validation
    split as the model's are, and it is scored on the test split.
    """
    if multi_label:
        return _run_tag_baseline(train_texts, train_labels, to_score, label_names, seed)
    to_predict = {split: texts for split, (texts, _) in to_score.items()}
    fitted = fit_and_predict(train_texts, train_labels, to_predict, len(label_names), seed=seed)
    return score_predictions(fitted, {split: labels for split, (_, labels) in to_score.items()}, label_names)


def _run_tag_baseline(
    train_texts: Sequence[str],
    train_labels: Sequence[Sequence[float]],
    to_score: dict[str, tuple[Sequence[str], Sequence[Sequence[float]]]],
    label_names: list[str],
    seed: int,
) -> BaselineResult:
    """The one-vs-rest baseline of a multi_label run, scored on test with thresholds tuned on validation."""
    from .multi_label import multi_label_report

    started = time.perf_counter()
    baseline = TfidfBaseline(len(label_names), seed=seed, multi_label=True).fit(train_texts, train_labels)
    fit_seconds = time.perf_counter() - started

    def probabilities_and_labels(split: str) -> tuple[np.ndarray, np.ndarray]:
        texts, labels = to_score[split]
        return baseline.probabilities(texts), np.asarray(labels) > 0.5

    validation = probabilities_and_labels("validation") if "validation" in to_score else None
    scores = {}
    if "test" in to_score:
        scores["test"] = multi_label_report(*probabilities_and_labels("test"), label_names, validation)
    return BaselineResult(
        description=DESCRIPTION.replace("logistic regression", "one-vs-rest logistic regression per tag"),
        train_reviews=baseline.train_reviews,
        features=baseline.features,
        fit_seconds=round(fit_seconds, 2),
        scores=scores,
        note=baseline.note,
    )


def compare(model_scores: dict[str, Any], baseline_scores: dict[str, Any]) -> dict[str, float]:
    """Model minus baseline, in points of accuracy and macro-F1 (positive: the model is better).

    Ratings: MAE and RMSE too (negative: the model is better), off-by-one accuracy and weighted kappa.
    """
    # With several tags per review, micro-F1 too (the headline there).
    metrics = ("micro_f1", "accuracy", "macro_f1") if "micro_f1" in model_scores else ("accuracy", "macro_f1")
    if "mae" in model_scores and "mae" in baseline_scores:
        metrics = ("mae", "rmse", "off_by_one_accuracy", "quadratic_weighted_kappa", *metrics)
    return {metric: round(float(model_scores[metric]) - float(baseline_scores[metric]), 4) for metric in metrics}


def describe_comparison(model_scores: dict[str, Any], baseline_scores: dict[str, Any]) -> str:
    """``'baseline 0.747 / 0.467; this model +0.031 accuracy, +0.090 macro-F1'`` for a summary line."""
    difference = compare(model_scores, baseline_scores)
    if "mae" in difference:
        return (
            f"baseline MAE {baseline_scores['mae']:.3f}, QWK {baseline_scores['quadratic_weighted_kappa']:.3f}; "
            f"this model {difference['mae']:+.3f} MAE, {difference['quadratic_weighted_kappa']:+.3f} QWK"
        )
    if "micro_f1" in difference:
        return (
            f"baseline micro-F1 {baseline_scores['micro_f1']:.3f}, macro-F1 {baseline_scores['macro_f1']:.3f}; "
            f"this model {difference['micro_f1']:+.3f} micro-F1, {difference['macro_f1']:+.3f} macro-F1"
        )
    return (
        f"baseline {baseline_scores['accuracy']:.3f} / {baseline_scores['macro_f1']:.3f}; "
        f"this model {difference['accuracy']:+.3f} accuracy, {difference['macro_f1']:+.3f} macro-F1"
    )


def _lowercase_opening(text: str) -> str:
    return text[:MAX_CHARS_PER_REVIEW].lower()
