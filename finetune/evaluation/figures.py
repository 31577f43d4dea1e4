"""How the project's pictures are drawn: a fixed pixel size, off screen, written like every other output file."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ..config.output_files import output_file

DPI = 100
# Every picture is a fixed pixel size (inches x DPI), never trimmed to its contents,
# so pictures of two runs line up side by side.
FIGURE_INCHES = (8.0, 5.0)  # 800 x 500 px
CONFUSION_INCHES = (7.0, 6.0)  # 700 x 600 px


def new_figure(inches: tuple[float, float]) -> tuple[Any, Any]:
    """A matplotlib figure of ``inches`` at the report's DPI, drawn off screen, and its one axes."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    figure = Figure(figsize=inches, dpi=DPI, layout="constrained")
    FigureCanvasAgg(figure)
    return figure, figure.add_subplot()


def save_figure(figure: Any, path: Path) -> None:
    """Write ``figure`` to ``path`` (PNG or SVG by its suffix) at the report's DPI, through ``output_file``."""
    # No bbox_inches="tight": it would change the pixel size from picture to picture.
    with output_file(path, binary=True) as handle:
        figure.savefig(handle, dpi=DPI, format=path.suffix.lstrip("."))
