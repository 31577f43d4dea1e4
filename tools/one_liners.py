"""Score a model folder on one-line reviews of plain polarity (data/one_liners/).

    python tools/one_liners.py RUN [--set check|holdout|holdout2|holdout3|...]   # dev unless said

Prints how many of the set's reviews get their label (negative or positive),
the wrong ones with their probability, the most confident wrong label, and
how sure the model is when right (the median probability of the right labels:
a model that is unsure of everything would have no confident mistakes either).
dev.csv is for choosing the quickstart's short-review settings; check.csv
and the holdouts are never read by training or tuning, only here,
to check a shipped model (each holdout was written later, by someone who saw
none of the project's reviews, after the sets before it had been read).
"""

from __future__ import annotations

import argparse
import csv
import statistics
from pathlib import Path

from finetune.evaluation.inference import load_inference_model, predict_probabilities

SETS = Path(__file__).resolve().parent.parent / "data" / "one_liners"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("run", help="a model folder (a run, a checkpoint or an int8 export)")
    parser.add_argument(
        "--set",
        default="dev",
        # Every set in the folder: a new holdout needs its CSV there, not an edit here.
        choices=sorted(path.stem for path in SETS.glob("*.csv")),
        help="which set (dev unless said: check sets only on purpose)",
    )
    options = parser.parse_args()
    rows = list(csv.DictReader((SETS / f"{options.set}.csv").open(encoding="utf-8")))
    model, tokenizer = load_inference_model(Path(options.run))
    probabilities = predict_probabilities(model, tokenizer, [row["review"] for row in rows])
    id2label = model.config.id2label
    right, worst_wrong, right_confidences = 0, 0.0, []
    for row, probs in zip(rows, probabilities):
        predicted = id2label[int(probs.argmax())]
        if predicted == row["label"]:
            right += 1
            right_confidences.append(float(probs.max()))
        else:
            worst_wrong = max(worst_wrong, float(probs.max()))
            print(f"  wrong: {row['review']!r} -> {predicted} {probs.max():.2f} (is {row['label']})")
    share = right / len(rows)
    print(f"{options.set}: {right}/{len(rows)} right ({share:.1%}); most confident wrong label {worst_wrong:.2f}")
    if right_confidences:
        print(f"  when right: median probability {statistics.median(right_confidences):.2f}")


if __name__ == "__main__":
    main()
