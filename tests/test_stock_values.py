"""Stock ``TrainingArguments`` values that are valid pass the checks of ``config/stock_values.py`` untouched.

The refusals, each once a traceback after the data was read, are asserted with
their messages in tests/bad_input/test_recipe_and_flags.py.
"""

from __future__ import annotations

import pytest
from helpers import quiet_args

from finetune.errors import FinetuneError


@pytest.mark.parametrize(
    "values",
    [
        dict(lr_scheduler_type="cosine", lr_scheduler_kwargs={"num_cycles": 0.3}),
        dict(lr_scheduler_type="cosine_with_min_lr", lr_scheduler_kwargs={"min_lr_rate": 0.1}),
        # Passed on to torch's ReduceLROnPlateau, which says itself what it takes.
        dict(lr_scheduler_type="reduce_lr_on_plateau", lr_scheduler_kwargs={"patience": 1}, eval_strategy="epoch"),
        dict(report_to="all"),
        dict(report_to="none"),
        dict(optim_args="lr=1e-3, betas=0.9"),
        dict(label_names=["labels"]),
        dict(torch_compile_mode="reduce-overhead"),
        dict(torch_compile_backend="aot_eager", torch_compile_mode="anything the backend reads"),
        dict(dataloader_num_workers=2, dataloader_persistent_workers=True, dataloader_prefetch_factor=1),
        dict(eval_accumulation_steps=1, neftune_noise_alpha=5.0),
    ],
    ids=lambda values: ",".join(values),
)
def test_valid_values_pass(tmp_path, values):
    args = quiet_args(tmp_path, **values)
    for name, value in values.items():
        if name != "report_to":  # turned into a list of integrations
            assert getattr(args, name) == value


def test_a_misspelt_scheduler_option_names_what_the_scheduler_takes(tmp_path):
    with pytest.raises(FinetuneError, match="lr_scheduler_type constant has no warmup; it takes last_epoch, or pick"):
        quiet_args(tmp_path, lr_scheduler_type="constant", lr_scheduler_kwargs={"warmup": 3})
