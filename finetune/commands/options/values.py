"""What a flag's value may be: argparse types that refuse a bad value in words a user can act on."""

from __future__ import annotations

import argparse


def resample_count(text: str) -> int:
    """An argparse type: bootstrap resamples, 1 to ``MAX_RESAMPLES``."""
    from ...evaluation.bootstrap import MAX_RESAMPLES

    value = positive_int(text)
    if value > MAX_RESAMPLES:
        raise argparse.ArgumentTypeError(
            f"at most {MAX_RESAMPLES:,} (got {value:,}); past that a 95% interval no longer moves"
        )
    return value


def seed_int(text: str) -> int:
    """An argparse type: a random seed, a whole number >= 0 (numpy refuses negative seeds)."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number >= 0, got {text!r}")
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be >= 0 (got {value})")
    return value


def port_number(text: str) -> int:
    """An argparse type: a TCP port, 0 (any free port) to 65535."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a port number 0-65535, got {text!r}")
    if not 0 <= value <= 65535:
        raise argparse.ArgumentTypeError(f"must be 0-65535 (got {value})")
    return value


def positive_seconds(text: str) -> float:
    """An argparse type: a number of seconds > 0 (a timeout of 0 or NaN would close every connection, or none)."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number of seconds > 0, got {text!r}")
    if not 0 < value < float("inf"):
        raise argparse.ArgumentTypeError(f"must be a number of seconds > 0 (got {text})")
    return value


def positive_int(text: str) -> int:
    """An argparse type: a whole number >= 1 (a batch of 0 or -1 reviews is a mistake, not a setting)."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number >= 1, got {text!r}")
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1 (got {value})")
    return value
