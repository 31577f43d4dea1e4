"""A run that asks for bf16 or fp16 on a CPU without native kernels for it is warned, once, with the fix."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from finetune.pipeline import arguments


def _args(bf16: bool = False, fp16: bool = False, device: str = "cpu") -> SimpleNamespace:
    return SimpleNamespace(bf16=bf16, fp16=fp16, device=torch.device(device), should_log=True)


@pytest.mark.parametrize("precision", ["bf16", "fp16"])
def test_half_precision_without_cpu_kernels_is_warned_with_the_fix(precision, monkeypatch, capsys):
    asked = []
    monkeypatch.setattr(arguments, "half_precision_has_cpu_kernels", lambda name: asked.append(name) or False)
    arguments.warn_half_precision_without_cpu_kernels(_args(**{precision: True}))
    err = capsys.readouterr().err.strip().splitlines()
    assert asked == [precision]
    assert len(err) == 1 and err[0].startswith(f"warning: this CPU has no native {precision} kernels")
    assert f"drop --{precision}" in err[0]


@pytest.mark.parametrize(
    ("args", "kernels"),
    [
        (_args(bf16=True), True),  # native kernels: nothing to say
        (_args(), False),  # fp32 needs none
        (_args(bf16=True, device="cuda"), False),  # a GPU's kernels are not the CPU's
    ],
)
def test_no_warning_where_the_precision_runs_at_speed(args, kernels, monkeypatch, capsys):
    monkeypatch.setattr(arguments, "half_precision_has_cpu_kernels", lambda name: kernels)
    arguments.warn_half_precision_without_cpu_kernels(args)
    assert capsys.readouterr().err == ""
