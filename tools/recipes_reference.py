"""The recipes reference page, written from the argument dataclasses' help (one source of truth).

    python tools/recipes_reference.py            # print the page
    mkdocs build                                  # adds it to the site as reference/recipes.md

MkDocs loads this file as a hook (``hooks:`` in mkdocs.yml): ``on_files`` adds
the page to the build, so it is never committed and never out of date. Every
field a recipe may set is listed with its type, default and ``help``: the
fields of ``ModelArguments`` and ``DataArguments``, those
``FinetuneTrainingArguments`` adds, the ``TrainingArguments`` fields the
shipped recipes set, then the rest of ``TrainingArguments``.
"""

from __future__ import annotations

import dataclasses
import enum
import json
import re
import sys
from pathlib import Path
from typing import Any

PROJECT = Path(__file__).resolve().parent.parent
PAGE = "reference/recipes.md"


def field_rows(cls: type, names: list[str] | None = None) -> list[tuple[str, str, str, str]]:
    """``(name, type, default, help)`` for the fields of the dataclass ``cls`` (only ``names``, in order, if given)."""
    fields = {field.name: field for field in dataclasses.fields(cls) if field.init}
    return [_row(fields[name]) for name in (names if names is not None else list(fields))]


def render() -> str:
    """The page's Markdown."""
    from transformers import TrainingArguments

    from finetune.config.arguments import DataArguments, FinetuneTrainingArguments, ModelArguments
    from finetune.config.recipes import ALIASES, read_recipe_file

    inherited = [field.name for field in dataclasses.fields(TrainingArguments) if field.init]
    # Fields FinetuneTrainingArguments declares itself (overwrite_output_dir among them: stock has no such field).
    added = [name for name in FinetuneTrainingArguments.__annotations__ if name not in inherited]
    recipe_keys = {key for path in sorted((PROJECT / "recipes").glob("*.yaml")) for key in read_recipe_file(str(path))}
    recipe_keys = {ALIASES.get(key, key) for key in recipe_keys}
    used = [name for name in inherited if name in recipe_keys]
    others = [name for name in inherited if name not in recipe_keys]
    aliases = ", ".join(f"`{alias}` for `{name}`" for alias, name in ALIASES.items())
    sections = [
        (
            "Model: `ModelArguments`",
            ModelArguments.__doc__,
            field_rows(ModelArguments),
        ),
        ("Data: `DataArguments`", DataArguments.__doc__, field_rows(DataArguments)),
        (
            "Training: the fields finetune adds",
            "`FinetuneTrainingArguments` is `transformers.TrainingArguments` plus these fields.",
            field_rows(FinetuneTrainingArguments, added),
        ),
        (
            "Training: `TrainingArguments` fields the shipped recipes set",
            "As in `transformers.TrainingArguments` (its help, its defaults).",
            field_rows(FinetuneTrainingArguments, used),
        ),
        (
            "Training: the other `TrainingArguments` fields",
            "Accepted as in `transformers.TrainingArguments`; see also "
            "[where ReviewTrainer differs from Trainer](../python-api.md#where-reviewtrainer-differs-from-trainer).",
            field_rows(FinetuneTrainingArguments, others),
        ),
    ]
    lines = [
        "# Recipes reference",
        "",
        "Every field a recipe may set, with its type, default and help, generated at build time",
        "from the argument dataclasses in `finetune/config/arguments.py` and",
        "`transformers.TrainingArguments` (the same help `finetune train --help` prints).",
        "Each is a YAML key in a recipe or a flag on the command line:",
        "",
        "```bash",
        "finetune train recipes/quickstart.yaml --learning_rate 5e-5 --max_length 128",
        "```",
        "",
        f"Also accepted: {aliases}. How recipes and flags combine: [Recipes and datasets](../recipes.md).",
    ]
    for title, intro, rows in sections:
        lines += ["", f"## {title}", "", _one_line(intro or ""), "", "| field | type | default | help |"]
        lines.append("| --- | --- | --- | --- |")
        lines += [f"| `{name}` | {kind} | {default} | {help_text} |" for name, kind, default, help_text in rows]
    return "\n".join(lines) + "\n"


def on_files(files: Any, config: Any) -> Any:
    """MkDocs hook: add the generated page to the site."""
    from mkdocs.structure.files import File

    # Document this checkout's dataclasses, whichever copy of finetune the environment has installed.
    if str(PROJECT) not in sys.path:
        sys.path.insert(0, str(PROJECT))

    files.append(File.generated(config, PAGE, content=render()))
    return files


def _row(field: dataclasses.Field) -> tuple[str, str, str, str]:
    if not field.metadata.get("help", "").strip():
        raise ValueError(f"the field {field.name} has no help; give it field(..., metadata={{'help': '...'}})")
    kind, help_text = markdown_cell(_type_name(field.type)), markdown_cell(field.metadata["help"])
    return field.name, kind, f"`{_default(field)}`", help_text


def _type_name(kind: Any) -> str:
    if isinstance(kind, str):
        return kind
    if isinstance(kind, type):
        return kind.__name__
    return re.sub(r"\b(?:[a-z_]+\.)+", "", str(kind))  # typing.Optional[transformers.x.Y] -> Optional[Y]


def _default(field: dataclasses.Field) -> str:
    if field.default_factory is not dataclasses.MISSING:
        value = field.default_factory()
    elif field.default is dataclasses.MISSING:
        return "required"
    else:
        value = field.default
    if isinstance(value, enum.Enum):
        value = value.value
    if isinstance(value, str):
        return value if value else "''"
    return json.dumps(value) if value is None or isinstance(value, (bool, list, dict)) else str(value)


def _one_line(text: str) -> str:
    return " ".join(text.split())


def markdown_cell(text: str) -> str:
    """``text`` on one line, safe in a table cell: no column breaks, no stray emphasis or HTML (code spans kept)."""
    parts = re.split(r"(`[^`]*`)", _one_line(text))
    return "".join(
        part.replace("|", "\\|") if part.startswith("`") else re.sub(r"([\\|*_<>\[\]])", r"\\\1", part)
        for part in parts
    )


if __name__ == "__main__":
    sys.stdout.write(render())
