"""Counting host syncs: the times a training loop reads a tensor's value into Python.

On a GPU each such read (``.item()``, ``float(t)``, ``.tolist()``, ``bool(t)``,
``.cpu()`` ...) waits for every kernel queued before it, so the GPU idles
while Python catches up. ``counting_host_reads`` patches those methods of
``torch.Tensor`` while it is open and counts the calls made while
``counter.counting`` is on; ``HostReadsWindow`` turns counting on for a
``Trainer``'s steps only (from ``on_train_begin`` to the last update).
Reads made inside the model's forward (transformers' attention-mask code
checks whether a batch has padding, for one) are counted apart, in
``model_count``: they are the model's, not the training loop's.

What counts as a read:

- on an accelerator (CUDA, ...): any of the methods on a tensor stored there,
  wherever it is called from;
- on the CPU, where nothing waits, the reads a GPU run would make: the value
  reads (not ``.cpu()``, a no-op here, nor ``.to(...)``), minus those of
  tensors that live on the host on a GPU too: the optimizer's step counts
  (read by ``torch.optim``) and whatever a DataLoader reads while it draws a
  batch (samplers' seeds and orders, the collator's work), and the seeds of
  the dropout masks drawn on the host (``dropout_masks.py``), a path only a
  CPU run takes.

On CUDA ``torch.cuda.set_sync_debug_mode`` sees more (blocking host-to-device
copies, ``nonzero``, ...); ``CudaSyncWarnings`` counts those as a second figure.
"""

from __future__ import annotations

import contextlib
import os
import sys
import warnings
from collections.abc import Callable, Iterator
from typing import Any

import torch
from transformers import TrainerCallback

# Reads of a value into Python, counted on every device.
VALUE_READS = ("item", "tolist", "numpy", "__float__", "__int__", "__bool__", "__index__")
# Copies to the host: a sync only from an accelerator.
HOST_COPIES = ("cpu", "to")
# Where PyTorch reads the optimizer's step counts, host tensors on a GPU too.
TORCH_OPTIM = os.path.join(os.path.dirname(torch.__file__), "optim") + os.sep
# Code that draws batches (and calls samplers and collators) on the host, before a batch is moved to the device.
DATA_LOADING = (os.path.join(os.path.dirname(torch.__file__), "utils", "data") + os.sep, "accelerate/data_loader.py")
# Where packed rows' dropout masks are drawn on a CPU, a seed read each; on a GPU dropout is the device's kernel.
PACKAGE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CPU_DROPOUT_MASKS = os.path.join(PACKAGE, "fast_path", "dropout_masks.py")


class HostReadCounter:
    """How many host reads were made while ``counting`` was on, on tensors of ``device_type``.

    ``count`` holds the loop's (outside the forward of a model given to
    ``watch``), ``model_count`` the model's own.
    """

    def __init__(self, device_type: str) -> None:
        self.device_type = device_type
        self.counting = False
        self.count = 0
        self.model_count = 0
        self._forward_depth = 0

    def watch(self, model: torch.nn.Module) -> list[Any]:
        """Count reads inside ``model``'s forward as the model's; returns the hooks' handles."""

        def entering(*_: Any) -> None:
            self._forward_depth += 1

        def leaving(*_: Any) -> None:
            self._forward_depth -= 1

        return [model.register_forward_pre_hook(entering), model.register_forward_hook(leaving, always_call=True)]

    def is_host_read(self, name: str, tensor: torch.Tensor, args: tuple[Any, ...], kwargs: dict[str, Any]) -> bool:
        """Whether ``tensor.name(*args, **kwargs)``, called from the caller's caller, is a host sync."""
        if tensor.device.type != self.device_type:
            return False
        if self.device_type == "cpu":
            if name in HOST_COPIES:
                return False
            return not _on_host_side()
        if name == "to":
            targets = [*args, kwargs.get("device")]
            return any(_is_host(target) for target in targets)
        return True

    def wrap(self, name: str, method: Callable[..., Any]) -> Callable[..., Any]:
        """``method`` counting its calls that are host reads."""

        def counted(tensor: torch.Tensor, *args: Any, **kwargs: Any) -> Any:
            if self.counting and self.is_host_read(name, tensor, args, kwargs):
                if self._forward_depth:
                    self.model_count += 1
                else:
                    self.count += 1
            return method(tensor, *args, **kwargs)

        counted.__name__ = name
        return counted


def _on_host_side() -> bool:
    """Whether the read is made by ``torch.optim``, for a CPU dropout mask, or while a DataLoader draws a batch."""
    frame = sys._getframe(1)
    while frame.f_code.co_filename == __file__:
        frame = frame.f_back
    if frame.f_code.co_filename.startswith(TORCH_OPTIM) or frame.f_code.co_filename == CPU_DROPOUT_MASKS:
        return True
    while frame is not None:
        filename = frame.f_code.co_filename
        if filename.startswith(DATA_LOADING[0]) or filename.endswith(DATA_LOADING[1]):
            return True
        frame = frame.f_back
    return False


def _is_host(target: Any) -> bool:
    return (isinstance(target, str) and target.startswith("cpu")) or (
        isinstance(target, torch.device) and target.type == "cpu"
    )


@contextlib.contextmanager
def counting_host_reads(device_type: str) -> Iterator[HostReadCounter]:
    """A counter of host reads of ``device_type`` tensors, with ``torch.Tensor``'s methods patched while it is open."""
    counter = HostReadCounter(device_type)
    names = (*VALUE_READS, *HOST_COPIES)
    # Methods inherited from torch's C base class are removed again, not set back, on the way out.
    own = {name: torch.Tensor.__dict__[name] for name in names if name in torch.Tensor.__dict__}
    originals = {name: getattr(torch.Tensor, name) for name in names}
    try:
        for name, method in originals.items():
            setattr(torch.Tensor, name, counter.wrap(name, method))
        yield counter
    finally:
        for name in names:
            if name in own:
                setattr(torch.Tensor, name, own[name])
            elif name in torch.Tensor.__dict__:
                delattr(torch.Tensor, name)


class CudaSyncWarnings:
    """Every sync CUDA itself reports (``torch.cuda.set_sync_debug_mode("warn")``) while ``counting`` is on."""

    MESSAGE = "called a synchronizing CUDA operation"

    def __init__(self) -> None:
        self.count = 0
        self._counting = False
        self._records: list[Any] = []

    @property
    def counting(self) -> bool:
        """Whether CUDA's syncs are being recorded now."""
        return self._counting

    @counting.setter
    def counting(self, on: bool) -> None:
        torch.cuda.set_sync_debug_mode("warn" if on else "default")
        if not on:
            self.count += sum(self.MESSAGE in str(record.message) for record in self._records)
            self._records.clear()
        self._counting = on

    @contextlib.contextmanager
    def recording(self) -> Iterator[CudaSyncWarnings]:
        """Record warnings while open (every one, not once per place), then leave the sync debug mode off."""
        with warnings.catch_warnings(record=True) as records:
            warnings.simplefilter("always")
            self._records = records
            try:
                yield self
            finally:
                if self._counting:
                    self.counting = False


class HostReadsWindow(TrainerCallback):
    """Turns ``counters`` on when training begins and off after the run's last update (``max_steps``).

    Logging, evaluation and saving between updates are counted too, so a run
    measured with this should switch them off.
    """

    def __init__(self, *counters: Any) -> None:
        self.counters = counters

    def on_train_begin(self, args: Any, state: Any, control: Any, model: Any = None, **kwargs: Any) -> None:
        """Start counting (a ``HostReadCounter`` tells the model's reads apart from the loop's)."""
        for counter in self.counters:
            if model is not None and hasattr(counter, "watch"):
                counter.watch(model)
            counter.counting = True

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        """Stop counting after the last update: what follows (final metrics, saving) is not a step."""
        if state.global_step >= state.max_steps:
            for counter in self.counters:
                counter.counting = False
