"""A trained run as a teacher: its checked model, its soft labels (cached), and the student's training set.

:class:`TeacherRun` opens and checks the teacher's folder and computes its
log-probabilities once per teacher, text and encoding (:mod:`finetune.data.array_cache`);
:class:`Distillation` is what the run's stages need to train a student of it
(``finetune distill``, :mod:`finetune.commands.distill`).
"""

from __future__ import annotations

import functools
import hashlib
import json
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from ..data.columns import column_values
from ..errors import FinetuneError

UNLABELED_FORMATS = (".csv", ".tsv", ".jsonl", ".json")


@dataclass
class TeacherRun:
    """A trained run folder used as a teacher: its model folder, class order, encoding and test scores."""

    folder: Path
    class_names: list[str]
    encoding_fields: dict[str, Any]
    base_model: str
    test_scores: dict[str, float] | None
    model: Any = None  # loaded by the model check, used for the soft labels

    @classmethod
    def open(cls, path: str) -> TeacherRun:
        """Check that ``path`` holds a trained run whose PyTorch model works, and read what distillation needs."""
        from ..evaluation.inference import is_exported_folder
        from ..training.model_check import check_model_folder, refuse_rating_model, refuse_tag_model
        from ..training.runs import RUN_CONFIG, find_run_config, require_model_folder

        folder = Path(path)
        if not folder.is_dir():
            raise FinetuneError(f"teacher run {path} is not a folder; pass a run folder made by 'finetune train'")
        if is_exported_folder(folder):
            raise FinetuneError(
                f"teacher {path} is an int8 export; pass the run folder it was exported from (its fp32 model)"
            )
        require_model_folder(folder)
        run_config = find_run_config(folder)
        if run_config is None:
            raise FinetuneError(
                f"teacher {path} has a model but no {RUN_CONFIG}, so how it reads reviews is unknown; "
                "pass a run folder made by 'finetune train'"
            )
        # Soft sigmoid targets per tag are not built: the loss, the cache and the trade read a softmax.
        refuse_tag_model(
            folder, "finetune distill reads", "train a small model on the tags themselves with finetune train"
        )
        refuse_rating_model(folder, "finetune distill reads")
        config = json.loads((folder / "config.json").read_text(encoding="utf-8"))
        id2label = config.get("id2label") or {}
        class_names = [id2label[str(index)] for index in range(len(id2label))] if id2label else []
        test = _read_json(folder / "test_report.json")
        scores = {"accuracy": test["accuracy"], "macro_f1": test["macro_f1"]} if test else None
        base_model = (run_config.get("model") or {}).get("model_name_or_path", "unknown")
        # Weights that do not fit, a NaN, reordered classes: refused here, before the student's folder exists.
        model = check_model_folder(folder)
        return cls(folder.resolve(), class_names, run_config.get("data") or {}, str(base_model), scores, model)

    def train_student(self, recipe: str | None, overrides: list[str] | None) -> dict[str, Any]:
        """Train the recipe's model as this teacher's student; returns its metrics, as ``train`` does."""
        from ..config.recipes import load_recipe
        from ..data.splits import load_review_data
        from ..data.unlabeled import unused_reviews
        from .run import train

        run = load_recipe(recipe, overrides)
        if run.data.class_names:
            self.check_classes(run.data.class_names, "the recipe")
        texts = read_unlabeled_reviews(run.data) if run.data.unlabeled_file else []
        # The splits as the run will draw them, read here so that what is wrong with them (a test review the
        # teacher trained on, a source with nothing left to label) is said before anything is written.
        data = load_review_data(run.data, seed=run.training.seed)
        if data.multi_label:
            raise FinetuneError(
                f"{recipe or 'the recipe'} trains several tags per review (multi_label), and finetune distill is for "
                "one label per review for now; train it with finetune train"
            )
        self.check_unseen(data)
        unused = None
        if run.data.unlabeled_from:
            unused = unused_reviews(run.data, data)
            texts += unused.texts
        cache = _soft_label_cache()
        distillation = Distillation(
            self, run.data.unlabeled_file, texts, cache, sentences=run.data.unlabeled_sentences, unused=unused
        )
        metrics = train(recipe, overrides, distillation=distillation)
        trade = None
        # Under torchrun every process trains the student; the first measures the trade.
        if run.training.distill_trade_reviews and "test" in data.splits and run.training.process_index == 0:
            from .trade import measure_trade

            trade = measure_trade(
                self,
                Path(run.training.output_dir),
                data,
                run.training.per_device_eval_batch_size,
                run.training.distill_trade_reviews,
                cache,
            )
        if trade is None:
            _print_comparison(self, metrics)
        return metrics

    def check_unseen(self, data: Any) -> None:
        """Refuse a student whose test reviews trained the teacher: its scores would not be a test of either.

        The teacher's splits are read back as its run drew them; where its data cannot be read any more
        (a file moved), a warning says the check was not made.
        """
        from ..training.runs import find_run_config, load_run_data

        if "test" not in data.splits:
            return
        config = find_run_config(self.folder) or {}
        try:
            teacher_train = (
                set(column_values(load_run_data(config).splits["train"], "text")) if config.get("data") else set()
            )
        except (FinetuneError, OSError, KeyError, TypeError) as error:
            print(
                f"warning: the teacher's training reviews could not be read back ({error}), so whether the "
                "recipe's test reviews are among them was not checked",
                file=sys.stderr,
            )
            return
        seen = sum(text in teacher_train for text in column_values(data.splits["test"], "text"))
        if seen:
            raise FinetuneError(
                f"{seen} of the recipe's {len(data.splits['test'])} test reviews trained the teacher {self.folder}, "
                f"so neither model's test score would be a test; set split_seed: {self.split_seed} (the seed that "
                "drew the teacher's splits) so the student's splits are the teacher's"
            )

    @property
    def split_seed(self) -> int:
        """The seed that drew the teacher's subsets and held-out splits: a student that shares it shares them."""
        from ..data.splits import drawing_seed
        from ..training.runs import find_run_config

        config = find_run_config(self.folder) or {}
        return drawing_seed((config.get("data") or {}).get("split_seed"), config.get("seed", 42))

    @property
    def dataset_name(self) -> str | None:
        """The catalog dataset the teacher trained on, or None for files of the user's own."""
        return self.encoding_fields.get("dataset_name")

    def check_classes(self, class_names: list[str], where: str) -> None:
        """Refuse a student whose classes (or their order) differ from the teacher's."""
        if list(class_names) != self.class_names:
            raise FinetuneError(
                f"the teacher {self.folder} has the classes {self.class_names}, {where} has {list(class_names)}; "
                "distill into the same classes in the same order (set class_names or label_bins to match)"
            )

    @functools.cached_property
    def fingerprint(self) -> str:
        """SHA-256 of the teacher's config and weights: the soft labels depend on nothing else of it."""
        digest = hashlib.sha256()
        for name in [*sorted(path.name for path in self.folder.glob("*.safetensors")), "config.json"]:
            digest.update(name.encode())
            with (self.folder / name).open("rb") as handle:
                for block in iter(lambda: handle.read(1 << 20), b""):
                    digest.update(block)
        return digest.hexdigest()

    @functools.cached_property
    def tokenizer_fingerprint(self) -> str:
        """SHA-256 of the teacher's tokenizer files: another vocabulary reads the same texts as other tokens."""
        from ..training.runs import TOKENIZER_FILE_PREFIXES, model_files

        digest = hashlib.sha256()
        for path in model_files(self.folder):
            if path.name.startswith(TOKENIZER_FILE_PREFIXES):
                digest.update(path.name.encode())
                digest.update(path.read_bytes())
        return digest.hexdigest()

    def soft_labels(self, texts: list[str], batch_size: int, cache_dir: Path | None) -> tuple[np.ndarray, str]:
        """The teacher's log-probabilities for ``texts`` (one row each), from the cache or computed once.

        The cache's key is everything the values depend on: the teacher's
        weights and tokenizer, how reviews are encoded, and the texts
        (:mod:`finetune.data.array_cache`); a cached array that is not the one
        stored (changed, cut short, unreadable) is computed again. Returns the
        values and a one-line note of where they came from.
        """
        from ..data.array_cache import ArrayCache, cache_key
        from ..data.encoding import ReviewEncoding

        encoding = ReviewEncoding.from_fields(self.encoding_fields)
        key = cache_key(
            kind="teacher log-probabilities, clipped at 1e-12",
            teacher=self.fingerprint,
            tokenizer=self.tokenizer_fingerprint,
            encoding=encoding.__dict__,
            texts=texts,
        )
        cache = ArrayCache(cache_dir) if cache_dir is not None else None
        what = f"teacher soft labels for {len(texts)} reviews"
        why_not = None
        if cache is not None:
            values, why_not = cache.read(key, (len(texts), len(self.class_names)))
            if values is not None:
                return values, f"{what} read from the cache ({cache.path(key)})"
        started = time.perf_counter()
        values = self._compute(texts, batch_size, encoding)
        note = f"{what} computed in {time.perf_counter() - started:.0f}s"
        if cache is None:
            return values, note
        if why_not is not None:
            # Never trained on: a cached copy that fails a check is named, with why, and replaced.
            note = note.replace(" computed in ", " computed again in ") + f", as the cached copy {why_not}"
        # A cache that cannot be written costs the next student a recomputation, not this run.
        not_stored = cache.write(key, values)
        return values, note + (f" (not cached: {not_stored})" if not_stored else f"; cached in {cache.path(key)}")

    def _compute(self, texts: list[str], batch_size: int, encoding: Any) -> np.ndarray:
        from transformers import AutoTokenizer

        from ..evaluation.inference import predict_probabilities

        tokenizer = AutoTokenizer.from_pretrained(self.folder)
        probabilities = predict_probabilities(self.model, tokenizer, texts, batch_size, encoding)
        self.model = None  # the student trains next: free the teacher's memory
        if not np.isfinite(probabilities).all():
            raise FinetuneError(
                f"the teacher {self.folder} gives non-finite probabilities; check it with 'finetune evaluate "
                f"{self.folder}' or train it again"
            )
        # Log-probabilities: the distillation loss softens them at its temperature (a constant shift is harmless).
        return np.log(np.clip(probabilities.astype(np.float64), 1e-12, 1.0))


@dataclass
class Distillation:
    """What ``finetune train`` needs to train a student: the teacher, its settings and the unlabelled reviews."""

    teacher: TeacherRun
    unlabeled_file: str | None = None
    unlabeled_texts: list[str] = field(default_factory=list)
    cache_dir: Path | None = None
    sentences: bool = False  # also the training reviews' sentences (unlabeled_sentences)
    unused: Any = None  # a :class:`finetune.data.unlabeled.UnusedReviews`: unlabeled_from's reviews, at the end
    notes: list[str] = field(default_factory=list)
    sentence_count: int = 0  # how many sentences the last attach added

    def attach(self, data: Any, encoded_train: Any, tokenizer: Any, encoding: Any, batch_size: int) -> Any:
        """The student's training set: the train split and the unlabelled reviews, each with the teacher's view."""
        import datasets

        from ..data.splits import tokenize_splits
        from ..training.distillation import NO_LABEL, TEACHER_COLUMN

        self.teacher.check_classes(data.label_names, "the recipe's data")
        train_texts = column_values(data.splits["train"], "text")
        unlabeled_texts = list(self.unlabeled_texts)
        if self.unused is not None:
            self.notes.append(self.unused.note())
        if self.sentences:
            from ..data.sentences import MIN_SENTENCE_WORDS, review_sentences

            # Only the train split is split: a validation or test sentence here would leak into training.
            sentences = review_sentences(train_texts)
            self.sentence_count = len(sentences)
            unlabeled_texts += sentences
            self.notes.append(
                f"unlabeled_sentences: {len(sentences)} sentences of at least {MIN_SENTENCE_WORDS} words from "
                f"the {len(train_texts)} training reviews, labelled by the teacher"
            )
        soft, note = self.teacher.soft_labels(train_texts + unlabeled_texts, batch_size, self.cache_dir)
        self.notes.append(note)
        train = encoded_train.add_column(TEACHER_COLUMN, soft[: len(train_texts)].tolist())
        if not unlabeled_texts:
            return train
        unlabeled = datasets.Dataset.from_dict({"text": unlabeled_texts, "labels": [NO_LABEL] * len(unlabeled_texts)})
        encoded, _ = tokenize_splits(datasets.DatasetDict({"train": unlabeled}), tokenizer, encoding)
        unlabeled = encoded["train"].add_column(TEACHER_COLUMN, soft[len(train_texts) :].tolist())
        unlabeled = unlabeled.select_columns(train.column_names).cast(train.features)
        return datasets.concatenate_datasets([train, unlabeled])

    def record(self, alpha: float, temperature: float) -> dict[str, Any]:
        """What ``finetune_run.json`` keeps of the distillation (the model card reads it)."""
        return {
            "distillation": {
                "teacher": str(self.teacher.folder),
                "teacher_base_model": self.teacher.base_model,
                "teacher_fingerprint": self.teacher.fingerprint,
                "teacher_test": self.teacher.test_scores,
                "alpha": alpha,
                "temperature": temperature,
                "unlabeled_file": str(Path(self.unlabeled_file).resolve()) if self.unlabeled_file else None,
                "unlabeled_reviews": len(self.unlabeled_texts),
                "unlabeled_from": self.unused.source if self.unused else None,
                "unlabeled_from_reviews": len(self.unused.texts) if self.unused else 0,
                "unlabeled_sentences": self.sentence_count,
            }
        }


def read_unlabeled_reviews(data_args: Any) -> list[str]:
    """The non-empty review texts of ``unlabeled_file``, read and cleaned as training reads its reviews."""
    from ..data.sources import read_table
    from ..data.splits import review_texts

    path = Path(data_args.unlabeled_file)
    if not path.is_file():
        raise FinetuneError(f"unlabeled_file {path} not found; check the path, or drop unlabeled_file")
    if path.suffix.lower() not in UNLABELED_FORMATS:
        raise FinetuneError(
            f"unlabeled_file {path} is not a CSV, TSV or JSONL file (by its name); convert it or rename it"
        )
    table = read_table(path)
    if data_args.text_column not in table.column_names:
        raise FinetuneError(
            f"unlabeled_file {path} has no column '{data_args.text_column}' (text_column); its columns are "
            f"{', '.join(table.column_names)}; rename the column or set text_column"
        )
    has_titles = bool(data_args.title_column) and data_args.title_column in table.column_names
    titles = table[data_args.title_column] if has_titles else None
    texts, _ = review_texts(table[data_args.text_column], titles, data_args.clean_text)
    kept = [text for text in texts if text]
    if not kept:
        raise FinetuneError(f"unlabeled_file {path} has no non-empty review in '{data_args.text_column}'")
    return kept


def _soft_label_cache() -> Path | None:
    """Where teachers' soft labels are kept: ``<cache>/soft-labels`` (none when the cache cannot be made)."""
    from ..fetching.wheels import cache_root

    try:
        folder = cache_root(kind="soft-label") / "soft-labels"
        folder.mkdir(parents=True, exist_ok=True)
    except (OSError, FinetuneError):
        return None
    return folder


def _print_comparison(teacher: TeacherRun, metrics: dict[str, Any]) -> None:
    test = metrics.get("test")
    if not test or not teacher.test_scores:
        return
    gap = test["accuracy"] - teacher.test_scores["accuracy"]
    print(
        f"student test accuracy {test['accuracy']:.3f}, macro-F1 {test['macro_f1']:.3f}; teacher "
        f"({teacher.base_model}) {teacher.test_scores['accuracy']:.3f}, {teacher.test_scores['macro_f1']:.3f} "
        f"on its own test split ({gap * 100:+.1f} points of accuracy)",
        file=sys.stderr,
    )


def _read_json(path: Path) -> Any:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
