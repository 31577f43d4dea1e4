"""Padded batches read through SDPA without a host read: transformers' padding check left out.

Before each forward, transformers' SDPA mask code asks whether a padded batch
has any padding at all (``padding_mask.all()``), to pass no mask when it has
none. On a GPU that question is a host sync: the host waits for every kernel
queued before it, once per micro-batch, where ReviewTrainer reads the device
once per update. Here the mask is built without asking: a batch with an
attention mask gets SDPA's boolean mask (the one stock builds whenever there
is padding, so the same logits), and one without gets none, as in stock.
Installed for a training run (ReviewTrainer), removed after, so the saved
model is stock.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn
from transformers import AttentionInterface
from transformers.integrations.sdpa_attention import sdpa_attention_forward
from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

from .models import classifier_of

SDPA_WITHOUT_READS = "finetune_sdpa_without_reads"


def sdpa_mask_without_reads(*args: Any, attention_mask: torch.Tensor | None = None, **kwargs: Any) -> Any:
    """``sdpa_mask``, skipping the mask only where there is none to read (no ``attention_mask``)."""
    kwargs["allow_is_bidirectional_skip"] = kwargs.get("allow_is_bidirectional_skip", False) and attention_mask is None
    return sdpa_mask(*args, attention_mask=attention_mask, **kwargs)


AttentionInterface.register(SDPA_WITHOUT_READS, sdpa_attention_forward)
AttentionMaskInterface.register(SDPA_WITHOUT_READS, sdpa_mask_without_reads)


class MaskWithoutReads:
    """``model`` (a classifier using transformers' SDPA) masking without a host read until :meth:`remove`.

    Other models (eager attention, or their own attention code as MPNet's)
    are left as they are.
    """

    def __init__(self, model: nn.Module) -> None:
        self.model = classifier_of(model)
        config = getattr(self.model, "config", None)
        self.installed = (
            getattr(self.model, "_supports_attention_backend", False)
            and getattr(config, "_attn_implementation", None) == "sdpa"
        )
        if self.installed:
            self.model.set_attn_implementation(SDPA_WITHOUT_READS)

    def remove(self) -> None:
        """Put SDPA's own mask code back."""
        if self.installed:
            self.model.set_attn_implementation("sdpa")
