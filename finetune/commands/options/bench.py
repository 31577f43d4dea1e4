"""``finetune bench RECIPE``: the training systems side by side, peak memory (``--memory``), or ``--scaling``."""

from __future__ import annotations

from dataclasses import dataclass

from ...errors import FinetuneError
from .fields import Command, argument, option
from .values import positive_int


@dataclass(frozen=True)
class BenchOptions:
    """The options of ``finetune bench``; the recipe's fields travel in ``extra``."""

    recipe: str | None = argument(
        None,
        nargs="?",
        help="a recipe YAML file, e.g. recipes/drugscom.yaml; with --scaling also a CSV, TSV or JSONL file of reviews",
    )
    updates: int = option(
        20,
        type=positive_int,
        help="updates each system trains for; with --scaling, each run's max_steps (default: 20)",
    )
    output: str | None = option(help="also save the report as JSON here")
    memory: bool = option(False, help="peak memory of ReviewTrainer for n in 1, 4, 16 and 4b")
    no_inference: bool = option(False, help="skip the prediction throughput comparison")
    device: str = option("cpu", choices=("cpu", "cuda"), help="where the systems train (default: cpu)")
    count_ops: bool = option(
        False,
        help=(
            "also count the operators each training system dispatches per update (on a GPU, its kernel "
            "launches: the host's work when the GPU waits for it), in a run apart from the timed one"
        ),
    )
    scaling: bool = option(
        False,
        help=(
            "how each stage of finetune train grows with the number of reviews: train --max_steps UPDATES on "
            "nested subsets of the reviews, each in a fresh process; a table of seconds per stage and size, "
            "each stage's growth exponent, and the stages growing faster than linearly"
        ),
    )
    sizes: str | None = option(
        help="with --scaling: the subsets, smallest first, as fractions of the reviews or counts "
        "(default: 1/8,1/4,1/2,1)",
    )
    max_reviews: int | None = option(
        type=positive_int,
        help="with --scaling: draw at most this many reviews (seeded) from the source first, so the runs fit "
        "the time at hand",
    )
    synthetic: int | None = option(
        type=positive_int,
        metavar="N",
        help="with --scaling: train on N synthetic reviews (seeded, written on demand, 5 star classes) instead",
    )


def run(options: BenchOptions, extra: list[str]) -> None:
    """The scaling bench with ``--scaling``, else the systems' bench; flags of the other one are refused."""
    if options.count_ops and (options.scaling or options.memory):
        raise FinetuneError(
            f"--count_ops is for the training systems' bench, not --{'scaling' if options.scaling else 'memory'}; "
            "run them one at a time"
        )
    if options.scaling:
        if options.memory:
            raise FinetuneError("--scaling and --memory are two benches; run them one at a time")
        if options.device != "cpu":
            raise FinetuneError(
                "--device is for the training systems' bench; --scaling trains where finetune train would "
                "(on the GPU when there is one); drop --device"
            )
        from ...bench.scaling import bench_scaling

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
    from ...bench.command import bench

    bench(
        options.recipe,
        extra,
        updates=options.updates,
        output=options.output,
        memory=options.memory,
        inference=not options.no_inference,
        device=options.device,
        count_ops=options.count_ops,
    )


COMMAND = Command(
    "bench",
    help=(
        "ReviewTrainer vs stock Trainer vs the classic loop on a recipe; --memory for peak memory against n; "
        "--scaling for how each stage of a run grows with the reviews"
    ),
    options=BenchOptions,
    run=run,
    description="Recipe fields can be overridden after the options, e.g. --per_device_train_batch_size 16.",
    takes_recipe_fields=True,
)
