"""Checks of a model folder's files before anything loads them: each problem one line, not a traceback.

Weights only in pickle files (which can run code), safetensors or JSON files cut
short, a tokenizer without a vocabulary. Kept apart from checkpoint saving so
that reading a model folder (``predict``, ``serve``, ``export``) imports no
training code.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from ..errors import FinetuneError, first_line

PICKLED_WEIGHTS = ("pytorch_model.bin", "pytorch_model.bin.index.json")
SAFE_WEIGHTS = ("model.safetensors", "model.safetensors.index.json")
# The JSON files a model folder is loaded from: cut short, each gives a JSONDecodeError traceback.
MODEL_JSON_FILES = ("config.json", "tokenizer.json", "tokenizer_config.json", "special_tokens_map.json")


def require_safe_weights(
    folder: str | Path, allow_pickle: bool = False, flag: str = "allow_pickle_checkpoints"
) -> None:
    """Refuse a model folder whose weights are only pickle files (which can run code when loaded).

    ``flag`` is the option that allows them, named in the message.
    """
    folder = Path(folder)
    has_safe = any((folder / name).is_file() for name in SAFE_WEIGHTS)
    has_pickle = any((folder / name).is_file() for name in PICKLED_WEIGHTS)
    if has_pickle and not has_safe and not allow_pickle:
        raise FinetuneError(
            f"{folder} has only pickled weights (pytorch_model.bin), which can run code when loaded; "
            f"convert them to safetensors, or pass --{flag} if you trust where they came from"
        )


def require_readable_safetensors(folder: str | Path) -> None:
    """Refuse a folder whose ``*.safetensors`` files are cut short or not safetensors at all.

    Reading the header is cheap, and ``safetensors`` checks it against the
    file's size, so a copy cut off part-way is found here rather than as a
    traceback while loading.
    """
    from safetensors import safe_open

    for path in sorted(Path(folder).glob("*.safetensors")):
        try:
            with safe_open(str(path), framework="pt"):
                pass
        except Exception as error:  # SafetensorError, or an OSError for an unreadable file
            raise FinetuneError(f"{path} is damaged or cut short ({first_line(error)}); copy or save it again")


def read_json_object(path: str | Path, fix: str) -> dict[str, Any]:
    """``path``'s JSON object, or a one-line error that it is damaged, ending in ``fix``."""
    path = Path(path)
    try:
        loaded = json.loads(path.read_text(encoding="utf-8"))
    except (ValueError, UnicodeDecodeError) as error:
        raise FinetuneError(f"{path} is damaged or cut short (not JSON: {first_line(error)[:80]}); {fix}") from None
    if not isinstance(loaded, dict):
        raise FinetuneError(f"{path} is damaged or cut short (not a JSON object); {fix}")
    return loaded


def require_loadable_model_files(
    folder: str | Path, allow_pickle: bool = False, flag: str = "allow_pickle_checkpoints"
) -> None:
    """Refuse a model folder that would not load, or only with a traceback: pickled weights alone (unless
    ``allow_pickle``), safetensors or config / tokenizer JSON cut short."""
    require_safe_weights(folder, allow_pickle, flag)
    require_readable_safetensors(folder)
    for name in MODEL_JSON_FILES:
        if (Path(folder) / name).is_file():
            read_json_object(Path(folder) / name, "copy or save the model again")


def require_vocabulary(tokenizer: Any, folder: str | Path) -> None:
    """Refuse a tokenizer that knows only its special tokens: the model folder had no vocabulary file.

    transformers loads a folder without tokenizer files as an empty tokenizer
    that reads every word as an unknown token, and every prediction would be
    made from nothing, with exit status 0. Checked on the loaded tokenizer,
    not by file names, which differ between tokenizers (tokenizer.json,
    vocab.txt, spm.model, ...).
    """
    if len(tokenizer) <= len(set(tokenizer.all_special_tokens)):
        raise FinetuneError(
            f"{folder} has no tokenizer (no tokenizer.json or vocabulary file, so every word would be unknown); "
            "copy the tokenizer files of the model it was trained from into it (tokenizer.save_pretrained)"
        )
