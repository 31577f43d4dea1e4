"""MPNet's attention, eager (transformers) against fused (SDPA, finetune's): time both, alternated, in one process.

    python tools/attention_ab.py                                   # all-mpnet-base-v2 (fetched once), 2 CPU cores
    python tools/attention_ab.py --lengths 256 512 --batch 8 16    # the shapes to time
    python tools/attention_ab.py --model /tmp/models/all-mpnet-base-v2 --device cuda --bf16   # a lent GPU

For each length and batch: a prediction pass (eval, no gradients) and a training
step (forward and backward, dropout on), each the best of ``--repeats``, eager
and fused alternated so that a busy machine weighs on both alike. Random token
ids; the second half of the batch is padded from 3/4 of the length on, so the
padding mask is exercised. Prints one row per shape and the logits' largest
difference between the two (a sanity check; tests/test_mpnet_attention.py is
the equivalence test).
"""

from __future__ import annotations

import argparse
import contextlib
import time
from collections.abc import Callable

import torch
import transformers
from transformers import AutoModelForSequenceClassification

from finetune.fast_path.mpnet import FusedMPNetAttention
from finetune.training.modeling import resolve_model_path


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="all-mpnet-base-v2", help="a model name or folder (an MPNet)")
    parser.add_argument("--lengths", type=int, nargs="+", default=[256, 512])
    parser.add_argument("--batch", type=int, nargs="+", default=[8])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--bf16", action="store_true", help="autocast to bf16, as a bf16 run does")
    options = parser.parse_args()
    transformers.logging.set_verbosity_error()
    transformers.logging.disable_progress_bar()
    torch.manual_seed(0)
    path = resolve_model_path(options.model)
    model = AutoModelForSequenceClassification.from_pretrained(path, num_labels=2).to(options.device)
    print(f"{path} on {options.device}{' (bf16 autocast)' if options.bf16 else ''}, torch {torch.__version__}")
    print("| tokens | batch | pass | eager s | fused s | eager / fused | largest logit difference |")
    print("| --- | --- | --- | --- | --- | --- | --- |")
    for length in options.lengths:
        for batch in options.batch:
            for name, step in (("predict", _predict), ("train step", _train_step)):
                _compare(model, name, step, length, batch, options)


def _inputs(length: int, batch: int, vocabulary: int, device: str) -> dict[str, torch.Tensor]:
    input_ids = torch.randint(1000, vocabulary, (batch, length), device=device)
    attention_mask = torch.ones_like(input_ids)
    attention_mask[batch // 2 :, length * 3 // 4 :] = 0
    return {"input_ids": input_ids, "attention_mask": attention_mask}


def _predict(model: torch.nn.Module, inputs: dict[str, torch.Tensor]) -> torch.Tensor:
    model.eval()
    with torch.inference_mode():
        return model(**inputs).logits.float()


def _train_step(model: torch.nn.Module, inputs: dict[str, torch.Tensor]) -> torch.Tensor:
    model.train()
    labels = torch.zeros(inputs["input_ids"].shape[0], dtype=torch.long, device=inputs["input_ids"].device)
    output = model(**inputs, labels=labels)
    output.loss.backward()
    model.zero_grad(set_to_none=True)
    return output.logits.detach().float()


def _compare(model: torch.nn.Module, name: str, step: Callable, length: int, batch: int, options) -> None:
    inputs = _inputs(length, batch, model.config.vocab_size, options.device)
    seconds: dict[str, list[float]] = {"eager": [], "fused": []}
    logits: dict[str, torch.Tensor] = {}
    for _ in range(options.repeats):
        for mode in ("eager", "fused"):
            installed = FusedMPNetAttention(model) if mode == "fused" else None
            if installed is not None and not installed.installed:
                raise SystemExit(f"{options.model} is not an MPNet; this tool compares MPNet's attention")
            precision = torch.autocast(options.device, dtype=torch.bfloat16) if options.bf16 else None
            with precision or contextlib.nullcontext():
                step(model, inputs)  # warm-up: kernels chosen, memory allocated
                _synchronize(options.device)
                started = time.perf_counter()
                logits[mode] = step(model, inputs)
                _synchronize(options.device)
            seconds[mode].append(time.perf_counter() - started)
            if installed is not None:
                installed.remove()
    eager, fused = min(seconds["eager"]), min(seconds["fused"])
    # A train step's logits differ by dropout's draws; the prediction pass's by rounding alone.
    difference = f"{(logits['eager'] - logits['fused']).abs().max().item():.1e}" if name == "predict" else "-"
    print(f"| {length} | {batch} | {name} | {eager:.3f} | {fused:.3f} | {eager / fused:.2f}x | {difference} |")


def _synchronize(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


if __name__ == "__main__":
    main()
