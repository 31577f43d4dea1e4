"""Contract 8: N processes with micro-batch b train exactly as one process with N x b (2 processes, gloo, CPU).

One torchrun launch of ``distributed_worker.py`` trains every case on 2
processes and saves what each rank ended with; the tests compare that with
test_exactness.py's plain-PyTorch reference (one full-batch SGD step per
window of 2 x b x n samples) and with ReviewTrainer on one process with 2 x b.
A second launch runs ``torchrun -m finetune train`` on a tiny recipe.
"""

from __future__ import annotations

import json
import math
import os
import re
import socket
import subprocess
import sys
import textwrap
from collections import Counter
from pathlib import Path

import pytest
import torch
from distributed_worker import (
    COVERAGE_SAMPLES,
    COVERAGE_STRATEGIES,
    EVAL_SAMPLES,
    EXACTNESS_CASES,
    TOKEN_LEVEL_CASES,
    case_dataset,
    run_evaluation,
    sample_rows,
)
from helpers import flat_parameters, review_dataset, tiny_recipe
from test_exactness import (
    assert_matches_reference,
    by_hand_balanced_weights,
    reference_full_batch_steps,
    trained_parameters,
)
from transformers import BertForSequenceClassification, DataCollatorWithPadding

from finetune import ReviewTrainer

PROCESSES = 2
TESTS = Path(__file__).parent
TORCHRUN = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={PROCESSES}"]


def launch(command: list[str], cwd: Path, env: dict[str, str] | None = None) -> str:
    """Run a launcher's ``command``; its stdout and stderr, or fail with their tail."""
    done = subprocess.run(
        command,
        cwd=cwd,
        env={**os.environ, **(env or {})},
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, f"exit status {done.returncode}:\n{(done.stdout + done.stderr)[-4000:]}"
    return done.stdout + done.stderr


@pytest.fixture(scope="module")
def ranks(tmp_path_factory, tiny_model_dir) -> list[dict]:
    """What each of the 2 ranks of distributed_worker.py saved."""
    out = tmp_path_factory.mktemp("distributed")
    # --standalone: torchrun finds a free port itself, so parallel test runs do not collide.
    launch([*TORCHRUN, str(TESTS / "distributed_worker.py"), str(tiny_model_dir), str(out)], cwd=TESTS)
    return [torch.load(out / f"rank{rank}.pt") for rank in range(PROCESSES)]


@pytest.fixture(scope="module")
def initial_model(tiny_model_dir):
    return BertForSequenceClassification.from_pretrained(tiny_model_dir)


def relative_difference(trained: torch.Tensor, other: torch.Tensor) -> float:
    return float((trained - other).norm() / other.norm())


@pytest.mark.parametrize("name", EXACTNESS_CASES)
def test_two_processes_equal_one_full_batch_step_per_window(ranks, initial_model, tokenizer, tmp_path, name):
    case = EXACTNESS_CASES[name]
    dataset = case_dataset(tokenizer, case)
    collator = DataCollatorWithPadding(tokenizer)
    weights = None if case.class_weighting == "none" else by_hand_balanced_weights(dataset["labels"], 3)
    window_samples = PROCESSES * case.micro_batch * case.n
    reference = reference_full_batch_steps(
        initial_model, dataset, collator, window_samples, epochs=case.epochs, class_weights=weights
    )
    one_process = trained_parameters(
        ReviewTrainer,
        initial_model,
        dataset,
        collator,
        tmp_path,
        PROCESSES * case.micro_batch,
        case.n,
        epochs=case.epochs,
        class_weighting=case.class_weighting,
        micro_batch_tokens=case.micro_batch_tokens,
        padding_free=case.padding_free,
    )
    trained = ranks[0]["cases"][name]["parameters"]
    print(f"{name}: 2 processes x {case.micro_batch} vs 1 process x {PROCESSES * case.micro_batch}: ", end="")
    print(f"relative difference {relative_difference(trained, one_process):.3g}; vs the reference: ", end="")
    assert_matches_reference(trained, reference, flat_parameters(initial_model))
    print(f"{name}: 1 process x {PROCESSES * case.micro_batch} vs the reference: ", end="")
    assert_matches_reference(one_process, reference, flat_parameters(initial_model))


@pytest.mark.parametrize("name", TOKEN_LEVEL_CASES)
def test_two_processes_sum_a_token_level_windows_items_over_both(ranks, name):
    """Contract 10 with 8: a causal LM's, token classifier's or tagger's window is shared by its items on both ranks."""
    from test_every_loss_exact import FAMILIES, reference_steps

    family, samples, micro_batch, n = TOKEN_LEVEL_CASES[name][:4]
    make_model, make_rows = FAMILIES[family]
    model = make_model()
    reference = reference_steps(model, make_rows(samples, seed=samples), PROCESSES * micro_batch * n)
    assert torch.equal(ranks[0]["token_level"][name], ranks[1]["token_level"][name])
    assert_matches_reference(ranks[0]["token_level"][name], reference, flat_parameters(model))


def test_token_budget_cases_cut_windows_into_different_piece_counts_per_rank(ranks):
    """The token-budget cases test what they claim: the ranks made different numbers of forward passes."""
    for name, case in EXACTNESS_CASES.items():
        if case.micro_batch_tokens is not None:
            steps = [results["cases"][name]["micro_steps"] for results in ranks]
            assert steps[0] != steps[1], name


def test_ranks_end_with_identical_parameters(ranks):
    for name in EXACTNESS_CASES:
        assert torch.equal(ranks[0]["cases"][name]["parameters"], ranks[1]["cases"][name]["parameters"]), name


@pytest.mark.parametrize("name", EXACTNESS_CASES)
def test_one_gradient_all_reduce_and_one_scheduler_step_per_update(ranks, name):
    case = EXACTNESS_CASES[name]
    global_micro_batches = math.ceil(case.samples / (PROCESSES * case.micro_batch))
    expected_updates = case.epochs * math.ceil(global_micro_batches / case.n)
    for rank, results in enumerate(ranks):
        counts = results["cases"][name]
        print(
            f"{name} rank {rank}: {counts['updates']} updates, {counts['gradient_all_reduces']} gradient all-reduces "
            f"({counts['buckets']} buckets), {counts['scheduler_steps']} scheduler steps, "
            f"{counts['window_reductions']} window sample-count reductions"
        )
        assert counts["updates"] == expected_updates
        if case.sync_each_batch:
            assert counts["gradient_all_reduces"] == case.epochs * global_micro_batches
        else:
            assert counts["gradient_all_reduces"] == expected_updates  # none on the micro-steps inside a window
        assert counts["scheduler_steps"] == expected_updates
        assert counts["window_reductions"] == expected_updates


@pytest.mark.parametrize("strategy", COVERAGE_STRATEGIES)
def test_every_sample_trains_once_per_epoch_on_one_rank(ranks, tokenizer, strategy):
    """Shuffled orders with dropout on: ranks still shard one order, so no sample trains twice or never."""
    dataset = review_dataset(tokenizer, COVERAGE_SAMPLES, seed=1)
    every_sample = Counter(sample_rows(DataCollatorWithPadding(tokenizer)(list(dataset))))
    epochs = [rank["coverage"][strategy] for rank in ranks]
    assert len(epochs[0]) == len(epochs[1]) == 3
    for rank_0, rank_1 in zip(*epochs):
        assert Counter(rank_0 + rank_1) == every_sample
    assert epochs[0][0] != epochs[0][1]  # the order does change between epochs


def test_evaluation_counts_each_validation_sample_once(ranks, tiny_model_dir, tokenizer, tmp_path):
    """even_batches pads the last evaluation batch with repeats; gather_for_metrics drops them."""
    two = ranks[0]["evaluation"]
    one = run_evaluation(tiny_model_dir, tokenizer, tmp_path)
    print(f"eval_loss: 1 process {one['metrics']['eval_loss']:.6f}, 2 processes {two['metrics']['eval_loss']:.6f}")
    assert two["metrics"]["eval_samples"] == EVAL_SAMPLES  # what compute_metrics was given
    assert two["labels"] == one["labels"]
    assert two["predictions"] == one["predictions"]
    # Scored sorted by length across both ranks, handed to compute_metrics in dataset order.
    assert two["labels"] == list(review_dataset(tokenizer, EVAL_SAMPLES, seed=2)["labels"])
    assert ranks[1]["evaluation"]["labels"] == two["labels"]  # every rank gathers the same
    # Close, not equal: Trainer's eval loss is per batch, and rank 1's padded last batch holds a repeat.
    assert two["metrics"]["eval_loss"] == pytest.approx(one["metrics"]["eval_loss"], rel=1e-3)


# Written into the launched processes' PYTHONPATH: each rank lists what it writes under the run folder.
RECORD_WRITES = """
import os
import sys

_RUN = os.environ["RECORD_WRITES_UNDER"]
_LOG = os.path.join(os.environ["RECORD_WRITES_TO"], "writes-rank" + os.environ.get("RANK", "launcher") + ".txt")
_WRITE_FLAGS = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_APPEND | os.O_TRUNC
_EVENTS = {"os.mkdir", "os.rename", "os.replace", "os.remove", "os.rmdir", "shutil.rmtree"}


def _record(event, args):
    if event == "open":
        path, mode, flags = args
        if not (isinstance(mode, str) and any(c in mode for c in "wax+") or (flags or 0) & _WRITE_FLAGS):
            return
    elif event not in _EVENTS:
        return
    else:
        path = args[0]
    if isinstance(path, (str, os.PathLike)) and os.path.abspath(path).startswith(_RUN):
        with open(_LOG, "a") as log:  # outside _RUN, so not recorded itself
            log.write(f"{event} {os.path.relpath(os.path.abspath(path), _RUN)}\\n")


sys.addaudithook(_record)
"""


# What rank 1 may write under the run folder. Trainer saves each rank's RNG state in the checkpoint
# (rng_state_<rank>.pth, for an exact resume), making the folder first if rank 0 has not yet.
# Every process writes its own RNG state into the checkpoint being written (for exact resume).
RANK_1_MAY_WRITE = re.compile(r"^os\.mkdir \.?checkpoint-\d+(\.partial)?$")
LAUNCHERS = {
    "torchrun": TORCHRUN,
    "accelerate": [
        *(sys.executable, "-m", "accelerate.commands.launch", "--multi_gpu", "--num_machines", "1"),
        *("--num_processes", str(PROCESSES), "--mixed_precision", "no", "--dynamo_backend", "no"),
    ],
}


def recording_writes(tmp_path: Path, run_dir: Path) -> tuple[Path, dict[str, str]]:
    """A hooks folder whose sitecustomize records every process's writes under ``run_dir``, and its environment."""
    hooks = tmp_path / "hooks"
    hooks.mkdir()
    (hooks / "sitecustomize.py").write_text(textwrap.dedent(RECORD_WRITES), encoding="utf-8")
    return hooks, {
        "PYTHONPATH": os.pathsep.join(filter(None, [str(hooks), os.environ.get("PYTHONPATH")])),
        "RECORD_WRITES_UNDER": str(run_dir),
        "RECORD_WRITES_TO": str(hooks),
    }


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


@pytest.mark.slow
@pytest.mark.parametrize("launcher", LAUNCHERS)
def test_readme_launch_trains_as_two_processes_on_the_cpu_writing_from_rank_0_only(tmp_path, tiny_model_dir, launcher):
    """``torchrun ... -m finetune train`` and ``accelerate launch ... -m finetune train`` as the README has them.

    No use_cpu in the recipe: both processes once set themselves up as a lone process 0, and the second met
    the first's folder lock ("another finetune run"). One launch a launcher checks both that and the writes.
    """
    run_dir = tmp_path / "run"
    recipe = tiny_recipe(tmp_path, tiny_model_dir, run_dir, use_cpu=None)
    hooks, env = recording_writes(tmp_path, run_dir)
    command = LAUNCHERS[launcher]
    if launcher == "accelerate":
        command = [*command, "--main_process_port", str(free_port())]
    output = launch(
        [*command, "-m", "finetune", "train", str(recipe), "--num_train_epochs", "1"], cwd=tmp_path, env=env
    )

    assert output.count("no GPU found: the 2 launched processes train together on the CPU") == 1  # rank 0 only
    state = json.loads((run_dir / "trainer_state.json").read_text())
    train_rows = json.loads((run_dir / "finetune_run.json").read_text())["data_report"]["rows"]["train"]
    global_micro_batches = math.ceil(train_rows / (PROCESSES * 16))
    # n_accumulate 2, micro-batch 16 on each of 2 processes, one epoch; one process alone would take 15 updates.
    assert state["global_step"] == math.ceil(global_micro_batches / 2) == 8
    assert json.loads((run_dir / "report" / "metrics.json").read_text())["batch"]["world_size"] == PROCESSES
    assert sorted(path.name for path in run_dir.glob("*.safetensors")) == ["model.safetensors"]
    assert (run_dir / f"checkpoint-{state['global_step']}").is_dir()
    assert json.loads((run_dir / "test_report.json").read_text())["num_samples"] == 111  # each test review once
    # Python-level writes only: torch.save and safetensors write from C++ and Rust, in Trainer's
    # own saving, which it leaves to the main process (should_save) but for the RNG states.
    rank_0 = (hooks / "writes-rank0.txt").read_text().splitlines()
    rank_1_log = hooks / "writes-rank1.txt"
    rank_1 = rank_1_log.read_text().splitlines() if rank_1_log.exists() else []
    print(f"{launcher}: rank 0 wrote {len(rank_0)} times under the run folder, rank 1 {rank_1}")
    assert any(line.endswith("trainer_state.json") for line in rank_0)
    assert any(line.endswith("all_results.json") for line in rank_0)
    unexpected = [line for line in rank_1 if not RANK_1_MAY_WRITE.match(line)]
    assert unexpected == []
