"""check_pool: the one check of a batch and its optional pool that the losses, miners and metrics share;
check_labels and as_labels: the one check of labels."""

import numpy as np
import pytest
import torch

from composer_dynsample.validation import LABEL_MESSAGES, InputTypeError, as_labels, check_labels, check_pool

NAMES = ("embeddings", "labels", "ref_emb", "ref_labels")
BATCH = (torch.randn(3, 2), torch.tensor([0, 0, 1]))


def test_no_pool_and_a_valid_pool():
    assert check_pool(BATCH, (None, None), NAMES) is None
    pool = (torch.randn(5, 2), torch.arange(5))
    checked = check_pool(BATCH, pool, NAMES)
    assert checked[0] is pool[0] and checked[1] is pool[1]


@pytest.mark.parametrize(
    ("pool", "error", "message"),
    [
        ((torch.randn(5, 2), None), ValueError, "ref_emb and ref_labels must be given together: ref_emb was"),
        ((None, torch.arange(5)), ValueError, "together: ref_labels was given without ref_emb"),
        ((torch.randn(5, 4), torch.arange(5)), ValueError, "ref_emb has dimension 4 but embeddings 2"),
        ((torch.randn(5, 2), torch.arange(4)), ValueError, "ref_labels has 4 entries but ref_emb has 5 rows"),
        ((torch.randn(5, 2), torch.rand(5)), InputTypeError, "ref_labels must be a 1-D integer tensor"),
        ((torch.arange(10).view(5, 2), torch.arange(5)), InputTypeError, "ref_emb must be a 2-D floating"),
    ],
)
def test_bad_pool_names_the_argument(pool, error, message):
    with pytest.raises(error, match=message):
        check_pool(BATCH, pool, NAMES)


def test_the_batch_is_checked_first_and_finiteness_is_optional():
    with pytest.raises(ValueError, match="labels has 2 entries but embeddings has 3 rows"):
        check_pool((BATCH[0], torch.tensor([0, 1])), (None, None), NAMES)
    bad = torch.tensor([[0.0, float("nan")]] * 5)
    with pytest.raises(ValueError, match="ref_emb contain NaN or inf"):
        check_pool(BATCH, (bad, torch.arange(5)), NAMES)
    assert check_pool(BATCH, (bad, torch.arange(5)), NAMES, finite=False) is not None


# --- check_labels and as_labels: the label checks of the losses, metrics, mining, samplers and data ---


def test_check_labels_returns_the_tensor_itself():
    labels = torch.tensor([3, 1, 3], dtype=torch.int32)
    assert check_labels("labels", labels) is labels
    assert check_labels("labels", labels, 3, "embeddings") is labels


@pytest.mark.parametrize(
    ("value", "error", "message"),
    [
        ([0, 1], InputTypeError, "labels must be a 1-D integer tensor, got an object of type list."),
        (
            torch.zeros(2),
            InputTypeError,
            r"labels must be a 1-D integer tensor, got a tensor of shape \(2,\) and dtype torch.float32.",
        ),
        (torch.ones(2, dtype=torch.bool), InputTypeError, "dtype torch.bool"),
        (torch.ones(2, dtype=torch.complex64), InputTypeError, "dtype torch.complex64"),
        (
            torch.zeros(2, 1, dtype=torch.long),
            ValueError,
            r"1-D integer tensor, got a tensor of shape \(2, 1\)",
        ),
        (torch.arange(2), ValueError, "^labels has 2 entries but embeddings has 3 rows; they must match.$"),
    ],
)
def test_check_labels_names_what_is_wrong(value, error, message):
    with pytest.raises(error, match=message) as raised:
        check_labels("labels", value, 3, "embeddings")
    assert error is InputTypeError or not isinstance(raised.value, TypeError)  # a shape is no type error


@pytest.mark.parametrize(
    "value",
    [[3, 1, 3], (3, 1, 3), np.array([3, 1, 3], dtype=np.uint8), torch.tensor([3, 1, 3], dtype=torch.int16)],
)
@pytest.mark.parametrize("to", ["numpy", "torch"])
def test_as_labels_takes_lists_arrays_and_tensors(value, to):
    labels = as_labels("labels", value, 3, "features", to=to)
    kind = np.ndarray if to == "numpy" else torch.Tensor
    assert isinstance(labels, kind) and labels.tolist() == [3, 1, 3]
    assert labels.dtype == (np.int64 if to == "numpy" else torch.int64)
    if to == "torch":
        assert labels.is_contiguous() and labels.device.type == "cpu"


def test_as_labels_copies_an_array_it_makes_a_tensor_of_and_takes_empty_and_sparse_input():
    array = np.array([1, 2, 3])
    labels = as_labels("labels", array, to="torch")
    array[0] = 9
    assert labels.tolist() == [1, 2, 3]
    assert (
        as_labels("labels", []).dtype == np.int64 and as_labels("labels", [], to="torch").dtype == torch.int64
    )
    assert as_labels("labels", torch.tensor([0, 2]).to_sparse()).tolist() == [0, 2]


@pytest.mark.parametrize(
    ("value", "to", "message"),
    [
        ([0.0, 1.0], "numpy", "labels must hold integers, got dtype float64."),
        ([0.0, 1.0], "torch", "labels must hold integers, got dtype torch.float64."),  # named as torch does
        (np.array([True, False]), "torch", "labels must hold integers, got dtype torch.bool."),
        (
            torch.tensor([0.0, 1.0]),
            "numpy",
            "labels must hold integers, got a tensor of dtype torch.float32.",
        ),
        (torch.tensor([True]), "torch", "labels must hold integers, got a tensor of dtype torch.bool."),
        ([1, None], "torch", "labels must hold integers, got an array of Python objects."),
        (["a", "b"], "torch", "labels must hold integers, got dtype <U1."),
        ([[0, 1], [1, 0]], "numpy", r"labels must be 1-D, got shape (2, 2)."),
        (torch.zeros(2, 1, dtype=torch.long), "torch", r"labels must be 1-D, got shape (2, 1)."),
        ([0, 1], "numpy", "labels has 2 entries but features has 3 rows; they must match."),
    ],
)
def test_as_labels_names_what_is_wrong(value, to, message):
    with pytest.raises(ValueError) as raised:
        as_labels("labels", value, 3, "features", to=to)
    assert str(raised.value) == message


def test_as_labels_messages_can_be_worded_by_the_caller():
    messages = {
        "dtype": "{name}: {dtype} ({got})",
        "ndim": "{name}: shape {shape}",
        "length": "{name}: {count} of {num_items} {items_name}",
    }

    def message(value):
        with pytest.raises(ValueError) as raised:
            as_labels("f: 'y'", value, 2, "rows", to="torch", messages=messages)
        return str(raised.value)

    assert message(np.zeros(2)) == "f: 'y': float64 (dtype torch.float64)"  # the input's own dtype
    assert message(torch.zeros(2, dtype=torch.bfloat16)) == (
        "f: 'y': torch.bfloat16 (a tensor of dtype torch.bfloat16)"
    )
    assert message(np.zeros((2, 1), dtype=int)) == "f: 'y': shape (2, 1)"
    assert message([1]) == "f: 'y': 1 of 2 rows"
    partial = {"ndim": "{name} is not flat"}
    with pytest.raises(ValueError, match=r"^y must hold integers, got dtype float64\.$"):  # the others stay
        as_labels("y", [0.5], messages=partial)
    assert set(LABEL_MESSAGES) == {"dtype", "ndim", "length"}


def test_as_labels_to_is_checked():
    with pytest.raises(ValueError, match=r"to must be one of \('numpy', 'torch'\), got 'list'"):
        as_labels("labels", [1], to="list")
