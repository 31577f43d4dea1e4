"""Pictures of a multi_label run's test scores: each tag's F1 with its interval, and which tags come together."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from .figures import CONFUSION_INCHES, FIGURE_INCHES, new_figure, save_figure

# The picture files a multi_label run's report folder gains, with their captions.
TAG_PICTURES = {
    "tag_f1_test.png": "each tag's test F1 with its 95% bootstrap interval, beside the baseline's",
    "tag_cooccurrence_test.png": "how often the test reviews' true tags come together",
}


def draw_tag_pictures(
    folder: Path, test_report: dict[str, Any], baseline_test: dict[str, Any] | None
) -> dict[str, str]:
    """The two tag pictures of a run in ``folder``; each picture's caption by file name."""
    tag_names = list(test_report["per_class"])
    shown = [("this model", test_report)] + ([("TF-IDF baseline", baseline_test)] if baseline_test else [])
    title = (
        f"{test_report['num_samples']} test reviews, micro-F1 {test_report['micro_f1']:.3f}, "
        f"macro-F1 {test_report['macro_f1']:.3f}"
    )
    plot_tag_f1(folder / "tag_f1_test.png", shown, tag_names, title)
    plot_tag_cooccurrence(folder / "tag_cooccurrence_test.png", test_report["cooccurrence"], tag_names, title)
    return dict(TAG_PICTURES)


def plot_tag_f1(
    path: Path, reports: Sequence[tuple[str, dict[str, Any]]], tag_names: Sequence[str], title: str
) -> None:
    """Micro-F1, macro-F1 and each tag's F1 for each (name, report), one row each, with 95% interval bars."""
    import numpy as np

    figure, axes = new_figure((FIGURE_INCHES[0], max(FIGURE_INCHES[1], 1.2 + 0.45 * (len(tag_names) + 2))))
    rows = ["micro-F1", "macro-F1", *tag_names]
    height = 0.8 / max(len(reports), 1)
    for number, (name, report) in enumerate(reports):
        intervals = report["intervals"]
        values = [report["micro_f1"], report["macro_f1"], *(report["per_class"][tag]["f1"] for tag in tag_names)]
        bounds = [intervals["micro_f1"], intervals["macro_f1"], *(intervals["per_class_f1"][tag] for tag in tag_names)]
        values_array, bounds_array = np.asarray(values), np.asarray(bounds)
        errors = np.vstack([values_array - bounds_array[:, 0], bounds_array[:, 1] - values_array]).clip(min=0)
        positions = np.arange(len(rows)) + (number - (len(reports) - 1) / 2) * height
        axes.errorbar(values_array, positions, xerr=errors, marker="o", linestyle="none", capsize=3, label=name)
    axes.set_yticks(range(len(rows)), labels=rows)
    axes.invert_yaxis()  # the headline on top
    axes.set_xlim(0, 1.02)
    axes.set_xlabel("F1 (0 to 1), bars: 95% bootstrap interval over reviews")
    axes.grid(alpha=0.3, axis="x")
    axes.legend(loc="best", fontsize=9)
    axes.set_title(f"Scores per tag\n{title}", fontsize=11)
    save_figure(figure, path)


def plot_tag_cooccurrence(path: Path, counts: Sequence[Sequence[int]], tag_names: Sequence[str], title: str) -> None:
    """Reviews holding both tags of each pair, and their share of the row tag's reviews (the diagonal: 100%)."""
    import numpy as np

    together = np.asarray(counts, dtype=float)
    own = np.diag(together)[:, None]
    shares = np.divide(together, own, out=np.zeros_like(together), where=own > 0)
    figure, axes = new_figure(CONFUSION_INCHES)
    image = axes.imshow(shares, cmap="Purples", vmin=0.0, vmax=1.0)
    figure.colorbar(image, ax=axes, shrink=0.8).set_label(
        "share of the row tag's reviews that also hold the column tag"
    )
    ticks = range(len(tag_names))
    axes.set_xticks(ticks, labels=tag_names, rotation=30 if len(tag_names) > 3 else 0, ha="center")
    axes.set_yticks(ticks, labels=tag_names)
    if len(tag_names) <= 12:  # past that, numbers in cells are too small to read
        for row in ticks:
            for column in ticks:
                color = "white" if shares[row, column] > 0.55 else "black"
                label = f"{int(together[row, column])}\n{shares[row, column]:.0%}"
                axes.text(column, row, label, ha="center", va="center", color=color, fontsize=8)
    axes.set_title(f"Tags together (true tags)\n{title}\neach cell: reviews, share of the row", fontsize=11)
    save_figure(figure, path)
