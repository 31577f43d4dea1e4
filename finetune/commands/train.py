"""``finetune train``: load a recipe, train, evaluate on the test split, save, report (finetune.pipeline.run)."""

from __future__ import annotations

from ..pipeline.run import train

__all__ = ["train"]
