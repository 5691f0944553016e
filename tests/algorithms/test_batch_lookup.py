"""The one lookup of a tensor in a Composer batch or outputs (composer_dynsample/batches.py) and its callers' errors."""

from collections import namedtuple

import pytest
import torch
from composer.core import State
from composer.devices import DeviceCPU

from composer_dynsample import EmbeddingModel
from composer_dynsample.batches import batch_rows, batch_tensor, find_in_batch

FEATURES = torch.arange(6.0).view(3, 2)
LABELS = torch.tensor([4, 5, 6])
HNM = {"owner": "HardNegativeMining", "what": "the labels", "advice": "Set labels_key to where it is."}


def _state(batch):
    state = State(
        model=EmbeddingModel(torch.nn.Linear(2, 2)), rank_zero_seed=0, run_name="t", device=DeviceCPU()
    )
    state.batch = batch
    return state


@pytest.mark.parametrize(
    ("source", "key", "found_key"),
    [
        ({"features": FEATURES, "labels": LABELS}, None, "labels"),  # a dict: the default key
        ({"features": FEATURES, "target": LABELS}, "target", "target"),  # a dict: the key given
        ((FEATURES, LABELS), None, 1),  # a tuple: the default index
        ([FEATURES, LABELS], None, 1),  # a list
        ([FEATURES, LABELS], -1, -1),  # an index given
        (namedtuple("Batch", "x y")(FEATURES, LABELS), "y", "y"),  # an attribute, as batch_get_item reads it
        (_state({"labels": LABELS}), None, "labels"),  # a State: its batch
        (_state((FEATURES, LABELS)), None, 1),
    ],
)
def test_every_kind_of_batch_finds_the_labels(source, key, found_key):
    value, looked_at = batch_tensor(source, key, "labels", 1)
    assert value is LABELS and looked_at == found_key
    assert find_in_batch(source, key, "labels", 1, **HNM) is LABELS


def test_a_getter_key_is_taken_as_composer_takes_it():
    value, _ = batch_tensor({"nested": {"y": LABELS}}, lambda batch: batch["nested"]["y"])
    assert value is LABELS


def test_outputs_without_a_key_are_the_tensor_itself():
    embeddings = torch.randn(3, 2)
    assert batch_tensor(embeddings, None) == (embeddings, None)
    assert find_in_batch(embeddings, None, where="state.outputs", **HNM) is embeddings


@pytest.mark.parametrize(
    ("source", "key", "dict_key"),
    [
        ({"features": FEATURES}, None, "labels"),  # the default key is missing
        ({"features": FEATURES, "labels": [4, 5, 6]}, None, "labels"),  # there, but not a tensor
        ((FEATURES, LABELS), "labels", "labels"),  # a string key on a tuple (batch_get raises AttributeError)
        ({"labels": LABELS}, 1, "labels"),  # an index on a dict
        ((FEATURES,), None, "labels"),  # a tuple too short
        (FEATURES, None, "labels"),  # a tensor batch has no default place: no row is taken for the labels
        ({"labels": LABELS}, None, None),  # only an index is a default: a dict has none
    ],
)
def test_no_tensor_there_is_none(source, key, dict_key):
    assert batch_tensor(source, key, dict_key, 1)[0] is None


@pytest.mark.parametrize(
    ("source", "key", "where", "message"),
    [
        (
            {"features": FEATURES, "target": LABELS},
            None,
            "state.batch",
            "HardNegativeMining looked for the labels at state.batch['labels'] and found nothing; state.batch "
            "is a dict with keys ['features', 'target']. Set labels_key to where it is.",
        ),
        (
            {"labels": [4, 5, 6]},
            None,
            "state.batch",
            "HardNegativeMining looked for the labels at state.batch['labels'] and found an object of type list; "
            "state.batch is a dict with keys ['labels']. Set labels_key to where it is.",
        ),
        (
            (FEATURES,),
            None,
            "state.batch",
            "HardNegativeMining looked for the labels at state.batch[1] and found nothing; state.batch is a "
            "tuple of 1 items. Set labels_key to where it is.",
        ),
        (
            FEATURES,
            None,
            "batch",
            "HardNegativeMining looked for the labels at batch and found nothing; batch is a tensor of shape "
            "(3, 2) and dtype torch.float32. Set labels_key to where it is.",
        ),
        (
            _state({3: LABELS}),
            "labels",
            "state.batch",
            "HardNegativeMining looked for the labels at state.batch['labels'] and found nothing; state.batch "
            "is a dict with keys ['3']. Set labels_key to where it is.",
        ),
    ],
)
def test_the_error_says_what_was_looked_for_where_and_what_is_there(source, key, where, message):
    with pytest.raises(ValueError) as raised:
        find_in_batch(source, key, "labels", 1, where=where, **HNM)
    assert str(raised.value) == message


def test_any_value_is_taken_when_no_tensor_is_required():
    features = {"input_ids": torch.zeros(3, 4, dtype=torch.long)}
    assert find_in_batch({"features": features}, None, "features", 0, tensor=False, **HNM) is features
    assert find_in_batch(([1, 2], LABELS), None, "features", 0, tensor=False, **HNM) == [1, 2]
    with pytest.raises(ValueError, match=r"at state.batch\['features'\] and found nothing"):
        find_in_batch({"labels": LABELS}, None, "features", 0, tensor=False, **HNM)


@pytest.mark.parametrize(
    ("source", "rows"),
    [
        (LABELS, 3),
        ({"index": torch.tensor(7), "features": FEATURES[:2], "labels": LABELS}, 2),  # the first with rows
        ([["not", "a", "tensor"], LABELS], 3),
        ((FEATURES[:1],), 1),
        (_state({"features": FEATURES}), 3),
        (None, None),
        (torch.tensor(7), None),
        ({"labels": [1, 2]}, None),
    ],
)
def test_batch_rows_reads_the_first_tensor_with_rows(source, rows):
    assert batch_rows(source) == rows


@pytest.mark.parametrize(
    ("batch", "message"),
    [
        (
            {"x": FEATURES, "labels": LABELS},
            r"looked for the features at batch\['features'\] and found nothing; ",
        ),
        ((FEATURES,), r"looked for the labels at batch\[1\] and found nothing; batch is a tuple of 1 items"),
        (
            FEATURES,
            r"looked for the features at batch and found nothing; batch is a tensor of shape \(3, 2\)",
        ),
    ],
)
def test_the_model_names_both_batch_forms(batch, message):
    model = EmbeddingModel(torch.nn.Linear(2, 2))
    with pytest.raises(
        ValueError, match=message + r".*'features' and 'labels' .* or \(features, labels\) sequences"
    ):
        model(batch)


def test_the_model_reads_dicts_and_sequences_alike():
    model = EmbeddingModel(torch.nn.Linear(2, 2), features_key="x", labels_key="y")
    expected = model.embed(FEATURES)
    for batch in ({"x": FEATURES, "y": LABELS}, (FEATURES, LABELS), [FEATURES, LABELS, "extra"]):
        assert torch.equal(model(batch), expected)
