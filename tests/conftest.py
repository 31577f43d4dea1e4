"""Shared fixtures: a tiny BERT (2 layers, hidden 32) with the real packaged tokenizer."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

# The server tests' shared fixtures (served_run, token_server).
pytest_plugins = ["serving"]

# Tests never reach the Hugging Face Hub; fail fast instead of waiting on it.
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


def _own_cores_per_worker() -> None:
    """Give each xdist worker its own share of the cores, before torch is imported (its threads follow it).

    Two workers on two cores, each with torch's thread per core (and their child processes too), put four or
    more threads on two cores: tests/test_resume.py, test_any_split.py and test_exactness.py took 116 s so,
    89 s with a core and a thread each. Pinned, a run inside a test sees the cores it has, as on a machine of
    that size (one torch thread, its TF-IDF baseline inline); children inherit the pinning.
    """
    worker = os.environ.get("PYTEST_XDIST_WORKER", "")
    workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "0"))
    if not worker.startswith("gw") or workers < 2 or not hasattr(os, "sched_setaffinity"):
        return
    cores = sorted(os.sched_getaffinity(0))
    if len(cores) >= workers:
        os.sched_setaffinity(0, cores[int(worker[2:]) % workers :: workers])


_own_cores_per_worker()


@pytest.fixture(scope="session")
def tokenizer():
    """The real uncased WordPiece tokenizer of the packaged MiniLM model."""
    from transformers import AutoTokenizer

    from finetune.training.modeling import resolve_model_path

    return AutoTokenizer.from_pretrained(resolve_model_path("all-minilm-l6-v2"))


def save_tiny_bert(folder, tokenizer, dropout: float, initializer_range: float = 0.02):
    """A 2-layer BERT classifier (hidden 32, 3 labels) with the real tokenizer, saved in ``folder``."""
    import torch
    from transformers import BertConfig, BertForSequenceClassification

    torch.manual_seed(0)
    config = BertConfig(
        vocab_size=tokenizer.vocab_size,
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=2,
        intermediate_size=64,
        max_position_embeddings=128,
        hidden_dropout_prob=dropout,
        attention_probs_dropout_prob=dropout,
        num_labels=3,
        initializer_range=initializer_range,
    )
    BertForSequenceClassification(config).save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory, tokenizer):
    """A saved 2-layer BERT classifier (hidden 32, no dropout) plus tokenizer: a model folder recipes can name."""
    return save_tiny_bert(tmp_path_factory.mktemp("tiny-bert"), tokenizer, dropout=0.0)


@pytest.fixture(scope="session")
def tiny_dropout_model_dir(tmp_path_factory, tokenizer):
    """The same tiny BERT with BERT's usual dropout (0.1), for tests where the random state matters."""
    return save_tiny_bert(tmp_path_factory.mktemp("tiny-bert-dropout"), tokenizer, dropout=0.1)


@pytest.fixture(scope="session")
def tiny_varied_model_dir(tmp_path_factory, tokenizer):
    """The tiny BERT with weights drawn 25 times wider (initializer_range 0.5): its answers differ by review.

    At BERT's 0.02 the tiny model's logits differ by about 1e-4 from one review to another, and a run
    trained from it answers one label for every review, which a prediction test cannot tell from a bug.
    """
    return save_tiny_bert(tmp_path_factory.mktemp("tiny-bert-varied"), tokenizer, dropout=0.0, initializer_range=0.5)


# Session-wide: resuming, faults and evaluate tests all start from copies of this one run.
@pytest.fixture(scope="session")
def finished_run(tmp_path_factory, tiny_model_dir):
    """A finished 2-update run with checkpoint-1 and checkpoint-2 (each test works on a copy)."""
    from bad_input.common import run_recipe

    from finetune.cli import main

    folder = tmp_path_factory.mktemp("finished")
    assert main(["train", str(run_recipe(folder, tiny_model_dir))]) == 0
    return folder


@pytest.fixture
def run_copy(finished_run, tmp_path) -> Path:
    """A copy of ``finished_run``'s folder (recipe, data and run) in ``tmp_path``."""
    shutil.copytree(finished_run, tmp_path, dirs_exist_ok=True)
    recipe = tmp_path / "recipe.yaml"
    recipe.write_text(recipe.read_text().replace(str(finished_run), str(tmp_path)), encoding="utf-8")
    return tmp_path


def _signals_children_inherit() -> dict[str, tuple[bool, bool]]:
    """Whether SIGINT and SIGTERM are ignored, and whether blocked, here: a child started now inherits both."""
    import signal

    blocked = signal.pthread_sigmask(signal.SIG_BLOCK, [])
    return {
        signum.name: (signal.getsignal(signum) is signal.SIG_IGN, signum in blocked)
        for signum in (signal.SIGINT, signal.SIGTERM)
    }


@pytest.fixture(autouse=True)
def signals_left_as_found():
    """Each test leaves SIGINT and SIGTERM neither ignored nor blocked if it found them so.

    Left ignored or blocked, they would pass to every child a later test starts,
    and test_warm_processes.py's signal test would see a real child outlive its
    signal (as it did when the suite itself was started as a background job,
    which ignores SIGINT from the start: that test skips then). A leak fails
    the test that made it, by name.
    """
    before = _signals_children_inherit()
    yield
    after = _signals_children_inherit()
    assert after == before, f"SIGINT / SIGTERM (ignored, blocked) left as {after}, found as {before}"


@pytest.fixture(scope="session")
def tiny_regression_run(tmp_path_factory, tiny_model_dir):
    """A 2-epoch star-rating regression run of the tiny BERT (the ratings serve and export tests read it)."""
    from test_ratings_run import tiny_rating_run

    return tiny_rating_run(tmp_path_factory, tiny_model_dir, "regression")


@pytest.fixture(scope="session")
def tiny_ordinal_run(tmp_path_factory, tiny_model_dir):
    """A 2-epoch ordinal (CORN) run of the tiny BERT, as :func:`tiny_regression_run`."""
    from test_ratings_run import tiny_rating_run

    return tiny_rating_run(tmp_path_factory, tiny_model_dir, "ordinal")
