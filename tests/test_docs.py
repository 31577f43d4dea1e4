"""Docs that cannot rot: every ``finetune`` command shown in README.md and docs/ still parses.

The commands in the pages' code blocks are collected and checked against the
real CLI: the subcommand exists, every flag is an option of it or a recipe
field (so renaming a documented flag fails here), and every recipe file named
exists.
"""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest

from finetune.cli import build_cli
from finetune.config.recipes import valid_keys

PROJECT = Path(__file__).parent.parent
PAGES = [PROJECT / "README.md", *sorted((PROJECT / "docs").glob("*.md"))]
# Subcommands whose unknown flags are recipe fields (the rest take only their own options).
TAKES_RECIPE_FIELDS = {"train", "distill", "check", "bench", "baseline", "tune"}


def documented_commands() -> list[tuple[str, list[str]]]:
    """``(where, argv)`` for every ``finetune ...`` command in a fenced code block of the pages."""
    found = []
    for page in PAGES:
        in_code = False
        for number, line in enumerate(page.read_text(encoding="utf-8").splitlines(), start=1):
            if line.lstrip().startswith("```"):
                in_code = not in_code
                continue
            if not in_code:
                continue
            line = line.lstrip("$ ").rstrip("\\").strip()
            for part in re.split(r"&&|;|\|", line):
                try:
                    words = shlex.split(part, comments=True)
                except ValueError:
                    continue
                # "VAR=value finetune ..." and "python -m finetune ..." are the same command.
                while words and "=" in words[0] and not words[0].startswith("-"):
                    words = words[1:]
                if words[:3] == ["python", "-m", "finetune"]:
                    words = ["finetune", *words[3:]]
                if len(words) >= 2 and words[0] == "finetune":
                    found.append((f"{page.relative_to(PROJECT)}:{number}", words[1:]))
    return found


COMMANDS = documented_commands()


def test_the_pages_show_commands():
    subcommands = {argv[0] for _, argv in COMMANDS}
    assert {"train", "evaluate", "predict", "distill", "export", "bench"} <= subcommands


@pytest.mark.parametrize(("where", "argv"), COMMANDS, ids=[where for where, _ in COMMANDS])
def test_a_documented_command_parses(where, argv):
    parser = build_cli()
    subparsers = next(action for action in parser._actions if action.dest == "command").choices
    assert argv[0] in subparsers, f"{where}: no subcommand '{argv[0]}'"
    _, extra = parser.parse_known_args(argv)
    flags = [token.split("=", 1)[0] for token in extra if token.startswith("--")]
    if argv[0] in TAKES_RECIPE_FIELDS:
        fields = valid_keys()
        unknown = [flag for flag in flags if flag[2:].replace("-", "_") not in fields | {"help"}]
        assert not unknown, f"{where}: {' '.join(unknown)} is neither an option of '{argv[0]}' nor a recipe field"
    else:
        assert not flags, f"{where}: '{argv[0]}' has no option {' '.join(flags)}"
    for token in argv:
        if token.startswith("recipes/") and token.endswith(".yaml"):
            assert (PROJECT / token).is_file(), f"{where}: {token} does not exist"


def test_every_recipe_a_page_names_exists():
    for page in PAGES:
        for name in set(re.findall(r"recipes/[\w.-]+\.yaml", page.read_text(encoding="utf-8"))):
            assert (PROJECT / name).is_file(), f"{page.name} names {name}, which does not exist"
