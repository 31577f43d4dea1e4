"""``finetune export RUN --int8``: an int8 ONNX copy of a model folder that predict and evaluate accept."""

from __future__ import annotations

import shutil
import sys
from collections.abc import Callable
from pathlib import Path

from ..errors import FinetuneError


def export(
    model_path: str, output: str | None = None, int8: bool = True, quantize: Callable[[Path, Path], None] | None = None
) -> Path:
    """Write an int8 copy of ``model_path`` (a run or checkpoint folder) to ``output`` (default ``<model>-int8``).

    ``quantize(fp32_onnx, int8_onnx)`` replaces the shipped quantization (for comparing others).
    """
    from ..evaluation.export import copy_run_record, export_int8, require_onnx_runtime
    from ..evaluation.inference import load_inference_model
    from ..training.runs import require_model_folder

    if not int8:
        raise FinetuneError("only --int8 export is supported; pass --int8")
    require_onnx_runtime()
    model_dir = Path(model_path)
    require_model_folder(model_dir)
    output_dir = Path(output) if output else model_dir.with_name(f"{model_dir.resolve().name}-int8")
    if output_dir.exists():
        raise FinetuneError(f"{output_dir} already exists; remove it or pass --output DIR")
    if not output_dir.parent.is_dir():
        raise FinetuneError(f"--output {output_dir}: folder {output_dir.parent} does not exist; create it first")
    model, tokenizer = load_inference_model(model_dir)
    try:
        onnx_file = export_int8(model, tokenizer, output_dir, source=str(model_dir), quantize=quantize)
        copy_run_record(model_dir, output_dir)
    except BaseException:
        # Half an export is no model: leave nothing a later predict could mistake for one.
        shutil.rmtree(output_dir, ignore_errors=True)
        raise
    size_mib = onnx_file.stat().st_size / 2**20
    print(f"wrote {onnx_file} ({size_mib:.0f} MiB); use it with: finetune predict {output_dir}", file=sys.stderr)
    return output_dir
