"""Small builders shared by the tests: datasets of short reviews and quiet TrainingArguments."""

from __future__ import annotations

import copy
import importlib.util
import os
import random
import sys
from pathlib import Path

import datasets
import torch

PROJECT = Path(__file__).parent.parent

WORDS = [
    "great",
    "terrible",
    "fine",
    "broke",
    "love",
    "awful",
    "okay",
    "cheap",
    "sturdy",
    "returned",
    "works",
    "perfect",
    "meh",
    "slow",
    "fast",
    "battery",
    "lasted",
    "cracked",
    "comfortable",
    "refund",
    "gift",
]


def review_dataset(tokenizer, num_samples: int, seed: int = 0, max_words: int = 20) -> datasets.Dataset:
    """``num_samples`` tokenized pseudo-reviews of varied length with random labels 0..2."""
    rng = random.Random(seed)
    texts = [" ".join(rng.choice(WORDS) for _ in range(rng.randint(2, max_words))) for _ in range(num_samples)]
    encoded = tokenizer(texts)
    return datasets.Dataset.from_dict({**encoded, "labels": [rng.randrange(3) for _ in range(num_samples)]})


# FINETUNE_TEST_DEVICE=cuda runs the trainer tests on a GPU (the references stay on the CPU); CI has none.
TEST_ON_CPU = os.environ.get("FINETUNE_TEST_DEVICE", "cpu") == "cpu"


def quiet_args(output_dir, **overrides):
    """TrainingArguments for tests: CPU (or FINETUNE_TEST_DEVICE), fp32, no saving, no bars, no integrations."""
    from finetune import FinetuneTrainingArguments

    values = dict(
        output_dir=str(output_dir),
        use_cpu=TEST_ON_CPU,
        report_to="none",
        save_strategy="no",
        logging_strategy="no",
        disable_tqdm=True,
        seed=0,
    )
    values.update(overrides)
    return FinetuneTrainingArguments(**values)


def sgd_args(output_dir, micro_batch: int, accumulation_steps: int, epochs: int = 1, **overrides):
    """The exactness setting of the contract: SGD lr=1, no clipping, no decay, sequential order."""
    values = dict(
        per_device_train_batch_size=micro_batch,
        gradient_accumulation_steps=accumulation_steps,
        num_train_epochs=epochs,
        learning_rate=1.0,
        optim="sgd",
        lr_scheduler_type="constant",
        max_grad_norm=0.0,
        weight_decay=0.0,
        train_sampling_strategy="sequential",
    )
    values.update(overrides)
    return quiet_args(output_dir, **values)


def sgd_step(parameters: list[torch.nn.Parameter], loss: torch.Tensor) -> None:
    """One explicit SGD(lr=1) step: subtract ``loss``'s gradient from ``parameters`` (the references' update)."""
    gradients = torch.autograd.grad(loss, parameters, allow_unused=True)
    with torch.no_grad():
        for parameter, gradient in zip(parameters, gradients):
            if gradient is not None:
                parameter -= gradient


def flat_parameters(model: torch.nn.Module) -> torch.Tensor:
    """All parameters as one vector (a copy, on the CPU)."""
    return torch.cat([parameter.detach().flatten().cpu().clone() for parameter in model.parameters()])


def tiny_recipe(folder: Path, model_dir: Path, output_dir: Path, **fields) -> Path:
    """The quickstart recipe pointed at the tiny model, for speed; ``fields`` replace, add or (None) drop keys."""
    values = {
        "model_name_or_path": model_dir,
        "dataset_dir": PROJECT / "data" / "reviews",
        "text_column": "review",
        "title_column": "title",
        "label_column": "stars",
        "label_bins": "{negative: [1, 2], neutral: [3], positive: [4, 5]}",
        "max_length": 64,
        "output_dir": output_dir,
        "per_device_train_batch_size": 16,
        "n_accumulate": 2,
        "num_train_epochs": 2,
        "learning_rate": "1.0e-3",
        "eval_strategy": "epoch",
        "save_strategy": "epoch",
        "save_total_limit": 2,
        "load_best_model_at_end": "true",
        "metric_for_best_model": "macro_f1",
        "train_sampling_strategy": "group_by_length",
        "logging_steps": 5,
        # FINETUNE_TEST_DEVICE=cuda: recipe runs train on the GPU too (the resume test on CUDA).
        "use_cpu": "true" if TEST_ON_CPU else "false",
        "disable_tqdm": "true",
    }
    values.update(fields)
    path = folder / "recipe.yaml"
    kept = {key: value for key, value in values.items() if value is not None}
    lines = ["# test recipe: finetune train recipe.yaml", *(f"{key}: {value}" for key, value in kept.items())]
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


def checkpointing_recipe(folder: Path, model_dir: Path, epochs: int, save_steps: int) -> Path:
    """458 reviews in micro-batches of 8, 3 to a window (20 updates an epoch, the last window partial), every
    update logged, a checkpoint every ``save_steps`` updates, all kept; no validation, no baseline: the kill and
    resume tests compare such runs bitwise."""
    return tiny_recipe(
        folder,
        model_dir,
        folder / "run",
        max_length=32,
        per_device_train_batch_size=8,
        n_accumulate=3,
        num_train_epochs=epochs,
        eval_strategy="no",
        save_strategy="steps",
        save_steps=save_steps,
        save_total_limit="null",
        load_best_model_at_end="false",
        logging_steps=1,
        baseline="false",
    )


def reference_sgd_steps(model, dataset, collator, window_samples: int) -> torch.Tensor:
    """One SGD(lr=1) step per window on all its samples at once, on transformers' own model (train mode)."""
    model = copy.deepcopy(model).train()
    parameters = list(model.parameters())
    for start in range(0, len(dataset), window_samples):
        rows = range(start, min(start + window_samples, len(dataset)))
        sgd_step(parameters, model(**collator([dataset[row] for row in rows])).loss)
    return flat_parameters(model)


def padded_batch(tokenizer, samples: int = 6) -> dict:
    """``samples`` reviews of 1 to 40 words collated with padding (refused if none was needed: masks untested)."""
    from transformers import DataCollatorWithPadding

    features = [dict(row) for row in review_dataset(tokenizer, samples, max_words=40)]
    batch = DataCollatorWithPadding(tokenizer)(features)
    assert bool((batch["attention_mask"] == 0).any()), "the batch must have padding to test the masks"
    return batch


def load_tool(name: str):
    """tools/<name>.py as a module (the tools are scripts, not a package), registered in sys.modules."""
    spec = importlib.util.spec_from_file_location(name, Path(__file__).parent.parent / "tools" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # a dataclass in the tool looks its module up there
    spec.loader.exec_module(module)
    return module
