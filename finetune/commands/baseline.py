"""``finetune baseline``: the TF-IDF + logistic-regression baseline alone, on a recipe's data."""

from __future__ import annotations

import json
import sys
from typing import Any

from ..config.output_files import OUTPUT_FLAG, check_output_file, write_output_text
from ..data.columns import column_values


def baseline(recipe: str | None, overrides: list[str] | None = None, output: str | None = None) -> dict[str, Any]:
    """Fit the baseline on the recipe's train split, score it on validation and test, print a table.

    ``overrides`` are recipe flags (``--max_train_samples 2000``); ``output``
    also saves the result as JSON. Returns the result as a dict.
    """
    from ..config.recipes import load_recipe
    from ..data.splits import load_review_data
    from ..evaluation.baseline import run_baseline
    from ..evaluation.rating_baseline import run_rating_baseline

    run = load_recipe(recipe, overrides)
    if output:
        check_output_file(output)
    data = load_review_data(run.data, seed=run.training.seed)
    print("\n".join(data.report.summary_lines()), file=sys.stderr)
    splits = data.splits
    to_score = {
        split: (column_values(splits[split], "text"), column_values(splits[split], "labels"))
        for split in splits
        if split != "train"
    }
    train_texts, train_labels = column_values(splits["train"], "text"), column_values(splits["train"], "labels")
    if data.scale is not None:  # a ratings recipe: the ridge on the rating, scored in stars
        result = run_rating_baseline(
            train_texts, train_labels, to_score, data.label_names, data.scale, data.task, seed=run.training.seed
        )
    else:
        result = run_baseline(train_texts, train_labels, to_score, data.label_names, seed=run.training.seed)

    print(f"{result.description}: fit on {result.train_reviews} reviews, {result.features:,} features")
    stars = data.scale is not None
    print("| split | reviews | " + ("MAE | QWK | " if stars else "") + "accuracy | macro-F1 |")
    print("| --- | --- | " + ("--- | --- | " if stars else "") + "--- | --- |")
    for split, scores in result.scores.items():
        ordered = f"{scores['mae']:.4f} | {scores['quadratic_weighted_kappa']:.4f} | " if stars else ""
        print(f"| {split} | {scores['num_samples']} | {ordered}{scores['accuracy']:.4f} | {scores['macro_f1']:.4f} |")
    print(f"fit in {result.fit_seconds:.1f} s" + (f"; {result.note}" if result.note else ""), file=sys.stderr)
    if output:
        write_output_text(output, json.dumps(result.to_dict(), indent=2) + "\n", instead=OUTPUT_FLAG)
        print(f"saved to {output}", file=sys.stderr)
    return result.to_dict()
