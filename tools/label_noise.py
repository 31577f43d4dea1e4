"""Measure how well ``finetune find-label-issues`` finds labels flipped on purpose (issue 76's detection table).

    python tools/label_noise.py flip recipes/quickstart.yaml --seed 76 --share 0.1 --output /tmp/noisy
    finetune find-label-issues recipes/quickstart.yaml --baseline_only --dataset_dir /tmp/noisy \\
        --output_dir /tmp/noisy-run
    python tools/label_noise.py score /tmp/noisy/flips.json /tmp/noisy-run/label_issues_tfidf/label_issues.csv

``flip`` copies the recipe's ``dataset_dir`` (a folder of train/validation/test
CSVs rated by ``label_bins``) to ``--output`` with ``share`` of the train rows,
drawn with ``seed``, moved to another class drawn uniformly (the rating written
is the lowest of that class's bin), and records the flipped row ids (positions
in the train split find-label-issues reads) in ``flips.json``. ``score`` gives
the precision and recall of the flagged rows against the flips.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
from pathlib import Path

import numpy as np
import pandas as pd


def flip(recipe: str, seed: int, share: float, output: Path) -> dict:
    """Write the noisy copy of the recipe's dataset_dir and flips.json; returns what flips.json holds."""
    from finetune.config.recipes import load_recipe
    from finetune.pipeline.out_of_fold import folded_train_split

    run = load_recipe(recipe, [])
    data = run.data
    source = Path(data.dataset_dir)
    shutil.copytree(source, output)
    train = pd.read_csv(source / "train.csv", keep_default_na=False)
    bins = list(data.label_bins.values())
    ratings = pd.to_numeric(train[data.label_column], errors="coerce")
    classes = [next((index for index, (low, high) in enumerate(bins) if low <= r <= high), None) for r in ratings]
    rated = [row for row, class_id in enumerate(classes) if class_id is not None]
    rng = np.random.default_rng(seed)
    chosen = sorted(rng.choice(rated, round(share * len(rated)), replace=False).tolist())
    for row in chosen:
        other = rng.choice([class_id for class_id in range(len(bins)) if class_id != classes[row]])
        train.loc[row, data.label_column] = int(bins[other][0])
    train.to_csv(output / "train.csv", index=False)
    # Row ids as find-label-issues counts them: the clean and the noisy split read the same rows in the same order.
    clean = folded_train_split(run, 2)
    noisy = folded_train_split(load_recipe(recipe, ["--dataset_dir", str(output)]), 2)
    assert clean.texts == noisy.texts, "flipping changed which rows are read"
    flipped = [row for row, (before, after) in enumerate(zip(clean.labels, noisy.labels)) if before != after]
    record = {
        "recipe": recipe,
        "seed": seed,
        "share": share,
        "train_reviews": len(clean.texts),
        "flipped": flipped,
        "noisy_labels": [int(label) for label in noisy.labels],
    }
    (output / "flips.json").write_text(json.dumps(record, indent=2) + "\n", encoding="utf-8")
    return record


def score(flips_path: Path, issues_path: Path, recall: float = 0.5) -> dict:
    """Precision and recall of the rows in label_issues.csv against the flipped rows.

    Also the precision of cleanlab's whole ranking (label quality, lowest first, from the
    ``oof_probabilities.npy`` beside the CSV) where it first reaches ``recall``: the figure
    two sources of probabilities are compared at.
    """
    from cleanlab.rank import get_label_quality_scores

    flips = json.loads(flips_path.read_text(encoding="utf-8"))
    flipped = set(flips["flipped"])
    flagged = set(pd.read_csv(issues_path, keep_default_na=False)["row_id"].astype(int))
    found = len(flagged & flipped)
    probabilities = np.load(issues_path.parent / "oof_probabilities.npy").astype(np.float64)
    quality = get_label_quality_scores(np.asarray(flips["noisy_labels"]), probabilities)
    hits = np.cumsum([row in flipped for row in np.argsort(quality, kind="stable")])
    reached = int(np.argmax(hits >= recall * len(flipped)))  # the first rank where recall is reached
    return {
        "flipped": len(flipped),
        "flagged": len(flagged),
        "flagged_and_flipped": found,
        "precision": found / len(flagged) if flagged else None,
        "recall": found / len(flipped) if flipped else None,
        f"precision_at_recall_{recall}": float(hits[reached] / (reached + 1)),
    }


def main() -> None:
    """The two steps as subcommands."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    steps = parser.add_subparsers(dest="step", required=True)
    flip_step = steps.add_parser("flip")
    flip_step.add_argument("recipe")
    flip_step.add_argument("--seed", type=int, required=True)
    flip_step.add_argument("--share", type=float, default=0.1)
    flip_step.add_argument("--output", type=Path, required=True)
    score_step = steps.add_parser("score")
    score_step.add_argument("flips", type=Path)
    score_step.add_argument("issues", type=Path)
    args = parser.parse_args()
    if args.step == "flip":
        record = flip(args.recipe, args.seed, args.share, args.output)
        print(f"flipped {len(record['flipped'])} of {record['train_reviews']} training labels", file=sys.stderr)
    else:
        print(json.dumps(score(args.flips, args.issues), indent=2))


if __name__ == "__main__":
    main()
