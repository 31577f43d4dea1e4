"""What a launcher (torchrun, accelerate launch, mpirun) told this process, asked before any device is set up.

``TrainingArguments`` decides whether a launch is distributed when it sets up
its device, from accelerate's ``PartialState``. Accelerate makes a launch of
several processes distributed on the CPU only when told ``cpu=True``: without
it each process sets itself up as a lone process 0, and all of them act as the
main one. So the launcher's own word is read here, from its environment
variables, and the arguments are held to it.
"""

from __future__ import annotations

import functools
import os
import sys

from ..errors import FinetuneError

# Where accelerate reads the number of processes: MPI's launchers, then torchrun's (accelerate launch sets it too).
_WORLD_SIZE_VARIABLES = ("PMI_SIZE", "OMPI_COMM_WORLD_SIZE", "MV2_COMM_WORLD_SIZE", "WORLD_SIZE")
_RANK_VARIABLES = ("PMI_RANK", "OMPI_COMM_WORLD_RANK", "MV2_COMM_WORLD_RANK", "RANK")


def launched_processes() -> int:
    """How many processes the launcher started (1 when the process was not launched by one)."""
    from accelerate.utils import get_int_from_env

    return get_int_from_env(list(_WORLD_SIZE_VARIABLES), 1)


def launched_rank() -> int:
    """This process's rank as the launcher numbered it (0 when not launched)."""
    from accelerate.utils import get_int_from_env

    return get_int_from_env(list(_RANK_VARIABLES), 0)


def launch_id() -> str | None:
    """What the processes of one launch share and no other running launch does, or None outside a launch.

    torchrun's run id alone is ``none`` unless ``--rdzv_id`` is given, so the
    rendezvous address goes with it: two launches running at once cannot both
    hold one address and port.
    """
    if launched_processes() <= 1:
        return None
    parts = [os.environ.get(name, "") for name in ("TORCHELASTIC_RUN_ID", "MASTER_ADDR", "MASTER_PORT")]
    return " ".join(parts) if any(parts) else f"parent process {os.getppid()}"


def accelerator_available() -> bool:
    """True when torch sees a GPU or another accelerator (CUDA, ROCm, XPU, MPS, ...) in this process."""
    import torch

    return torch.accelerator.is_available()


def cpu_for_launch(use_cpu: bool) -> bool:
    """``use_cpu`` for this process: turned on, with one line saying so, for a multi-process launch with no accelerator.

    Without it such a launch would not be distributed at all (see the module docstring).
    """
    processes = launched_processes()
    if use_cpu or processes <= 1 or accelerator_available():
        return use_cpu
    if launched_rank() == 0:
        _say_once(
            f"no GPU found: the {processes} launched processes train together on the CPU (use_cpu turned on; "
            "put use_cpu: true in the recipe to say so yourself)"
        )
    return True


@functools.cache
def _say_once(line: str) -> None:
    # --seeds and --folds build the arguments once per run; the user needs telling once.
    print(line, file=sys.stderr)


def check_launch_agrees(world_size: int, use_cpu: bool) -> None:
    """Refuse a launch whose processes would each train alone: the launcher started N, the arguments see fewer."""
    processes = launched_processes()
    if processes <= 1 or world_size == processes:
        return
    fix = (
        "launch one process per GPU, or pass --use_cpu true to train them together on the CPU"
        if not use_cpu
        else "launch them with torchrun or accelerate launch, which tell each process where the others are"
    )
    raise FinetuneError(
        f"{processes} processes were launched, but this one is set up with world size {world_size}, so they would "
        f"not train together (each alone, into the same output_dir); {fix}"
    )
