"""A command declared as an options dataclass gets the parser a hand-written argparse parser would be.

The reference parser is written out with ``add_argument`` here, so the generator's
help, usage, defaults, types and refusals are compared with something it did not
compute. The toy command is registered the way a real one is: one module's
dataclass, ``run`` and ``Command``, one entry in the list the parser is built from.
"""

from __future__ import annotations

import argparse
import dataclasses
import re

import pytest

from finetune.cli import build_cli
from finetune.cli_parser import build_parser, options_from
from finetune.commands.options import COMMANDS
from finetune.commands.options.fields import Command, argument, option
from finetune.commands.options.values import positive_int
from finetune.errors import FinetuneError


@dataclasses.dataclass(frozen=True)
class ToyOptions:
    """Every kind of field the generator knows."""

    paths: list[str] = argument(nargs="+", help="one or more folders")  # noqa: RUF009 (a field, not a default)
    count: int = option(3, type=positive_int, help="how many (default: 3)")
    ratio: float | None = option(metavar="R", help="a fraction")
    colour: str = option("red", choices=("red", "blue"), help="which colour")
    name: str | None = option()
    loud: bool = option(False, help="say it loudly")


def hand_written() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="toy", description="A toy.", allow_abbrev=False)
    toy = parser.add_subparsers(dest="command", required=True).add_parser("toy", help="the toy command")
    toy.add_argument("paths", nargs="+", help="one or more folders")
    toy.add_argument("--count", type=positive_int, default=3, help="how many (default: 3)")
    toy.add_argument("--ratio", type=float, metavar="R", help="a fraction")
    toy.add_argument("--colour", choices=("red", "blue"), default="red", help="which colour")
    toy.add_argument("--name")
    toy.add_argument("--loud", action="store_true", help="say it loudly")
    return parser


def generated() -> argparse.ArgumentParser:
    toy = Command("toy", help="the toy command", options=ToyOptions, run=lambda options, extra: None)
    return build_parser([toy], prog="toy", description="A toy.")


def subparser(parser: argparse.ArgumentParser, name: str) -> argparse.ArgumentParser:
    return next(action for action in parser._actions if action.dest == "command").choices[name]


def test_the_generated_help_is_the_hand_written_one():
    assert generated().format_help() == hand_written().format_help()
    assert subparser(generated(), "toy").format_help() == subparser(hand_written(), "toy").format_help()


@pytest.mark.parametrize(
    "argv",
    [
        ["toy", "a"],
        ["toy", "a", "b", "--count", "7", "--ratio", "0.5", "--colour", "blue", "--name", "n", "--loud"],
    ],
)
def test_the_generated_parser_reads_what_the_hand_written_one_reads(argv):
    expected = vars(hand_written().parse_args(argv))
    namespace = generated().parse_args(argv)
    command, options = options_from(namespace)
    assert command.name == "toy"
    assert dataclasses.asdict(options) == {key: value for key, value in expected.items() if key != "command"}


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["toy"], "the following arguments are required: paths; see 'toy toy --help'"),
        (["toy", "a", "--count", "0"], "argument --count: must be >= 1 (got 0); see 'toy toy --help'"),
        (["toy", "a", "--ratio", "x"], "argument --ratio: invalid float value: 'x'; see 'toy toy --help'"),
        (
            ["toy", "a", "--colour", "green"],
            "argument --colour: invalid choice: 'green' (choose from 'red', 'blue'); see 'toy toy --help'",
        ),
    ],
)
def test_a_bad_value_is_refused_naming_the_command_help(argv, message):
    with pytest.raises(FinetuneError) as refused:
        generated().parse_args(argv)
    assert str(refused.value) == message


def test_a_flag_that_is_on_unless_turned_off_is_refused():
    # store_true cannot express a default of True: such a field would be on whatever the command line said.
    @dataclasses.dataclass(frozen=True)
    class Wrong:
        """A bool defaulting to True."""

        loud: bool = option(True, help="say it loudly")

    with pytest.raises(TypeError) as refused:
        build_parser([Command("wrong", help="", options=Wrong, run=print)], prog="x", description="")
    assert str(refused.value) == "Wrong.loud: a bool is a flag defaulting to False"


def test_build_cli_lists_every_registered_command_in_order():
    subcommands = next(action for action in build_cli()._actions if action.dest == "command").choices
    assert list(subcommands) == [command.name for command in COMMANDS]
    assert list(subcommands) == [
        "train", "distill", "check", "evaluate", "baseline", "compare-tasks", "find-label-issues", "tune", "predict",
        "export", "serve", "bench", "data", "model",
    ]  # fmt: skip


RECIPE_COMMANDS = {
    # command line: what its own options show, declared in its options module
    "train --help": ("--seeds N", "--folds K", "finetune train --train_file FILE"),
    "train recipes/quickstart.yaml --help": ("--seeds N",),
    "distill --help": ("teacher", "--seeds N", "usage: finetune distill TEACHER_RUN RECIPE"),
    "tune --help": ("--trials TRIALS", "recipe"),
    "check --help": ("--teacher RUN", "dataset"),
}


@pytest.mark.parametrize("line", RECIPE_COMMANDS, ids=RECIPE_COMMANDS.keys())
def test_a_command_taking_recipe_fields_lists_them_after_its_own_options(line, capsys):
    from finetune.cli import main
    from finetune.config.recipes import ALIASES, valid_keys

    with pytest.raises(SystemExit) as exited:
        main(line.split())
    assert exited.value.code == 0
    shown = capsys.readouterr().out
    for own in RECIPE_COMMANDS[line]:
        assert own in shown, own
    recipe_part = shown.partition("recipe fields (each also a flag: --field value):")[2]
    assert recipe_part, "no recipe fields listed"
    # Every field a recipe may set is listed, from the recipe's dataclasses (aliases such as n_accumulate aside).
    listed = set(re.findall(r"^  --(\w+)", recipe_part, flags=re.MULTILINE))
    assert {"learning_rate", "gradient_accumulation_steps", "train_file", "model_name_or_path"} <= listed
    assert valid_keys() - set(ALIASES) <= listed


def test_no_command_prints_its_help_by_hand():
    # Help is argparse's, generated from the declarations: no options module writes usage text itself.
    from pathlib import Path

    options = Path(__file__).parent.parent / "finetune" / "commands" / "options"
    printing = [path.name for path in options.glob("*.py") if re.search(r"print\(\s*[\"']usage", path.read_text())]
    assert printing == []
