"""Where a run's wall-clock time goes: reading, tokenizing, the baseline, training steps, test scoring, the report.

``finetune train`` times itself as laps: each stretch of time goes to the
part named when it ends, so the parts add up to the whole run exactly, and
what no part claims (building the Trainer, say) is ``other``. Inside ``trainer.train()`` the trainer times its own
evaluations and checkpoint saves, which ``move`` takes out of the training
steps.

Run from the command line, the first run's clock starts with the process:
its startup holds the interpreter's start and the imports of torch,
transformers and datasets (7 to 10 s on 2 CPU cores), which a user waits for
as for any other part. A run started from Python (a test, ``--seeds``' later
runs) starts its clock when it is called.
"""

from __future__ import annotations

import contextlib
import os
import time
from pathlib import Path

# In the order a run goes through them; "other" is whatever no part claimed.
PARTS = (
    "startup",  # imports and the checks made before any data is read
    "load",  # the tokenizer and the model's weights
    "read",  # reading, cleaning and splitting the reviews
    "tokenize",  # the splits into token ids
    "teacher",  # a teacher's soft labels (finetune distill)
    "baseline",  # the TF-IDF baseline: its fit inline, or the wait for its process after training
    "train_steps",  # trainer.train() less the two below
    "evaluation",  # evaluations during training
    "checkpoint_saves",
    "final_save",  # the final model folder
    "test_scoring",  # the test split scored, test_report.json
    "report",  # report/: pictures and metrics.json
    "model_card",  # README.md
    "other",
)
LABELS = {
    "train_steps": "train steps",
    "checkpoint_saves": "checkpoint saves",
    "final_save": "final save",
    "test_scoring": "test scoring",
    "model_card": "model card",
}


# On time.perf_counter()'s scale: when the process running the command line started, until a run claims it.
_command_started: float | None = None


def start_at_process_start() -> None:
    """Make the next run's clock start when this process started: the command line calls it."""
    global _command_started
    _command_started = time.perf_counter() - seconds_since_process_start()


def seconds_since_process_start() -> float:
    """Seconds since this process started, to the kernel's tick (10 ms) on Linux."""
    with contextlib.suppress(OSError, ValueError, IndexError):
        # Both counted from the boot: the process's start in ticks (field 22 of its stat; the fields after the
        # command's closing parenthesis start at field 3) and the uptime in seconds. psutil's create_time adds
        # the boot time, which Linux gives in whole seconds: up to a second off.
        start_ticks = int(Path("/proc/self/stat").read_text().rsplit(")", 1)[1].split()[19])
        uptime = float(Path("/proc/uptime").read_text().split()[0])
        return max(uptime - start_ticks / os.sysconf("SC_CLK_TCK"), 0.0)
    import psutil

    return max(time.time() - psutil.Process().create_time(), 0.0)


class RunClock:
    """Wall-clock seconds per part of a run, timed as laps from the clock's creation.

    The first clock made after :func:`start_at_process_start` starts at the process's start instead, so
    its first lap (``startup``) holds the interpreter's start and the imports.
    """

    def __init__(self) -> None:
        global _command_started
        self.seconds = dict.fromkeys(PARTS, 0.0)
        self._lap_started = time.perf_counter() if _command_started is None else _command_started
        _command_started = None

    def lap(self, part: str) -> None:
        """Give the time since the last lap (or the start) to ``part``."""
        now = time.perf_counter()
        self.seconds[part] += now - self._lap_started
        self._lap_started = now

    def move(self, seconds: float, source: str, target: str) -> None:
        """Count ``seconds`` of ``source``'s time as ``target``'s (an evaluation inside the training steps, say)."""
        self.seconds[source] -= seconds
        self.seconds[target] += seconds

    def breakdown(self) -> dict[str, float]:
        """Seconds per part and their ``total``, the time since the start; the time since the last lap is other's."""
        self.lap("other")
        parts = {part: round(seconds, 3) for part, seconds in self.seconds.items()}
        return {**parts, "total": round(sum(self.seconds.values()), 3)}


def format_breakdown(breakdown: dict[str, float]) -> str:
    """The breakdown as two lines: the total, then each part that took time (in run order)."""
    parts = [
        f"{LABELS.get(part, part)} {seconds:.1f}s"
        for part, seconds in breakdown.items()
        if part != "total" and seconds >= 0.05
    ]
    return f"wall time {breakdown['total']:.1f}s:\n  " + ", ".join(parts)
