"""``finetune export MODEL --int8``: an int8 copy of a model for fast CPU prediction."""

from __future__ import annotations

from dataclasses import dataclass

from ...export.common import BACKENDS, CALIBRATION_REVIEWS
from .fields import Command, argument, as_keywords, option
from .values import positive_int


@dataclass(frozen=True)
class ExportOptions:
    """The options of ``finetune export``."""

    model: str = argument(help="a model folder (a run's output_dir or a checkpoint)")
    int8: bool = option(False, help="int8 weights and activations in the Linear layers")
    output: str | None = option(metavar="DIR", help="where the exported folder goes (default: MODEL-int8)")
    backend: str = option(
        "openvino",
        choices=BACKENDS,
        help="openvino: static int8, calibrated on reviews, fastest (default); onnxruntime: dynamic int8, no reviews",
    )
    calibration: str | None = option(
        metavar="FILE",
        help="CSV, TSV or JSONL of reviews to calibrate on (default: drawn from the run's train split)",
    )
    calibration_reviews: int = option(
        CALIBRATION_REVIEWS,
        type=positive_int,
        help=f"how many reviews calibrate static int8 (default {CALIBRATION_REVIEWS})",
    )
    weights_only: bool = option(
        False,
        help="openvino: int8 weights, activations quantized at run time in groups of 32; closer to fp32, slower",
    )
    fp32_fallback: float | None = option(
        metavar="MARGIN",
        help="also keep the fp32 model and let it score the reviews whose int8 top-two probabilities are "
        "within MARGIN (e.g. 0.1): labels closer to fp32's, a little slower (a ratings run: reviews within "
        "MARGIN of a change of level; for regression, MARGIN is in stars)",
    )


def run(options: ExportOptions, extra: list[str]) -> None:
    """Export the model with the chosen backend."""
    from ..export import export

    export(options.model, **as_keywords(options, leave_out=("model",)))


COMMAND = Command(
    "export",
    help="an int8 copy of a model for fast CPU prediction (needs: pip install 'finetune[export]')",
    options=ExportOptions,
    run=run,
)
