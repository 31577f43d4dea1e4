"""Under CUDA graphs gradients and evaluation outputs must survive the next replay (training/cuda_graphs.py).

A CPU has no CUDA graphs, so :class:`GraphLikeTrainer` does to gradients what
they do: every backward writes each parameter's gradient into one buffer of
its own, overwritten by the next backward, and a parameter without a
``.grad`` takes that buffer as its ``.grad``. The reference is
test_exactness.py's plain PyTorch full-batch step.
"""

from __future__ import annotations

import copy
import functools
import types

import pytest
import torch
from helpers import flat_parameters, review_dataset, sgd_args
from test_exactness import assert_matches_reference, reference_full_batch_steps, trained_parameters
from transformers import BertForSequenceClassification, DataCollatorWithPadding

from finetune import ReviewTrainer
from finetune.training import trainer as trainer_module
from finetune.training.cuda_graphs import uses_cuda_graphs


@pytest.fixture(scope="module")
def initial_model(tiny_model_dir):
    return BertForSequenceClassification.from_pretrained(tiny_model_dir)


class GraphLikeTrainer(ReviewTrainer):
    """ReviewTrainer whose model's gradients live in buffers that each backward overwrites, as in a CUDA graph."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.graph_buffers: dict[torch.nn.Parameter, torch.Tensor] = {}
        self.had_no_grad: dict[torch.nn.Parameter, bool] = {}
        for parameter in self.model.parameters():
            parameter.register_hook(functools.partial(self._write_into_buffer, parameter))

    def _write_into_buffer(self, parameter, grad):
        # Runs before autograd adds the gradient into .grad: the replay's output, in the graph's memory.
        self.had_no_grad[parameter] = parameter.grad is None
        buffer = self.graph_buffers.setdefault(parameter, torch.empty_like(grad))
        return buffer.copy_(grad)

    def training_step(self, model, inputs, num_items_in_batch=None):
        loss = super().training_step(model, inputs, num_items_in_batch)
        for parameter, had_none in self.had_no_grad.items():
            if had_none and parameter.grad is not None:
                # Autograd takes a graph's output as .grad where there was none (here it copied, since the
                # buffer is held above): the buffer itself, as a CUDA graph's gradient would be.
                parameter.grad = self.graph_buffers[parameter]
        self.had_no_grad.clear()
        return loss


@pytest.mark.parametrize("budget", [None, 24], ids=["by-count", "budget-24"])
def test_gradients_survive_the_next_micro_batch(initial_model, tokenizer, tmp_path, monkeypatch, budget):
    dataset = review_dataset(tokenizer, 12)
    collator = DataCollatorWithPadding(tokenizer)
    reference = reference_full_batch_steps(initial_model, dataset, collator, 6)
    initial = flat_parameters(initial_model)

    monkeypatch.setattr(trainer_module, "uses_cuda_graphs", lambda args: True)
    trained = trained_parameters(GraphLikeTrainer, initial_model, dataset, collator, tmp_path, 3, 2, **_budget(budget))
    assert_matches_reference(trained, reference, initial)

    # The control: without the copies the stand-in graph loses every micro-batch's gradient but the last.
    monkeypatch.setattr(trainer_module, "uses_cuda_graphs", lambda args: False)
    broken = trained_parameters(GraphLikeTrainer, initial_model, dataset, collator, tmp_path, 3, 2, **_budget(budget))
    with pytest.raises(AssertionError, match="relative error"):
        assert_matches_reference(broken, reference, initial)


def _budget(budget):
    return {} if budget is None else {"micro_batch_tokens": budget}


def test_a_parameter_no_micro_batch_reached_keeps_no_gradient(initial_model, tokenizer, tmp_path, monkeypatch):
    """Copies only of gradients that exist: the optimizer still skips a parameter that none reached."""
    seen = []

    class Watching(GraphLikeTrainer):
        def _update(self, model, window_loss):
            seen.append(model.unused_weight.grad)
            return super()._update(model, window_loss)

    monkeypatch.setattr(trainer_module, "uses_cuda_graphs", lambda args: True)
    model = copy.deepcopy(initial_model)
    model.register_parameter("unused_weight", torch.nn.Parameter(torch.ones(4)))  # in no forward
    dataset = review_dataset(tokenizer, 12)
    trained_parameters(Watching, model, dataset, DataCollatorWithPadding(tokenizer), tmp_path, 3, 2)
    assert len(seen) == 2 and all(grad is None for grad in seen)


def args_like(**fields):
    values = {"torch_compile": True, "device": torch.device("cuda"), "torch_compile_backend": None}
    return types.SimpleNamespace(**{**values, **fields})


@pytest.mark.parametrize(
    ("fields", "expected"),
    [
        ({"torch_compile_mode": "reduce-overhead"}, True),
        ({"torch_compile_mode": "max-autotune"}, True),
        ({"torch_compile_mode": "max-autotune-no-cudagraphs"}, False),
        ({"torch_compile_mode": None}, False),
        ({"torch_compile_mode": None, "torch_compile_backend": "cudagraphs"}, True),
        ({"torch_compile_mode": "reduce-overhead", "torch_compile_backend": "aot_eager"}, False),
        ({"torch_compile_mode": "reduce-overhead", "device": torch.device("cpu")}, False),
        ({"torch_compile_mode": "reduce-overhead", "torch_compile": False}, False),
    ],
)
def test_which_runs_use_cuda_graphs(fields, expected):
    assert uses_cuda_graphs(args_like(**fields)) is expected


def test_evaluation_keeps_each_batchs_outputs(initial_model, tokenizer, tmp_path, monkeypatch):
    """Logits in memory the next batch's forward overwrites, as a CUDA graph's: predictions still each row's own."""
    dataset = review_dataset(tokenizer, 10)
    collator = DataCollatorWithPadding(tokenizer)
    batch = collator(list(dataset))
    labels = batch.pop("labels")
    with torch.no_grad():
        expected = initial_model.eval()(**batch).logits  # one padded batch, eager: each row's own logits
    assert len(set(labels.tolist())) > 1

    def predictions(under_cuda_graphs: bool) -> torch.Tensor:
        monkeypatch.setattr(trainer_module, "uses_cuda_graphs", lambda args: under_cuda_graphs)
        model = copy.deepcopy(initial_model)
        _outputs_in_graph_memory(model)
        args = sgd_args(tmp_path, 3, 2, per_device_eval_batch_size=3)
        trainer = ReviewTrainer(model=model, args=args, data_collator=collator)
        return torch.as_tensor(trainer.predict(dataset).predictions)

    assert torch.allclose(predictions(True), expected, atol=1e-5)
    # The control: kept as they come, every batch's logits but the last were overwritten.
    assert not torch.allclose(predictions(False), expected, atol=1e-5)


def _outputs_in_graph_memory(model) -> None:
    """``model``'s logits and loss written into one buffer that every forward overwrites, as a CUDA graph's."""
    forward, memory = model.forward, torch.empty(4096)

    @functools.wraps(forward)  # Trainer reads the signature to choose the dataset's columns
    def forward_into_memory(*args, **kwargs):
        outputs = forward(*args, **kwargs)
        for key in ("loss", "logits"):
            if outputs.get(key) is not None:
                start = 0 if key == "logits" else 2048
                value = outputs[key]
                outputs[key] = memory[start : start + value.numel()].view_as(value).copy_(value)
        return outputs

    model.forward = forward_into_memory
