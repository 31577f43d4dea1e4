"""``finetune bench`` on a tiny model: the report's fields, and the same samples for every system.

No timing is asserted; the bench's figures are for reading (see the README).
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
from helpers import tiny_recipe

from finetune.bench.flops import training_flops
from finetune.cli import main


@pytest.fixture(autouse=True)
def small_gemm_peak(monkeypatch):
    """The bench's GEMM peak from products of 256, not 2048: 5.4 s a bench on one pinned core, and 15 s in
    bf16 on a CPU without its native kernels, for a figure these tests only read as positive. The peak's
    own test (below) calls measure_gemm_peak with its sizes."""
    from finetune.bench import command as bench

    monkeypatch.setattr(bench, "CPU_GEMM_PRODUCTS", (256, 1))


def tiny_bench_recipe(folder: Path, model_dir: Path) -> Path:
    return tiny_recipe(folder, model_dir, folder / "unused", per_device_train_batch_size=4)


def tiny_speed_specs(folder: Path, model_dir: Path, updates: int) -> list:
    """The bench's three training systems for the tiny recipe, as ``finetune bench`` plans them, to run here."""
    from dataclasses import asdict

    from finetune.bench.command import _speed_specs
    from finetune.config.recipes import load_recipe
    from finetune.data.encoding import ReviewEncoding
    from finetune.data.splits import load_review_data, tokenize_splits
    from finetune.training.modeling import load_tokenizer

    recipe = str(tiny_bench_recipe(folder, model_dir))
    run = load_recipe(recipe, [])
    data = load_review_data(run.data, seed=run.training.seed)
    tokenizer = load_tokenizer(run.model, run.data.truncation_side)
    encoded, _ = tokenize_splits(data.splits, tokenizer, ReviewEncoding.from_fields(asdict(run.data)))
    return _speed_specs(recipe, [], run.training, encoded["train"], folder, data.label_names, updates, [])


def test_speed_report_fields_and_same_samples(tmp_path, tiny_model_dir, capsys, monkeypatch):
    import tempfile

    output = tmp_path / "bench.json"
    # Every scratch folder, the child processes' included, goes here, and none may be left behind.
    scratch = tmp_path / "tmp"
    scratch.mkdir()
    monkeypatch.setenv("TMPDIR", str(scratch))
    monkeypatch.setattr(tempfile, "tempdir", str(scratch))
    # ReviewTrainer's own settings go to its row alone; the others train at the recipe's (one bench run checks
    # both the report and that split; ReviewTrainer at the recipe's settings: the class weights test below).
    recipe = str(tiny_bench_recipe(tmp_path, tiny_model_dir))
    own = ["--padding_free", "true", "--micro_batch_tokens=4096"]
    status = main(["bench", recipe, "--updates", "2", "--output", str(output), "--count_ops", *own])
    assert status == 0
    report = json.loads(output.read_text())
    assert [row["system"] for row in report["systems"]] == ["ReviewTrainer", "stock Trainer", "classic loop"]
    assert report["review_trainer_overrides"] == ["--padding_free", "true", "--micro_batch_tokens", "4096"]
    rows = {row["system"]: row for row in report["systems"]}
    # Packed rows compute no padding; one piece holds a whole window of 4 x 2 short reviews.
    assert rows["ReviewTrainer"]["pad_fraction"] == 0.0
    assert rows["ReviewTrainer"]["forward_passes_per_update"] == 1
    # Stock Trainer still pads per micro-batch of 4 and makes n = 2 forward passes an update, as the loop does.
    assert rows["stock Trainer"]["pad_fraction"] > 0.0
    assert rows["stock Trainer"]["forward_passes_per_update"] == 2
    assert rows["classic loop"]["forward_passes_per_update"] == 2
    for row in report["systems"]:
        assert row["updates"] == 2 and row["samples"] == 2 * 4 * 2
        for field in ("samples_per_second", "real_tokens_per_second", "pad_fraction", "peak_rss_mib", "gflops", "mfu"):
            assert row[field] > 0 or (field == "pad_fraction" and row[field] >= 0), field
    assert report["same_samples"] is True
    assert len({tuple(row["sample_ids"]) for row in report["systems"]}) == 1
    assert (report["device"], report["precision"], report["gemm_peak_dtype"]) == ("cpu", "fp32", "fp32")
    # Host syncs per update: ReviewTrainer reads the device once an update, stock Trainer at least once per
    # micro-batch (n = 2 here), the classic loop not at all (it reads its loss after the loop only).
    syncs = {row["system"]: row["host_syncs_per_update"] for row in report["systems"]}
    assert syncs == {"ReviewTrainer": 1, "stock Trainer": pytest.approx(syncs["stock Trainer"]), "classic loop": 0}
    assert syncs["stock Trainer"] >= 2
    # The model's own: transformers' padding check, once a forward, in the two systems that pad; a packed row
    # has no padding to check.
    model_syncs = {row["system"]: row["model_host_syncs_per_update"] for row in report["systems"]}
    assert model_syncs == {"ReviewTrainer": 0, "stock Trainer": 2, "classic loop": 2}
    assert all("peak_gpu_memory_mib" not in row for row in report["systems"])
    # --count_ops: every training system counted the operators it dispatched (in a run apart from the timed one).
    assert all(row["dispatched_ops_per_update"] > 100 for row in report["systems"])
    # The classic loop pads every review to max_length; the others pad per batch.
    classic = report["systems"][2]
    assert classic["pad_fraction"] > max(row["pad_fraction"] for row in report["systems"][:2])
    assert set(report["ratios"]) == {
        "real_tokens_per_second vs stock Trainer",
        "real_tokens_per_second vs classic loop",
    }
    assert report["inference"]["max_abs_probability_difference"] < 1e-4
    # finetune predict from the saved fp32 model and from its int8 export, on the same held-out reviews.
    prediction = report["prediction"]
    assert set(prediction["systems"]) == {
        "predict fp32",
        "predict int8",
        "predict int8 + fp32 fallback",
        "predict int8 weights only",
    }
    for row in prediction["systems"].values():
        assert row["reviews"] == 111 and row["reviews_per_second"] > 0 and row["peak_rss_mib"] > 0
    ratios = prediction["int8_vs_fp32"]
    assert ratios["speedup"] > 0 and 0.0 <= ratios["agreement"] <= 1.0 and ratios["backend"] == "openvino"
    assert ratios == prediction["vs_fp32"]["predict int8"]
    # The fallback row is the same int8 model with its close calls scored again in fp32: never further from fp32.
    fallback = prediction["vs_fp32"]["predict int8 + fp32 fallback"]
    assert fallback["agreement"] >= ratios["agreement"]
    assert fallback["mean_probability_change"] <= ratios["mean_probability_change"]
    assert 0 <= fallback["rescored_in_fp32"] <= 111
    weights = prediction["vs_fp32"]["predict int8 weights only"]
    assert weights["speedup"] > 0 and 0.0 <= weights["agreement"] <= 1.0 and weights["backend"] == "openvino"
    text = capsys.readouterr().out
    assert "| host syncs/update (loop + model) | dispatched ops/update |" in text and "| ReviewTrainer |" in text
    assert "ReviewTrainer also with --padding_free true --micro_batch_tokens 4096 (the others at the recipe's)" in text
    # Ratios come first, then the table.
    assert text.index("ReviewTrainer real tokens/s vs stock Trainer") < text.index("| system |")
    assert "int8 prediction (openvino) vs fp32:" in text and "| predict int8 |" in text
    assert "int8 weights only prediction (openvino) vs fp32:" in text
    # (A library writes a one-line session file there; the bench's own scratch space is folders.)
    assert [path for path in scratch.iterdir() if path.is_dir()] == []


def test_review_trainer_flags_are_split_from_the_shared_ones():
    from finetune.bench.command import split_review_trainer_flags
    from finetune.errors import FinetuneError

    shared, ours = split_review_trainer_flags(
        ["--bf16", "true", "--micro_batch_tokens", "512", "--padding_free=true", "--learning_rate", "1e-4"]
    )
    assert shared == ["--bf16", "true", "--learning_rate", "1e-4"]
    assert ours == ["--micro_batch_tokens", "512", "--padding_free", "true"]
    with pytest.raises(FinetuneError, match=r"--micro_batch_tokens needs a value, e\.g\. --micro_batch_tokens 4096"):
        split_review_trainer_flags(["--micro_batch_tokens"])


def test_each_system_pads_as_it_would_in_a_run(tokenizer):
    from transformers import DataCollatorWithPadding

    from finetune.bench.systems import RecordingCollator
    from finetune.data.collation import PaddingCollator

    # ReviewTrainer swaps the DataCollatorWithPadding finetune train gives it; stock Trainer pads with it as given.
    assert type(RecordingCollator(tokenizer, review_trainer=True).collate) is PaddingCollator
    assert type(RecordingCollator(tokenizer).collate) is DataCollatorWithPadding
    classic = RecordingCollator(tokenizer, pad_to_max_length=64).collate
    assert type(classic) is DataCollatorWithPadding and (classic.padding, classic.max_length) == ("max_length", 64)


@pytest.mark.parametrize("workers", [0, 2])
def test_the_recording_collator_records_what_loader_workers_collate(tokenizer, tmp_path, workers):
    from datasets import Dataset

    from finetune.bench.systems import RecordingCollator

    texts = ["great", "not good at all", "fine I guess", "awful", "the best thing I ever bought", "meh", "ok"]
    encoded = [tokenizer(text)["input_ids"] for text in texts]
    samples = Dataset.from_dict(
        {"input_ids": encoded, "sample_id": list(range(100, 107)), "length": [len(ids) for ids in encoded]}
    )
    collator = RecordingCollator(tokenizer, record_dir=str(tmp_path))
    loader = torch.utils.data.DataLoader(samples, batch_size=2, num_workers=workers, collate_fn=collator)
    batches = [batch["input_ids"].shape for batch in loader]
    sample_ids, lengths, worker_batches = collator.recorded()
    # Every sample once, with its own length, whichever process collated it.
    assert sorted(zip(sample_ids, lengths, strict=True)) == [(100 + i, len(ids)) for i, ids in enumerate(encoded)]
    assert worker_batches == (len(batches) if workers else 0) and len(batches) == 4


@pytest.mark.parametrize("checkpointing", [False, True])
def test_the_classic_loop_checkpoints_activations_when_asked(tiny_model_dir, tokenizer, tmp_path, checkpointing):
    """Activation checkpointing as the trainers get it from Trainer: a layer's forward runs again in the backward."""
    from helpers import quiet_args, review_dataset
    from transformers import BertForSequenceClassification

    from finetune.bench.systems import RecordingCollator, _classic_loop, _Discard

    samples = review_dataset(tokenizer, 4)
    samples = samples.add_column("sample_id", list(range(4))).add_column(
        "length", [len(ids) for ids in samples["input_ids"]]
    )
    model = BertForSequenceClassification.from_pretrained(tiny_model_dir, num_labels=3)
    layer_forwards = []
    # A hook inside the first layer: the recomputation skips the layer's own hooks, not those of its parts.
    model.bert.encoder.layer[0].attention.register_forward_hook(lambda *_: layer_forwards.append(1))
    args = quiet_args(tmp_path, per_device_train_batch_size=4, gradient_accumulation_steps=1)
    args.activation_checkpointing = checkpointing
    collator = RecordingCollator(tokenizer, record_dir=str(tmp_path))
    _classic_loop(model, samples, collator, args, updates=1, queue=_Discard())
    # One micro-batch: one forward of the layer, and with checkpointing its recomputation in the backward.
    assert len(layer_forwards) == (2 if checkpointing else 1)


def test_memory_mode_runs_each_accumulation_setting(tmp_path, tiny_model_dir):
    output = tmp_path / "memory.json"
    recipe = tiny_bench_recipe(tmp_path, tiny_model_dir)
    assert main(["bench", str(recipe), "--memory", "--updates", "1", "--output", str(output)]) == 0
    runs = json.loads(output.read_text())["runs"]
    assert [(run["micro_batch"], run["gradient_accumulation_steps"]) for run in runs] == [
        (4, 1),
        (4, 4),
        (4, 16),
        (16, 1),
    ]
    assert [run["samples"] for run in runs] == [64, 64, 64, 64]  # the same samples in each
    assert [run["updates"] for run in runs] == [16, 4, 1, 4]
    assert all(run["peak_rss_mib"] > 0 for run in runs)


def test_recipe_options_reach_every_system_and_class_weights_come_from_the_whole_train_split(tmp_path, tiny_model_dir):
    """Balanced class weights, bf16 autocast, fused AdamW and a loader worker (all run on the CPU too), in one bench."""
    # One update of one review holds one class of three: weights computed from the bench's own
    # reviews would be refused ("needs training reviews of every class"), as a shipped recipe's were.
    output = tmp_path / "bench.json"
    recipe = str(tiny_bench_recipe(tmp_path, tiny_model_dir))
    flags = ["--updates", "1", "--no_inference", "--output", str(output), "--bf16", "true"]
    fields = [
        "--class_weighting",
        "balanced",
        "--per_device_train_batch_size",
        "1",
        "--gradient_accumulation_steps",
        "1",
    ]
    workers = ["--dataloader_num_workers", "1"]
    assert main(["bench", recipe, *flags, *fields, "--optim", "adamw_torch_fused", *workers]) == 0
    report = json.loads(output.read_text())
    assert [row["samples"] for row in report["systems"]] == [1, 1, 1]
    # Each system's one batch came from its loader worker (the classic loop's included), recorded there.
    assert report["loader_workers"] == 1
    assert [row["batches_collated_in_loader_workers"] for row in report["systems"]] == [1, 1, 1]
    assert [row["updates"] for row in report["systems"]] == [1, 1, 1]
    assert all(np.isfinite(row["train_loss"]) for row in report["systems"])
    # Every system trains in bf16, and the peak its MFU is read against is bf16's.
    assert (report["precision"], report["gemm_peak_dtype"]) == ("bf16", "bf16")
    # n / (classes x count) over the recipe's whole train split, counted here from its labels.
    from sklearn.utils.class_weight import compute_class_weight

    from finetune.config.recipes import load_recipe
    from finetune.data.splits import load_review_data

    run = load_recipe(recipe, fields)
    labels = load_review_data(run.data, seed=run.training.seed).splits["train"]["labels"]
    expected = compute_class_weight("balanced", classes=np.arange(3), y=np.asarray(labels))
    assert np.allclose(report["class_weights"], expected)


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has a CUDA device")
def test_cuda_without_a_gpu_is_a_one_line_error(tmp_path, tiny_model_dir, capsys):
    recipe = str(tiny_bench_recipe(tmp_path, tiny_model_dir))
    assert main(["bench", recipe, "--device", "cuda"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [
        "error: --device cuda: no CUDA device is available to this process; run on a machine with a GPU "
        "(and a CUDA build of PyTorch) or pass --device cpu"
    ]


def test_counting_operators_of_compiled_systems_is_a_one_line_error(tmp_path, tiny_model_dir, capsys):
    recipe = str(tiny_bench_recipe(tmp_path, tiny_model_dir))
    assert main(["bench", recipe, "--count_ops", "--torch_compile_backend", "aot_eager"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1] == (
        "error: --count_ops counts operators eagerly (a dispatch mode turns torch.compile off), so compiled "
        "systems would be counted uncompiled; drop --count_ops or torch_compile"
    )


def test_too_many_updates_is_a_one_line_error(tmp_path, tiny_model_dir, capsys):
    assert main(["bench", str(tiny_bench_recipe(tmp_path, tiny_model_dir)), "--updates", "1000"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1].startswith("error: --updates 1000 needs 8000 training reviews") and "pass --updates" in err[-1]


def test_flop_count_by_hand():
    # One layer, hidden 2, 10 non-embedding parameters, two sequences of 3 and 1 tokens:
    # forward = (2*10*3 + 4*1*2*9) + (2*10*1 + 4*1*2*1) = 132 + 28; training = 3x.
    assert training_flops([3, 1], non_embedding=10, num_layers=1, hidden_size=2) == pytest.approx(3 * 160)


def test_the_gemm_peak_grows_its_products_only_while_a_round_stays_short(monkeypatch):
    """Products double from 256 while a round of them would fit the time given, and stop at ``size``.

    bf16 on a CPU without native kernels multiplies at about 1.5 GFLOP/s: a
    fixed 2048 took the bench 5 minutes there before it trained anything.
    """
    from finetune.bench import flops

    sizes = []
    real_operands = flops._gemm_operands
    monkeypatch.setattr(flops, "_gemm_operands", lambda size, *rest: sizes.append(size) or real_operands(size, *rest))
    assert flops.measure_gemm_peak(size=2048, repeats=1, rounds=1, round_seconds=0.0) > 0
    assert sizes == [256]  # no round is short enough to grow into
    sizes.clear()
    assert flops.measure_gemm_peak(size=512, repeats=1, rounds=1, round_seconds=1e9) > 0
    assert sizes == [256, 512]  # grown as far as size, and no further
    sizes.clear()
    flops.measure_gemm_peak(size=100, repeats=1, rounds=1)
    assert sizes == [100]  # a size under the first probe's is used as it is


def test_prediction_rows_by_hand():
    """Agreement, probability change and near ties of a made-up fp32 / int8 pair, worked out by hand."""
    from finetune.bench.command import _format_prediction, _prediction_rows

    def result(system, probabilities, seconds):
        return {
            "system": system,
            "samples": 4,
            "seconds": seconds,
            "probabilities": probabilities,
            "predictions": [max(range(2), key=row.__getitem__) for row in probabilities],
            "labels": [0, 1, 1, 0],
            "peak_rss_bytes": 100 * 1024 * 1024,
            "backend": "openvino",
        }

    # fp32: review 2 is a near tie (0.52 / 0.48), review 3 is not (0.60 / 0.40).
    fp32 = result("predict fp32", [[0.9, 0.1], [0.2, 0.8], [0.52, 0.48], [0.6, 0.4]], 2.0)
    # int8 tips the tie and moves review 0 by 0.1.
    int8 = result("predict int8", [[0.8, 0.2], [0.2, 0.8], [0.48, 0.52], [0.6, 0.4]], 0.5)
    report = _prediction_rows(fp32, [int8])
    assert report["near_ties"] == 1
    ratios = report["int8_vs_fp32"]
    assert ratios["speedup"] == pytest.approx(4.0)
    assert ratios["agreement"] == 0.75
    # fp32 gets reviews 0, 1, 3 right (0.75); int8 gets 0, 1, 2, 3 (1.0): +25 points.
    assert ratios["accuracy_points"] == pytest.approx(25.0)
    # |change| per entry: 0.1, 0.1 (review 0), 0.04, 0.04 (review 2), the rest 0: mean 0.28 / 8.
    assert ratios["mean_probability_change"] == pytest.approx(0.035)
    assert ratios["max_probability_change"] == pytest.approx(0.1)
    assert "rescored_in_fp32" not in ratios

    # With an fp32 fallback, the count of reviews it scored again is reported, a zero included.
    fallback = {**result("predict int8 + fp32 fallback", fp32["probabilities"], 1.0), "rescored_in_fp32": 0}
    report = _prediction_rows(fp32, [int8, fallback])
    assert report["vs_fp32"]["predict int8 + fp32 fallback"]["rescored_in_fp32"] == 0
    assert report["vs_fp32"]["predict int8 + fp32 fallback"]["agreement"] == 1.0
    assert "0 reviews scored again in fp32" in "\n".join(_format_prediction(report))


def test_a_run_timed_apart_from_the_counted_one_starts_from_the_same_weights(tmp_path, tiny_model_dir):
    """On a GPU the bench counts syncs in a first run and times a second: both must train the same thing.

    Timed apart on the CPU here, each system's timed run must give the loss and samples of a single run
    from fresh weights (a second run that started from the first run's trained weights would not), and
    carry the first run's sync counts.
    """
    from finetune.bench.systems import _train_system

    class Updates:
        def __init__(self) -> None:
            self.count = 0

        def put(self, item) -> None:
            self.count += item == ("progress", 1)

    specs = tiny_speed_specs(tmp_path, tiny_model_dir, updates=2)
    for spec in specs:
        spec.timed_apart = False
        alone = _train_system(spec, Updates())
        spec.timed_apart = True
        updates = Updates()
        apart = _train_system(spec, updates)
        assert updates.count == 2, spec.system  # only the timed run moves the bench's bar
        assert apart["train_loss"] == pytest.approx(alone["train_loss"], rel=1e-6), spec.system
        assert apart["sample_ids"] == alone["sample_ids"] and apart["lengths"] == alone["lengths"]
        assert apart["host_syncs"] == alone["host_syncs"] is not None
        assert apart["model_host_syncs"] == alone["model_host_syncs"]


def test_a_trainer_s_set_up_is_timed_apart_from_its_updates(tmp_path, tiny_model_dir, monkeypatch):
    """What a trainer does before its first forward (here a callback's slow on_train_begin) is set-up, not rate.

    No speed is asserted: the slow start must land in ``setup_seconds``, and the two spans may not overlap
    (together they fit inside the call that measured them).
    """
    import time

    from finetune.bench import systems as bench_systems

    slow_start = 3.0
    with_progress = bench_systems._progress_callback

    def slowly_starting(queue):
        callback = with_progress(queue)
        callback.on_train_begin = lambda *args, **kwargs: time.sleep(slow_start)
        return callback

    monkeypatch.setattr(bench_systems, "_progress_callback", slowly_starting)
    spec = tiny_speed_specs(tmp_path, tiny_model_dir, updates=2)[0]
    assert spec.system == bench_systems.REVIEW_TRAINER
    called = time.perf_counter()
    result = bench_systems._train_system(spec, bench_systems._Discard())
    call_seconds = time.perf_counter() - called
    assert result["setup_seconds"] >= slow_start
    assert result["seconds"] > 0
    assert result["seconds"] + result["setup_seconds"] <= call_seconds


def test_counted_operators_follow_the_forward_passes_an_update_makes(tmp_path, tiny_model_dir):
    """--count_ops: one forward an update (a window cut by tokens) dispatches fewer operators than two.

    Stock Trainer makes n = 2 forward and backward passes an update on the tiny recipe; ReviewTrainer with a
    token budget that holds the whole window makes one, padded as stock pads: the same layers run half as
    often, so it must count fewer operators, and a run that counts nothing reports none.
    """
    from finetune.bench.systems import REVIEW_TRAINER, STOCK_TRAINER, _train_system

    class Discard:
        def put(self, item) -> None:
            pass

    specs = {spec.system: spec for spec in tiny_speed_specs(tmp_path, tiny_model_dir, updates=2)}
    specs[REVIEW_TRAINER].extra_overrides = ["--micro_batch_tokens", "100000"]
    counted = {}
    for system in (REVIEW_TRAINER, STOCK_TRAINER):
        specs[system].count_ops = True
        result = _train_system(specs[system], Discard())
        assert result["updates"] == 2
        counted[system] = result["dispatched_ops"]
    assert 0 < counted[REVIEW_TRAINER] < 0.75 * counted[STOCK_TRAINER]
    specs[STOCK_TRAINER].count_ops = False
    assert _train_system(specs[STOCK_TRAINER], Discard())["dispatched_ops"] is None


COMPILED_CALLS = []


def counting_backend(graph, example_inputs):
    """aot_eager, counting each call of a compiled graph: whether a run ran compiled code."""
    from torch._dynamo.backends.debugging import aot_eager

    compiled = aot_eager(graph, example_inputs)  # the registry's entry is replaced, not this function

    def call(*args):
        COMPILED_CALLS.append(1)
        return compiled(*args)

    return call


def test_compiled_systems_are_compiled_in_an_untimed_run_first(tmp_path, tiny_model_dir, monkeypatch):
    """With torch_compile every system (the classic loop too) is compiled, before its timed run, from the same weights.

    The timed run must compile nothing (its seconds would include compiling), run compiled code, and train as
    the uncompiled run does. Syncs are counted in a run of their own, as on a GPU: three runs on one model.
    """
    import torch._dynamo
    from torch._dynamo.backends import registry
    from torch._dynamo.utils import counters

    from finetune.bench.systems import _train_system

    registry.lookup_backend("aot_eager")  # registered on first use
    monkeypatch.setitem(registry._COMPILER_FNS, "aot_eager", counting_backend)  # Accelerate takes known names only

    class CallsWhileTimed:  # the timed run alone reports progress: calls from its first update on
        def __init__(self) -> None:
            self.at_first_update = None

        def put(self, item) -> None:
            self.at_first_update = self.at_first_update or len(COMPILED_CALLS)

    for spec in tiny_speed_specs(tmp_path, tiny_model_dir, updates=3):
        spec.timed_apart = True
        plain = _train_system(spec, CallsWhileTimed())
        assert plain["graphs_compiled_while_timed"] is None
        torch._dynamo.reset()
        spec.overrides = [*spec.overrides, "--torch_compile_backend", "aot_eager"]
        before = counters["stats"]["unique_graphs"]
        timed = CallsWhileTimed()
        compiled = _train_system(spec, timed)
        assert counters["stats"]["unique_graphs"] > before, spec.system
        assert compiled["graphs_compiled_while_timed"] == 0, spec.system
        assert len(COMPILED_CALLS) > timed.at_first_update, f"{spec.system}'s timed run ran uncompiled"
        assert compiled["train_loss"] == pytest.approx(plain["train_loss"], rel=1e-5), spec.system
        assert compiled["sample_ids"] == plain["sample_ids"]


def _messages(queue) -> list[tuple[str, object]]:
    """Everything on the bench's queue once its processes have ended."""
    import queue as queues

    messages = []
    while True:
        try:
            messages.append(queue.get(timeout=2))
        except queues.Empty:
            return messages


def test_a_system_that_fails_is_reported_and_no_later_system_runs(tmp_path, tiny_model_dir):
    import multiprocessing
    import warnings
    from dataclasses import replace

    from finetune.bench.systems import launch_children

    first, second, _ = tiny_speed_specs(tmp_path, tiny_model_dir, updates=1)
    broken = replace(first, dataset_path=str(tmp_path / "no such folder"))
    queue = multiprocessing.get_context("fork").Queue()
    with warnings.catch_warnings():  # the launcher's warning filter stays in it
        launch_children([broken, second], queue)
    messages = _messages(queue)
    assert [kind for kind, _ in messages] == ["error"]
    assert messages[0][1].startswith("ReviewTrainer: ")


def test_a_system_killed_before_it_reports_is_named_with_its_signal(tmp_path, tiny_model_dir, monkeypatch):
    """A child killed by the system (out of memory, say) puts nothing: the launcher says so and stops there."""
    import multiprocessing
    import os
    import signal
    import warnings

    from finetune.bench import systems as bench_systems

    monkeypatch.setattr(bench_systems, "run_in_child", lambda spec, queue: os.kill(os.getpid(), signal.SIGKILL))
    specs = tiny_speed_specs(tmp_path, tiny_model_dir, updates=1)
    queue = multiprocessing.get_context("fork").Queue()
    with warnings.catch_warnings():
        bench_systems.launch_children(specs, queue)
    assert _messages(queue) == [("error", "ReviewTrainer: its process ended (killed by signal 9) before it reported")]


def test_a_launcher_gone_without_a_word_is_a_one_line_error_not_a_hang():
    import multiprocessing

    from finetune.bench.command import _next_message
    from finetune.errors import FinetuneError

    class KilledLauncher:
        exitcode = -9

        def is_alive(self) -> bool:
            return False

    empty = multiprocessing.get_context("spawn").Queue()
    with pytest.raises(FinetuneError, match=r"launcher process ended with exit code -9 .*check free memory"):
        _next_message(empty, KilledLauncher())
