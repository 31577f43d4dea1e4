"""Docs that cannot rot: every ``finetune`` command shown in README.md and docs/ still parses.

The commands in the pages' code blocks (docs/ and its folders, and the recipes
reference the site generates) are collected and checked against the real CLI:
the subcommand exists, every flag is an option of it or a recipe field (so
renaming a documented flag fails here), and every recipe file named exists.
The generated reference lists every field with its help. Every table row sits
in its table (``markdown_tables.py``), named by file and line.
"""

from __future__ import annotations

import dataclasses
import re
import shlex
from pathlib import Path

import pytest
from helpers import load_tool
from markdown_tables import read_tables

from finetune.cli import build_cli
from finetune.config.arguments import DataArguments, FinetuneTrainingArguments, ModelArguments
from finetune.config.recipes import ALIASES, valid_keys

PROJECT = Path(__file__).parent.parent


REFERENCE_TOOL = load_tool("recipes_reference")  # the MkDocs hook that writes the recipes reference
try:
    REFERENCE, REFERENCE_ERROR = REFERENCE_TOOL.render(), None
except Exception as error:  # reported by the reference's own test below, not as an error collecting every test here
    REFERENCE, REFERENCE_ERROR = "", error
# (name, text) of every page: the README, docs/**/*.md, and the generated reference.
PAGES = [
    (str(path.relative_to(PROJECT)), path.read_text(encoding="utf-8"))
    for path in [PROJECT / "README.md", *sorted((PROJECT / "docs").rglob("*.md"))]
] + [("docs/reference/recipes.md (generated)", REFERENCE)]
# Subcommands whose unknown flags are recipe fields (the rest take only their own options).
TAKES_RECIPE_FIELDS = {"train", "distill", "check", "bench", "baseline", "find-label-issues", "tune", "compare-tasks"}


def documented_commands() -> list[tuple[str, list[str]]]:
    """``(where, argv)`` for every ``finetune ...`` command in a fenced code block of the pages.

    On the benchmarks pages, also every command of a provenance line (``- ... `finetune ...` ... · commit · machine``),
    so a row's command stays one that can be run again.
    """
    found = []
    for name, text in PAGES:
        in_code = False
        for number, line in enumerate(text.splitlines(), start=1):
            if line.lstrip().startswith("```"):
                in_code = not in_code
                continue
            if not in_code:
                if name.startswith("docs/benchmarks/") and line.startswith("- ") and " · " in line:
                    for command in re.findall(r"`(finetune [^`]+)`", line):
                        found.append((f"{name}:{number}", shlex.split(command)[1:]))
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
                    found.append((f"{name}:{number}", words[1:]))
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
    if "--help" in argv or "-h" in argv:
        # argparse prints the generated help and exits 0 (a command's recipe fields included).
        with pytest.raises(SystemExit) as exited:
            parser.parse_known_args(argv)
        assert exited.value.code == 0, f"{where}: --help exits {exited.value.code}"
        return
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
    for page, text in PAGES:
        for name in set(re.findall(r"recipes/[\w.-]+\.yaml", text)):
            assert (PROJECT / name).is_file(), f"{page} names {name}, which does not exist"


def test_every_table_row_is_in_its_table():
    # Rows appended after a blank line render as a paragraph of pipes; the built site is checked too (test_docs_site).
    problems = [problem for name, text in PAGES for problem in read_tables(name, text)[1]]
    assert not problems, "\n".join(problems)


def test_the_pages_under_docs_folders_are_read():
    names = [name for name, _ in PAGES]
    assert any(name.startswith("docs/benchmarks/") for name in names)
    assert "docs/reference/api.md" in names


RECIPE_FIELDS = [
    field for cls in (ModelArguments, DataArguments, FinetuneTrainingArguments) for field in dataclasses.fields(cls)
]


@pytest.mark.parametrize("field", [field for field in RECIPE_FIELDS if field.init], ids=lambda field: field.name)
def test_every_field_has_help(field):
    assert field.metadata.get("help", "").strip(), f"{field.name} has no help: add metadata={{'help': ...}}"


def test_the_reference_lists_every_field_once_with_its_help():
    assert REFERENCE_ERROR is None, f"tools/recipes_reference.py failed: {REFERENCE_ERROR}"
    rows = re.findall(r"^\| `(\w+)` \| .* \| (.*) \|$", REFERENCE, flags=re.MULTILINE)
    listed = [name for name, _ in rows]
    assert sorted(listed) == sorted(set(listed)), "a field is listed twice"
    assert set(listed) == valid_keys() - set(ALIASES)
    help_by_name = dict(rows)
    for field in RECIPE_FIELDS:
        if field.init:
            assert help_by_name[field.name] == REFERENCE_TOOL.markdown_cell(field.metadata["help"]), field.name
    for alias in ALIASES:
        assert f"`{alias}`" in REFERENCE


def heading_slugs(page: Path) -> set[str]:
    """The anchors of a page's headings, as MkDocs' toc extension makes them."""
    slugs = set()
    for heading in re.findall(r"^#+ (.+)$", page.read_text(encoding="utf-8"), flags=re.MULTILINE):
        slug = re.sub(r"[^\w\s-]", "", heading).strip().lower()
        slugs.add(re.sub(r"[-\s]+", "-", slug))
    return slugs


@pytest.mark.parametrize("recipe", sorted((PROJECT / "recipes").glob("*.yaml")), ids=lambda path: path.name)
def test_a_recipe_header_links_to_a_heading_that_exists(recipe):
    header = recipe.read_text(encoding="utf-8").split("\n\n", 1)[0]
    links = re.findall(r"(docs/[\w/.-]+\.md)#([\w-]+)", header)
    assert links, f"{recipe.name}'s header links to no docs page (e.g. docs/benchmarks/quality.md#...)"
    for page, anchor in links:
        assert (PROJECT / page).is_file(), f"{recipe.name} links to {page}, which does not exist"
        assert anchor in heading_slugs(PROJECT / page), f"{recipe.name} links to {page}#{anchor}: no such heading"


def first_code_block(text: str) -> list[str]:
    """The lines of a page's first fenced code block."""
    block = re.search(r"^```[^\n]*\n(.*?)^```", text, flags=re.MULTILINE | re.DOTALL)
    return block.group(1).splitlines() if block else []


def test_the_home_page_includes_the_readme_set_up_block():
    # One source: the README's set-up block (its two commands inside it) is included in the docs home page
    # when the site is built (pymdownx.snippets), so the two cannot say different things.
    readme = (PROJECT / "README.md").read_text(encoding="utf-8")
    home = (PROJECT / "docs" / "index.md").read_text(encoding="utf-8")
    block = re.search(r"<!-- --8<-- \[start:setup\] -->\n(.*?)<!-- --8<-- \[end:setup\] -->", readme, re.DOTALL)
    assert block, "README.md has no set-up block between --8<-- [start:setup] and [end:setup] markers"
    commands = [line for line in first_code_block(block.group(1)) if line.strip() and not line.startswith("#")]
    assert len(commands) == 2, commands
    assert '--8<-- "README.md:setup"' in home, "docs/index.md must include README.md's set-up block"
    assert "pip install" not in home.split("## What the quickstart gives")[0], "the home page repeats a command"


def test_the_home_page_tables_copy_the_rows_they_show():
    # Its quality row is the README's, its checkpoint table the one recorded on the evaluating page.
    home = (PROJECT / "docs" / "index.md").read_text(encoding="utf-8")
    sources = {
        line
        for page in ("README.md", "docs/evaluate.md")
        for line in (PROJECT / page).read_text(encoding="utf-8").splitlines()
    }
    tables, _ = read_tables("docs/index.md", home)
    lines = home.splitlines()
    rows = [lines[number - 1] for table in tables for number in table.body_lines]
    assert any("`quickstart.yaml`" in row for row in rows), "the home page shows no quality row of the quickstart"
    copied_from_nowhere = [row for row in rows if row not in sources]
    assert not copied_from_nowhere, f"rows found in neither README.md nor docs/evaluate.md: {copied_from_nowhere}"
