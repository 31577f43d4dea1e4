"""What each part of padding_free buys: one training step of the packaged MiniLM on drugscom's reviews, cut eight ways.

    python tools/packing_ablation.py                  # 20 windows of 16 reviews, 3 rounds, every variant each round
    python tools/packing_ablation.py --masks          # also: drawing one attention-sized dropout mask three ways

Each window is 16 of drugscom's training reviews, grouped by length as the recipe's sampler groups them
(a seeded shuffle, then sorted within megabatches of 50 windows); the model is the recipe's (mean pooling,
dropout 0.1), forward and backward, no optimizer step. The variants run round-robin, so a busy moment
costs them alike; the table gives the mean seconds per window and the ratio to stock's cut. Run it on an
otherwise idle machine.
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import random
import time
from collections.abc import Iterator
from typing import Any

import torch
import transformers
from transformers import AutoModelForSequenceClassification, DataCollatorWithPadding

from finetune.config.recipes import load_recipe
from finetune.data.splits import load_review_data
from finetune.fast_path import dropout_masks, packed_attention, review_attention
from finetune.fast_path.bert import LastLayerAtFirstTokens
from finetune.fast_path.packed_attention import PackedReading, attention_group_limit
from finetune.training import micro_batches
from finetune.training.micro_batches import pack
from finetune.training.modeling import load_tokenizer, resolve_model_path
from finetune.training.pooling import add_mean_pooling_layer

VARIANTS = (
    "padded, 2 micro-batches of 8 (stock's cut)",
    "padded, one micro-batch of 16 sorted (micro_batch_tokens 4096)",
    "  + last layer at first tokens",
    "packed, one attention group, bernoulli_ dropout",
    "packed, attention groups of like length, bernoulli_ dropout",
    "packed, groups, 31-bit dropout masks from torch's generator (until 2026-12-02)",
    "packed, groups, dropout masks from numpy's generators in chunks (until 2026-12-03)",
    "  + groups cut at 24 MiB of scores on the CPU (padding_free)",
)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--windows", type=int, default=20)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--masks", action="store_true", help="also time drawing one dropout mask three ways")
    options = parser.parse_args()
    transformers.logging.set_verbosity_error()
    transformers.logging.disable_progress_bar()
    run = load_recipe("recipes/drugscom.yaml", ["--output_dir", "/tmp/packing-ablation"])
    tokenizer = load_tokenizer(run.model)
    texts = list(load_review_data(run.data, seed=0).splits["train"]["text"])
    features = [dict(tokenizer(text, truncation=True, max_length=run.data.max_length), labels=0) for text in texts]
    windows = _length_grouped_windows(features, options.windows, 16)
    torch.manual_seed(0)
    model = AutoModelForSequenceClassification.from_pretrained(resolve_model_path("all-minilm-l6-v2"), num_labels=3)
    add_mean_pooling_layer(model)
    model.train()
    collator = DataCollatorWithPadding(tokenizer)
    seconds = {variant: 0.0 for variant in VARIANTS}
    for _ in range(options.rounds):
        for variant in VARIANTS:
            seconds[variant] += _time_variant(variant, copy.deepcopy(model), windows, collator)
    steps = options.rounds * len(windows)
    tokens = sum(len(feature["input_ids"]) for window in windows for feature in window)
    per_window = tokens / len(windows)
    print(f"{len(windows)} windows of 16 drugscom reviews ({per_window:.0f} tokens each), {options.rounds} rounds")
    print("| variant | s per window | vs stock's cut |")
    print("| --- | --- | --- |")
    base = seconds[VARIANTS[0]] / steps
    for variant in VARIANTS:
        mean = seconds[variant] / steps
        print(f"| {variant.strip()} | {mean:.3f} | {base / mean:.2f}x |")
    if options.masks:
        _time_masks()


def _length_grouped_windows(features: list[dict], count: int, size: int) -> list[list[dict]]:
    """``count`` windows of ``size`` reviews: shuffled, then sorted by length within megabatches of 50 windows."""
    order = list(range(len(features)))
    random.Random(0).shuffle(order)
    megabatch = 50 * size
    grouped = []
    for start in range(0, len(order), megabatch):
        grouped += sorted(order[start : start + megabatch], key=lambda row: -len(features[row]["input_ids"]))
    windows = [[features[row] for row in grouped[start : start + size]] for start in range(0, len(grouped), size)]
    return random.Random(1).sample([window for window in windows if len(window) == size], count)


def _time_variant(variant: str, model: Any, windows: list[list[dict]], collator: Any) -> float:
    """Seconds for forward and backward over every window, cut and read as ``variant`` says."""
    index = VARIANTS.index(variant)
    group_limit = attention_group_limit(model, torch.device("cpu")) if index == 7 else None
    with _installed(index, model):
        started = time.perf_counter()
        for window in windows:
            if index == 0:
                batches = [collator(window[:8]), collator(window[8:])]
            elif index in (1, 2):
                batches = [collator(sorted(window, key=lambda feature: -len(feature["input_ids"])))]
            else:
                batches = [pack(collator(window), max_group_scores=group_limit)]
            for batch in batches:
                model(**batch).loss.backward()
        return time.perf_counter() - started


@contextlib.contextmanager
def _installed(index: int, model: Any) -> Iterator[None]:
    """The variant's changes to the model and to the packing code, undone after."""
    patches = []

    def patch(module: Any, name: str, value: Any) -> None:
        patches.append((module, name, getattr(module, name)))
        setattr(module, name, value)

    def sdpa_dropout(query, key, value, mask, dropout, scaling):
        if mask is not None and mask.dtype != torch.bool:
            mask = mask.to(query.dtype)
        return torch.nn.functional.scaled_dot_product_attention(
            query, key, value, attn_mask=mask, dropout_p=dropout, scale=scaling
        )

    if index == 3:
        patch(micro_batches, "ATTENTION_GROUP_SHARE", 0.0)
    if index == 5:
        patch(dropout_masks, "dropout_keep", _torch_bits_keep)
        patch(review_attention, "dropout_keep", _torch_bits_keep)
    if index in (3, 4):
        # Packed rows and the last layer at first tokens both read attention through masked_attention.
        patch(review_attention, "masked_attention", sdpa_dropout)
        patch(packed_attention, "cheaper_dropout", lambda module: module.forward)
    installed = LastLayerAtFirstTokens(model) if index == 2 else PackedReading(model) if index >= 3 else None
    try:
        yield
    finally:
        if installed is not None:
            installed.remove()
        for module, name, value in reversed(patches):
            setattr(module, name, value)


def _torch_bits_keep(shape: torch.Size, rate: float, dtype: torch.dtype = torch.bool) -> torch.Tensor:
    """The masks padding_free drew until 2026-12-02: 31 bits per entry from torch's own generator."""
    return (torch.empty(shape, dtype=torch.int32).random_() >= round(rate * 2**31)).to(dtype)


def _time_masks() -> None:
    """Draw one dropout mask of 16 reviews x 12 heads x 150^2 attention weights: bernoulli_, 31 bits, 16-bit lanes."""
    shape = (16, 12, 150, 150)
    count = 16 * 12 * 150 * 150
    ways = {
        "bernoulli_ on floats (stock dropout)": lambda: torch.empty(shape).bernoulli_(0.9),
        "31 random bits per entry from torch's generator (until 2026-12-02)": lambda: (
            torch.empty(shape, dtype=torch.int32).random_() >= 214748365
        ),
        "16-bit lanes, 2 per draw (rate rounded to 1/65536; not kept)": lambda: (
            torch.empty((count + 1) // 2, dtype=torch.int32).random_(-(2**31), 2**31 - 1).view(torch.int16)[:count]
            >= -32768 + 6554
        ),
        "32 bits per entry from numpy's generators in chunks, as float (kept)": lambda: dropout_masks.dropout_keep(
            shape, 0.1, torch.float32
        ),
    }
    print("\n| one dropout mask of 16 x 12 x 150 x 150 | ms |")
    print("| --- | --- |")
    for name, draw in ways.items():
        draw()
        started = time.perf_counter()
        for _ in range(10):
            draw()
        print(f"| {name} | {(time.perf_counter() - started) * 100:.1f} |")


if __name__ == "__main__":
    main()
