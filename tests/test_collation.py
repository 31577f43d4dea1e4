"""``PaddingCollator`` (finetune/data/collation.py) against transformers' ``DataCollatorWithPadding``.

The reference is transformers' own collator on the same features: every batch
must have its keys in its order, its dtypes and its values, or raise its error.
"""

from __future__ import annotations

import copy

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from transformers import DataCollatorWithPadding

from finetune.data.collation import PaddingCollator, faster_collator


@pytest.fixture(scope="module")
def tokenizers(tokenizer):
    """The packaged tokenizer padding on the right (its own side) and a copy padding on the left."""
    left = copy.deepcopy(tokenizer)
    left.padding_side = "left"
    return {"right": tokenizer, "left": left}


def assert_same_batch(ours, theirs):
    assert type(ours) is type(theirs)
    assert list(ours.keys()) == list(theirs.keys())
    for key in theirs:
        assert type(ours[key]) is type(theirs[key]), key
        if isinstance(theirs[key], torch.Tensor):
            assert ours[key].dtype == theirs[key].dtype, key
            assert ours[key].shape == theirs[key].shape, key
            assert torch.equal(ours[key], theirs[key]), key
        else:
            np.testing.assert_array_equal(ours[key], theirs[key])


@st.composite
def review_features(draw):
    """Tokenized reviews as a datasets row gives them: token lists of one length per review, and row values."""
    count = draw(st.integers(min_value=1, max_value=9))
    lengths = draw(st.lists(st.integers(min_value=0, max_value=30), min_size=count, max_size=count))
    other_token_keys = st.sampled_from(["token_type_ids", "attention_mask", "special_tokens_mask"])
    token_keys = ["input_ids", *draw(st.lists(other_token_keys, unique=True))]
    label_key = draw(st.sampled_from([None, "labels", "label", "label_ids"]))
    soft_labels = draw(st.booleans())  # a teacher's probabilities, one list of floats per review (distillation)
    features = []
    for length in lengths:
        feature = {}
        for key in token_keys:
            high = 30_000 if key == "input_ids" else 1
            feature[key] = draw(st.lists(st.integers(0, high), min_size=length, max_size=length))
        if label_key:
            feature[label_key] = draw(st.integers(0, 4))
        if soft_labels:
            feature["teacher_probabilities"] = draw(st.lists(st.floats(0, 1), min_size=3, max_size=3))
        features.append(feature)
    return features


@settings(max_examples=300, deadline=None, derandomize=True)
@given(
    features=review_features(),
    side=st.sampled_from(["right", "left"]),
    pad_to_multiple_of=st.sampled_from([None, 1, 8]),
    padding=st.sampled_from([True, "longest"]),
    tensors=st.sampled_from(["pt", "np"]),  # np: prediction with an int8 export
)
def test_the_same_batches_as_data_collator_with_padding(
    tokenizers, features, side, pad_to_multiple_of, padding, tensors
):
    settings_ = {"tokenizer": tokenizers[side], "padding": padding, "pad_to_multiple_of": pad_to_multiple_of}
    settings_["return_tensors"] = tensors
    ours = PaddingCollator(**settings_)
    # Each drawn batch takes the fast path (a fallback would compare transformers with itself).
    assert ours._pad_fast(features) is not None
    assert_same_batch(ours(copy.deepcopy(features)), DataCollatorWithPadding(**settings_)(copy.deepcopy(features)))


def plain_features(lengths=(5, 3, 7)):
    return [
        {"input_ids": list(range(101, 101 + length)), "attention_mask": [1] * length, "labels": index % 3}
        for index, length in enumerate(lengths)
    ]


def with_values(features, key, values):
    changed = copy.deepcopy(features)
    changed[0][key] = values
    return changed


@pytest.mark.parametrize(
    "case, features, collator_settings",
    [
        ("input ids as floats", with_values(plain_features(), "input_ids", [1.0, 2.5, 3.0, 4.0, 5.0]), {}),
        ("a float after an int", with_values(plain_features(), "input_ids", [1, 2.5, 3, 4, 5]), {}),
        ("a bool mask", with_values(plain_features((2, 2)), "attention_mask", [True, True]), {}),
        ("numpy ids", [{**f, "input_ids": np.array(f["input_ids"])} for f in plain_features()], {}),
        ("torch ids", [{**f, "input_ids": torch.tensor(f["input_ids"])} for f in plain_features()], {}),
        ("a mask shorter than its ids", with_values(plain_features(), "attention_mask", [1, 1]), {}),
        ("a review without a key", [plain_features()[0], {"input_ids": [5, 6]}], {}),
        ("padding to max_length", plain_features(), {"padding": "max_length", "max_length": 12}),
        ("no padding", plain_features((4, 4)), {"padding": False}),
        ("a padding misspelt", plain_features(), {"padding": "longst"}),
        ("tensorflow batches", plain_features(), {"return_tensors": "tf"}),
        ("no reviews", [], {}),
    ],
)
def test_what_it_does_not_pad_itself_is_padded_by_transformers(tokenizers, case, features, collator_settings):
    settings_ = {"tokenizer": tokenizers["right"], **collator_settings}
    ours = PaddingCollator(**settings_)
    assert ours._pad_fast(copy.deepcopy(features)) is None, case
    try:
        theirs = DataCollatorWithPadding(**settings_)(copy.deepcopy(features))
    except Exception as error:  # the same refusal, message included
        with pytest.raises(type(error)) as raised:
            ours(copy.deepcopy(features))
        assert str(raised.value) == str(error)
        return
    assert_same_batch(ours(copy.deepcopy(features)), theirs)


def test_only_a_plain_data_collator_with_padding_is_replaced(tokenizer):
    stock = DataCollatorWithPadding(tokenizer, pad_to_multiple_of=8)
    replaced = faster_collator(stock)
    assert type(replaced) is PaddingCollator and isinstance(replaced, DataCollatorWithPadding)
    assert replaced.tokenizer is tokenizer and (replaced.padding, replaced.pad_to_multiple_of) == (True, 8)

    class OwnCollator(DataCollatorWithPadding):
        pass

    own = OwnCollator(tokenizer)
    assert faster_collator(own) is own  # a subclass may pad otherwise: left as it is
    assert faster_collator(replaced) is replaced
    assert faster_collator(None) is None
