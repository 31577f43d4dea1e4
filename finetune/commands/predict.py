"""``finetune predict``: a label and its probability for every review in a file or on stdin."""

from __future__ import annotations

import csv
import json
import sys
from pathlib import Path
from typing import Any

from ..errors import FinetuneError

_TEXT_COLUMN_GUESSES = ("text", "review", "content", "body", "sentence")


def predict(
    model_path: str,
    input_path: str | None = None,
    output_path: str | None = None,
    text_column: str | None = None,
    batch_size: int = 32,
    overwrite: bool = False,
) -> list[dict[str, Any]]:
    """Classify reviews from ``input_path`` (CSV or JSONL; stdin lines when None or '-').

    Writes the input rows plus ``label`` and ``probability`` (and one
    ``prob_<class>`` column per class) to ``output_path`` in the input's
    format, or CSV to stdout.
    """
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    from ..data.encoding import ReviewEncoding
    from ..evaluation.inference import predict_probabilities
    from ..training.runs import find_run_config, require_model_folder

    model_dir = Path(model_path)
    require_model_folder(model_dir)
    if output_path and Path(output_path).exists() and not overwrite:
        raise FinetuneError(f"{output_path} already exists; pass --overwrite to replace it or choose another --output")

    run_config = find_run_config(model_dir) or {}
    data_fields = run_config.get("data", {})
    rows, input_format = _read_rows(input_path)
    column = text_column or _guess_text_column(rows, data_fields.get("text_column"), input_path)
    texts = _model_inputs(rows, column, data_fields.get("title_column"), data_fields.get("clean_text", True))

    model = AutoModelForSequenceClassification.from_pretrained(model_dir, use_safetensors=True)
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    encoding = ReviewEncoding.from_fields(data_fields)
    probabilities = predict_probabilities(model, tokenizer, texts, batch_size, encoding)

    label_names = [model.config.id2label[index] for index in range(model.config.num_labels)]
    results = []
    for row, probs in zip(rows, probabilities):
        best = int(probs.argmax())
        result = {**row, "label": label_names[best], "probability": round(float(probs[best]), 6)}
        result.update({f"prob_{name}": round(float(p), 6) for name, p in zip(label_names, probs)})
        results.append(result)
    _write_rows(results, output_path, input_format)
    return results


def _read_rows(input_path: str | None) -> tuple[list[dict[str, Any]], str]:
    if input_path in (None, "-"):
        lines = [line.strip() for line in sys.stdin if line.strip()]
        if not lines:
            raise FinetuneError("no reviews on stdin; pipe one review per line or pass --input FILE")
        return [{"text": line} for line in lines], "csv"
    path = Path(input_path)
    if not path.is_file():
        raise FinetuneError(f"input file not found: {input_path}; check the path")
    suffix = path.suffix.lower()
    if suffix in (".csv", ".tsv"):
        with path.open(newline="", encoding="utf-8-sig") as handle:
            rows = list(csv.DictReader(handle, delimiter="\t" if suffix == ".tsv" else ","))
        for row_number, row in enumerate(rows, start=2):
            if None in row:  # DictReader files surplus fields under None
                raise FinetuneError(
                    f"{input_path} row {row_number} has more fields than the header; quote texts that contain commas"
                )
        input_format = "csv"
    elif suffix in (".jsonl", ".json"):
        try:
            rows = [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]
        except json.JSONDecodeError as error:
            raise FinetuneError(f"{input_path} is not JSON Lines (line {error.lineno}); write one object per line")
        input_format = "jsonl"
    else:
        raise FinetuneError(f"{input_path}: unsupported input type; use .csv, .tsv or .jsonl (or stdin)")
    if not rows:
        raise FinetuneError(f"{input_path} has no rows; give it at least one review")
    return rows, input_format


def _guess_text_column(rows: list[dict[str, Any]], recipe_column: str | None, input_path: str | None) -> str:
    columns = list(rows[0])
    for candidate in (recipe_column, *_TEXT_COLUMN_GUESSES):
        if candidate and candidate in columns:
            return candidate
    raise FinetuneError(f"{input_path} has no text column (columns: {', '.join(columns)}); pass --text_column NAME")


def _model_inputs(rows: list[dict[str, Any]], column: str, title_column: str | None, clean: bool) -> list[str]:
    """Each row's text cleaned and joined to its title as in training, so the model sees what it learned from."""
    from ..data.cleaning import clean_texts
    from ..data.splits import join_title

    if any(column not in row for row in rows):
        raise FinetuneError(f"a row has no '{column}' column; pass --text_column NAME")
    bodies = [str(row[column] or "") for row in rows]
    titles = [str(row.get(title_column) or "") if title_column else "" for row in rows]
    if clean:
        bodies, titles = clean_texts(bodies), clean_texts(titles)
    return [join_title(title.strip(), body.strip()) for title, body in zip(titles, bodies)]


def _write_rows(results: list[dict[str, Any]], output_path: str | None, input_format: str) -> None:
    if output_path is None:
        _write_csv(results, sys.stdout)
        return
    path = Path(output_path)
    output_format = "jsonl" if path.suffix.lower() in (".jsonl", ".json") else "csv" if path.suffix else input_format
    with path.open("w", newline="", encoding="utf-8") as handle:
        if output_format == "jsonl":
            for result in results:
                handle.write(json.dumps(result, ensure_ascii=False) + "\n")
        else:
            _write_csv(results, handle)
    print(f"wrote {len(results)} predictions to {output_path}", file=sys.stderr)


def _write_csv(results: list[dict[str, Any]], handle: Any) -> None:
    writer = csv.DictWriter(handle, fieldnames=list(results[0]))
    writer.writeheader()
    writer.writerows(results)
