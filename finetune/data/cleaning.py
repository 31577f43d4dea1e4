"""Normalise review text exported from web pages and spreadsheets.

Real review dumps carry the marks of where they came from: HTML entities
(``&#039;``, ``&quot;``), ``<br />`` tags, a CSV export's extra wrapping
quotes, Windows line ends, a byte-order mark. None of it is the reviewer's
words, and all of it costs tokens, so it is removed before tokenizing.
"""

from __future__ import annotations

import html
import re

_LINE_BREAK_TAG = re.compile(r"<\s*br\s*/?\s*>", re.IGNORECASE)
_LINE_ENDS = re.compile(r"\r\n?")
_BLANK_RUNS = re.compile(r"\n\s*\n+")
_SPACE_RUNS = re.compile(r"[ \t\f\v]+")
# A field quoted twice by an export ('"""text"""' in a CSV file) reads back as '"text"'.
_QUOTE = '"'
# Wrapping quotes are stripped only when most texts in a batch have them: then they
# are an export artifact, while a lone review that starts and ends with a quote is
# more likely quoting someone.
WRAPPED_SHARE_TO_STRIP = 0.9


def clean_text(text: str) -> str:
    """One review with entities decoded, ``<br>`` as line breaks, ``\\n`` line ends and no BOM or outer spaces."""
    text = text.replace("\ufeff", "")
    # Twice, because double-escaped exports ('&amp;#039;') are common.
    text = html.unescape(html.unescape(text)) if "&" in text else text
    text = _LINE_BREAK_TAG.sub("\n", text)
    text = _LINE_ENDS.sub("\n", text)
    text = _SPACE_RUNS.sub(" ", text)
    return _BLANK_RUNS.sub("\n\n", text).strip()


def unwrap_quotes(text: str) -> str:
    """``text`` without its wrapping double quotes (``"great"`` and ``""\"great""\"`` become ``great``)."""
    while len(text) >= 2 and text[0] == text[-1] == _QUOTE:
        text = text[1:-1].strip()
    return text


def is_wrapped_in_quotes(text: str) -> bool:
    """Whether ``text`` starts and ends with a double quote."""
    text = text.strip()
    return len(text) >= 2 and text[0] == text[-1] == _QUOTE


def clean_texts(texts: list[str]) -> list[str]:
    """:func:`clean_text` over a batch, stripping wrapping quotes when they are the batch's norm."""
    cleaned = [clean_text(text) if text else text for text in texts]
    present = [text for text in cleaned if text]
    wrapped = sum(is_wrapped_in_quotes(text) for text in present)
    if present and wrapped / len(present) >= WRAPPED_SHARE_TO_STRIP:
        cleaned = [unwrap_quotes(text) if text else text for text in cleaned]
    return cleaned


def join_title(title: str, text: str) -> str:
    """The text a model sees for a review with an optional title: ``'Title. Body'``."""
    return f"{title}. {text}" if title else text
