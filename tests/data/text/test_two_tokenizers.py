"""A ``TextStore`` of two tokenizers (``passage_tokens``): queries take their ids from the first, the other rows
from the second, each padded with its own pad id; checked against the rows built by hand."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from composer_dynsample.data.text.store import TextCollate, TextStore
from composer_dynsample.data.text.tokenized import TokenStore, TokenStoreWriter
from composer_dynsample.models.embed import embed_store

# Five distinct texts, tokenized by two tokenizers into ids of other lengths and ranges.
QUERY_IDS = [[5, 6], [7, 8, 9], [10], [11, 12, 13, 14], [15, 16]]
PASSAGE_IDS = [[105, 106, 107], [108], [109, 110], [111, 112], [113, 114, 115, 116, 117]]
HASHES = [11, 22, 33, 44, 55]


def _store(folder: Path, texts: list[list[int]], hashes: list[int] = HASHES) -> TokenStore:
    with TokenStoreWriter(folder, {"max_length": 8}) as writer:
        writer.append(np.concatenate(texts), [len(t) for t in texts], hashes)
    return TokenStore(folder)


@pytest.fixture
def store(tmp_path: Path) -> TextStore:
    # Rows: two queries (texts 0, 1), their passages (texts 2, 3), and text 4 as a query and as a passage.
    return TextStore(
        _store(tmp_path / "q", QUERY_IDS), [0, 1, 2, 3, 4, 4], [0, 1, 0, 1, 2, 2], pad_id=0, vocab_size=20,
        is_query=[True, True, False, False, True, False],
        passage_tokens=_store(tmp_path / "p", PASSAGE_IDS), passage_pad_id=100,
    )  # fmt: skip


def _by_hand(store: TextStore, rows: list[int], multiple: int | None) -> tuple[list, list]:
    chosen = [(QUERY_IDS if store.is_query[r] else PASSAGE_IDS)[store.text_ids[r]] for r in rows]
    width = max(map(len, chosen))
    width = width if multiple is None else -(-width // multiple) * multiple
    pads = [0 if store.is_query[r] else 100 for r in rows]
    ids = [ids + [pad] * (width - len(ids)) for ids, pad in zip(chosen, pads)]
    return ids, [[1] * len(c) + [0] * (width - len(c)) for c in chosen]


@pytest.mark.parametrize("multiple", [None, 8])
@pytest.mark.parametrize("rows", [[0, 1, 2, 3, 4, 5], [5, 2], [4, 0], [3, 0, 5, 1]])
def test_each_row_takes_its_ids_and_pad_id_from_its_towers_tokenizer(store, rows, multiple):
    batch = TextCollate(store, pad_to_multiple_of=multiple)(rows)
    ids, mask = _by_hand(store, rows, multiple)
    assert batch["features"]["input_ids"].tolist() == ids
    assert batch["features"]["attention_mask"].tolist() == mask
    assert batch["features"]["is_query"].tolist() == [bool(store.is_query[r]) for r in rows]
    assert batch["text_hash"].tolist() == [HASHES[store.text_ids[r]] for r in rows]  # one text, one hash


def test_the_lengths_are_each_rows_tokens_and_embedding_follows_the_rows(store):
    assert store.lengths(np.arange(6)).tolist() == [2, 3, 2, 2, 2, 5]

    class Sums(torch.nn.Module):  # an "encoder" that shows which ids it saw: their sum and count
        def embed(self, features):
            mask = features["attention_mask"]
            return torch.stack([(features["input_ids"] * mask).sum(1), mask.sum(1)], 1).float()

    embedded = embed_store(Sums(), store, batch_size=2)
    expected = [[sum(ids), len(ids)] for ids in (QUERY_IDS[0], QUERY_IDS[1], PASSAGE_IDS[2], PASSAGE_IDS[3])]
    expected += [[sum(QUERY_IDS[4]), 2], [sum(PASSAGE_IDS[4]), 5]]  # text 4 as a query, then as a passage
    assert embedded.tolist() == expected


def test_a_second_store_of_other_texts_or_without_its_pad_id_is_refused(tmp_path):
    tokens = _store(tmp_path / "q", QUERY_IDS)
    options = {"pad_id": 0, "vocab_size": 20, "is_query": [True, False]}
    with pytest.raises(ValueError, match="same 5 texts"):
        TextStore(tokens, [0, 1], [0, 0], **options, passage_tokens=_store(tmp_path / "p", PASSAGE_IDS[:4], HASHES[:4]), passage_pad_id=1)  # fmt: skip
    with pytest.raises(ValueError, match="same texts as tokens, in the same order"):
        TextStore(tokens, [0, 1], [0, 0], **options, passage_tokens=_store(tmp_path / "r", PASSAGE_IDS, HASHES[::-1]), passage_pad_id=1)  # fmt: skip
    with pytest.raises((ValueError, TypeError), match="passage_pad_id"):
        TextStore(tokens, [0, 1], [0, 0], **options, passage_tokens=_store(tmp_path / "s", PASSAGE_IDS))
