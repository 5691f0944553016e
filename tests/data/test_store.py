"""TensorStore, IndexDataset and GatherCollate, alone and inside DataLoaders with worker processes."""

from __future__ import annotations

import pickle
import warnings

import numpy as np
import pytest
import torch
from torch.utils.data import BatchSampler, DataLoader, SequentialSampler

from composer_dynsample.data import GatherCollate, IndexDataset, TensorStore, Unsqueeze


def make_store(n=23, shape=(5,)):
    generator = torch.Generator().manual_seed(0)
    return TensorStore(torch.randn(n, *shape, generator=generator), torch.arange(n) % 4)


class RecordingStore(TensorStore):
    """Counts gather calls, to check that a batch is gathered with one indexing operation."""

    calls = 0

    def gather(self, index):
        type(self).calls += 1
        return super().gather(index)


def assert_batch_consistent(batch, store):
    assert set(batch) == {"index", "features", "labels"}
    assert batch["index"].dtype == torch.int64 and batch["labels"].dtype == torch.int64
    assert torch.equal(batch["features"], store.features[batch["index"]])
    assert torch.equal(batch["labels"], store.labels[batch["index"]])


# --- TensorStore ---


def test_store_accepts_numpy_and_converts_labels_to_int64():
    store = TensorStore(np.zeros((3, 2, 2), dtype=np.float32), np.array([2, 0, 2], dtype=np.int32))
    assert store.labels.dtype == torch.int64 and store.features.dtype == torch.float32
    assert len(store) == 3 and store.feature_shape == (2, 2) and store.num_classes == 2
    assert "num_items=3" in repr(store)


@pytest.mark.parametrize(
    ("features", "labels", "error", "match"),
    [
        (torch.zeros(3, 2, dtype=torch.int64), [0, 1, 2], TypeError, "features must be floating point"),
        ([[0.0, 1.0]], [0], TypeError, "features must be a torch.Tensor or numpy array"),
        (torch.zeros(3), [0, 1, 2], ValueError, r"at least 2-D .* got shape \(3,\)"),
        (torch.zeros(3, 2), [0, 1], ValueError, "same length, got 3 features and 2 labels"),
        (
            torch.zeros(3, 2),
            [0.0, 1.0, 2.0],
            ValueError,
            "labels must hold integers, got dtype torch.float64",
        ),
        (
            torch.zeros(3, 2),
            torch.zeros(3, 1, dtype=torch.int64),
            ValueError,
            r"labels must be 1-D, got shape \(3, 1\)",
        ),
        (torch.zeros(3, 2), torch.tensor([True, False, True]), ValueError, "labels must hold integers"),
        (torch.tensor([[0.0, 1.0], [float("nan"), 0.0]]), [0, 1], ValueError, "row 1 holds NaN or inf"),
        (torch.tensor([[0.0, float("inf")]]), [0], ValueError, "row 0 holds NaN or inf"),
    ],
)
def test_store_validation(features, labels, error, match):
    with pytest.raises(error, match=match):
        TensorStore(features, labels)


# --- IndexDataset ---


def test_index_dataset_returns_python_ints_only():
    dataset = IndexDataset(torch.tensor([7, 3, 7, 1]))
    assert len(dataset) == 4 and torch.equal(dataset.labels, torch.tensor([7, 3, 7, 1]))
    for index in (2, np.int64(2), torch.tensor(2), -2):
        item = dataset[index]
        assert item == (2, 7) and all(type(value) is int for value in item)
    with pytest.raises(IndexError, match="index 4 is out of range for an IndexDataset of length 4"):
        dataset[4]
    with pytest.raises(IndexError):
        dataset[-5]
    with pytest.raises(TypeError, match="index must be an integer"):
        dataset["a"]
    with pytest.raises(ValueError, match="labels must be 1-D"):
        IndexDataset(torch.zeros(2, 2, dtype=torch.int64))
    assert len(IndexDataset([])) == 0
    assert dataset.__getitems__([3, 0, -1]) == [(3, 1), (0, 7), (3, 1)]


def test_dataset_and_collate_pickle():
    store = make_store()
    dataset = pickle.loads(pickle.dumps(IndexDataset(store.labels)))
    collate = pickle.loads(pickle.dumps(GatherCollate(store, transform=Unsqueeze(1))))
    items = [dataset[i] for i in (4, 1, 9)]
    batch = collate(items)
    assert torch.equal(batch["features"], store.features[[4, 1, 9]].unsqueeze(1))
    assert batch["labels"].tolist() == [store.labels[i].item() for i in (4, 1, 9)]


# --- GatherCollate ---


def test_collate_gathers_with_one_indexing_operation():
    store = RecordingStore(torch.randn(10, 3, 2), torch.arange(10) % 3)
    RecordingStore.calls = 0
    batch = GatherCollate(store)([(7, 1), (2, 2), (7, 1)])
    assert RecordingStore.calls == 1
    assert batch["index"].tolist() == [7, 2, 7]
    assert_batch_consistent(batch, store)


def test_collate_accepts_bare_indices_and_applies_the_transform():
    store = make_store()
    batch = GatherCollate(store, transform=Unsqueeze(1))([3, 0])
    assert batch["features"].shape == (2, 1, 5)
    assert torch.equal(batch["features"][:, 0], store.features[[3, 0]])


def test_collate_errors():
    store = make_store(n=5)
    with pytest.raises(TypeError, match="store must be a TensorStore"):
        GatherCollate(torch.zeros(5, 2))
    with pytest.raises(TypeError, match="transform must be callable"):
        GatherCollate(store, transform=3)
    with pytest.raises(ValueError, match="empty batch"):
        GatherCollate(store)([])
    with pytest.raises(IndexError, match=r"outside \[0, 4\]"):
        GatherCollate(store)([(5, 0)])
    with pytest.raises(TypeError, match="dim must be an int"):
        Unsqueeze(1.0)
    assert Unsqueeze(np.int64(1))(torch.zeros(2, 3)).shape == (2, 1, 3)  # numpy integers are integers


# --- DataLoaders ---


def batches_of(loader):
    return [batch for batch in loader]


@pytest.mark.parametrize(
    ("num_workers", "context"),
    [(0, None), (2, "fork"), (2, "spawn")],
)
def test_dataloader_with_a_batch_sampler(num_workers, context):
    store = make_store(n=23)
    batch_sampler = [[0, 5, 9], [22, 1], [3, 3, 4, 8], [10], [17, 2, 6]]
    loader = DataLoader(
        IndexDataset(store.labels),
        batch_sampler=batch_sampler,
        collate_fn=GatherCollate(store, transform=Unsqueeze(1)),
        num_workers=num_workers,
        multiprocessing_context=context,
    )
    batches = batches_of(loader)
    assert [batch["index"].tolist() for batch in batches] == batch_sampler  # order kept with workers too
    for batch in batches:
        assert torch.equal(batch["features"], store.features[batch["index"]].unsqueeze(1))
        assert torch.equal(batch["labels"], store.labels[batch["index"]])


def test_dataloader_with_batch_size_and_shuffle():
    store = make_store(n=23)
    loader = DataLoader(
        IndexDataset(store.labels),
        batch_size=4,
        shuffle=True,
        generator=torch.Generator().manual_seed(0),
        collate_fn=GatherCollate(store),
    )
    batches = batches_of(loader)
    assert [len(batch["index"]) for batch in batches] == [4, 4, 4, 4, 4, 3]
    assert sorted(torch.cat([batch["index"] for batch in batches]).tolist()) == list(range(23))
    for batch in batches:
        assert_batch_consistent(batch, store)


def test_dataloader_with_a_torch_batch_sampler_and_pin_memory():
    store = make_store(n=10)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # "pin_memory ... no accelerator is found" without CUDA
        loader = DataLoader(
            IndexDataset(store.labels),
            batch_sampler=BatchSampler(SequentialSampler(range(10)), batch_size=4, drop_last=False),
            collate_fn=GatherCollate(store),
            pin_memory=True,
        )
        batches = batches_of(loader)
    assert [batch["index"].tolist() for batch in batches] == [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9]]
    for batch in batches:
        assert_batch_consistent(batch, store)
        if torch.cuda.is_available():
            assert all(value.is_pinned() for value in batch.values())
