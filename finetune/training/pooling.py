"""Mean pooling for a BERT classifier, built from one more stock encoder layer.

Sentence-transformer checkpoints such as the packaged all-MiniLM-L6-v2 were
trained to be read as the mean of their token vectors, while
``BertForSequenceClassification`` reads only the ``[CLS]`` token. A new head
class would need ``trust_remote_code`` to load. Instead, ``pooling: mean``
appends one ordinary ``BertLayer`` whose weights make its ``[CLS]`` output the
masked mean of the layer below:

- query 0: every attention score is 0, so each head attends uniformly over the
  tokens the attention mask keeps (padding gets no weight);
- value identity: what is averaged is the hidden states themselves;
- attention output ``c x identity``: the residual adds the ``[CLS]`` vector
  itself, and the layer norm that follows cannot tell ``c m + h_cls`` from
  ``m + h_cls / c``, so with ``c`` large the ``[CLS]`` share is negligible;
- feed-forward output 0, layer norms identity: the block passes the mean on.

The pooler becomes the identity before its ``tanh``. The layer, the pooler and
the classifier then all train: the query can learn to weight tokens
(attention pooling, starting from the mean). The saved folder is a plain
``BertForSequenceClassification`` with one more layer, so ``pipeline()``,
``evaluate``, ``predict`` and the ONNX export load it with no code of ours.
"""

from __future__ import annotations

import torch
from transformers import PreTrainedModel

from ..errors import FinetuneError

# How much more the mean weighs than the [CLS] vector in the pooling layer's residual sum.
MEAN_WEIGHT = 64.0
# Recorded in config.json so that a model that already has the layer does not get a second one.
CONFIG_FLAG = "finetune_pooling"


def has_mean_pooling(model: PreTrainedModel) -> bool:
    """Whether ``model`` already ends in the mean-pooling layer (its config says so)."""
    return getattr(model.config, CONFIG_FLAG, None) == "mean"


def add_mean_pooling_layer(model: PreTrainedModel) -> PreTrainedModel:
    """Append the mean-pooling encoder layer to a BERT classifier, in place; returns ``model``."""
    from transformers.models.bert.modeling_bert import BertLayer

    if has_mean_pooling(model):
        return model
    bert = getattr(model, "bert", None)
    if bert is None or bert.pooler is None:
        raise FinetuneError(
            f"pooling: mean works on BERT classifiers with a pooler, and this model is a {type(model).__name__}; "
            "use pooling: cls"
        )
    config = model.config
    hidden = config.hidden_size
    layer = BertLayer(config, layer_idx=config.num_hidden_layers)
    identity = torch.eye(hidden)
    with torch.no_grad():
        attention = layer.attention
        attention.self.query.weight.zero_()
        attention.self.query.bias.zero_()
        attention.self.key.weight.copy_(identity)
        attention.self.key.bias.zero_()
        attention.self.value.weight.copy_(identity)
        attention.self.value.bias.zero_()
        attention.output.dense.weight.copy_(identity * MEAN_WEIGHT)
        attention.output.dense.bias.zero_()
        _identity_norm(attention.output.LayerNorm)
        layer.output.dense.weight.zero_()
        layer.output.dense.bias.zero_()
        _identity_norm(layer.output.LayerNorm)
        bert.pooler.dense.weight.copy_(identity)
        bert.pooler.dense.bias.zero_()
    reference = next(bert.encoder.layer[-1].parameters())
    bert.encoder.layer.append(layer.to(device=reference.device, dtype=reference.dtype))
    config.num_hidden_layers += 1
    setattr(config, CONFIG_FLAG, "mean")
    return model


def _identity_norm(norm: torch.nn.LayerNorm) -> None:
    norm.weight.fill_(1.0)
    norm.bias.zero_()
