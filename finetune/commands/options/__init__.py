"""Each subcommand's options, declared once: the parser and ``--help`` are generated from them.

A new subcommand is one module here (its options dataclass, its ``run`` and its
:class:`~finetune.commands.options.fields.Command`) and one line in :data:`COMMANDS`.
"""

from __future__ import annotations

from . import (
    baseline,
    bench,
    catalogs,
    check,
    compare_tasks,
    distill,
    evaluate,
    export,
    find_label_issues,
    predict,
    serve,
    train,
    tune,
)
from .fields import Command

# In the order ``finetune --help`` lists them.
COMMANDS: tuple[Command, ...] = (
    train.COMMAND,
    distill.COMMAND,
    check.COMMAND,
    evaluate.COMMAND,
    baseline.COMMAND,
    compare_tasks.COMMAND,
    find_label_issues.COMMAND,
    tune.COMMAND,
    predict.COMMAND,
    export.COMMAND,
    serve.COMMAND,
    bench.COMMAND,
    catalogs.DATA,
    catalogs.MODEL,
)
