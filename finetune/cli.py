"""The ``finetune`` command: each subcommand maps to one plain function.

| subcommand | function |
| --- | --- |
| ``train RECIPE [--field value ...]`` | :func:`finetune.train.train` |
| ``evaluate PATH [--data FILE]`` | :func:`finetune.evaluation.evaluate` |
| ``predict MODEL [--input FILE] [--output FILE]`` | :func:`finetune.prediction.predict` |

Heavy libraries are imported inside the functions so ``--help`` and input
errors answer quickly.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence

from .errors import FinetuneError


def _train(options: argparse.Namespace, extra: list[str]) -> None:
    if options.recipe in ("-h", "--help") or "-h" in extra or "--help" in extra:
        from .recipes import build_parser

        build_parser().print_help()
        return
    from .train import train

    train(options.recipe, extra)


def _evaluate(options: argparse.Namespace, extra: list[str]) -> None:
    from .evaluation import evaluate

    evaluate(options.path, data=options.data, split=options.split, batch_size=options.batch_size)


def _predict(options: argparse.Namespace, extra: list[str]) -> None:
    from .prediction import predict

    predict(
        options.model,
        input_path=options.input,
        output_path=options.output,
        text_column=options.text_column,
        batch_size=options.batch_size,
        overwrite=options.overwrite,
    )


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:
        raise FinetuneError(f"{message}; see 'finetune {self.prog.split()[-1]} --help'")


def build_cli() -> argparse.ArgumentParser:
    """The argument parser of the ``finetune`` command."""
    parser = _Parser(prog="finetune", description="Fine-tune BERT-family models on customer reviews.")
    commands = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)

    train = commands.add_parser(
        "train",
        help="train from a recipe; any recipe field can be overridden with --field value",
        add_help=False,
    )
    train.add_argument("recipe", nargs="?", help="a recipe YAML file, e.g. recipes/quickstart.yaml")
    train.set_defaults(handler=_train)

    evaluate = commands.add_parser("evaluate", help="score a model folder or every checkpoint of a run")
    evaluate.add_argument("path", help="a run folder (output_dir) or a model/checkpoint folder")
    evaluate.add_argument("--data", help="a labelled file with the recipe's columns (default: the run's test split)")
    evaluate.add_argument("--split", default="test", help="which split of the run's data to score (default: test)")
    evaluate.add_argument("--batch_size", type=int, default=32)
    evaluate.set_defaults(handler=_evaluate)

    predict = commands.add_parser("predict", help="label reviews from a CSV/JSONL file or stdin")
    predict.add_argument("model", help="a model folder (a run's output_dir or a checkpoint)")
    predict.add_argument("--input", help="CSV, TSV or JSONL with a text column; omit or '-' for one review per line")
    predict.add_argument("--output", help="where to write (CSV or JSONL by extension); default: CSV on stdout")
    predict.add_argument("--text_column", help="the column holding the review (default: the recipe's, or 'text')")
    predict.add_argument("--batch_size", type=int, default=32)
    predict.add_argument("--overwrite", action="store_true", help="replace --output if it exists")
    predict.set_defaults(handler=_predict)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line; returns the exit status (2 for bad input, with a one-line message)."""
    argv = list(sys.argv[1:] if argv is None else argv)
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    try:
        options, extra = build_cli().parse_known_args(argv)
        if options.command != "train" and extra:
            raise FinetuneError(f"unrecognized arguments: {' '.join(extra)}; see 'finetune {options.command} --help'")
        _quiet_libraries()
        options.handler(options, extra)
    except FinetuneError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
    return 0


def _quiet_libraries() -> None:
    # Library info logs drown the progress bar; warnings still show.
    import logging
    import warnings

    # DataLoader warns on every epoch that pinned memory needs a GPU; harmless on CPU.
    warnings.filterwarnings("ignore", message=".*'pin_memory' argument is set as true.*")

    for name in ("transformers", "datasets", "evaluate", "accelerate"):
        logging.getLogger(name).setLevel(logging.WARNING)


if __name__ == "__main__":
    sys.exit(main())
