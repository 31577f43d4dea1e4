"""Time the two ways reviews sorted by length are cut into scoring batches, on the packaged MiniLM.

Evaluation inside a training run (Trainer's loop, :class:`LengthSortedSampler`)
cuts the sorted reviews into fixed runs of ``per_device_eval_batch_size``;
``predict``, ``serve`` and ``evaluate`` (``predict_probabilities``) cut them
where padding costs more than another forward pass (``length_batches``, a
dynamic programme). Both are timed here on the same reviews, the same model
and the same reading (``reading_for_scores``), alternated, so the ratio says
whether evaluation would gain from the second::

    python tools/scoring_batches_ab.py --repeats 3

Reviews: the quickstart's validation and test splits (``data/reviews``) and,
where ``../shared/data/drugscom`` is present, drugs.com's test reviews
(long ones), at the recipes' ``max_length`` 256 and batch size 32.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import numpy as np
import pandas as pd
import torch
from transformers import AutoModelForSequenceClassification, AutoTokenizer

from finetune.data.collation import PaddingCollator
from finetune.data.length_batches import CPU_PASS_COST_TOKENS, length_batches
from finetune.fast_path.readings import reading_for_scores
from finetune.training.modeling import resolve_model_path

ROOT = Path(__file__).resolve().parents[1]
BATCH_SIZE, MAX_LENGTH = 32, 256


def review_sets() -> dict[str, list[str]]:
    """The review texts each comparison scores, by name."""
    quickstart = pd.concat([pd.read_csv(ROOT / "data/reviews" / f"{split}.csv") for split in ("validation", "test")])
    sets = {"quickstart validation+test": quickstart["review"].astype(str).tolist()}
    drugscom = ROOT.parent / "shared/data/drugscom/drugsComTest.tsv"
    if drugscom.is_file():
        table = pd.read_csv(drugscom, sep="\t")
        sets["drugscom test"] = table["review"].astype(str).tolist()
    return sets


def fixed_runs(lengths: list[int]) -> list[np.ndarray]:
    """Trainer's evaluation batches: rows longest first (LengthSortedSampler), cut into runs of BATCH_SIZE."""
    order = np.argsort(-np.asarray(lengths), kind="stable")
    return [order[start : start + BATCH_SIZE] for start in range(0, len(order), BATCH_SIZE)]


def score(model, collator, encoded: list[dict], batches: list[np.ndarray]) -> float:
    """Seconds to score every batch once (the logits are computed and dropped)."""
    start = time.perf_counter()
    with torch.inference_mode(), reading_for_scores(model):
        for rows in batches:
            model(**collator([encoded[row] for row in rows]))
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=3)
    repeats = parser.parse_args().repeats
    path = resolve_model_path("all-minilm-l6-v2")
    tokenizer = AutoTokenizer.from_pretrained(path)
    model = AutoModelForSequenceClassification.from_pretrained(path, num_labels=3).eval()
    collator = PaddingCollator(tokenizer, return_tensors="pt")
    print(f"torch threads {torch.get_num_threads()}, batch size {BATCH_SIZE}, max_length {MAX_LENGTH}")
    for name, texts in review_sets().items():
        encoded = [dict(tokenizer(text, truncation=True, max_length=MAX_LENGTH)) for text in texts]
        lengths = [len(row["input_ids"]) for row in encoded]
        ways = {
            "fixed runs (Trainer's evaluation)": fixed_runs(lengths),
            "length_batches (predict, serve)": length_batches(lengths, BATCH_SIZE, CPU_PASS_COST_TOKENS),
        }
        score(model, collator, encoded, ways["fixed runs (Trainer's evaluation)"][:2])  # warm-up
        times: dict[str, list[float]] = {way: [] for way in ways}
        for _ in range(repeats):
            for way, batches in ways.items():
                times[way].append(score(model, collator, encoded, batches))
        print(f"\n{name}: {len(texts)} reviews, {sum(lengths)} real tokens")
        for way, batches in ways.items():
            padded = sum(len(rows) * max(lengths[row] for row in rows) for rows in batches)
            best = min(times[way])
            print(f"  {way:36s} {len(batches):3d} passes, {padded:7d} tokens padded in, best {best:.2f} s of {repeats}")
        fixed, dynamic = (min(values) for values in times.values())
        print(f"  length_batches / fixed runs: {dynamic / fixed:.2f}x the time")


if __name__ == "__main__":
    main()
