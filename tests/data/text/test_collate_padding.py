"""TextCollate(pad_to_multiple_of=N): the same ids and mask as the unpadded batch, plus pad columns of mask 0."""

from __future__ import annotations

import numpy as np
import pytest
import torch

pytest.importorskip("tokenizers")

from composer_dynsample.data import IndexDataset
from composer_dynsample.data.text.pairs import load_pairs
from composer_dynsample.data.text.store import TextCollate
from composer_dynsample.samplers import PKBatchSampler
from composer_dynsample.samplers.dataloader import build_dataloader
from tests.data.text.helpers import pair_rows, write_jsonl


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    """Pairs of 3-word queries and code lines, with a given negative each (so batches grow past the sample)."""
    folder = tmp_path_factory.mktemp("collate_padding")
    write_jsonl(folder / "pairs.jsonl", pair_rows(48, seed=0, negatives=True))
    return load_pairs(folder / "pairs.jsonl", max_length=32, vocab_size=120, cache_dir=folder / "cache").train


@pytest.mark.parametrize("multiple", [2, 8, 64])
@pytest.mark.parametrize("rows", [[0], [0, 1, 2, 3], list(range(16))])
def test_padding_adds_pad_columns_and_changes_no_value(store, multiple, rows):
    plain = TextCollate(store)(rows)
    padded = TextCollate(store, pad_to_multiple_of=multiple)(rows)
    ids, mask = plain["features"]["input_ids"], plain["features"]["attention_mask"]
    wide_ids, wide_mask = padded["features"]["input_ids"], padded["features"]["attention_mask"]
    width = ids.shape[1]
    assert wide_ids.shape == wide_mask.shape == (ids.shape[0], -(-width // multiple) * multiple)
    assert wide_ids.shape[1] % multiple == 0 and wide_ids.shape[1] - width < multiple
    assert torch.equal(wide_ids[:, :width], ids) and torch.equal(wide_mask[:, :width], mask)
    assert (wide_ids[:, width:] == store.pad_id).all() and (wide_mask[:, width:] == 0).all()
    assert wide_ids.dtype == ids.dtype == torch.int64 and wide_mask.dtype == torch.int64
    for key in ("labels", "index", "text_hash"):
        assert torch.equal(padded[key], plain[key])
    assert torch.equal(padded["features"]["is_query"], plain["features"]["is_query"])


@pytest.mark.parametrize("multiple", [None, 1])
def test_none_or_one_pads_to_the_longest_row(store, multiple):
    batch = TextCollate(store, pad_to_multiple_of=multiple)([0, 1, 2, 3])
    assert batch["features"]["attention_mask"].sum(dim=1).max() == batch["features"]["input_ids"].shape[1]


def test_token_store_pad_rounds_up_and_keeps_values(store):
    text_ids = store.text_ids[:5]
    ids, mask = store.tokens.pad(text_ids, store.pad_id)
    wide_ids, wide_mask = store.tokens.pad(text_ids, store.pad_id, pad_to_multiple_of=8)
    assert wide_ids.shape[1] % 8 == 0 and wide_ids.shape[1] >= ids.shape[1]
    assert np.array_equal(wide_ids[:, : ids.shape[1]], ids) and np.array_equal(
        wide_mask[:, : ids.shape[1]], mask
    )
    assert not wide_mask[:, ids.shape[1] :].any()


@pytest.mark.parametrize("value", [0, -8, 2.5, "8", True])
def test_a_wrong_multiple_is_refused_naming_the_argument(store, value):
    with pytest.raises(ValueError, match="pad_to_multiple_of must be an integer >= 1, got"):
        TextCollate(store, pad_to_multiple_of=value)
    with pytest.raises(ValueError, match="pad_to_multiple_of must be an integer >= 1, got"):
        store.tokens.pad(store.text_ids[:2], store.pad_id, pad_to_multiple_of=value)


def test_workers_give_the_same_padded_batches(store):
    def batches(workers: int) -> list[dict]:
        sampler = PKBatchSampler(store.labels, classes_per_batch=8, samples_per_class=2, seed=3)
        collate = TextCollate(store, pad_to_multiple_of=8)
        return list(
            build_dataloader(IndexDataset(store.labels), sampler, collate_fn=collate, num_workers=workers)
        )

    serial, parallel = batches(0), batches(2)
    assert len(serial) == len(parallel) == len(store) // 16
    for one, two in zip(serial, parallel):
        assert one["features"]["input_ids"].shape[1] % 8 == 0
        assert torch.equal(one["index"], two["index"])
        assert torch.equal(one["features"]["input_ids"], two["features"]["input_ids"])
        assert torch.equal(one["features"]["attention_mask"], two["features"]["attention_mask"])
