"""How a subcommand is declared: its options as dataclass fields whose metadata the parser reads, and its record.

A field made by :func:`option` is a flag ``--name``; one made by :func:`argument`
is a positional argument. The parser's type comes from the annotation (``int``,
``float``; ``bool`` is an on/off flag) unless ``type`` names a stricter one, such
as :func:`~finetune.commands.options.values.positive_int`.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any


def option(
    default: Any = None,
    *,
    help: str | None = None,
    type: Callable[[str], Any] | None = None,
    choices: Sequence[str] | None = None,
    metavar: str | None = None,
) -> Any:
    """A flag ``--<field name>``: its default, help, a stricter type than the annotation's, choices, metavar."""
    return _field(default, help=help, type=type, choices=choices, metavar=metavar, positional=False)


def argument(default: Any = dataclasses.MISSING, *, help: str, nargs: str | None = None) -> Any:
    """A positional argument: required unless ``nargs`` is ``"?"`` (then ``default`` is its value when left out)."""
    return _field(default, help=help, nargs=nargs, positional=True)


def _field(default: Any, *, positional: bool, **parser_keywords: Any) -> Any:
    # Only what was given goes to argparse, so a flag declared without help shows none, as before.
    metadata = {key: value for key, value in parser_keywords.items() if value is not None}
    return dataclasses.field(default=default, metadata={**metadata, "positional": positional})


def as_keywords(options: Any, *, leave_out: Sequence[str] = ()) -> dict[str, Any]:
    """The options as keyword arguments, for a command function whose parameters share the options' names."""
    return {name: value for name, value in dataclasses.asdict(options).items() if name not in leave_out}


@dataclass(frozen=True)
class Command:
    """One subcommand: its name and help, its options dataclass, and the function that runs it.

    ``run(options, extra)`` receives the options dataclass filled from the command
    line, and ``extra``, the flags the parser did not know: recipe overrides for a
    command that ``takes_recipe_fields``, refused with exit 2 for any other. A
    command with ``subcommands`` (``data list``, ``data fetch``) has no options of its own.
    """

    name: str
    help: str
    options: type | None = None
    run: Callable[[Any, list[str]], None] | None = None
    description: str | None = None
    # The usage line where argparse's would not say it (a recipe that is no declared argument, two forms).
    usage: str | None = None
    # Recipe fields ride in ``extra``; ``--help`` lists them after the command's own options.
    takes_recipe_fields: bool = False
    subcommands: tuple[Command, ...] = ()
