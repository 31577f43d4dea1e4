"""Check that a run's explanations mean something: comprehensiveness on its test reviews.

    python tools/explanation_check.py RUN [--split test] [--limit N] [--n_steps 16] [--output FILE.json]

Explains every review of the run's split (finetune/evaluation/explain.py),
then for k = 1, 3, 5 deletes each review's k highest-scored words, and
separately k random words, and prints the mean fall in the probability of
the predicted class for both, their difference with a 95% bootstrap interval
over reviews, and what an explanation costs per review (seconds, beside the
cost of predicting it).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np

from finetune.commands.evaluate import load_labelled_texts
from finetune.errors import FinetuneError
from finetune.evaluation.explain import METHODS, N_STEPS, explain_predictions
from finetune.evaluation.faithfulness import KS, RANDOM_DRAWS, comprehensiveness
from finetune.evaluation.inference import load_inference_model, predict_probabilities


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("run", help="a run folder (or a checkpoint, or an int8 export with --fp32_fallback)")
    parser.add_argument("--split", default="test", help="the run's split to explain (default: test)")
    parser.add_argument("--limit", type=int, help="explain only the first N reviews of the split")
    parser.add_argument("--n_steps", type=int, default=N_STEPS, help=f"integration steps (default {N_STEPS})")
    parser.add_argument("--method", default=METHODS[0], choices=METHODS, help="attribution method")
    parser.add_argument("--batch_size", type=int, default=16)
    parser.add_argument("--random_draws", type=int, default=RANDOM_DRAWS, help="random deletions a review and k")
    parser.add_argument("--output", help="also write the figures to this JSON file")
    options = parser.parse_args()
    try:
        report = check(
            Path(options.run),
            options.split,
            options.limit,
            options.n_steps,
            options.batch_size,
            options.random_draws,
            options.method,
        )
    except FinetuneError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    print(format_report(report))
    if options.output:
        Path(options.output).write_text(json.dumps(report, indent=2) + "\n", encoding="utf-8")
    return 0


def check(
    run: Path, split: str, limit: int | None, n_steps: int, batch_size: int, random_draws: int, method: str
) -> dict:
    """Explain the split's reviews and measure comprehensiveness; the figures as a dict."""
    model, tokenizer = load_inference_model(run)
    label_names = [model.config.id2label[index] for index in range(model.config.num_labels)]
    scoring = load_labelled_texts(run, None, split, label_names)
    texts = scoring.texts[:limit] if limit else scoring.texts

    started = time.perf_counter()
    probabilities = predict_probabilities(model, tokenizer, texts, batch_size, scoring.encoding)
    predict_seconds = time.perf_counter() - started
    started = time.perf_counter()
    explanations = explain_predictions(
        model,
        tokenizer,
        texts,
        probabilities,
        batch_size=batch_size,
        max_length=scoring.encoding.max_length,
        n_steps=n_steps,
        method=method,
    )
    explain_seconds = time.perf_counter() - started

    def probability_of(edited: list[str], labels: list[str]) -> np.ndarray:
        edited_probabilities = predict_probabilities(model, tokenizer, edited, batch_size * 2, scoring.encoding)
        return edited_probabilities[np.arange(len(edited)), [label_names.index(label) for label in labels]]

    return {
        "run": str(run),
        "split": split,
        "reviews": len(texts),
        "method": method,
        "n_steps": n_steps,
        "explain_seconds_per_review": explain_seconds / len(texts),
        "predict_seconds_per_review": predict_seconds / len(texts),
        "comprehensiveness": comprehensiveness(texts, explanations, probability_of, KS, random_draws),
    }


def format_report(report: dict) -> str:
    """The figures as a small table."""
    steps = f" ({report['n_steps']} steps)" if report["method"] == "integrated_gradients" else ""
    lines = [
        f"{report['run']} {report['split']}: {report['reviews']} reviews, {report['method']}{steps}; "
        f"{report['explain_seconds_per_review']:.3f} s a review to explain, "
        f"{report['predict_seconds_per_review']:.4f} s to predict",
        "k  drop deleting top-k  drop deleting k random  difference  95% interval",
    ]
    for row in report["comprehensiveness"]:
        low, high = row["interval"]
        lines.append(
            f"{row['k']}  {row['top_k_drop']:19.3f}  {row['random_drop']:22.3f}  {row['difference']:10.3f}  "
            f"[{low:.3f}, {high:.3f}]"
        )
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
