"""Time one training step (forward + backward) of the packaged MiniLM BERT, to judge a speed-up before keeping it.

    python tools/step_time.py --lengths 121 128            # does padding to a multiple of 8 pay?
    python tools/step_time.py --lengths 64 128 --compile   # does torch.compile pay? (prints compile time too)

Micro-batch 8 of random token ids, every token real; the mean of 3 steps after one warm-up step per length.
"""

from __future__ import annotations

import argparse
import time

import torch
import transformers
from transformers import AutoModelForSequenceClassification

from finetune.training.modeling import resolve_model_path


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lengths", type=int, nargs="+", default=[128])
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--compile", action="store_true", help="torch.compile(dynamic=True) the model first")
    options = parser.parse_args()
    transformers.logging.set_verbosity_error()
    transformers.logging.disable_progress_bar()
    torch.manual_seed(0)
    model = AutoModelForSequenceClassification.from_pretrained(resolve_model_path("all-minilm-l6-v2"), num_labels=3)
    model.train()
    if options.compile:
        model = torch.compile(model, dynamic=True)

    def step(length: int) -> None:
        input_ids = torch.randint(1000, 20000, (options.batch, length))
        labels = torch.randint(0, 3, (options.batch,))
        model(input_ids=input_ids, attention_mask=torch.ones_like(input_ids), labels=labels).loss.backward()

    for length in options.lengths:
        started = time.perf_counter()
        step(length)  # warm-up (and, compiled, the compile for this shape)
        first = time.perf_counter() - started
        started = time.perf_counter()
        for _ in range(3):
            step(length)
        print(f"{length} tokens: {(time.perf_counter() - started) / 3:.3f} s a step (first step {first:.1f} s)")


if __name__ == "__main__":
    main()
