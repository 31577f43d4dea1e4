"""``finetune bench``: ReviewTrainer, stock Trainer and the classic loop side by side, on one recipe.

Each system trains the recipe's model from the same seed on the same samples
for the same number of updates, with the same micro-batch, n_accumulate and
optimizer, in its own process (see :mod:`finetune.bench.systems`). The report
gives throughput in samples and real (non-pad) tokens, the pad fraction, peak
resident memory, achieved GFLOP/s from :mod:`finetune.bench.flops`, and that as a
share of a matrix-multiply peak measured here at start (MFU). Ratios against
ReviewTrainer come first. Timings are for reading, never for asserting. Each system is
timed from its first forward to the end of its last update; what came before
(a trainer's accelerator, optimizer, loader and callbacks, paid once a run) is
its set-up column, outside the rates.

``--device cuda`` trains the three systems on the GPU, in the recipe's
precision (``--bf16 true``, or ``--fp16 true`` with a GradScaler, as
overrides), against a GEMM peak measured there in that precision, and adds
each system's peak GPU memory. Every system's row counts its host syncs per
update (see :mod:`finetune.bench.host_syncs`): the loop's own, the model's
forward's, and on CUDA every sync CUDA's sync debug mode reports. Speed-up
settings are overrides too (``--optim adamw_torch_fused``, ``--torch_compile
true``), which the classic loop follows where it can (fused AdamW, precision).
The prediction rows stay on the CPU.

``--memory`` runs ReviewTrainer alone at micro-batch b with n in {1, 4, 16}
and at 4b with n = 1, on identical micro-batches and the same samples (``--updates``
counts updates at n = 16), to show that accumulation costs no activation memory.
"""

from __future__ import annotations

import json
import multiprocessing
import os
import shutil
import sys
import tempfile
from dataclasses import asdict, dataclass
from pathlib import Path
from queue import Empty
from typing import Any

from tqdm.auto import tqdm

from ..config.output_files import OUTPUT_FLAG, check_output_file, write_output_text
from ..data.columns import column_values
from ..errors import FinetuneError
from .systems import (
    CLASSIC_LOOP,
    INFERENCE,
    PREDICT_FP32,
    PREDICT_INT8,
    PREDICT_INT8_FALLBACK,
    PREDICT_INT8_WEIGHTS,
    PREDICTION_EXPORTS,
    REVIEW_TRAINER,
    STOCK_TRAINER,
    SystemSpec,
    launch_children,
)

TRAINING_SYSTEMS = (REVIEW_TRAINER, STOCK_TRAINER, CLASSIC_LOOP)
# Settings only ReviewTrainer has: given to the bench, they set ReviewTrainer's row alone, so that it is
# measured against stock Trainer and the classic loop at the recipe's own settings.
REVIEW_TRAINER_FLAGS = ("--micro_batch_tokens", "--padding_free", "--fused_attention")
MEMORY_ACCUMULATION_STEPS = (1, 4, 16)
MIB = 1024 * 1024
# Two classes' fp32 probabilities closer than this make a "near tie" in the prediction report.
NEAR_TIE = 0.05


def bench(
    recipe: str | None,
    overrides: list[str] | None = None,
    updates: int = 20,
    output: str | None = None,
    memory: bool = False,
    inference: bool = True,
    device: str = "cpu",
    count_ops: bool = False,
) -> dict[str, Any]:
    """Run the bench on ``recipe`` and return (and print, and save to ``output``) its report.

    ``device``: where the training systems run. ``count_ops``: count their operators too (in a run apart).
    """
    import torch

    _check_options(updates, device, output)
    run, overrides, ours = _load_checked(recipe, list(overrides or []), count_ops)
    args = run.training
    data, tokenizer, encoded = _read_once(run)
    model_shape = _model_shape(run, len(data.label_names))
    precision = "bf16" if args.bf16 else "fp16" if args.fp16 else "fp32"
    gemm_peak, load = _machine(precision, device)
    workdir = Path(tempfile.mkdtemp(prefix="finetune-bench-data-"))
    try:
        bench_run = _BenchRun(recipe, overrides, ours, run, data, tokenizer, encoded, workdir, updates)
        specs = _memory_or_speed_specs(bench_run, memory, inference)
        class_weights = _class_weights(args, encoded, len(data.label_names))
        results = _run_children(_on_device(specs, device, class_weights, count_ops))
    finally:
        shutil.rmtree(workdir, ignore_errors=True)

    report = {
        "recipe": recipe,
        "overrides": overrides,
        "review_trainer_overrides": ours,
        "mode": "memory" if memory else "speed",
        "device": device if device == "cpu" else f"cuda: {torch.cuda.get_device_name()}",
        "precision": precision,
        "compiled": _compiled(args),
        "class_weights": class_weights,
        "updates": updates,
        "micro_batch": args.per_device_train_batch_size,
        "gradient_accumulation_steps": args.gradient_accumulation_steps,
        "max_length": run.data.max_length,
        "threads": torch.get_num_threads(),
        "loader_workers": args.dataloader_num_workers,
        "load_average_at_start": load,
        "gemm_peak_gflops": gemm_peak,
        "gemm_peak_dtype": precision,
        "model": model_shape,
        "flop_formula": "3 x sum over samples of (2 N s + 4 L d s^2), s = real tokens (see finetune/flops.py)",
    }
    print(_add_rows(report, results, memory, model_shape, gemm_peak))
    if output:
        write_output_text(output, json.dumps(report, indent=2) + "\n", instead=OUTPUT_FLAG)
        print(f"saved to {output}", file=sys.stderr)
    return report


def _compiled(args: Any) -> str | None:
    """How the recipe has the systems compiled (``torch.compile``'s backend and mode), or None."""
    if not args.torch_compile:
        return None
    return f"torch.compile, backend {args.torch_compile_backend}, mode {args.torch_compile_mode or 'default'}"


def _read_once(run: Any) -> tuple[Any, Any, Any]:
    """The same samples for every system, tokenized once: the data, the tokenizer, the tokenized splits."""
    from ..data.encoding import ReviewEncoding
    from ..data.splits import load_review_data, tokenize_splits
    from ..training.modeling import load_tokenizer

    data = load_review_data(run.data, seed=run.training.seed)
    tokenizer = load_tokenizer(run.model, run.data.truncation_side)
    encoded, _ = tokenize_splits(data.splits, tokenizer, ReviewEncoding.from_fields(asdict(run.data)))
    return data, tokenizer, encoded


def _on_device(specs: list[SystemSpec], device: str, class_weights: Any, count_ops: bool = False) -> list[SystemSpec]:
    """``specs`` set to run on ``device`` with the recipe's class weights (None: none), counting operators or not."""
    for spec in specs:
        spec.device = device
        spec.count_ops = count_ops
        if class_weights is not None:
            spec.class_weights = [float(w) for w in class_weights]
    return specs


def _load_checked(recipe: str | None, overrides: list[str], count_ops: bool) -> tuple[Any, list[str], list[str]]:
    """The recipe's run for the systems, with the shared flags and ReviewTrainer's own, each checked."""
    from ..config.recipes import load_recipe

    overrides, ours = split_review_trainer_flags(overrides)
    run = load_recipe(recipe, overrides)
    load_recipe(recipe, overrides + ours)  # checks ReviewTrainer's own settings before anything runs
    if count_ops and run.training.torch_compile:
        # Under a dispatch mode torch.compile runs the model eagerly: the count would be the uncompiled one's.
        raise FinetuneError(
            "--count_ops counts operators eagerly (a dispatch mode turns torch.compile off), so compiled "
            "systems would be counted uncompiled; drop --count_ops or torch_compile"
        )
    return run, overrides, ours


def _check_options(updates: int, device: str, output: str | None) -> None:
    """Refuse no updates, a CUDA device that is not there, and an output file that cannot be written."""
    import torch

    if updates < 1:
        raise FinetuneError(f"--updates must be >= 1 (got {updates}); try --updates 20")
    if device == "cuda" and not torch.cuda.is_available():
        raise FinetuneError(
            "--device cuda: no CUDA device is available to this process; run on a machine with a GPU "
            "(and a CUDA build of PyTorch) or pass --device cpu"
        )
    if output:
        check_output_file(output)


def _model_shape(run: Any, num_labels: int) -> dict[str, int]:
    """The model's shape for the FLOP count; built from its config, since no weights are needed here."""
    from transformers import AutoConfig, AutoModelForSequenceClassification

    from ..training.modeling import resolve_model_path
    from .flops import non_embedding_parameters

    config = AutoConfig.from_pretrained(resolve_model_path(run.model.model_name_or_path), num_labels=num_labels)
    model = AutoModelForSequenceClassification.from_config(config)
    return {
        "non_embedding_parameters": non_embedding_parameters(model),
        "num_layers": config.num_hidden_layers,
        "hidden_size": config.hidden_size,
    }


# The GEMM peak's products, size and how many a round: a GPU needs bigger products (and more of them) to
# reach its peak than 2 CPU cores. The tests of the report shrink the CPU's (the peak has a test of its own).
GPU_GEMM_PRODUCTS = (8192, 20)
CPU_GEMM_PRODUCTS = (2048, 8)


def _machine(precision: str, device: str) -> tuple[float, float]:
    """This machine's measured matrix-product peak (GFLOP/s) at ``precision``, and its load average now."""
    import torch

    from .flops import measure_gemm_peak

    gemm_dtype = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}[precision]
    gemm_size, gemm_repeats = GPU_GEMM_PRODUCTS if device == "cuda" else CPU_GEMM_PRODUCTS
    gemm_peak = measure_gemm_peak(gemm_size, gemm_repeats, device=device, dtype=gemm_dtype)
    load = os.getloadavg()[0]
    if load > 0.5 * (os.cpu_count() or 1):
        # Timings are only comparable on an otherwise idle machine.
        print(f"warning: load average {load:.1f} on {os.cpu_count()} cores; timings will be noisy", file=sys.stderr)
    return gemm_peak, load


@dataclass
class _BenchRun:
    """What every system of one bench is made from: the recipe, its flags, the data read and tokenized once."""

    recipe: str | None
    overrides: list[str]  # the flags every system takes
    ours: list[str]  # ReviewTrainer's own flags
    run: Any
    data: Any
    tokenizer: Any
    encoded: Any
    workdir: Path
    updates: int


def _memory_or_speed_specs(bench_run: _BenchRun, memory: bool, inference: bool) -> list[SystemSpec]:
    """The systems to run, each as a ``SystemSpec``: ReviewTrainer's memory runs, or the speed comparison."""
    from ..data.sources import progress_bars

    recipe, overrides, ours, data = bench_run.recipe, bench_run.overrides, bench_run.ours, bench_run.data
    args, workdir, updates, train = (
        bench_run.run.training,
        bench_run.workdir,
        bench_run.updates,
        bench_run.encoded["train"],
    )
    with progress_bars(False):  # "Saving the dataset" bars would bury the bench's own
        if memory:
            # Only ReviewTrainer runs here, so its own settings join the recipe's.
            micro_batch = args.per_device_train_batch_size
            return _memory_specs(recipe, overrides + ours, train, workdir, data.label_names, micro_batch, updates)
        specs = _speed_specs(recipe, overrides, args, train, workdir, data.label_names, updates, ours)
        held_out = "test" if "test" in data.splits else "validation"
        if inference:
            path = workdir / "inference"
            data.splits[held_out].select_columns(["text", "labels"]).save_to_disk(str(path))
            specs.append(SystemSpec(INFERENCE, recipe, overrides, str(path), data.label_names, updates))
            train_texts = list(data.splits["train"]["text"])
            specs += _prediction_specs(
                bench_run.run, recipe, overrides, bench_run.tokenizer, data.label_names, str(path), workdir, train_texts
            )
    return specs


def _class_weights(args: Any, encoded: Any, num_labels: int) -> Any:
    """The class weights the recipe asks for (None without), given to every system alike."""
    from ..data.class_weights import class_weights_for

    return class_weights_for(
        getattr(args, "class_weighting", "none"), column_values(encoded["train"], "labels"), num_labels
    )


def _add_rows(
    report: dict[str, Any], results: list[dict[str, Any]], memory: bool, model_shape: dict[str, int], gemm_peak: float
) -> str:
    """Add each system's row (and the ratios between them) to ``report``; returns the report as a table."""
    if memory:
        report["runs"] = [_memory_row(result) for result in results]
        return format_memory_report(report)
    training = [result for result in results if result["system"] in TRAINING_SYSTEMS]
    report["systems"] = [_speed_row(result, model_shape, gemm_peak) for result in training]
    report["same_samples"] = len({tuple(result["sample_ids"]) for result in training}) == 1
    report["ratios"] = _ratios(report["systems"])
    inference_results = [result for result in results if result["system"] == INFERENCE]
    if inference_results:
        report["inference"] = _inference_row(inference_results[0])
    by_system = {result["system"]: result for result in results}
    if PREDICT_FP32 in by_system:
        exports = [by_system[name] for name in PREDICTION_EXPORTS if name in by_system]
        report["prediction"] = _prediction_rows(by_system[PREDICT_FP32], exports)
    return format_speed_report(report)


def split_review_trainer_flags(overrides: list[str]) -> tuple[list[str], list[str]]:
    """``overrides`` split in two: those every system takes, and ReviewTrainer's own (``REVIEW_TRAINER_FLAGS``).

    A flag is followed by its value (``--padding_free true``) or joined to it (``--padding_free=true``).
    """
    shared: list[str] = []
    ours: list[str] = []
    index = 0
    while index < len(overrides):
        flag = overrides[index]
        name = flag.split("=", 1)[0]
        if name not in REVIEW_TRAINER_FLAGS:
            shared.append(flag)
            index += 1
            continue
        if "=" in flag:
            ours += [name, flag.split("=", 1)[1]]
            index += 1
        elif index + 1 < len(overrides):
            ours += [flag, overrides[index + 1]]
            index += 2
        else:
            raise FinetuneError(f"{flag} needs a value, e.g. {flag} {'4096' if 'tokens' in flag else 'true'}")
    return shared, ours


# ------------------------------------------------------------------ specs


def _speed_specs(
    recipe: str | None,
    overrides: list[str],
    args: Any,
    train: Any,
    workdir: Path,
    label_names: list[str],
    updates: int,
    review_trainer_overrides: list[str],
) -> list[SystemSpec]:
    needed = updates * args.per_device_train_batch_size * args.gradient_accumulation_steps
    if needed > len(train):
        most = len(train) // (args.per_device_train_batch_size * args.gradient_accumulation_steps)
        raise FinetuneError(
            f"--updates {updates} needs {needed} training reviews and the recipe's train split has {len(train)}; "
            f"pass --updates {most} or less"
        )
    # A seeded random subset, one epoch of it: every system sees exactly these samples once.
    samples = train.shuffle(seed=args.seed).select(range(needed)).flatten_indices()
    samples = samples.add_column("sample_id", list(range(needed)))
    path = workdir / "train"
    samples.save_to_disk(str(path))
    return [
        SystemSpec(
            system,
            recipe,
            overrides,
            str(path),
            label_names,
            updates,
            extra_overrides=review_trainer_overrides if system == REVIEW_TRAINER else [],
        )
        for system in TRAINING_SYSTEMS
    ]


def _memory_specs(
    recipe: str | None,
    overrides: list[str],
    train: Any,
    workdir: Path,
    label_names: list[str],
    micro_batch: int,
    updates: int,
) -> list[SystemSpec]:
    # Every micro-batch holds the same b longest reviews, so the configurations differ
    # only in n and b: a larger n must not cost activation memory, a larger b does.
    lengths = column_values(train, "length")
    longest = sorted(range(len(train)), key=lambda row: -lengths[row])[:micro_batch]
    needed = updates * micro_batch * max(MEMORY_ACCUMULATION_STEPS)
    rows = [longest[index % micro_batch] for index in range(needed)]
    samples = train.select(rows).flatten_indices().add_column("sample_id", list(range(needed)))
    path = workdir / "memory"
    samples.save_to_disk(str(path))
    configurations = [(micro_batch, steps) for steps in MEMORY_ACCUMULATION_STEPS] + [(4 * micro_batch, 1)]
    return [
        SystemSpec(
            REVIEW_TRAINER,
            recipe,
            overrides,
            str(path),
            label_names,
            # The same samples (so the same number of forward passes) in every configuration: a
            # longer run must not look cheaper or dearer for being shorter.
            updates * max(MEMORY_ACCUMULATION_STEPS) * micro_batch // (size * steps),
            # Sequential order: with identical micro-batches, shuffling only adds noise.
            extra_overrides=[
                *("--per_device_train_batch_size", str(size)),
                *("--gradient_accumulation_steps", str(steps)),
                *("--train_sampling_strategy", "sequential"),
            ],
        )
        for size, steps in configurations
    ]


def _prediction_specs(
    run: Any,
    recipe: str | None,
    overrides: list[str],
    tokenizer: Any,
    label_names: list[str],
    held_out: str,
    workdir: Path,
    train_texts: list[str],
) -> list[SystemSpec]:
    """``finetune predict`` from the recipe's model saved as is (fp32) and exported to int8 as ``finetune export`` does.

    The int8 copies are OpenVINO's static int8 calibrated on the train split's reviews and
    its weight-only int8, or ONNX Runtime's dynamic int8 where OpenVINO is not installed. With
    ``--model_name_or_path`` a fine-tuned run, the accuracies are real; a base model gets
    a seeded random head, so only the speeds and the agreement mean something.
    """
    from transformers import set_seed

    from ..export.fallback import DEFAULT_FALLBACK_MARGIN, add_fp32_fallback
    from ..training.modeling import load_classifier

    set_seed(run.training.seed)
    model = load_classifier(run.model, label_names)
    fp32_dir, int8_dir = workdir / "predict-fp32", workdir / "predict-int8"
    model.save_pretrained(fp32_dir)
    tokenizer.save_pretrained(fp32_dir)
    specs = [SystemSpec(PREDICT_FP32, recipe, overrides, held_out, label_names, 1, model_dir=str(fp32_dir))]
    weights_dir = workdir / "predict-int8-weights"
    backend = _write_int8_copies(run, model, tokenizer, int8_dir, weights_dir, train_texts)
    if backend is None:
        return specs
    specs.append(SystemSpec(PREDICT_INT8, recipe, overrides, held_out, label_names, 1, model_dir=str(int8_dir)))
    # The same int8 model with the fp32 model beside it for its close calls (finetune export --fp32_fallback).
    fallback_dir = workdir / "predict-int8-fallback"
    shutil.copytree(int8_dir, fallback_dir)
    add_fp32_fallback(fallback_dir, model, DEFAULT_FALLBACK_MARGIN)
    specs.append(
        SystemSpec(PREDICT_INT8_FALLBACK, recipe, overrides, held_out, label_names, 1, model_dir=str(fallback_dir))
    )
    if backend == "openvino":
        specs.append(
            SystemSpec(PREDICT_INT8_WEIGHTS, recipe, overrides, held_out, label_names, 1, model_dir=str(weights_dir))
        )
    return specs


def _write_int8_copies(
    run: Any, model: Any, tokenizer: Any, int8_dir: Path, weights_dir: Path, train_texts: list[str]
) -> str | None:
    """The model exported to int8 as ``finetune export`` does; returns the backend used (None: none installed).

    OpenVINO writes its static int8 (calibrated on the train split's reviews) to ``int8_dir`` and its
    weight-only int8 to ``weights_dir``; ONNX Runtime its dynamic int8 to ``int8_dir``.
    """
    import dataclasses

    from ..data.encoding import ReviewEncoding
    from ..export.common import CALIBRATION_REVIEWS
    from ..export.onnxruntime import export_int8
    from ..export.openvino import export_openvino_int8, export_openvino_weights_int8, sample_calibration_texts

    source = run.model.model_name_or_path
    backend = _int8_backend()
    if backend == "openvino":
        encoding = ReviewEncoding.from_fields(dataclasses.asdict(run.data))
        calibration = sample_calibration_texts(train_texts, CALIBRATION_REVIEWS)
        export_openvino_int8(model, tokenizer, int8_dir, source, calibration, encoding, "the recipe's train split")
        export_openvino_weights_int8(model, tokenizer, weights_dir, source)
    elif backend == "onnxruntime":
        export_int8(model, tokenizer, int8_dir, source=source)
    else:
        return None
    return backend


def _int8_backend() -> str | None:
    """The export backend the int8 rows can use: OpenVINO, else ONNX Runtime (with a note), else None (a note)."""
    from ..export.onnxruntime import require_onnx_runtime
    from ..export.openvino import require_openvino

    try:
        require_openvino()
        return "openvino"
    except FinetuneError as no_openvino:
        try:
            require_onnx_runtime()
        except FinetuneError as missing:
            print(f"note: no int8 rows: {missing}", file=sys.stderr)
            return None
        print(f"note: int8 rows from ONNX Runtime's dynamic int8: {no_openvino}", file=sys.stderr)
        return "onnxruntime"


def _run_children(specs: list[SystemSpec]) -> list[dict[str, Any]]:
    """Run each spec in a fresh process, one after another, with one progress bar over all updates.

    One spawned launcher imports what every system needs once and forks each
    system's process from there (see :func:`~finetune.commands.bench_systems.launch_children`).
    """
    context = multiprocessing.get_context("spawn")
    steps = {INFERENCE: 2, PREDICT_FP32: 1, **dict.fromkeys(PREDICTION_EXPORTS, 1)}
    total = sum(steps.get(spec.system, spec.updates) for spec in specs)
    queue = context.Queue()
    launcher = context.Process(target=launch_children, args=(specs, queue))
    launcher.start()
    results: list[dict[str, Any]] = []
    with tqdm(total=total, desc="bench", unit="update", dynamic_ncols=True) as bar:
        for spec in specs:
            shape = " x ".join(spec.extra_overrides[1::2][:2])  # micro-batch x n in --memory mode
            bar.set_postfix_str(f"{spec.system} {shape}".strip())
            kind, payload = _next_message(queue, launcher)
            while kind == "progress":
                bar.update(payload)
                kind, payload = _next_message(queue, launcher)
            if kind == "error":
                launcher.join()
                raise FinetuneError(f"bench failed in {payload.splitlines()[0]}")
            results.append(payload)
    launcher.join()
    return results


def _next_message(queue: Any, launcher: Any) -> tuple[str, Any]:
    """The next message from the bench's processes; a one-line error if the launcher ended without one."""
    while True:
        try:
            return queue.get(timeout=2)
        except Empty:
            if not launcher.is_alive():
                break
    try:  # what it put just before it ended
        return queue.get(timeout=2)
    except Empty:
        raise FinetuneError(
            f"bench failed: its launcher process ended with exit code {launcher.exitcode} before the systems "
            "reported; run it again, and check free memory (`free -h`) if it was killed"
        ) from None


# ----------------------------------------------------------------- figures


def _speed_row(result: dict[str, Any], model_shape: dict[str, int], gemm_peak: float) -> dict[str, Any]:
    from .flops import training_flops

    seconds = result["seconds"]
    flops = training_flops(
        result["lengths"],
        model_shape["non_embedding_parameters"],
        model_shape["num_layers"],
        model_shape["hidden_size"],
    )
    gflops = flops / seconds / 1e9
    return {
        "system": result["system"],
        "seconds": seconds,
        # Before the first forward, outside the rates: the system's set-up (see bench_systems._train_once).
        "setup_seconds": result["setup_seconds"],
        "updates": result["updates"],
        "samples": result["samples"],
        "samples_per_second": result["samples"] / seconds,
        "real_tokens_per_second": result["real_tokens"] / seconds,
        "pad_fraction": 1 - result["real_tokens"] / result["padded_tokens"],
        "forward_passes_per_update": result["forward_passes"] / result["updates"],
        "peak_rss_mib": result["peak_rss_bytes"] / MIB,
        # Pages zero-filled on first touch (see bench_systems._train_once), a cost that shows on a CPU.
        "minor_page_faults_per_update": result["minor_page_faults"] / result["updates"],
        "gflops": gflops,
        "mfu": gflops / gemm_peak,
        "train_loss": result["train_loss"],
        "sample_ids": result["sample_ids"],
        # Reads of a tensor into Python per update: the loop's, and those inside the model's forward.
        "host_syncs_per_update": result["host_syncs"] / result["updates"],
        "model_host_syncs_per_update": result["model_host_syncs"] / result["updates"],
        **_gpu_fields(result),
        "graphs_compiled_while_timed": result.get("graphs_compiled_while_timed"),
        # Batches collated ahead of the loop by the recipe's loader workers (dataloader_num_workers; 0: none).
        "batches_collated_in_loader_workers": result["batches_collated_in_loader_workers"],
        # Operators dispatched per update: on a GPU, the kernel launches the host makes (--count_ops).
        **(
            {"dispatched_ops_per_update": result["dispatched_ops"] / result["updates"]}
            if result.get("dispatched_ops") is not None
            else {}
        ),
    }


def _gpu_fields(result: dict[str, Any]) -> dict[str, float]:
    """Peak GPU memory and every sync CUDA reported per update, for a system trained on CUDA ({} otherwise)."""
    if result.get("peak_gpu_memory_bytes") is None:
        return {}
    return {
        "peak_gpu_memory_mib": result["peak_gpu_memory_bytes"] / MIB,
        "cuda_syncs_per_update": result["cuda_syncs"] / result["updates"],
    }


def _ratios(rows: list[dict[str, Any]]) -> dict[str, float]:
    ours = next(row for row in rows if row["system"] == REVIEW_TRAINER)
    return {
        f"real_tokens_per_second vs {row['system']}": ours["real_tokens_per_second"] / row["real_tokens_per_second"]
        for row in rows
        if row is not ours
    }


def _inference_row(result: dict[str, Any]) -> dict[str, Any]:
    return {
        "samples": result["samples"],
        "ours_samples_per_second": result["samples"] / result["ours_seconds"],
        "naive_samples_per_second": result["samples"] / result["naive_seconds"],
        "speedup": result["naive_seconds"] / result["ours_seconds"],
        "max_abs_probability_difference": result["max_abs_probability_difference"],
    }


def _prediction_rows(fp32: dict[str, Any], exports: list[dict[str, Any]]) -> dict[str, Any]:
    """Reviews/s, accuracy and peak memory of fp32 and each int8 export's prediction, and each as ratios of fp32.

    ``int8_vs_fp32`` is the default export's (``finetune export --int8``);
    ``vs_fp32`` holds every export's, by system name, with how far its class
    probabilities moved from fp32's (and, with an fp32 fallback, how many
    reviews its fp32 model scored again). ``near_ties`` counts the reviews whose two
    most likely classes fp32 puts within ``NEAR_TIE`` of each other: the labels
    any approximation of the model is likely to flip.
    """
    import numpy as np

    from ..export.fallback import top_two_gap

    labels = np.asarray(fp32["labels"])
    base_probabilities = np.asarray(fp32["probabilities"])
    rows = {}
    for result in (fp32, *exports):
        rows[result["system"]] = {
            "reviews": result["samples"],
            "seconds": result["seconds"],
            "reviews_per_second": result["samples"] / result["seconds"],
            "accuracy": float(np.mean(np.asarray(result["predictions"]) == labels)),
            "peak_rss_mib": result["peak_rss_bytes"] / MIB,
        }
    report: dict[str, Any] = {"systems": rows, "near_ties": int(np.sum(top_two_gap(base_probabilities) < NEAR_TIE))}
    base = rows[PREDICT_FP32]
    ratios = {}
    for result in exports:
        fast = rows[result["system"]]
        change = np.abs(np.asarray(result["probabilities"]) - base_probabilities)
        ratios[result["system"]] = {
            "backend": result.get("backend"),
            "speedup": fast["reviews_per_second"] / base["reviews_per_second"],
            "accuracy_points": 100 * (fast["accuracy"] - base["accuracy"]),
            "agreement": float(np.mean(np.asarray(result["predictions"]) == np.asarray(fp32["predictions"]))),
            "mean_probability_change": float(change.mean()),
            "max_probability_change": float(change.max()),
            "peak_rss_ratio": fast["peak_rss_mib"] / base["peak_rss_mib"],
        }
        if result.get("rescored_in_fp32") is not None:
            ratios[result["system"]]["rescored_in_fp32"] = result["rescored_in_fp32"]
    if ratios:
        report["vs_fp32"] = ratios
    if PREDICT_INT8 in ratios:
        report["int8_vs_fp32"] = ratios[PREDICT_INT8]
    return report


def _memory_row(result: dict[str, Any]) -> dict[str, Any]:
    return {
        "micro_batch": result["micro_batch"],
        "gradient_accumulation_steps": result["gradient_accumulation_steps"],
        "updates": result["updates"],
        "samples": result["samples"],
        "peak_rss_mib": result["peak_rss_bytes"] / MIB,
        "training_increase_mib": (result["peak_rss_bytes"] - result["rss_before_training_bytes"]) / MIB,
        **_gpu_fields(result),
    }


def _speed_report_header(report: dict[str, Any]) -> list[str]:
    """What was run: the recipe, updates, threads, GEMM peak, device, and the settings every system shared."""
    lines = [
        f"bench: {report['recipe']}, {report['updates']} updates of {report['micro_batch']} x "
        f"{report['gradient_accumulation_steps']} samples, {report['threads']} threads, "
        f"GEMM peak {report['gemm_peak_gflops']:.0f} GFLOP/s",
        f"device {report['device']}, {report['precision']}",
    ]
    if report.get("loader_workers"):
        lines.append(
            f"every system's batches collated by {report['loader_workers']} loader workers (dataloader_num_workers)"
        )
    if report.get("compiled"):
        lines.append(f"every system compiled ({report['compiled']}), each in an untimed run first")
    if report.get("review_trainer_overrides"):
        overrides = " ".join(report["review_trainer_overrides"])
        lines.append(f"ReviewTrainer also with {overrides} (the others at the recipe's)")
    return [*lines, ""]


def format_speed_report(report: dict[str, Any]) -> str:
    """The speed report as text: ratios first, then one table row per system."""
    lines = _speed_report_header(report)
    for name, ratio in report["ratios"].items():
        lines.append(f"ReviewTrainer real tokens/s vs {name.split(' vs ')[1]}: {ratio:.2f}x")
    lines.append(f"same samples in every system: {'yes' if report['same_samples'] else 'NO'}")
    for row in report["systems"]:
        if row.get("graphs_compiled_while_timed"):
            lines.append(
                f"warning: {row['system']} compiled {row['graphs_compiled_while_timed']} graphs while timed; "
                "its seconds include compiling"
            )
    on_gpu = "peak_gpu_memory_mib" in report["systems"][0]
    ops_counted = "dispatched_ops_per_update" in report["systems"][0]
    gpu_columns = " peak GPU MiB | CUDA syncs/update |" if on_gpu else ""
    ops_column = " dispatched ops/update |" if ops_counted else ""
    lines += [
        "",
        "| system | seconds | set-up s | samples/s | real tokens/s | pad fraction | forward passes/update "
        f"| peak RSS MiB | GFLOP/s | MFU | host syncs/update (loop + model) |{gpu_columns}{ops_column}",
        "| --- " * (11 + 2 * on_gpu + ops_counted) + "|",
    ]
    for row in report["systems"]:
        gpu_cells = f" {row['peak_gpu_memory_mib']:.0f} | {row['cuda_syncs_per_update']:.1f} |" if on_gpu else ""
        gpu_cells += f" {row['dispatched_ops_per_update']:.0f} |" if ops_counted else ""
        lines.append(
            f"| {row['system']} | {row['seconds']:.2f} | {row['setup_seconds']:.2f} | "
            f"{row['samples_per_second']:.2f} | "
            f"{row['real_tokens_per_second']:.0f} | {row['pad_fraction']:.1%} | "
            f"{row['forward_passes_per_update']:.1f} | {row['peak_rss_mib']:.0f} | "
            f"{row['gflops']:.1f} | {row['mfu']:.1%} | "
            f"{row['host_syncs_per_update']:.1f} + {row['model_host_syncs_per_update']:.1f} |{gpu_cells}"
        )
    if "inference" in report:
        row = report["inference"]
        lines += [
            "",
            f"prediction on {row['samples']} held-out reviews: {row['ours_samples_per_second']:.1f} samples/s "
            f"against {row['naive_samples_per_second']:.1f} for a loop padding to max_length "
            f"({row['speedup']:.2f}x; probabilities agree to {row['max_abs_probability_difference']:.1e})",
        ]
    if "prediction" in report:
        lines += ["", *_format_prediction(report["prediction"])]
    return "\n".join(lines)


def _format_prediction(prediction: dict[str, Any]) -> list[str]:
    lines = []
    for name, ratios in prediction.get("vs_fp32", {}).items():
        lines.append(
            f"{name.removeprefix('predict ')} prediction ({ratios['backend']}) vs fp32: {ratios['speedup']:.2f}x "
            f"reviews/s, accuracy {ratios['accuracy_points']:+.1f} points, {ratios['agreement']:.1%} of labels "
            f"agree, probabilities moved {ratios['mean_probability_change']:.4f} on average "
            f"(at most {ratios['max_probability_change']:.3f}), peak RSS {ratios['peak_rss_ratio']:.2f}x"
            + (f", {ratios['rescored_in_fp32']} reviews scored again in fp32" if "rescored_in_fp32" in ratios else "")
        )
    if "vs_fp32" in prediction:
        lines.append(
            f"{prediction['near_ties']} reviews have fp32's two likeliest classes within {NEAR_TIE} of each other "
            "(labels int8 can flip by a hair)"
        )
    lines += [
        "| prediction | reviews | seconds | reviews/s | accuracy | peak RSS MiB |",
        "| --- | --- | --- | --- | --- | --- |",
    ]
    for name, row in prediction["systems"].items():
        lines.append(
            f"| {name} | {row['reviews']} | {row['seconds']:.1f} | {row['reviews_per_second']:.1f} | "
            f"{row['accuracy']:.4f} | {row['peak_rss_mib']:.0f} |"
        )
    return lines


def format_memory_report(report: dict[str, Any]) -> str:
    """The memory report as text: one row per (micro-batch, n), with n=16 against n=1 first."""
    runs = report["runs"]
    base = next(
        row for row in runs if row["gradient_accumulation_steps"] == 1 and row["micro_batch"] == report["micro_batch"]
    )
    lines = [
        f"bench --memory: {report['recipe']}, the same {report['micro_batch']} longest reviews in every micro-batch",
        "",
    ]
    for row in runs:
        if row is not base:
            share = row["peak_rss_mib"] / base["peak_rss_mib"]
            lines.append(
                f"peak RSS at micro-batch {row['micro_batch']}, n={row['gradient_accumulation_steps']}: {share:.3f}x "
                f"micro-batch {base['micro_batch']}, n=1 (increase during training "
                f"{row['training_increase_mib']:.0f} MiB against {base['training_increase_mib']:.0f})"
            )
    lines += [
        "",
        "| micro-batch | n | samples per update | peak RSS MiB | increase during training MiB |",
        "| --- | --- | --- | --- | --- |",
    ]
    for row in runs:
        lines.append(
            f"| {row['micro_batch']} | {row['gradient_accumulation_steps']} | "
            f"{row['micro_batch'] * row['gradient_accumulation_steps']} | {row['peak_rss_mib']:.0f} | "
            f"{row['training_increase_mib']:.0f} |"
        )
    return "\n".join(lines)
