"""ReviewTrainer under ``torch_compile``: the same updates, and one graph for pieces of every shape.

A window cut by tokens gives pieces of many shapes (rows x longest review).
Compiled, they must still make the full-batch update (the reference is the
plain PyTorch of test_exactness.py and test_mpnet_attention.py, uncompiled),
and must not compile a graph per shape: after the first shape, Dynamo's
automatic dynamic shapes compile one graph for the rest (and one for pieces
of a single review). The tests use the
``aot_eager`` backend (Dynamo and AOTAutograd, without generating kernels),
which takes seconds where Inductor takes minutes on a CPU.
"""

from __future__ import annotations

import copy

import pytest
import torch
import torch._dynamo
from helpers import TEST_ON_CPU, flat_parameters, reference_sgd_steps, review_dataset, sgd_args
from test_any_split import RecordingCollator
from test_exactness import assert_matches_reference, reference_full_batch_steps, trained_parameters
from test_mpnet_attention import tiny_mpnet
from transformers import BertForSequenceClassification, DataCollatorWithPadding

from finetune import ReviewTrainer

BACKEND = "aot_eager"


@pytest.fixture(scope="module")
def initial_model(tiny_model_dir):
    return BertForSequenceClassification.from_pretrained(tiny_model_dir)


def graphs_compiled() -> int:
    """Graphs Dynamo has compiled in this process so far (forward graphs; each has its backward)."""
    return torch._dynamo.utils.counters["stats"]["unique_graphs"]


@pytest.mark.parametrize("budget", [24, None], ids=["by-tokens", "by-count"])
def test_compiled_update_equals_full_batch_step(initial_model, tokenizer, tmp_path, budget):
    torch._dynamo.reset()
    dataset = review_dataset(tokenizer, 12)
    collator = RecordingCollator(tokenizer)
    reference = reference_full_batch_steps(initial_model, dataset, collator, 6)
    collator.batches.clear()
    before = graphs_compiled()
    compiled = {"micro_batch_tokens": budget, "torch_compile_backend": BACKEND}
    trained = trained_parameters(ReviewTrainer, initial_model, dataset, collator, tmp_path, 3, 2, **compiled)
    assert_matches_reference(trained, reference, flat_parameters(initial_model))
    graphs = graphs_compiled() - before
    shapes = {tuple(batch["input_ids"].shape) for batch in collator.batches}
    # Compiled indeed, and not once per shape: the first shape's graph, then one for every other, and one
    # for pieces of a single review (Dynamo specializes sizes of 1).
    assert len(shapes) >= 4, shapes
    assert 1 <= graphs <= 3, f"{graphs} graphs for {len(shapes)} shapes"


def test_compiled_mpnet_keeps_the_contract_and_evaluates(tokenizer, tmp_path):
    """MPNet's fused attention (installed for the run, then for evaluation) compiles and computes the same."""
    torch._dynamo.reset()
    model = tiny_mpnet(tokenizer)
    dataset = review_dataset(tokenizer, 10)
    collator = DataCollatorWithPadding(tokenizer)
    reference = reference_sgd_steps(model, dataset, collator, window_samples=6)
    trained = copy.deepcopy(model)
    args = sgd_args(tmp_path, 3, 2, micro_batch_tokens=24, torch_compile_backend=BACKEND)
    trainer = ReviewTrainer(model=trained, args=args, train_dataset=dataset, data_collator=collator)
    before = graphs_compiled()
    trainer.train()
    assert graphs_compiled() > before
    assert torch.allclose(flat_parameters(trained), reference, atol=1e-5)
    batch = {key: value.to(trained.device) for key, value in collator(list(dataset)).items()}  # CUDA: on the GPU
    labels = batch.pop("labels")
    with torch.no_grad():
        eager_loss = torch.nn.functional.cross_entropy(trained.eval()(**batch).logits, labels)
    assert trainer.evaluate(dataset)["eval_loss"] == pytest.approx(float(eager_loss), abs=1e-5)
    assert not any("forward" in vars(module) for module in trained.modules()), "removed after the run"


@pytest.mark.skipif(TEST_ON_CPU, reason="CUDA graphs need a GPU: FINETUNE_TEST_DEVICE=cuda (tools/gpu_bench.sh)")
@pytest.mark.parametrize("budget", [24, None], ids=["by-tokens", "by-count"])
def test_cuda_graphs_keep_the_update(initial_model, tokenizer, tmp_path, budget):
    """Inductor with CUDA graphs (reduce-overhead): a window of several micro-batches, every gradient kept.

    Without cuda_graphs.py's copies torch 2.13 overwrites the first micro-batch's gradient with the
    second's (or says it cannot read it); test_cuda_graphs.py shows the same on a CPU stand-in.
    """
    torch._dynamo.reset()
    dataset = review_dataset(tokenizer, 12)
    reference = reference_full_batch_steps(initial_model, dataset, DataCollatorWithPadding(tokenizer), 6)
    collator = RecordingCollator(tokenizer, pad_to_multiple_of=8)  # few shapes, few graphs to record
    compiled = {"micro_batch_tokens": budget, "torch_compile": True, "torch_compile_mode": "reduce-overhead"}
    trained = trained_parameters(ReviewTrainer, initial_model, dataset, collator, tmp_path, 3, 2, **compiled)
    assert_matches_reference(trained, reference, flat_parameters(initial_model))
    assert any(len(batch["labels"]) < 6 for batch in collator.batches), "no window of several micro-batches"
