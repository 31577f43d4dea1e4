"""The package's folders are layers: a module imports only from its own layer or the ones below."""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).parent.parent / "finetune"
# Lowest first. Top-level modules: errors.py is the floor; the others (cli.py, cli_parser.py, __init__.py,
# __main__.py) the roof.
# fetching sits below data and training: a recipe's dataset or model name is followed down to files, never back up.
# fast_path sits below training: the model's cheaper readings, which training, evaluation and export install.
# export sits between training (it reads run records and pooling) and evaluation (inference runs its models).
# serve sits above evaluation (it answers with inference and explanations), below commands (serve starts it).
# pipeline sits above serve and below commands: the stages of a run, and what several commands share.
# bench sits above pipeline and below commands: what only `finetune bench` uses; no training run imports it.
LAYERS = [
    "errors",
    "config",
    "fetching",
    "data",
    "fast_path",
    "training",
    "export",
    "evaluation",
    "serve",
    "pipeline",
    "bench",
    "commands",
    "cli",
]


def layer_of(module: str) -> int:
    """The layer of a dotted module name inside the package, e.g. ``finetune.data.splits`` -> data's."""
    parts = module.split(".")[1:] or ["cli"]
    first = parts[0]
    if first in ("__init__", "__main__") or (first != "errors" and (PACKAGE / f"{first}.py").is_file()):
        first = "cli"
    return LAYERS.index(first)


def module_name(path: Path) -> str:
    """The dotted name of a module file inside the package, e.g. ``finetune.data.splits`` (a package: its own)."""
    parts = path.relative_to(PACKAGE).with_suffix("").parts
    return ".".join(("finetune", *(parts[:-1] if parts[-1] == "__init__" else parts)))


def imported_modules(path: Path) -> list[str]:
    """Absolute names of the finetune modules ``path`` imports (lazy imports inside functions included)."""
    module = ".".join(("finetune", *path.relative_to(PACKAGE).with_suffix("").parts))
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    found = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.ImportFrom) and node.level:
            base = package.split(".")
            base = base[: len(base) - node.level + 1]
            target = ".".join([*base, node.module] if node.module else base)
            # "from .. import x" and "from ..pipeline import run" import the module x, run; "from .run import f", run.
            names = [target] if node.module else [f"{target}.{alias.name}" for alias in node.names]
            if node.module:
                names += [f"{target}.{alias.name}" for alias in node.names if _is_module(f"{target}.{alias.name}")]
            found.extend(names)
        elif isinstance(node, ast.ImportFrom) and (node.module or "").startswith("finetune"):
            found.append(node.module)
        elif isinstance(node, ast.Import):
            found.extend(alias.name for alias in node.names if alias.name.startswith("finetune"))
    return found


def _is_module(name: str) -> bool:
    """Whether a dotted name is a module or package of the finetune package (not a function or a class in one)."""
    relative = Path(*name.split(".")[1:])
    return (PACKAGE / relative).with_suffix(".py").is_file() or (PACKAGE / relative / "__init__.py").is_file()


def import_graph() -> dict[str, set[str]]:
    """Every package module and the package modules it imports, at module level or inside a function."""
    graph: dict[str, set[str]] = {}
    for path in PACKAGE.rglob("*.py"):
        if "metric_modules" in path.parts:
            continue
        # The package itself ("finetune") loads its public names lazily and is imported for its errors only.
        targets = {target for target in imported_modules(path) if target != "finetune" and _is_module(target)}
        graph[module_name(path)] = targets - {module_name(path)}
    return graph


def import_circle(graph: dict[str, set[str]]) -> list[str]:
    """One circle of imports in ``graph`` (``[a, b, a]``: a imports b, b imports a), or [] when there is none."""
    finished: set[str] = set()
    for start in sorted(graph):
        path: list[str] = []
        on_path: set[str] = set()
        stack = [(start, iter(sorted(graph.get(start, ()))))]
        path.append(start)
        on_path.add(start)
        while stack:
            node, targets = stack[-1]
            target = next(targets, None)
            if target is None:
                stack.pop()
                path.pop()
                on_path.discard(node)
                finished.add(node)
            elif target in on_path:
                return [*path[path.index(target) :], target]
            elif target not in finished:
                stack.append((target, iter(sorted(graph.get(target, ())))))
                path.append(target)
                on_path.add(target)
    return []


def test_no_import_circle_among_modules():
    # A circle (train -> distill -> seeds -> repeats -> train, as there was) means no module of it can be
    # read, tested or moved alone; function-local imports hide it from Python but not from a reader.
    graph = import_graph()
    assert len(graph) > 30
    assert " -> ".join(import_circle(graph)) == ""


def test_an_import_circle_is_found_and_named():
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a", "d"}, "d": set()}
    assert import_circle(graph) == ["a", "b", "c", "a"]
    assert import_circle({"a": {"b"}, "b": set()}) == []


# Modules of commands/ that are one command's parts or modes rather than commands: train's --seeds and --folds.
COMMAND_PARTS = {
    "finetune.commands.seeds": "train",
    "finetune.commands.folds": "train",
    "finetune.commands.evaluate_tags": "evaluate",
}
# commands/options/ declares each command's options in a module named after it; these modules serve them all.
OPTIONS_HELPERS = {"__init__", "fields", "values", "shared"}


def command_of(module: str) -> str:
    """The command a module of commands/ belongs to: ``train`` for commands.train, commands.seeds and options.train."""
    if module.startswith("finetune.commands.options."):
        name = module.rpartition(".")[2]
        return "options" if name in OPTIONS_HELPERS else name
    return COMMAND_PARTS.get(module, module.rpartition(".")[2])


def test_no_command_imports_another_command():
    # What commands share lives in pipeline/: a command that calls another reuses its flags and its output
    # rather than stages with plain inputs and outputs. A command's options module starts that command only.
    crossing = [
        f"{module} imports {target}"
        for module, targets in sorted(import_graph().items())
        if module.startswith("finetune.commands.")
        for target in sorted(targets)
        if target.startswith("finetune.commands.")
        and command_of(target) != command_of(module)
        and not (command_of(target) == "options" and module.startswith("finetune.commands.options."))
    ]
    assert crossing == []


def test_a_command_importing_another_is_caught():
    assert command_of("finetune.commands.options.check") == command_of("finetune.commands.check") == "check"
    assert command_of("finetune.commands.seeds") == "train"
    assert command_of("finetune.commands.distill") != command_of("finetune.commands.seeds")


def test_no_import_runs_up_a_layer():
    modules = [path for path in PACKAGE.rglob("*.py") if "metric_modules" not in path.parts]
    assert len(modules) > 30
    upward = []
    for path in modules:
        relative = path.relative_to(PACKAGE)
        own = layer_of(".".join(("finetune", *relative.with_suffix("").parts)))
        for target in imported_modules(path):
            if target != "finetune" and layer_of(target) > own:
                upward.append(f"{relative} imports {target}")
    assert upward == []


def test_every_folder_says_what_lives_there():
    for folder in LAYERS[1:-1]:
        init = PACKAGE / folder / "__init__.py"
        docstring = ast.get_docstring(ast.parse(init.read_text(encoding="utf-8")))
        assert docstring and len(docstring.splitlines()) == 1, init


def test_fetching_sits_below_data_and_training():
    """fetching/ imports only errors, config and itself; data/ and training/ reach their files through it."""
    assert LAYERS.index("config") < LAYERS.index("fetching") < LAYERS.index("data") < LAYERS.index("training")
    reached_from_fetching = set()
    for path in (PACKAGE / "fetching").glob("*.py"):
        reached_from_fetching.update(target.split(".")[1] for target in imported_modules(path) if target != "finetune")
    assert reached_from_fetching - {"errors", "config", "fetching"} == set()
    # The way down is used: the data sources and the model loader take their files from fetching/, not a copy.
    importers = {
        path.relative_to(PACKAGE).parts[0]
        for path in PACKAGE.rglob("*.py")
        if any(target.startswith("finetune.fetching") for target in imported_modules(path))
    }
    assert {"data", "training"} <= importers


# A command or a stage longer than this is several steps that want names of their own.
MAX_FUNCTION_LINES = 60


def functions_over(limit: int, paths: list[Path], root: Path = PACKAGE) -> list[str]:
    """Every function (methods and nested ones included) of ``paths`` longer than ``limit`` lines, named."""
    too_long = []
    for path in paths:
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            # From the def line to the last line, docstring included.
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                lines = node.end_lineno - node.lineno + 1
                if lines > limit:
                    too_long.append(f"{path.relative_to(root)}: {node.name} is {lines} lines")
    return too_long


def test_no_function_in_the_package_is_over_60_lines():
    # Every function on a screen, in every folder (once only commands/ and pipeline/ were held to it).
    paths = sorted(path for path in PACKAGE.rglob("*.py") if "metric_modules" not in path.parts)
    assert len(paths) > 100
    assert functions_over(MAX_FUNCTION_LINES, paths) == []


def test_a_long_method_is_found_and_named(tmp_path):
    # The check has teeth: a method of 61 lines in a class is found; one of 60 is not.
    for lines, expected in ((61, ["module.py: handle is 61 lines"]), (60, [])):
        body = "\n".join(f"        x = {line}" for line in range(lines - 2))
        (tmp_path / "module.py").write_text(f"class Server:\n    def handle(self):\n{body}\n        return x\n")
        assert functions_over(MAX_FUNCTION_LINES, [tmp_path / "module.py"], root=tmp_path) == expected
