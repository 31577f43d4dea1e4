"""``finetune find-label-issues RECIPE``: the training reviews whose labels are likely wrong, worst first.

Every review of the train split is scored by a model that never trained on it
(the ``--folds`` runs, or with ``--baseline_only`` the TF-IDF baseline on the
same folds, in seconds), and cleanlab ranks the likely label errors from those
out-of-fold probabilities (:mod:`finetune.evaluation.label_issues`); with
classes, the fine-tuned folds' probabilities are averaged with the TF-IDF
folds' first (``--finetuned_only`` ranks on them alone). The test split is not
used. What it writes goes to ``OUTPUT_DIR/label_issues`` (or
``OUTPUT_DIR/label_issues_tfidf``): ``label_issues.csv``, the out-of-fold
probabilities with their row ids, and ``label_issues.json``; edited down to the
rows you agree with, the CSV is what ``train --drop_label_issues`` leaves out.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

from ..config.output_files import write_output_text
from ..errors import FinetuneError

# How many of the worst reviews are printed.
SHOWN = 10
# How much of a review's text a printed row shows.
SHOWN_CHARS = 80


def find_label_issues(
    recipe: str | None,
    overrides: list[str] | None = None,
    folds: int = 5,
    baseline_only: bool = False,
    finetuned_only: bool = False,
) -> dict[str, Any]:
    """Rank the recipe's likely label errors from out-of-fold probabilities; returns (and writes) the summary."""
    from ..config.recipes import load_recipe
    from ..evaluation.label_issues import (
        LABEL_ISSUES_FILE,
        blend_probabilities,
        issue_rows,
        rank_label_issues,
        write_label_issues,
    )
    from ..pipeline.out_of_fold import (
        baseline_out_of_fold,
        finetuned_out_of_fold,
        folded_train_split,
        save_out_of_fold,
    )

    # Arguments and the folds: every refusal before any fold trains.
    if baseline_only and finetuned_only:
        raise FinetuneError("--baseline_only and --finetuned_only each name the only source to rank on: pass one")
    overrides = list(overrides or [])
    run = load_recipe(recipe, overrides)
    split = folded_train_split(run, folds)
    folder = Path(run.training.output_dir) / ("label_issues_tfidf" if baseline_only else "label_issues")
    _refuse_earlier_list(folder / LABEL_ISSUES_FILE, run.training.overwrite_output_dir)

    # Out-of-fold probabilities: the baseline's, or each fold run's model on the fold it did not train on,
    # averaged with the baseline's on the same folds (seconds more) where they are classes.
    tfidf = None
    if baseline_only:
        probabilities = baseline_out_of_fold(split, run.training.seed)
    else:
        probabilities = finetuned_out_of_fold(recipe, overrides, split, run)
        if not (finetuned_only or split.multi_label):
            tfidf = baseline_out_of_fold(split, run.training.seed)
    ranked_on = probabilities if tfidf is None else blend_probabilities(probabilities, tfidf)

    # cleanlab flags and ranks; the table, the probabilities and the summary are written, the worst printed.
    issues = rank_label_issues(split.labels, ranked_on, split.multi_label)
    rows = issue_rows(issues, split.row_ids, split.texts, split.labels, ranked_on, split.label_names, split.multi_label)
    folder.mkdir(parents=True, exist_ok=True)
    save_out_of_fold(folder, split, probabilities, tfidf)
    write_label_issues(folder / LABEL_ISSUES_FILE, rows)
    source = "tfidf_baseline" if baseline_only else "finetuned_folds" if tfidf is None else "finetuned_and_tfidf_folds"
    summary = _summary(recipe, overrides, folds, source, len(split.texts), rows)
    write_output_text(folder / "label_issues.json", json.dumps(summary, indent=2) + "\n")
    print(_printed(summary, rows))
    print(f"saved to {folder / LABEL_ISSUES_FILE} (and the out-of-fold probabilities beside it)", file=sys.stderr)
    return summary


def _refuse_earlier_list(path: Path, overwrite: bool) -> None:
    # The list may have been edited by hand (rows deleted after reading them): never replaced unasked.
    if path.exists() and not overwrite:
        raise FinetuneError(
            f"{path} already exists (perhaps edited); move it away, pass --overwrite_output_dir to write it again "
            "(fold runs are trained again too), or choose another output_dir"
        )


def _summary(
    recipe: str | None, overrides: list[str], folds: int, source: str, reviews: int, rows: list[dict]
) -> dict[str, Any]:
    """What was looked at and what was found: label_issues.json."""
    from ..evaluation.label_issues import pair_counts

    return {
        "recipe": recipe,
        "overrides": overrides,
        "folds": folds,
        "probabilities_from": source,
        "train_reviews": reviews,
        "flagged": len(rows),
        "pairs": [
            {"given": given, "suggested": suggested, "count": count} for given, suggested, count in pair_counts(rows)
        ],
    }


def _printed(summary: dict[str, Any], rows: list[dict]) -> str:
    """The worst reviews and the count per (given, suggested) pair, as markdown tables."""
    share = summary["flagged"] / summary["train_reviews"]
    found = (
        f"{summary['flagged']} of {summary['train_reviews']} training reviews ({share:.1%}) flagged as likely "
        f"label errors ({summary['probabilities_from'].replace('_', ' ')}, {summary['folds']} folds)"
    )
    if not rows:
        return found
    lines = [
        f"{found}; the worst {min(SHOWN, len(rows))}:",
        "",
        "| row_id | quality | given | suggested | text |",
        "| --- | --- | --- | --- | --- |",
    ]
    for row in rows[:SHOWN]:
        text = " ".join(row["text"].split())
        text = text if len(text) <= SHOWN_CHARS else text[: SHOWN_CHARS - 3] + "..."
        cells = [str(row["row_id"]), f"{row['label_quality']:.3f}", row["given_label"], row["suggested_label"], text]
        lines.append("| " + " | ".join(cell.replace("|", "\\|") for cell in cells) + " |")
    lines += ["", "| given | suggested | reviews |", "| --- | --- | --- |"]
    lines += [f"| {pair['given']} | {pair['suggested']} | {pair['count']} |" for pair in summary["pairs"]]
    return "\n".join(lines)
