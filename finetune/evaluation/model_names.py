"""Names for models compared side by side: each folder's name, with as many parent folders as tell them apart."""

from __future__ import annotations

from pathlib import PurePath


def distinct_names(models: list[str]) -> dict[str, str]:
    """Each model path's shortest trailing part that no other path in ``models`` shares.

    ``runs/clean/seed-42`` and ``runs/noisy/seed-42`` read ``clean/seed-42`` and
    ``noisy/seed-42``; a run's checkpoints keep their own names (``checkpoint-40``).
    """
    parts = {model: PurePath(model).parts for model in models}
    names: dict[str, str] = {}
    for model, own in parts.items():
        others = [other for key, other in parts.items() if key != model]
        depth = 1
        while depth < len(own) and any(other[-depth:] == own[-depth:] for other in others):
            depth += 1
        names[model] = "/".join(own[-depth:])
    return names
