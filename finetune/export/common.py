"""What every export backend shares: the backends' names, the ``export.json`` record, quiet loggers, the run record.

Kept free of heavy imports at module level: the CLI reads :data:`BACKENDS` and
:data:`CALIBRATION_REVIEWS` to build its parser.
"""

from __future__ import annotations

import contextlib
import json
import logging
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Literal

Backend = Literal["openvino", "onnxruntime"]
BACKENDS: tuple[str, ...] = ("openvino", "onnxruntime")
EXPORT_RECORD = "export.json"
# Static int8 calibrated on 96 train reviews changed 7 of drugscom's 379 test labels, on 300
# reviews 6; calibrating on 300 takes about 20 s on 2 cores.
CALIBRATION_REVIEWS = 300


def read_export_record(folder: Path) -> dict[str, Any]:
    """The ``export.json`` of an int8 export (how it was made), or {} for a folder without one."""
    path = folder / EXPORT_RECORD
    return json.loads(path.read_text(encoding="utf-8")) if path.is_file() else {}


def export_backend(model_dir: Path) -> str:
    """``openvino`` or ``onnxruntime`` for an int8 export (from its ``export.json``), ``pytorch`` otherwise."""
    record = read_export_record(model_dir)
    # Exports from before OpenVINO was a backend were all ONNX Runtime's and say no backend.
    return record.get("backend", "onnxruntime") if record else "pytorch"


@contextlib.contextmanager
def quiet_loggers(*names: str) -> Iterator[None]:
    """Raise the named loggers to ERROR for the block ('' is the root logger), then restore their levels."""
    loggers = [logging.getLogger(name) for name in names]
    levels = [logger.level for logger in loggers]
    for logger in loggers:
        logger.setLevel(logging.ERROR)
    try:
        yield
    finally:
        for logger, level in zip(loggers, levels):
            logger.setLevel(level)


def copy_run_record(model_dir: Path, output_dir: Path) -> None:
    """Copy the run's ``finetune_run.json`` (columns, cleaning, max_length) so predict reads reviews as trained."""
    from ..training.runs import RUN_CONFIG

    for folder in (model_dir, model_dir.parent):
        if (folder / RUN_CONFIG).is_file():
            shutil.copy2(folder / RUN_CONFIG, output_dir / RUN_CONFIG)
            return
