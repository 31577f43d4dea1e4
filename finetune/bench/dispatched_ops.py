"""Counting the operators a training loop dispatches: on a GPU, each is a kernel launch the host must make.

Where a GPU finishes an update's kernels faster than Python can queue them
(short reviews, a small model), the host's work sets the pace: an update
costs about its operator count times the host's cost per operator (tens of
microseconds in eager PyTorch). The count follows the code, not the
device's speed, so systems can be compared by it on a CPU too; where the code
takes device-specific paths (SDPA's CPU math path, CPU-only dropout masks)
the CPU's count is not the GPU's.
``DispatchedOps`` counts every ATen operator call (forward, backward,
optimizer, views included) while ``counting`` is on, through a
``TorchDispatchMode`` pushed only for that span; the mode costs a Python
call per operator, so a bench times a run it did not count.
"""

from __future__ import annotations

from typing import Any

from torch.utils._python_dispatch import TorchDispatchMode


class _CountingMode(TorchDispatchMode):
    """A dispatch mode that adds one to ``owner.count`` per operator and runs it unchanged."""

    def __init__(self, owner: DispatchedOps) -> None:
        super().__init__()
        self.owner = owner

    def __torch_dispatch__(self, func: Any, types: Any, args: tuple = (), kwargs: dict | None = None) -> Any:
        self.owner.count += 1
        return func(*args, **(kwargs or {}))


class DispatchedOps:
    """How many ATen operators were dispatched while ``counting`` was on (a ``HostReadsWindow`` counter)."""

    def __init__(self) -> None:
        self.count = 0
        self._mode: _CountingMode | None = None

    @property
    def counting(self) -> bool:
        """Whether operators are being counted now."""
        return self._mode is not None

    @counting.setter
    def counting(self, on: bool) -> None:
        if on and self._mode is None:
            self._mode = _CountingMode(self)
            self._mode.__enter__()
        elif not on and self._mode is not None:
            mode, self._mode = self._mode, None
            mode.__exit__(None, None, None)
