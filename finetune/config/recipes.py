"""Read a recipe (YAML) and command-line flags into the argument dataclasses.

A recipe is data: a YAML mapping of field names to values. Flags override it.
Both go through the same ``HfArgumentParser`` so a value means the same thing
whichever way it was given (``learning_rate: 1e-4`` in YAML is a float here,
although YAML alone would read it as a string).
"""

from __future__ import annotations

import difflib
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NoReturn

import yaml
from transformers import HfArgumentParser

from ..errors import FinetuneError
from .arguments import DataArguments, FinetuneTrainingArguments, ModelArguments
from .text_files import encoding_problem

# Names people know from other tools, accepted as spellings of ours.
ALIASES = {"n_accumulate": "gradient_accumulation_steps"}


@dataclass
class Recipe:
    """The three argument groups of one run, plus where they came from."""

    model: ModelArguments
    data: DataArguments
    training: FinetuneTrainingArguments
    source: str | None
    values: dict[str, Any]


class _Parser(HfArgumentParser):
    """An ``HfArgumentParser`` that raises ``FinetuneError`` instead of printing usage and exiting."""

    def error(self, message: str) -> NoReturn:
        raise FinetuneError(_explain_argparse_error(message))


def build_parser() -> HfArgumentParser:
    """The parser for every field a recipe or flag may set."""
    return _Parser((ModelArguments, DataArguments, FinetuneTrainingArguments))


def valid_keys(parser: HfArgumentParser | None = None) -> set[str]:
    """Every key a recipe may use: the dataclass fields and their aliases."""
    parser = parser or build_parser()
    return {action.dest for action in parser._actions if action.dest != "help"} | set(ALIASES)


def load_recipe(recipe_path: str | None, flags: list[str] | None = None) -> Recipe:
    """Read ``recipe_path`` (may be None: flags only) and apply ``flags`` on top."""
    values = read_recipe_file(recipe_path) if recipe_path else {}
    return recipe_from_values(values, flags, recipe_path)


def recipe_from_values(
    values: dict[str, Any], flags: list[str] | None = None, recipe_path: str | None = None
) -> Recipe:
    """The recipe these values (as a recipe file holds them) and ``flags`` give; errors name ``recipe_path``."""
    flags = list(flags or [])
    values = _resolve_aliases(values, recipe_path or "the flags")
    parser = build_parser()
    keys = valid_keys(parser)
    for key in values:
        if not isinstance(key, str):
            # YAML reads `1:`, `null:` or `true:` as a number, None or a boolean, which no field is named.
            raise FinetuneError(
                f"recipe {recipe_path} has the key {_as_yaml(key)}, which is not a field name; recipe keys are "
                "field names such as learning_rate (run 'finetune train --help' for the valid keys)"
            )
        if key not in keys:
            raise FinetuneError(f"unknown key '{key}' in {recipe_path}{_suggest(key, keys)}")

    flag_argv = _join_negative_values([_rename_alias_flag(token) for token in flags])
    _refuse_alias_twice(flags)
    given = _given_flags(flag_argv, keys, _option_names(parser))
    _refuse_undecodable(recipe_path, {**values, **given})
    takes_many = _list_fields(parser)
    for key, value in {**values, **given}.items():
        if isinstance(value, list) and len(value) > 1 and key not in takes_many:
            raise FinetuneError(
                f"{key} takes one value, not a list ({' '.join(str(item) for item in value)}); "
                f"give it one, e.g. --{key} {value[0]}"
            )
    argv = _to_argv(values, _choices(parser)) + flag_argv
    try:
        model, data, training = parser.parse_args_into_dataclasses(args=argv)
    except FinetuneError:
        raise
    except ValueError as error:
        # TrainingArguments.__post_init__ speaks in ValueErrors, some of several lines: joined into one,
        # since a first line alone can stop at "but found".
        one_line = " ".join(line.strip() for line in str(error).strip().splitlines() if line.strip())
        raise FinetuneError(f"invalid training arguments: {one_line}")
    return Recipe(model=model, data=data, training=training, source=recipe_path, values={**values, **given})


def typed_values(recipe: Recipe) -> dict[str, Any]:
    """The values the recipe and its flags set, each as its field parsed it (``"8e-5"`` and ``8.0e-5`` alike).

    A flag's value is the string typed, a recipe's what YAML read; the parsed
    fields are what the run trained with, so two runs compare equal here when
    they trained alike however their values were written. In JSON's types.
    """
    groups = (recipe.model, recipe.data, recipe.training)
    typed = {}
    for key in recipe.values:
        name = ALIASES.get(key, key)
        holder = next((group for group in groups if hasattr(group, name)), None)
        typed[name] = getattr(holder, name) if holder is not None else recipe.values[key]
    return json.loads(json.dumps(typed, default=str))


def _refuse_undecodable(recipe_path: str | None, values: dict[str, Any]) -> None:
    """Refuse a value (a path, mostly) holding bytes that are not UTF-8, before any work.

    Python carries such bytes of a command line as lone surrogates, which open() accepts but UTF-8
    does not: the run would train, then fail at its first checkpoint or leave a 0-byte README.md.
    """
    named = [("the recipe path", recipe_path)] + [(key, value) for key, value in values.items()]
    for name, value in named:
        for text in value if isinstance(value, list) else [value]:
            if not isinstance(text, str):
                continue
            try:
                text.encode("utf-8")
            except UnicodeEncodeError as error:
                raw = text.encode("utf-8", "surrogateescape")
                shown = raw.decode("utf-8", "backslashreplace")
                byte = ord(text[error.start]) - 0xDC00 if 0xDC80 <= ord(text[error.start]) <= 0xDCFF else None
                which = f" (byte 0x{byte:02x})" if byte is not None else ""
                raise FinetuneError(
                    f"{name} {shown} is not UTF-8{which}; a run records its paths as UTF-8 (finetune_run.json, "
                    "the model card), so rename it to a UTF-8 name"
                ) from None


def _rename_alias_flag(token: str) -> str:
    """``--n_accumulate 4`` / ``--n_accumulate=4`` become ``--gradient_accumulation_steps ...``."""
    name, equals, value = token.partition("=")
    if name.startswith("--") and name[2:].replace("-", "_") in ALIASES:
        return f"--{ALIASES[name[2:].replace('-', '_')]}{equals}{value}"
    return token


def flag_names(flags: list[str]) -> set[str]:
    """The field names ``flags`` set (``--max-steps=3`` sets ``max_steps``)."""
    return {token[2:].partition("=")[0].replace("-", "_") for token in flags if token.startswith("--")}


def flag_value(flags: list[str], name: str) -> str | None:
    """The value ``flags`` give field ``name`` (``--name X``, ``--name=X``, dashes or underscores); None if unset.

    A field set twice is refused before a run reads its flags, so the last one is the one there is.
    """
    value = None
    for index, token in enumerate(flags):
        flag, equals, given = token.partition("=")
        if not flag.startswith("--") or flag[2:].replace("-", "_") != name:
            continue
        if equals:
            value = given
        elif index + 1 < len(flags):
            value = flags[index + 1]
    return value


def _refuse_alias_twice(flags: list[str]) -> None:
    """Two spellings of one field among the flags: which one wins would be an accident of order."""
    names = flag_names(flags)
    for alias, name in ALIASES.items():
        if alias in names and name in names:
            raise FinetuneError(f"the flags set both --{alias} and --{name}; keep one of them")


def _join_negative_values(argv: list[str]) -> list[str]:
    """``--learning_rate -5e-5`` as ``--learning_rate=-5e-5``.

    argparse takes any token that starts with '-' and is not a plain number
    (``-5e-5``, ``-inf``) for an option and reports "expected one argument";
    joined, the value reaches the field's own check, which names the fix.
    """
    joined: list[str] = []
    for token in argv:
        if joined and _is_negative_number(token) and joined[-1].startswith("--") and "=" not in joined[-1]:
            joined[-1] = f"{joined[-1]}={token}"
        else:
            joined.append(token)
    return joined


def _is_negative_number(token: str) -> bool:
    if not token.startswith("-"):
        return False
    try:
        float(token)
    except ValueError:
        return False
    return True


class _DuplicateKey(Exception):
    def __init__(self, key: Any, first_line: int, second_line: int) -> None:
        super().__init__(key)
        self.key, self.first_line, self.second_line = key, first_line, second_line


# Values a recipe may hold once its aliases are expanded. A real recipe holds a few hundred (a long
# class_names list a few thousand); nested anchors ("billion laughs") reach billions from 1 KB, and
# turning them into flags would take gigabytes before any check ran.
MAX_EXPANDED_VALUES = 100_000


class _AliasBomb(Exception):
    pass


class _RecipeLoader(yaml.SafeLoader):
    """``yaml.safe_load``'s loader, except that a key given twice in one mapping is an error, not "last wins",
    and a document whose aliases expand past ``MAX_EXPANDED_VALUES`` values is refused before it is built."""

    def get_single_node(self) -> yaml.Node | None:
        """The document's node graph, checked for its expanded size before any value is constructed."""
        node = super().get_single_node()
        if node is not None and _expanded_size(node, {}) > MAX_EXPANDED_VALUES:
            raise _AliasBomb()
        return node


def _expanded_size(node: yaml.Node, sizes: dict[int, int]) -> int:
    """How many values ``node`` stands for with every alias written out (each shared node counted once in time)."""
    if id(node) in sizes:
        return sizes[id(node)]
    sizes[id(node)] = 1  # a node that holds itself (a recursive alias) is counted once, not forever
    if isinstance(node, yaml.SequenceNode):
        size = 1 + sum(_expanded_size(item, sizes) for item in node.value)
    elif isinstance(node, yaml.MappingNode):
        size = 1 + sum(_expanded_size(key, sizes) + _expanded_size(value, sizes) for key, value in node.value)
    else:
        size = 1
    sizes[id(node)] = size
    return size


def _mapping_without_duplicates(loader: _RecipeLoader, node: yaml.MappingNode, deep: bool = False) -> dict:
    lines: dict[Any, int] = {}
    for key_node, _ in node.value:
        if key_node.tag == "tag:yaml.org,2002:merge":
            continue  # keys written beside a '<<' merge override the merged ones on purpose
        key = loader.construct_object(key_node, deep=True)
        line = key_node.start_mark.line + 1
        try:
            if key in lines:
                raise _DuplicateKey(key, lines[key], line)
            lines[key] = line
        except TypeError:
            pass  # an unhashable key: construct_mapping below reports it
    return loader.construct_mapping(node, deep=deep)


_RecipeLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _mapping_without_duplicates)


def read_recipe_file(recipe_path: str) -> dict[str, Any]:
    """The recipe file's keys and values as YAML reads them (checked: found, UTF-8, no key twice, a mapping)."""
    path = Path(recipe_path)
    if not path.is_file():
        _refuse_recipe_path(path, recipe_path)
    data = path.read_bytes()
    problem = encoding_problem(data)
    if problem is not None:
        raise FinetuneError(f"recipe {recipe_path} {problem}")
    try:
        # A safe loader: a recipe is data and must never construct Python objects.
        loaded = yaml.load(data.decode("utf-8"), Loader=_RecipeLoader)
    except _AliasBomb:
        raise FinetuneError(
            f"recipe {recipe_path} expands to more than {MAX_EXPANDED_VALUES:,} values through its YAML aliases "
            "(anchors nested in anchors); write the values out, or nest fewer aliases"
        ) from None
    except _DuplicateKey as duplicate:
        raise FinetuneError(
            f"recipe {recipe_path} sets '{duplicate.key}' twice (lines {duplicate.first_line} and "
            f"{duplicate.second_line}); keep one of them"
        )
    except yaml.YAMLError as error:
        mark = getattr(error, "problem_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        problem = getattr(error, "problem", None) or "cannot be parsed"
        raise FinetuneError(f"recipe {recipe_path} is not valid YAML{where}: {problem}; fix that line")
    if loaded is None:
        return {}
    if not isinstance(loaded, dict):
        raise FinetuneError(
            f"recipe {recipe_path} holds {_what_yaml_holds(loaded)}, not settings; a recipe is a mapping of keys to "
            "values, one 'key: value' per line, e.g. learning_rate: 5e-5"
        )
    return loaded


def _refuse_recipe_path(path: Path, recipe_path: str) -> None:
    """Say what a recipe path that is no regular file is: missing, a folder, a device, a pipe, a socket."""
    import stat

    try:
        mode = path.stat().st_mode
    except OSError:
        raise FinetuneError(f"recipe not found: {recipe_path}; check the path (recipes live in recipes/*.yaml)")
    if stat.S_ISDIR(mode):
        what = "is a folder, not a recipe file"
    elif stat.S_ISCHR(mode) or stat.S_ISBLK(mode):
        what = "is a device, not a recipe file"
    elif stat.S_ISFIFO(mode):
        # Reading a pipe no one writes to would wait for ever; a recipe is read more than once besides.
        what = "is a pipe, not a recipe file"
    else:
        what = "is a socket or other special file, not a recipe file"
    raise FinetuneError(f"recipe {recipe_path} {what}; pass a recipe YAML file, e.g. recipes/quickstart.yaml")


def _what_yaml_holds(value: Any) -> str:
    """A YAML document that is no mapping, in words: ``a number (42)``, ``a list``, ``text ('just words')``."""
    shown = repr(value) if len(repr(value)) <= 40 else repr(value)[:37] + "..."
    if isinstance(value, bool):
        return f"a yes/no value ({shown})"
    if isinstance(value, (int, float)):
        return f"a number ({shown})"
    if isinstance(value, list):
        return "a list"
    if isinstance(value, str):
        return f"text ({shown})"
    return f"a {type(value).__name__} ({shown})"


def _resolve_aliases(values: dict[str, Any], where: str) -> dict[str, Any]:
    resolved = dict(values)
    for alias, name in ALIASES.items():
        if alias in resolved:
            if name in resolved:
                raise FinetuneError(f"{where} sets both {alias} and {name}; keep one of them")
            resolved[name] = resolved.pop(alias)
    return resolved


def _as_yaml(value: Any) -> str:
    """``value`` as the recipe wrote it: ``1``, ``null``, ``true``."""
    return yaml.safe_dump(value, default_flow_style=True).splitlines()[0]


def _suggest(key: str, keys: set[str]) -> str:
    close = difflib.get_close_matches(key, sorted(keys), n=1, cutoff=0.6)
    return f"; did you mean '{close[0]}'?" if close else "; run 'finetune train --help' for the valid keys"


def _option_names(parser: HfArgumentParser) -> set[str]:
    """Every ``--name`` the parser accepts, with underscores (``--no_x`` complements included)."""
    return {option[2:].replace("-", "_") for action in parser._actions for option in action.option_strings}


def flag_values(argv: list[str]) -> dict[str, Any]:
    """``{field: raw value}`` for each ``--flag`` in ``argv``, in order, names with '_' for '-'.

    A value is the string after ``=`` or the word after the flag, a list of
    strings for several words, and ``True`` for a flag with no value.
    """
    given: dict[str, Any] = {}
    current = None
    for token in argv:
        if token.startswith("--"):
            name, _, inline = token[2:].partition("=")
            name = name.replace("-", "_")
            given[name] = inline if inline else True
            current = None if inline else name
        elif current is not None:
            given[current] = token if given[current] is True else [*_as_list(given[current]), token]
    return given


def _given_flags(argv: list[str], keys: set[str], options: set[str]) -> dict[str, Any]:
    """The flags the user typed, as raw strings, and an error for any unknown one."""
    given: dict[str, Any] = {}
    for name, value in flag_values(argv).items():
        if name.startswith("no_") and name in options and name[3:] in keys:
            given[name[3:]] = False
            continue
        if name not in options:
            raise FinetuneError(f"unknown flag '--{name}'{_suggest(name, keys)}")
        given[name] = value
    return given


def _as_list(value: Any) -> list[Any]:
    return value if isinstance(value, list) else [value]


def _list_fields(parser: HfArgumentParser) -> set[str]:
    """The fields that take several values (``--report_to tensorboard wandb``)."""
    return {action.dest for action in parser._actions if action.nargs in ("+", "*")}


def _choices(parser: HfArgumentParser) -> dict[str, list[Any]]:
    return {action.dest: list(action.choices) for action in parser._actions if action.choices}


def _to_argv(values: dict[str, Any], choices: dict[str, list[Any]]) -> list[str]:
    """Render recipe values as flags so argparse applies one set of types and checks."""
    argv: list[str] = []
    for key, value in values.items():
        if value is None:
            continue  # null in a recipe means "use the default"
        if value is False and "no" in [str(choice) for choice in choices.get(key, [])]:
            # YAML 1.1 reads a bare `no` as false: `save_strategy: no` means the choice "no".
            argv += [f"--{key}", "no"]
        elif isinstance(value, bool):
            argv += [f"--{key}", "true" if value else "false"]
        elif isinstance(value, list):
            if value:
                argv += [f"--{key}", *[str(item) for item in value]]
        elif isinstance(value, dict):
            argv += [f"--{key}", json.dumps(value)]
        else:
            # One token with '=': a value such as -5e-5 would otherwise be read as an option.
            argv.append(f"--{key}={value}")
    return argv


def _explain_argparse_error(message: str) -> str:
    # argparse says "argument --x/--x: invalid int value: '2.5'"; name the field and the fix.
    if message.startswith("argument "):
        names, _, problem = message[len("argument ") :].partition(": ")
        field_name = names.split("/")[0].lstrip("-")
        # transformers' boolean message ends in a full stop, which the fix would follow as ".;".
        problem = problem.rstrip(". ")
        return f"{field_name}: {problem}; fix it in the recipe or pass --{field_name} with a valid value"
    return message
