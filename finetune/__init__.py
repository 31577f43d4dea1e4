"""finetune: fine-tune BERT-family models on customer reviews, with exact gradient accumulation."""

from __future__ import annotations

import importlib
from typing import Any

from .errors import FinetuneError

# Imported on first use: torch and transformers take seconds to load, and commands
# such as `finetune data list` or `finetune train --help` should not wait for them.
_LAZY = {
    "DataArguments": ".config.arguments",
    "FinetuneTrainingArguments": ".config.arguments",
    "ModelArguments": ".config.arguments",
    "ReviewTrainer": ".training.trainer",
}

__all__ = ["DataArguments", "FinetuneError", "FinetuneTrainingArguments", "ModelArguments", "ReviewTrainer"]
__version__ = "0.1.0"


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name], __name__), name)
    raise AttributeError(f"module 'finetune' has no attribute {name!r}")
