"""What CUDA graphs' reuse of memory asks of the loop: gradients and evaluation outputs copied out in time.

Compiled with CUDA graphs (``torch_compile_mode: reduce-overhead`` or
``max-autotune``), a backward writes its gradients into memory the graph owns
and overwrites on its next replay. Where a parameter has no ``.grad`` yet,
autograd takes that output as the ``.grad`` itself, so the window's next
micro-batch overwrites it before adding to it: the update holds the last
micro-batch's gradient twice and the others' not at all (torch 2.13 raises
"accessing gradient tensor output of CUDAGraphs that has been overwritten"
where it notices, and pytorch/pytorch#96693 shows the silent case). A window
cut into one piece is safe: the optimizer reads the gradients before the
next replay.

ReviewTrainer therefore copies, after every micro-batch but the window's last,
each gradient it has not copied yet into memory of its own; the later
micro-batches add into those copies. Gradients that are absent stay absent,
so the optimizer still skips a parameter no micro-batch reached (no weight
decay on it), as it would without CUDA graphs.

Evaluation is hit the same way: Trainer keeps each batch's loss and logits
until it joins them to the next batch's, after that batch's replay has
overwritten them; ReviewTrainer copies them as they come (:func:`copied_tensors`).
"""

from __future__ import annotations

import weakref
from collections.abc import Iterable
from typing import Any

import torch


def uses_cuda_graphs(args: Any) -> bool:
    """Whether the run compiles its model into CUDA graphs, on a GPU."""
    device = getattr(args, "device", None)
    if not getattr(args, "torch_compile", False) or getattr(device, "type", None) != "cuda":
        return False
    backend = getattr(args, "torch_compile_backend", None) or "inductor"
    if backend == "cudagraphs":
        return True
    mode = getattr(args, "torch_compile_mode", None)
    if backend != "inductor" or mode is None:
        return False
    from torch._inductor import list_mode_options

    return bool(list_mode_options(mode).get("triton.cudagraphs", False))


class OwnedGradients:
    """The window's gradients copied out of a CUDA graph's memory, each once; :meth:`clear` at every update."""

    def __init__(self) -> None:
        # Weak: once zero_grad drops a gradient, its copy is not kept alive here until the next window.
        self._copies: weakref.WeakValueDictionary[int, torch.Tensor] = weakref.WeakValueDictionary()

    def take(self, parameters: Iterable[torch.nn.Parameter]) -> None:
        """Copy each gradient not copied yet in this window (one multi-tensor copy for all of them)."""
        fresh = [
            parameter
            for parameter in parameters
            if parameter.grad is not None
            and self._copies.get(id(parameter)) is not parameter.grad
            # A view is a DDP bucket's (gradient_as_bucket_view): the reducer owns it, and it is not graph memory.
            and parameter.grad._base is None
        ]
        if not fresh:
            return
        # Multiplying by one makes new tensors in one launch per chunk of them; a clone each would be one launch
        # per parameter, the host work CUDA graphs are there to save.
        copies = torch._foreach_mul([parameter.grad for parameter in fresh], 1.0)
        for parameter, copy in zip(fresh, copies, strict=True):
            parameter.grad = copy
            self._copies[id(parameter)] = copy

    def clear(self) -> None:
        """Forget the copies: the update has used the gradients, and the next window starts without them."""
        self._copies.clear()


def copied_tensors(value: Any) -> Any:
    """``value`` with each tensor in it copied, tuples, lists and dicts rebuilt, anything else as it is."""
    if isinstance(value, torch.Tensor):
        return value.clone()
    if isinstance(value, (tuple, list)):
        return type(value)(copied_tensors(item) for item in value)
    if isinstance(value, dict):
        return type(value)((key, copied_tensors(item)) for key, item in value.items())
    return value
