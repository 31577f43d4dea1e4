"""The systems ``finetune bench`` compares, each run in its own process.

A fresh process per system keeps the comparison fair (no warm caches or
allocator state carried over) and makes its peak resident memory its own.
Each system trains the same model from the same seed on the same samples for
the same number of updates, and reports what it saw through a queue.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import pathlib
import resource
import shutil
import sys
import tempfile
import time
import traceback
from dataclasses import dataclass, field
from typing import Any

from ..data.columns import column_values

REVIEW_TRAINER = "ReviewTrainer"
STOCK_TRAINER = "stock Trainer"
CLASSIC_LOOP = "classic loop"
INFERENCE = "inference"
PREDICT_FP32 = "predict fp32"
PREDICT_INT8 = "predict int8"
PREDICT_INT8_WEIGHTS = "predict int8 weights only"
PREDICT_INT8_FALLBACK = "predict int8 + fp32 fallback"
PREDICTION_EXPORTS = (PREDICT_INT8, PREDICT_INT8_FALLBACK, PREDICT_INT8_WEIGHTS)


@dataclass
class SystemSpec:
    """What one child process runs."""

    system: str
    recipe: str | None
    overrides: list[str]
    dataset_path: str
    label_names: list[str]
    updates: int
    extra_overrides: list[str] = field(default_factory=list)
    model_dir: str | None = None  # the saved model a prediction system loads
    # ReviewTrainer's class weights, from the recipe's whole train split: the bench's few
    # reviews may lack a class, and then no "balanced" weights could be computed from them.
    class_weights: list[float] | None = None
    device: str = "cpu"  # where a training system trains: "cpu" or "cuda"
    # Count the syncs in a first run and time a second, uncounted one from the same weights and seed
    # (None: on a GPU, where counting costs more than small kernels; see _train_system).
    timed_apart: bool | None = None
    # Count the operators each update dispatches (see training/dispatched_ops.py) in the counted run; a
    # run that counts them is timed apart on the CPU too, since the counting costs a Python call per operator.
    count_ops: bool = False


# What every system's process imports. The launcher imports it once and runs nothing, so each process forked
# from it starts with no model, no allocator state, no thread pool and no warm caches, as a spawned one would,
# without the ~7 s of imports each (a bench with prediction runs 11). The int8 backends stay out: only the
# prediction processes load them.
CHILD_PRELOAD = (
    "torch",
    "datasets",
    "transformers",
    "finetune.config.recipes",
    "finetune.training.modeling",
    "finetune.training.trainer",
    "finetune.evaluation.inference",
)

# The exit code of a child that put its error on the queue.
REPORTED_ERROR = 3


def launch_children(specs: list[SystemSpec], queue: Any) -> None:
    """Entry point of the bench's launcher process: run each spec in a process of its own, one after another.

    Each is forked from this process, which has imported :data:`CHILD_PRELOAD`
    and done nothing else (CUDA included: a child initialises its own, as a
    spawned one would). A child that ends without reporting, killed for memory
    for one, is reported here; after any error the rest are not run.
    """
    import importlib
    import multiprocessing
    import warnings

    try:
        for name in CHILD_PRELOAD:
            importlib.import_module(name)
    except BaseException as error:
        queue.put(("error", f"the bench's launcher: {type(error).__name__}: {error}\n{traceback.format_exc()}"))
        return
    # Python 3.12+ warns of fork() beside threads; torch's and pyarrow's idle ones are fork-safe (a DataLoader
    # worker is forked the same way), and nothing here holds a lock while it forks.
    warnings.filterwarnings("ignore", message=r".*fork\(\) may lead to deadlocks", category=DeprecationWarning)
    fork = multiprocessing.get_context("fork")
    for spec in specs:
        child = fork.Process(target=run_in_child, args=(spec, queue), name=spec.system)
        child.start()
        child.join()
        if child.exitcode == REPORTED_ERROR:
            return
        if child.exitcode != 0:
            how = f"killed by signal {-child.exitcode}" if child.exitcode < 0 else f"exit code {child.exitcode}"
            queue.put(("error", f"{spec.system}: its process ended ({how}) before it reported"))
            return


def run_in_child(spec: SystemSpec, queue: Any) -> None:
    """Entry point of a child process: run ``spec`` and put ``("result", dict)`` or ``("error", text)``."""
    try:
        os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
        # Trainer prints its log dicts when tqdm is off; the parent prints the report.
        sys.stdout = open(os.devnull, "w")  # noqa: SIM115 (kept open for the child's life)
        import warnings

        warnings.filterwarnings("ignore")
        _quiet()
        runners = {INFERENCE: _inference, **dict.fromkeys((PREDICT_FP32, *PREDICTION_EXPORTS), _predict_folder)}
        runner = runners.get(spec.system, _train_system)
        queue.put(("result", runner(spec, queue)))
    except BaseException as error:  # the parent turns it into one line
        queue.put(("error", f"{spec.system}: {type(error).__name__}: {error}\n{traceback.format_exc()}"))
        sys.exit(REPORTED_ERROR)  # after the queue's feeder has sent it: the launcher runs no more systems


def peak_rss_bytes() -> int:
    """This process's peak resident memory: VmHWM where Linux gives it, else ru_maxrss.

    ru_maxrss survives exec on Linux, so a spawned child would report at least the
    parent's peak at fork time; VmHWM belongs to the new address space and starts afresh.
    """
    try:
        with open("/proc/self/status", encoding="ascii") as status:
            for line in status:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) * 1024  # reported in kB
    except OSError:
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # Linux reports KiB


def _quiet() -> None:
    import logging

    import datasets
    import transformers

    transformers.logging.set_verbosity_error()
    transformers.logging.disable_progress_bar()  # "Loading weights" bars would break the bench's bar
    datasets.disable_progress_bars()
    for name in ("transformers", "datasets", "accelerate"):
        logging.getLogger(name).setLevel(logging.ERROR)


def _load(spec: SystemSpec) -> tuple[Any, Any, Any, Any]:
    """The recipe (with bench overrides), the tokenizer, the seeded model and the bench samples."""
    import datasets
    from transformers import set_seed

    from ..config.recipes import load_recipe
    from ..training.modeling import load_classifier, load_tokenizer

    output_dir = _scratch_dir(spec)
    run = load_recipe(
        spec.recipe,
        [
            *spec.overrides,
            *spec.extra_overrides,
            *("--output_dir", output_dir, "--max_steps", str(spec.updates), "--num_train_epochs", "1"),
            *("--use_cpu", "true" if spec.device == "cpu" else "false"),
            *("--eval_strategy", "no", "--save_strategy", "no", "--logging_strategy", "no"),
            *("--report_to", "none", "--disable_tqdm", "true", "--load_best_model_at_end", "false"),
            # The bench's collator needs the sample ids and lengths that Trainer would drop.
            *("--remove_unused_columns", "false"),
        ],
    )
    tokenizer = load_tokenizer(run.model, run.data.truncation_side)
    set_seed(run.training.seed)
    model = load_classifier(run.model, spec.label_names)
    samples = datasets.load_from_disk(spec.dataset_path)
    return run, tokenizer, model, samples


def _scratch_dir(spec: SystemSpec) -> str:
    """An ``output_dir`` for one system, inside the bench's work folder so that it is removed with it."""
    return tempfile.mkdtemp(prefix="output-", dir=os.path.dirname(spec.dataset_path))


class RecordingCollator:
    """Pads like the system would and records which samples it saw and their real (unpadded) lengths.

    With loader workers (``dataloader_num_workers`` > 0) a batch is collated in a
    worker process, where a record kept in memory would stay; there each batch's
    record is appended to a file of ``record_dir`` instead, and :meth:`recorded`
    reads them back in the system's process.
    """

    def __init__(
        self,
        tokenizer: Any,
        pad_to_max_length: int | None = None,
        review_trainer: bool = False,
        record_dir: str | None = None,
        pad_to_multiple_of: int | None = None,
    ) -> None:
        from transformers import DataCollatorWithPadding

        from ..data.collation import faster_collator

        if pad_to_max_length is None:
            # ReviewTrainer swaps the DataCollatorWithPadding that `finetune train` gives it for PaddingCollator
            # (the same batches, padded faster); wrapped here, it would not see it, so the swap is made here.
            collate = DataCollatorWithPadding(tokenizer, pad_to_multiple_of=pad_to_multiple_of)
            self.collate = faster_collator(collate) if review_trainer else collate
        else:
            self.collate = DataCollatorWithPadding(tokenizer, padding="max_length", max_length=pad_to_max_length)
        # Read by ReviewTrainer, whose token budget counts the padding to a multiple (the recipe's, every system's).
        self.pad_to_multiple_of = self.collate.pad_to_multiple_of
        self.sample_ids: list[int] = []
        self.lengths: list[int] = []
        self.record_dir = record_dir

    def __call__(self, features: list[dict[str, Any]]) -> dict[str, Any]:
        features = [dict(feature) for feature in features]
        sample_ids = [int(feature.pop("sample_id")) for feature in features]
        lengths = [int(feature.pop("length")) for feature in features]
        from torch.utils.data import get_worker_info  # imported already: a lookup, once a batch

        if get_worker_info() is None:
            self.sample_ids += sample_ids
            self.lengths += lengths
        else:
            if self.record_dir is None:
                raise RuntimeError("RecordingCollator in a loader worker needs a record_dir to write to")
            # One file a worker, so no two processes append to one file.
            with open(os.path.join(self.record_dir, f"worker-{os.getpid()}.jsonl"), "a") as records:
                records.write(json.dumps([sample_ids, lengths]) + "\n")
        return self.collate(features)

    def recorded(self) -> tuple[list[int], list[int], int]:
        """The sample ids and lengths recorded here and in loader workers, and how many batches workers collated."""
        sample_ids, lengths, worker_batches = list(self.sample_ids), list(self.lengths), 0
        for path in sorted(pathlib.Path(self.record_dir).glob("worker-*.jsonl")) if self.record_dir else []:
            for line in path.read_text().splitlines():
                batch_ids, batch_lengths = json.loads(line)
                sample_ids += batch_ids
                lengths += batch_lengths
                worker_batches += 1
        return sample_ids, lengths, worker_batches


def _progress_callback(queue: Any) -> Any:
    from transformers import TrainerCallback

    class _Progress(TrainerCallback):
        def on_step_end(self, args, state, control, **kwargs):
            queue.put(("progress", 1))

    return _Progress()


def _train_system(spec: SystemSpec, queue: Any) -> dict[str, Any]:
    import psutil
    import torch

    run, tokenizer, model, samples = _load(spec)
    args = run.training
    # Exactly the samples of `updates` windows, so a prefetching loader cannot collate more.
    samples = samples.select(range(spec.updates * args.per_device_train_batch_size * args.gradient_accumulation_steps))
    rss_before = psutil.Process().memory_info().rss
    on_gpu = spec.device == "cuda"
    if on_gpu:
        # Outside the timed span: CUDA's start-up and the weights' copy are no system's doing.
        model.to(spec.device)
        torch.cuda.synchronize()
    # On a GPU the counting (patched tensor methods, CUDA's sync warnings with their stack walks) costs more
    # than the kernels of a small batch, and a process's first run pays for loading and choosing kernels. So
    # there the syncs are counted in a first run, which also warms CUDA up, and a second run from the same
    # weights and seed, with nothing patched, is timed. On the CPU the counting costs nothing next to the
    # matrix products: one run is counted and timed.
    timed_apart = on_gpu if spec.timed_apart is None else spec.timed_apart
    timed_apart = timed_apart or spec.count_ops
    # A copy of the weights only where a run comes before the timed one: it would count in every peak RSS.
    if args.torch_compile or timed_apart:
        initial_weights = {name: value.clone() for name, value in model.state_dict().items()}
    if args.torch_compile:
        # Compiling takes seconds to minutes a graph, once a process: a plain run compiles, first, so that
        # the graphs are traced without the counters' patches, and the timed run reuses them.
        _train_once(spec, run, model, samples, tokenizer, queue=None, counting=False)
        _restore(model, initial_weights)
    if timed_apart:
        counted = _train_once(spec, run, model, samples, tokenizer, queue=None, counting=True)
        _restore(model, initial_weights)
    if on_gpu:
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
    graphs_before = _graphs_compiled()
    timed = _train_once(spec, run, model, samples, tokenizer, queue, counting=not timed_apart)
    if not timed_apart:
        counted = timed

    return {
        **timed,
        "host_syncs": counted["host_syncs"],
        "model_host_syncs": counted["model_host_syncs"],
        "cuda_syncs": counted["cuda_syncs"],
        "dispatched_ops": counted["dispatched_ops"],
        # Graphs compiled during the timed run: its seconds include compiling them (none, once warmed up).
        "graphs_compiled_while_timed": _graphs_compiled() - graphs_before if args.torch_compile else None,
        "peak_gpu_memory_bytes": torch.cuda.max_memory_allocated() if on_gpu else None,
        "system": spec.system,
        "peak_rss_bytes": peak_rss_bytes(),
        "rss_before_training_bytes": rss_before,
        "micro_batch": args.per_device_train_batch_size,
        "gradient_accumulation_steps": args.gradient_accumulation_steps,
        "threads": torch.get_num_threads(),
    }


def _graphs_compiled() -> int:
    """Graphs ``torch.compile`` has compiled in this process so far."""
    from torch._dynamo.utils import counters

    return counters["stats"]["unique_graphs"]


def _restore(model: Any, weights: dict[str, Any]) -> None:
    """``model`` back to ``weights``, with no gradient left: the next run starts where the first did."""
    model.load_state_dict(weights)
    model.zero_grad(set_to_none=True)


def _train_once(
    spec: SystemSpec, run: Any, model: Any, samples: Any, tokenizer: Any, queue: Any, counting: bool
) -> dict[str, Any]:
    """One seeded training run of ``spec.system``: its seconds, samples and tokens, and (``counting``) its syncs.

    ``queue`` (None: nothing) hears of each update, for the bench's progress bar.
    """
    import torch
    from transformers import set_seed

    from .host_syncs import HostReadsWindow

    args = run.training
    on_gpu = spec.device == "cuda"
    queue = queue if queue is not None else _Discard()
    pad_to = run.data.max_length if spec.system == CLASSIC_LOOP else None
    # Loader workers (dataloader_num_workers) record what they collate in files of a folder of its own.
    record_dir = tempfile.mkdtemp(prefix="records-", dir=os.path.dirname(spec.dataset_path))
    collator = RecordingCollator(tokenizer, pad_to, spec.system == REVIEW_TRAINER, record_dir, args.pad_to_multiple_of)
    # What the model computed, padding included, counted where it computes: ReviewTrainer may cut and
    # pack the collated batches again, so the collator's count would not be what ran.
    computed = _ComputedTokens(model, spec.device)
    set_seed(args.seed)
    with contextlib.ExitStack() as stack:
        # Host syncs are counted during the run itself: the patched methods cost every system alike.
        counts = _start_counting(stack, spec) if counting else _Counts()
        counters = counts.counters
        faults_before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
        started = time.perf_counter()
        if spec.system == CLASSIC_LOOP:
            final_loss = _classic_loop(model, samples, collator, args, spec.updates, queue, spec.device, counters)
            updates = spec.updates
        else:
            callbacks = [_progress_callback(queue), *([HostReadsWindow(*counters)] if counting else [])]
            final_loss, updates = _trainer_run(spec, model, args, samples, collator, callbacks)
        if on_gpu:
            torch.cuda.synchronize()
        ended = time.perf_counter()
        # Pages the kernel zero-filled for this process during the run, set-up included: mostly the heap
        # growing to its peak, once; every step again for blocks above malloc's mmap threshold (see
        # packed_attention.CPU_ATTENTION_GROUP_BYTES).
        page_faults = resource.getrusage(resource.RUSAGE_SELF).ru_minflt - faults_before
    computed.remove()
    # Timed from the first forward: a trainer's set-up (accelerator, optimizer, loader, callbacks) is paid
    # once a run, about a second, and in a bench of 20 updates it would outweigh the updates themselves.
    training_started = computed.first_forward_at if computed.first_forward_at is not None else started

    return {
        **counts.fields(),
        "seconds": ended - training_started,
        "setup_seconds": training_started - started,
        "updates": updates,
        **_recorded_samples(collator, spec.system),
        "padded_tokens": computed.tokens,
        "forward_passes": computed.forward_passes,
        "minor_page_faults": page_faults,
        "train_loss": float(final_loss),
    }


def _recorded_samples(collator: RecordingCollator, system: str) -> dict[str, Any]:
    """The samples ``collator`` saw, in this process and in loader workers (whose record folder goes with it)."""
    sample_ids, lengths, worker_batches = collator.recorded()
    if collator.record_dir is not None:
        shutil.rmtree(collator.record_dir)
    if not sample_ids:
        raise RuntimeError(f"{system} trained on no recorded samples; the bench cannot compare its rate")
    return {
        "samples": len(sample_ids),
        "sample_ids": sorted(sample_ids),
        "lengths": lengths,
        "real_tokens": sum(lengths),
        "batches_collated_in_loader_workers": worker_batches,
    }


@dataclass
class _Counts:
    """What a counted run counts: host reads, CUDA's own syncs (on a GPU), operators (``count_ops``); None: not."""

    host_reads: Any = None
    cuda_syncs: Any = None
    dispatched_ops: Any = None

    @property
    def counters(self) -> tuple[Any, ...]:
        """The counters to switch on and off around the updates (a ``HostReadsWindow``'s)."""
        return tuple(c for c in (self.host_reads, self.cuda_syncs, self.dispatched_ops) if c is not None)

    def fields(self) -> dict[str, int | None]:
        """The counts as a run's result fields."""
        return {
            "host_syncs": None if self.host_reads is None else self.host_reads.count,
            "model_host_syncs": None if self.host_reads is None else self.host_reads.model_count,
            "cuda_syncs": None if self.cuda_syncs is None else self.cuda_syncs.count,
            "dispatched_ops": None if self.dispatched_ops is None else self.dispatched_ops.count,
        }


def _start_counting(stack: contextlib.ExitStack, spec: SystemSpec) -> _Counts:
    """The counters for a counted run of ``spec``, each undone by ``stack`` on every way out."""
    from .dispatched_ops import DispatchedOps
    from .host_syncs import CudaSyncWarnings, counting_host_reads

    counts = _Counts(host_reads=stack.enter_context(counting_host_reads(spec.device)))
    if spec.device == "cuda":
        counts.cuda_syncs = stack.enter_context(CudaSyncWarnings().recording())
    if spec.count_ops:
        counts.dispatched_ops = DispatchedOps()
        # Popped on every way out, so a failed run leaves no dispatch mode behind.
        stack.callback(setattr, counts.dispatched_ops, "counting", False)
    return counts


def _trainer_run(
    spec: SystemSpec, model: Any, args: Any, samples: Any, collator: Any, callbacks: list[Any]
) -> tuple[float, int]:
    """``spec.updates`` of ReviewTrainer or stock Trainer; the final training loss and the updates made."""
    from transformers import Trainer

    from ..training.trainer import ReviewTrainer

    review_trainer = spec.system == REVIEW_TRAINER
    # Accelerate marks a model it prepared and hands it back as it is the next time: a second run on the same
    # model (the timed one after the counted or warm-up run) would not be compiled, with torch_compile. Each
    # run prepares it afresh, as a run in a fresh process does.
    vars(model).pop("_is_accelerate_prepared", None)
    trainer = (ReviewTrainer if review_trainer else Trainer)(
        model=model,
        args=args,
        train_dataset=samples,
        data_collator=collator,
        callbacks=callbacks,
        **({"class_weights": spec.class_weights} if review_trainer and spec.class_weights else {}),
    )
    result = trainer.train()
    return result.training_loss, result.global_step


class _ComputedTokens:
    """Counts the tokens (padding included) and the forward passes of a model, from its inputs.

    Also notes when the first forward began (``first_forward_at``, a ``time.perf_counter`` reading, after
    the device's queued work on a GPU): the training itself starts there, once the system is set up.
    """

    def __init__(self, model: Any, device: str = "cpu") -> None:
        self.tokens = 0
        self.forward_passes = 0
        self.first_forward_at: float | None = None
        self._device = device
        import torch

        # Left out of a compiled model's graph: traced, the hook's counts became guards, a new graph a forward.
        self._hook = model.register_forward_pre_hook(torch.compiler.disable(self._count), with_kwargs=True)

    def _count(self, module: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        input_ids = kwargs.get("input_ids", args[0] if args else None)
        if input_ids is not None:
            if self.first_forward_at is None:
                if self._device == "cuda":
                    import torch

                    torch.cuda.synchronize()  # once a run: the set-up's queued work is set-up
                self.first_forward_at = time.perf_counter()
            self.tokens += int(input_ids.numel())
            self.forward_passes += 1

    def remove(self) -> None:
        """Stop counting."""
        self._hook.remove()


class _Discard:
    """A queue that drops what it is given: on a GPU the counted first run reports no progress."""

    def put(self, item: Any) -> None:
        """Drop ``item``."""


def _classic_loop(
    model: Any,
    samples: Any,
    collator: Any,
    args: Any,
    updates: int,
    queue: Any,
    device: str = "cpu",
    counters: tuple[Any, ...] = (),
) -> float:
    """The loop most tutorials show: pad to max_length, ``loss / n``, step when ``(step + 1) % n == 0``.

    On ``device``, in the recipe's precision (bf16 autocast, or fp16 with a
    GradScaler), with fused AdamW, activation checkpointing and loader workers
    when the recipe asks for them, so that it differs from the trainers in its
    loop only. ``counters`` count
    host syncs while it runs.
    """
    import torch

    n_accumulate = args.gradient_accumulation_steps
    loader = torch.utils.data.DataLoader(
        samples,
        batch_size=args.per_device_train_batch_size,
        shuffle=True,
        generator=torch.Generator().manual_seed(args.seed),
        collate_fn=collator,
        # As the trainers' loaders: the recipe's workers collate ahead of the loop.
        num_workers=args.dataloader_num_workers,
    )
    model.to(device)
    _checkpoint_activations_as_asked(model, args)
    optimizer, scheduler = _classic_optimizer(model, args, updates)
    if args.torch_compile:  # as the trainers are compiled (by Accelerate), with the recipe's backend and mode
        model = torch.compile(model, backend=args.torch_compile_backend, mode=args.torch_compile_mode)
    precision = torch.bfloat16 if args.bf16 else torch.float16 if args.fp16 else None
    scaler = torch.amp.GradScaler(device, enabled=args.fp16)
    criterion = torch.nn.CrossEntropyLoss()
    model.train()
    loss = torch.zeros(())
    for counter in counters:
        if hasattr(counter, "watch"):
            counter.watch(model)
        counter.counting = True
    for step, data in enumerate(loader):
        data = {key: value.to(device) for key, value in data.items()}
        with torch.autocast(device, dtype=precision, enabled=precision is not None):
            logits = model(input_ids=data["input_ids"], attention_mask=data["attention_mask"]).logits
            loss = criterion(logits.float(), data["labels"]) / n_accumulate
        scaler.scale(loss).backward()
        if (step + 1) % n_accumulate == 0:
            scaler.step(optimizer)
            scaler.update()
            optimizer.zero_grad()
            scheduler.step()
            queue.put(("progress", 1))
    for counter in counters:
        counter.counting = False
    return float(loss.detach()) * n_accumulate


def _checkpoint_activations_as_asked(model: Any, args: Any) -> None:
    """Activation checkpointing (``activation_checkpointing`` or ``gradient_checkpointing``) as Trainer sets it up."""
    if not args.activation_checkpointing:
        return
    checkpointing = dict(args.activation_checkpointing_kwargs or {})
    every_n_layers, offload = checkpointing.pop("every_n_layers", 1), checkpointing.pop("offload", False)
    model.activation_checkpointing_enable(
        activation_checkpointing_kwargs=checkpointing or None, every_n_layers=every_n_layers, offload=offload
    )


def _classic_optimizer(model: Any, args: Any, updates: int) -> tuple[Any, Any]:
    """AdamW (fused when the recipe's ``optim`` asks for it) and the recipe's schedule over ``updates``."""
    import torch
    from transformers import get_scheduler

    fused = {"fused": True} if args.optim == "adamw_torch_fused" else {}
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.learning_rate, weight_decay=args.weight_decay, **fused)
    scheduler = get_scheduler(
        args.lr_scheduler_type,
        optimizer,
        num_warmup_steps=args.get_warmup_steps(updates),
        num_training_steps=updates,
    )
    return optimizer, scheduler


def _inference(spec: SystemSpec, queue: Any) -> dict[str, Any]:
    """Prediction throughput: the project's inference against a naive loop padding to max_length."""
    import numpy as np
    import torch
    from transformers import DataCollatorWithPadding

    from ..data.encoding import ReviewEncoding
    from ..evaluation.inference import predict_probabilities

    run, tokenizer, model, samples = _load(spec)
    texts = list(samples["text"])
    batch_size = run.training.per_device_eval_batch_size
    max_length = run.data.max_length

    started = time.perf_counter()
    # Cut, not windowed: the naive loop below reads each review once too.
    encoding = dataclasses.replace(ReviewEncoding.from_fields(dataclasses.asdict(run.data)), sliding_window=False)
    ours = predict_probabilities(model, tokenizer, texts, batch_size=batch_size, encoding=encoding)
    ours_seconds = time.perf_counter() - started
    queue.put(("progress", 1))

    # Naive: every review padded to max_length, in file order, autograd merely switched off.
    started = time.perf_counter()
    model.eval()
    collator = DataCollatorWithPadding(tokenizer, padding="max_length", max_length=max_length)
    encoded = tokenizer(texts, truncation=True, max_length=max_length)
    naive = []
    with torch.no_grad():
        for start in range(0, len(texts), batch_size):
            rows = [
                {key: encoded[key][row] for key in encoded} for row in range(start, min(start + batch_size, len(texts)))
            ]
            logits = model(**collator(rows)).logits
            naive.append(torch.softmax(logits, dim=-1).numpy())
    naive_seconds = time.perf_counter() - started
    queue.put(("progress", 1))
    return {
        "system": INFERENCE,
        "samples": len(texts),
        "real_tokens": sum(len(ids) for ids in encoded["input_ids"]),
        "ours_seconds": ours_seconds,
        "naive_seconds": naive_seconds,
        "max_abs_probability_difference": float(np.abs(ours - np.concatenate(naive)).max()),
    }


def _predict_folder(spec: SystemSpec, queue: Any) -> dict[str, Any]:
    """``finetune predict``'s inference on the held-out reviews from a saved folder (PyTorch fp32 or an int8 export)."""
    from pathlib import Path

    import datasets

    from ..config.recipes import load_recipe
    from ..data.encoding import ReviewEncoding
    from ..evaluation.inference import load_inference_model, predict_probabilities
    from ..export.common import export_backend
    from ..export.fallback import Int8WithFallback

    run = load_recipe(spec.recipe, [*spec.overrides, "--output_dir", _scratch_dir(spec)])
    samples = datasets.load_from_disk(spec.dataset_path)
    texts, labels = column_values(samples, "text"), column_values(samples, "labels")
    model, tokenizer = load_inference_model(Path(spec.model_dir))
    encoding = dataclasses.replace(ReviewEncoding.from_fields(dataclasses.asdict(run.data)), sliding_window=False)
    batch_size = run.training.per_device_eval_batch_size
    # One batch first, untimed: the first call pays for lazy initialisation in both runtimes.
    predict_probabilities(model, tokenizer, texts[:batch_size], batch_size=batch_size, encoding=encoding)
    fallback = isinstance(model, Int8WithFallback)
    if fallback:
        # An fp32 fallback's own first call is as lazy, and that batch may hold no close call.
        predict_probabilities(model.fp32, tokenizer, texts[:batch_size], batch_size=batch_size, encoding=encoding)
    rescored_before = model.rescored if fallback else 0
    started = time.perf_counter()
    probabilities = predict_probabilities(model, tokenizer, texts, batch_size=batch_size, encoding=encoding)
    seconds = time.perf_counter() - started
    queue.put(("progress", 1))
    return {
        # An int8 export with an fp32 fallback counts the reviews its fp32 model scored again.
        "rescored_in_fp32": model.rescored - rescored_before if fallback else None,
        "system": spec.system,
        "samples": len(texts),
        "seconds": seconds,
        "predictions": probabilities.argmax(-1).tolist(),
        "probabilities": probabilities.tolist(),
        "labels": labels,
        "peak_rss_bytes": peak_rss_bytes(),
        "backend": export_backend(pathlib.Path(spec.model_dir)),
    }
