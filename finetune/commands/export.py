"""``finetune export RUN --int8``: an int8 copy of a model folder that predict and evaluate accept.

Two backends. ``openvino`` (the default) is static int8, calibrated on reviews
the model will see: the run's own training reviews, or ``--calibration FILE``;
with ``--weights_only``, int8 weights and activations quantized at run time in
small groups, closer to fp32 and slower. ``onnxruntime`` is dynamic int8,
slower still here, and needs no reviews. With ``--fp32_fallback MARGIN`` (either
backend) the folder also keeps the fp32 model, which scores again the reviews
whose int8 top-two probabilities are within ``MARGIN`` (:mod:`finetune.export.fallback`).

A multi_label run's export keeps its tags: ``config.json``'s problem_type and the
run's ``tag_thresholds.json`` travel with it, and its tags are compared with the
fp32 model's on the run's test split, per review-tag pair (printed, and kept in
``export.json``; :mod:`finetune.export.agreement`). Its ``--fp32_fallback``
scores again the reviews with a tag within ``MARGIN`` of its threshold.

A star-rating run's export (``regression``, ``ordinal``) keeps what decodes its
outputs (``config.json``'s ``finetune_task``, ``rating_levels``, ``rating_mean``,
``rating_std``, ``rating_decoding``), and its stars are compared with the fp32
model's on the test split, per review: the share of the same level, and the mean
absolute difference of the rating (``export.json``'s ``rating_agreement``). Its
``--fp32_fallback`` scores again the reviews near a change of level.
"""

from __future__ import annotations

import glob
import json
import os
import shutil
import sys
from pathlib import Path
from typing import Any

from ..errors import FinetuneError
from ..export.common import BACKENDS, CALIBRATION_REVIEWS, Backend


def export(
    model_path: str,
    output: str | None = None,
    int8: bool = True,
    backend: Backend = "openvino",
    calibration: str | None = None,
    calibration_reviews: int = CALIBRATION_REVIEWS,
    weights_only: bool = False,
    fp32_fallback: float | None = None,
) -> Path:
    """Write an int8 copy of ``model_path`` (a run or checkpoint folder) to ``output`` (default ``<model>-int8``).

    ``calibration`` is a review file (CSV, TSV or JSONL) whose first
    ``calibration_reviews`` reviews calibrate OpenVINO's static int8; without
    it they are drawn (seeded) from the run's train split. ``weights_only``
    stores only the weights in int8 and quantizes activations at run time in
    small groups (OpenVINO; closer to fp32, slower, no calibration).
    ``fp32_fallback`` keeps the fp32 model beside int8 for the reviews whose two
    likeliest classes int8 puts within that gap of each other (a tags run: a tag within that gap of its
    threshold; a ratings run: a P(rating > level) within it of 0.5, or a regression's rating within that
    many stars of halfway between two levels).
    """
    from ..evaluation.inference import load_inference_model
    from ..training.runs import find_run_config, require_model_folder

    # Every check before the model loads or a folder is made: a mistake costs a second.
    _check_options(int8, backend, calibration, calibration_reviews, weights_only, fp32_fallback)
    model_dir = Path(model_path)
    require_model_folder(model_dir)
    output_dir = _checked_output_dir(model_dir, output)
    _remove_dead_exports(output_dir)
    # Written under a hidden name and renamed when whole: a kill -9 part-way leaves no folder named
    # like an export, only a hidden one that the next export into the same place removes.
    staging = output_dir.with_name(f".{output_dir.name}.{os.getpid()}.partial")
    shutil.rmtree(staging, ignore_errors=True)  # a dead export's, whose process id this one now has
    static = backend == "openvino" and not weights_only
    run_config = find_run_config(model_dir)
    texts, texts_source = (
        _calibration_texts(model_dir, run_config, calibration, calibration_reviews) if static else ([], "")
    )
    model, tokenizer = load_inference_model(model_dir, tags_read=True, ratings_read=True)
    try:
        model_file = _write_int8(
            model, tokenizer, staging, model_dir, backend, weights_only, run_config, texts, texts_source
        )
        _finish_export(model_dir, staging, output_dir, (model, tokenizer), fp32_fallback, run_config)
        model_file = output_dir / model_file.relative_to(staging)
    except BaseException:
        # Half an export is no model: leave nothing a later predict could mistake for one.
        shutil.rmtree(staging, ignore_errors=True)
        raise
    size_mib = sum(path.stat().st_size for path in output_dir.rglob("*") if path.is_file()) / 2**20
    kind = f"{backend}, weights only" if weights_only else backend
    if fp32_fallback is not None:
        kind += f", fp32 for reviews whose top two are within {fp32_fallback:g}"
    print(
        f"wrote {model_file} ({kind}, folder {size_mib:.0f} MiB); use it with: finetune predict {output_dir}",
        file=sys.stderr,
    )
    return output_dir


def _check_options(
    int8: bool,
    backend: str,
    calibration: str | None,
    calibration_reviews: int,
    weights_only: bool,
    fp32_fallback: float | None,
) -> None:
    """Refuse options that do not go together, and a backend that is not installed."""
    from ..export.fallback import check_fallback_margin
    from ..export.onnxruntime import require_onnx_runtime
    from ..export.openvino import require_openvino

    if not int8:
        raise FinetuneError("only --int8 export is supported; pass --int8")
    if backend not in BACKENDS:
        raise FinetuneError(f"--backend {backend!r} is not one of {', '.join(BACKENDS)}; pass --backend openvino")
    if isinstance(calibration_reviews, bool) or not isinstance(calibration_reviews, int) or calibration_reviews < 1:
        raise FinetuneError(f"--calibration_reviews must be a whole number >= 1 (got {calibration_reviews!r})")
    if backend == "onnxruntime" and (calibration is not None or weights_only):
        flag = "--calibration" if calibration is not None else "--weights_only"
        raise FinetuneError(f"{flag} is for --backend openvino; leave it out with --backend onnxruntime")
    if weights_only and calibration is not None:
        raise FinetuneError("--weights_only needs no calibration reviews; leave out --calibration")
    if fp32_fallback is not None:
        check_fallback_margin(fp32_fallback)
    require_openvino() if backend == "openvino" else require_onnx_runtime()


def _checked_output_dir(model_dir: Path, output: str | None) -> Path:
    """Where the export goes (``<model>-int8`` by default): not there yet, in a folder that is."""
    # Made absolute first: "." and ".." (export run from inside the run folder) have no name to add "-int8"
    # to. abspath, not resolve: a run reached through a symlink gets its copy beside the link, where it was named.
    absolute = Path(os.path.abspath(model_dir))
    output_dir = Path(output) if output else absolute.with_name(f"{absolute.name}-int8")
    if output_dir.exists():
        raise FinetuneError(f"{output_dir} already exists; remove it or pass --output DIR")
    if not output_dir.parent.is_dir():
        raise FinetuneError(f"--output {output_dir}: folder {output_dir.parent} does not exist; create it first")
    return output_dir


def _write_int8(
    model: Any,
    tokenizer: Any,
    staging: Path,
    model_dir: Path,
    backend: str,
    weights_only: bool,
    run_config: dict[str, Any] | None,
    texts: list[str],
    texts_source: str,
) -> Path:
    """The int8 model written into ``staging`` by the backend asked for; returns its model file."""
    if backend == "openvino" and not weights_only:
        from ..data.encoding import ReviewEncoding
        from ..export.openvino import export_openvino_int8

        encoding = ReviewEncoding.from_fields((run_config or {}).get("data", {}))
        return export_openvino_int8(
            model, tokenizer, staging, str(model_dir), texts, encoding, calibration_source=texts_source
        )
    if weights_only:
        from ..export.openvino import export_openvino_weights_int8

        return export_openvino_weights_int8(model, tokenizer, staging, str(model_dir))
    from ..export.onnxruntime import export_int8

    return export_int8(model, tokenizer, staging, source=str(model_dir))


def _finish_export(
    model_dir: Path,
    staging: Path,
    output_dir: Path,
    model_and_tokenizer: tuple[Any, Any],
    fp32_fallback: float | None,
    run_config: dict[str, Any] | None,
) -> None:
    """The run record (a tags run's thresholds, the fp32 fallback) added to ``staging``, renamed to ``output_dir``.

    A multi_label or star-rating run's export is measured against its fp32 model on the run's test split
    (:func:`_record_tag_agreement`, :func:`_record_rating_agreement`) before it is renamed into place.
    """
    from ..config.tasks import MULTI_LABEL, ORDERED_TASKS, task_of_model
    from ..evaluation.tag_thresholds import copy_tag_thresholds
    from ..export.common import copy_run_record
    from ..export.fallback import add_fp32_fallback

    model, tokenizer = model_and_tokenizer
    task = task_of_model(model.config)
    copy_run_record(model_dir, staging)
    # An export predicts a run's tags at the thresholds the run tuned, so it carries them.
    copy_tag_thresholds(model_dir, staging)
    if fp32_fallback is not None:
        add_fp32_fallback(staging, model, fp32_fallback, task=task)
    if task == MULTI_LABEL:
        _record_tag_agreement(staging, model, tokenizer, run_config)
    elif task in ORDERED_TASKS:
        _record_rating_agreement(staging, model, tokenizer, run_config)
    try:
        os.rename(staging, output_dir)  # fails rather than replace a folder another export made meanwhile
    except OSError as error:
        raise FinetuneError(
            f"cannot move the export into {output_dir} ({error.strerror or error}); it was made meanwhile "
            "by another export, or cannot be written: remove it or pass --output DIR"
        ) from None


def _test_split_outputs(
    export_dir: Path, model: Any, tokenizer: Any, run_config: dict[str, Any] | None, what: str
) -> tuple[Any, Any] | None:
    """The fp32 model's and the export's outputs on the run's test split, the export read back as predict reads it.

    None, said on stderr, for a run with no test split on record (``what``: what was not compared).
    """
    from ..data.encoding import ReviewEncoding
    from ..evaluation.inference import load_inference_model, predict_probabilities
    from ..training.runs import load_run_data

    data = load_run_data(run_config) if run_config is not None else None
    if data is None or "test" not in data.splits:
        print(
            f"note: the run has no test split on record, so int8's {what} were not compared with fp32's; "
            f"compare them with finetune predict on labelled reviews",
            file=sys.stderr,
        )
        return None
    texts = list(data.splits["test"]["text"])
    encoding = ReviewEncoding.from_fields((run_config or {}).get("data", {}))
    int8, _ = load_inference_model(export_dir, tags_read=True, ratings_read=True)
    fp32_outputs = predict_probabilities(model, tokenizer, texts, encoding=encoding)
    return fp32_outputs, predict_probabilities(int8, tokenizer, texts, encoding=encoding)


def _record_agreement(export_dir: Path, key: str, agreement: dict[str, Any]) -> None:
    """Add ``agreement`` (measured on the test split) to the export's ``export.json`` under ``key``."""
    from ..config.output_files import write_output_text
    from ..export.common import EXPORT_RECORD, read_export_record

    record = read_export_record(export_dir)
    record[key] = {"split": "test", **agreement}
    write_output_text(export_dir / EXPORT_RECORD, json.dumps(record, indent=2) + "\n")


def _record_tag_agreement(export_dir: Path, model: Any, tokenizer: Any, run_config: dict[str, Any] | None) -> None:
    """Score the run's test split with the fp32 model and the export; print and record how often their tags agree.

    The export is read back as ``predict`` and ``serve`` read it, at the thresholds it carries;
    the figures go to its ``export.json`` (``tag_agreement``).
    """
    from ..evaluation.tag_thresholds import tag_thresholds
    from ..export.agreement import tag_agreement

    outputs = _test_split_outputs(export_dir, model, tokenizer, run_config, "tags")
    if outputs is None:
        return
    names = [model.config.id2label[index] for index in range(model.config.num_labels)]
    agreement = tag_agreement(*outputs, tag_thresholds(export_dir, names), names)
    _record_agreement(export_dir, "tag_agreement", agreement)
    print(
        f"int8 gives the same tags as fp32 on {agreement['pair_agreement']:.2%} of the {agreement['pairs']:,} "
        f"review-tag pairs of the run's test split ({agreement['pairs_changed']:,} changed), and the same whole "
        f"set on {agreement['review_agreement']:.2%} of its {agreement['reviews']:,} reviews",
        file=sys.stderr,
    )


def _record_rating_agreement(export_dir: Path, model: Any, tokenizer: Any, run_config: dict[str, Any] | None) -> None:
    """Score the run's test split with the fp32 model and the export; print and record how close their stars are.

    Both are decoded as ``predict`` and ``serve`` decode them; the figures go to the export's
    ``export.json`` (``rating_agreement``).
    """
    from ..export.agreement import rating_agreement
    from ..training.ordered_heads import StarReader

    outputs = _test_split_outputs(export_dir, model, tokenizer, run_config, "ratings")
    if outputs is None:
        return
    stars = StarReader.of_config(model.config, export_dir)
    agreement = rating_agreement(*outputs, stars)
    _record_agreement(export_dir, "rating_agreement", agreement)
    print(
        f"int8 gives the same level as fp32 on {agreement['level_agreement']:.2%} of the {agreement['reviews']:,} "
        f"reviews of the run's test split ({agreement['levels_changed']:,} changed), its rating "
        f"{agreement['mean_absolute_rating_difference']:.4f} stars apart on average",
        file=sys.stderr,
    )


def _remove_dead_exports(output_dir: Path) -> None:
    """Remove the hidden ``.NAME.PID.partial`` folders of exports into ``output_dir`` whose process is gone.

    What a kill -9 (or a power cut) during an export leaves: no model, only space taken. A folder whose
    process still runs is another export at work, and is left to it.
    """
    for leftover in output_dir.parent.glob(f".{glob.escape(output_dir.name)}.*.partial"):
        pid = leftover.name[len(output_dir.name) + 2 : -len(".partial")]
        if pid.isdigit() and not _process_alive(int(pid)):
            shutil.rmtree(leftover, ignore_errors=True)


def _process_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # another user's process
    return True


def _calibration_texts(
    model_dir: Path, run_config: dict[str, Any] | None, calibration: str | None, count: int
) -> tuple[list[str], str]:
    """Up to ``count`` reviews to calibrate on, as the model reads them, and where they came from."""
    if calibration is not None:
        from ..pipeline.review_rows import read_model_inputs

        return read_model_inputs(model_dir, calibration, limit=count), f"the first reviews of {calibration}"
    if run_config is None:
        raise FinetuneError(
            f"{model_dir} has no run on record (finetune_run.json) to draw calibration reviews from; "
            "pass --calibration FILE (reviews like the ones it will score) or --backend onnxruntime"
        )
    from ..export.openvino import sample_calibration_texts
    from ..training.runs import load_run_data

    train_texts = list(load_run_data(run_config).splits["train"]["text"])
    return sample_calibration_texts(train_texts, count), "the run's train split"
