"""Text the tokenizer cannot encode: lone surrogates, found and named, or repaired with U+FFFD.

JSON may escape any UTF-16 code unit (``"\\ud800"``), so a JSON string can hold
half of a surrogate pair, which is not Unicode text: no UTF-8 encodes it and
the tokenizer refuses it with a TypeError. It is the one such case, since a
file or stream decoded from UTF-8 cannot hold one. A review holding one is
refused, naming where, unless the user asked for ``replace``: each lone
surrogate is then read as U+FFFD, the replacement character.
"""

from __future__ import annotations

import re
from typing import Any

# What --on_bad_text accepts: refuse the review in one line (the default), or read U+FFFD in its place.
ON_BAD_TEXT = ("refuse", "replace")
_SURROGATE = re.compile("[\ud800-\udfff]")


def first_bad_character(text: str) -> int | None:
    """The index of the first lone surrogate in ``text``, or None when it is all Unicode text."""
    found = _SURROGATE.search(text)
    return found.start() if found else None


def describe_bad_text(text: str) -> str:
    """What is wrong with ``text`` (which holds a lone surrogate), as the rest of a sentence naming it."""
    index = first_bad_character(text)
    if index is None:
        raise ValueError("describe_bad_text takes text that holds a lone surrogate")
    return f"holds a lone surrogate (U+{ord(text[index]):04X}) at character {index + 1}, which is not Unicode text"


def repair_text(text: str) -> str:
    """``text`` with each lone surrogate replaced by U+FFFD."""
    return _SURROGATE.sub("\ufffd", text)


def find_bad_text(value: Any, name: str) -> tuple[str, str] | None:
    """The first text in ``value`` (text, or a JSON object or list of them) holding a lone surrogate.

    Returns where it is (``name``, ``name.key`` or ``name[2]``) and what is wrong
    (:func:`describe_bad_text`), or None when every text in it is Unicode text.
    """
    if isinstance(value, str):
        return (name, describe_bad_text(value)) if first_bad_character(value) is not None else None
    if isinstance(value, dict):
        for key, item in value.items():
            found = find_bad_text(key, name) or find_bad_text(item, f"{name}.{key}" if name else str(key))
            if found:
                return found
    if isinstance(value, list):
        for index, item in enumerate(value):
            found = find_bad_text(item, f"{name}[{index}]")
            if found:
                return found
    return None


def repair_value(value: Any) -> Any:
    """``value`` (text, or a JSON object or list of them) with every text repaired (:func:`repair_text`)."""
    if isinstance(value, str):
        return repair_text(value)
    if isinstance(value, dict):
        return {repair_value(key): repair_value(item) for key, item in value.items()}
    if isinstance(value, list):
        return [repair_value(item) for item in value]
    return value
