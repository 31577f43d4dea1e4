"""Micro-F1 of tag runs and their TF-IDF baseline with some tags never predicted, from the per-tag test counts.

    python tools/tag_lead.py runs/clothing-tags/seed-42 runs/clothing-tags/seed-43 --leave_out petite trend

Each run's ``test_report.json`` gives its per-tag precision, recall and
support on the test split; the baseline's come from the first run's
``evaluation_test.json`` (``finetune evaluate`` writes it; the baseline is the
same for every seed). A tag left out counts as never predicted: its reviews
become false negatives, its false positives go. It answers one question: how
much of the model's lead in micro-F1 would a threshold rule that silences the
tags no model reads from the text leave (docs/benchmarks/quality.md).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path


def micro_f1(per_tag: dict[str, dict], leave_out: tuple[str, ...] = ()) -> float:
    """Micro-F1 from per-tag precision, recall and support, the tags in ``leave_out`` never predicted."""
    true_positives = false_positives = false_negatives = 0.0
    for tag, scores in per_tag.items():
        found = scores["recall"] * scores["support"]
        if tag in leave_out:
            false_negatives += scores["support"]
            continue
        true_positives += found
        false_negatives += scores["support"] - found
        false_positives += found / scores["precision"] - found if scores["precision"] else 0.0
    return 2 * true_positives / (2 * true_positives + false_positives + false_negatives)


def main() -> None:
    """Print each run's micro-F1, the baseline's and the lead, as tuned and with the tags left out."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("runs", nargs="+", type=Path)
    parser.add_argument("--leave_out", nargs="+", default=[])
    args = parser.parse_args()
    compared = json.loads((args.runs[0] / "evaluation_test.json").read_text(encoding="utf-8"))
    baseline = next(row for row in compared if row["model"] == "TF-IDF baseline")["per_class"]
    for run in args.runs:
        model = json.loads((run / "test_report.json").read_text(encoding="utf-8"))["per_class"]
        for leave_out in ((), tuple(args.leave_out)):
            ours, theirs = micro_f1(model, leave_out), micro_f1(baseline, leave_out)
            told = "as tuned" if not leave_out else "without " + ", ".join(leave_out)
            print(f"{run.name} {told}: micro-F1 {ours:.3f}, baseline {theirs:.3f}, lead {100 * (ours - theirs):+.1f}")


if __name__ == "__main__":
    main()
