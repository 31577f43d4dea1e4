"""Micro-batches copied to a GPU without making the host wait for the GPU.

A copy from ordinary (pageable) host memory to a CUDA device is a sync: the
host waits until every kernel already queued has run (CUDA's "API
synchronization behavior": a stream sync before a pageable copy starts), and
PyTorch's plain ``tensor.to("cuda")`` waits for the copy itself too. A piece
cut from a window is collated on the host, so each of its tensors (a packed
piece has a dozen: token ids, positions, labels, the attention groups'
indices) would make the host wait for the GPU's queue to drain, and the host
could not prepare the next piece while the GPU computes this one. Copied from pinned
(page-locked) memory with ``non_blocking=True``, a copy is queued behind the
kernels like any other work: the caching host allocator keeps the pinned
source alive until the copy has run, and the model's kernels, queued after it
on the same stream, read it in order.
"""

from __future__ import annotations

from typing import Any

import torch
from accelerate.utils import recursively_apply, send_to_device


def _copied_without_waiting(tensor: torch.Tensor, device: torch.device) -> torch.Tensor:
    """``tensor`` on ``device``: from pinned memory and without blocking when it is on the host."""
    return _pinned(tensor).to(device, non_blocking=True)


def _pinned(tensor: torch.Tensor) -> torch.Tensor:
    """``tensor`` in pinned host memory: a host tensor is copied there, any other is left as it is."""
    if tensor.device.type != "cpu" or tensor.is_pinned():
        return tensor
    return tensor.pin_memory()


def to_device_without_waiting(data: Any, device: torch.device) -> Any:
    """``data`` (tensors, nested in dicts, lists and tuples) on ``device``, copied so that the host does not wait.

    On CUDA the host tensors go through pinned memory and are copied with
    ``non_blocking=True``; elsewhere (the CPU, where nothing waits, and other
    accelerators) this is a plain ``send_to_device``. Everything that is not
    a tensor is returned as it is.
    """
    device = torch.device(device)
    if device.type != "cuda":
        return send_to_device(data, device)
    return recursively_apply(_copied_without_waiting, data, device)
