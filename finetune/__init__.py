"""finetune: fine-tune BERT-family models on customer reviews, with exact gradient accumulation."""

from .arguments import DataArguments, FinetuneTrainingArguments, ModelArguments
from .errors import FinetuneError
from .trainer import ReviewTrainer

__all__ = ["DataArguments", "FinetuneError", "FinetuneTrainingArguments", "ModelArguments", "ReviewTrainer"]
__version__ = "0.1.0"
