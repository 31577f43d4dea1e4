"""The ``finetune`` argument parser, generated from the subcommands' option dataclasses.

Each :class:`~finetune.commands.options.fields.Command` becomes a subparser, each
field of its options dataclass one argument (see ``commands/options/fields.py``
for how a field declares it); the chosen command rides on the parsed namespace,
and :func:`options_from` turns the namespace back into its dataclass.
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
import typing
from collections.abc import Collection, Sequence
from typing import Any

from .commands.options.fields import Command
from .errors import FinetuneError

# The namespace attribute naming the Command the command line chose.
CHOSEN = "chosen_command"
# The annotations a field may have, and the argparse type each gives (str needs none; bool is an on/off flag).
_PARSER_TYPES: dict[Any, Any] = {str: None, int: int, float: float, list[str]: None}


class _Parser(argparse.ArgumentParser):
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        # No abbreviations: unknown flags pass on as recipe fields, and argparse would otherwise
        # read the recipe's --seed 43 as --seeds 43 (43 runs instead of one run with seed 43).
        kwargs.setdefault("allow_abbrev", False)
        super().__init__(*args, **kwargs)

    # Set on a command that takes recipe fields: its --help lists them after its own options.
    lists_recipe_fields = False

    def format_help(self) -> str:
        """argparse's help, then (for a command that takes them) every recipe field, from the recipe's dataclasses."""
        text = super().format_help()
        return text + "\n" + recipe_fields_help() if self.lists_recipe_fields else text

    def error(self, message: str) -> None:
        # prog is the full command, e.g. "finetune data fetch", so the hint names the right --help.
        raise FinetuneError(f"{message}; see '{self.prog} --help'")

    def parse_known_args(self, args: Sequence[str] | None = None, namespace: Any = None) -> Any:
        """argparse's parsing, after refusing a flag given twice (see :func:`refuse_flags_given_twice`)."""
        given = list(sys.argv[1:] if args is None else args)
        # Checked by the command's own parser, which gets every flag after the command's name and knows
        # which take no value; the parsers above it only choose the command.
        if self._subparsers is None:
            on_off = {option for option, action in self._option_string_actions.items() if action.nargs == 0}
            refuse_flags_given_twice(given, on_off)
        return super().parse_known_args(given, namespace)


def refuse_flags_given_twice(argv: Sequence[str], on_off: Collection[str] = ()) -> None:
    """Refuse a flag given twice, in either spelling (``--max_steps`` / ``--max-steps``), as a recipe key twice is.

    argparse keeps the last without a word, so ``--max_steps 2 --max_steps 3`` trained 3 steps while
    the 2 typed first looked in force. ``on_off`` are the flags that take no value (``--overwrite``).
    """
    seen: dict[str, str] = {}
    for index, token in enumerate(argv):
        if token == "--":
            return  # what follows is positional, whatever it looks like
        if not token.startswith("--"):
            continue
        name, equals, _ = token.partition("=")
        field = name[2:].replace("-", "_")
        following = argv[index + 1] if index + 1 < len(argv) else ""
        takes_value = not equals and name not in on_off and following and not following.startswith("--")
        written = f"{token} {following}" if takes_value else token
        if field in seen:
            raise FinetuneError(f"--{field} is given twice ({seen[field]}, then {written}); give it once")
        seen[field] = written


def build_parser(commands: Sequence[Command], prog: str, description: str) -> argparse.ArgumentParser:
    """A parser with one subcommand per entry of ``commands``."""
    parser = _Parser(prog=prog, description=description)
    _add_commands(parser, commands, dest="command", metavar=None)
    return parser


def _add_commands(parser: argparse.ArgumentParser, commands: Sequence[Command], dest: str, metavar: str | None) -> None:
    subparsers = parser.add_subparsers(dest=dest, metavar=metavar, required=True, parser_class=_Parser)
    for command in commands:
        subparser = subparsers.add_parser(
            command.name, help=command.help, description=command.description, usage=command.usage
        )
        subparser.lists_recipe_fields = command.takes_recipe_fields
        if command.subcommands:
            # The names as metavar, so a missing one reads "required: {list,fetch}", not "required: data_command".
            names = "{" + ",".join(sub.name for sub in command.subcommands) + "}"
            _add_commands(subparser, command.subcommands, dest=f"{command.name}_command", metavar=names)
        else:
            add_options(subparser, command.options)
            subparser.set_defaults(**{CHOSEN: command})


def recipe_fields_help() -> str:
    """Every field a recipe (or a flag after the command's own) may set, with its help, grouped by dataclass."""
    from .config.recipes import build_parser as build_recipe_parser

    recipe_parser = build_recipe_parser()
    formatter = recipe_parser._get_formatter()  # argparse's own formatting, as its format_help uses
    formatter.start_section("recipe fields (each also a flag: --field value)")
    formatter.add_arguments([action for action in recipe_parser._actions if action.dest != "help"])
    formatter.end_section()
    return formatter.format_help()


def add_options(parser: argparse.ArgumentParser, options: type) -> None:
    """One argument of ``parser`` per field of the ``options`` dataclass, in the fields' order."""
    hints = typing.get_type_hints(options)
    for field in dataclasses.fields(options):
        keywords = {key: value for key, value in field.metadata.items() if key != "positional"}
        hint = _without_none(hints[field.name])
        if hint is bool:
            # An on/off flag: absent is False, so its field's default must be False too.
            if field.default is not False or field.metadata["positional"]:
                raise TypeError(f"{options.__name__}.{field.name}: a bool is a flag defaulting to False")
            parser.add_argument(f"--{field.name}", action="store_true", **keywords)
            continue
        if hint not in _PARSER_TYPES:
            raise TypeError(f"{options.__name__}.{field.name}: annotate it str, int, float, bool or list[str]")
        if "type" not in keywords and _PARSER_TYPES[hint] is not None:
            keywords["type"] = _PARSER_TYPES[hint]
        if field.default is not dataclasses.MISSING:
            keywords["default"] = field.default
        name = field.name if field.metadata["positional"] else f"--{field.name}"
        parser.add_argument(name, **keywords)


def _without_none(hint: Any) -> Any:
    # "int | None" is an int that may be left out: its default is None.
    arguments = [argument for argument in typing.get_args(hint) if argument is not type(None)]
    return arguments[0] if typing.get_origin(hint) is not list and len(arguments) == 1 else hint


def options_from(namespace: argparse.Namespace) -> tuple[Command, Any]:
    """The command ``namespace`` chose and its options dataclass, filled from the namespace."""
    command = getattr(namespace, CHOSEN)
    values = {field.name: getattr(namespace, field.name) for field in dataclasses.fields(command.options)}
    return command, command.options(**values)
