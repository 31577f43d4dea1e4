"""Flags that say how to run rather than what is trained, and a command line without them."""

from __future__ import annotations

# Flags that say how to run, not what is trained (True: the flag takes a value). Advice to resume
# leaves them out and adds its own; a run made with or without them is the same run.
HOW_TO_RUN_FLAGS = {"--overwrite_output_dir": False, "--resume_from_checkpoint": True}


def without_flags(flags: list[str], dropped: dict[str, bool]) -> list[str]:
    """``flags`` minus the ``dropped`` ones (``True``: the flag takes a value, dropped with it)."""
    kept: list[str] = []
    skip_value = False
    for flag in flags:
        name = flag.split("=", 1)[0]
        if skip_value:
            skip_value = False
        elif name in dropped:
            skip_value = dropped[name] and "=" not in flag
        else:
            kept.append(flag)
    return kept
