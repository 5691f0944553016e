"""embed_store and RetrievalGallery on texts: rows of a TextStore, in their order, padded per batch."""

from __future__ import annotations

import numpy as np
import pytest
import torch

pytest.importorskip("tokenizers")

from composer_dynsample import EmbeddingModel
from composer_dynsample.callbacks.retrieval_gallery import RetrievalGallery
from composer_dynsample.data.text.pairs import load_pairs
from composer_dynsample.data.text.store import TextCollate
from composer_dynsample.models.embed import embed_store, store_labels
from composer_dynsample.models.text import BagOfTokensEncoder
from tests.data.text.helpers import write_pairs


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    folder = tmp_path_factory.mktemp("pairs")
    splits = load_pairs(write_pairs(folder / "p.jsonl", 30), vocab_size=150, cache_dir=folder / "cache")
    return splits.test


def test_embed_store_embeds_text_rows_in_the_order_asked(store):
    torch.manual_seed(0)
    model = EmbeddingModel(BagOfTokensEncoder(vocab_size=store.vocab_size, token_dim=8))
    rows = np.array([5, 0, 3, 1])
    embeddings = embed_store(model, store, rows=rows, batch_size=3)
    model.eval()
    with torch.no_grad():
        one_by_one = torch.cat([model.embed(TextCollate(store)([int(r)])["features"]) for r in rows])
    torch.testing.assert_close(embeddings, one_by_one, rtol=1e-5, atol=1e-6)
    assert store_labels(store, rows).tolist() == store.labels[rows].tolist()
    assert embed_store(model, store).shape == (len(store), 8)


def test_embed_store_refuses_rows_outside_the_store(store):
    model = EmbeddingModel(BagOfTokensEncoder(vocab_size=store.vocab_size, token_dim=8))
    with pytest.raises(IndexError, match=rf"rows must lie in \[0, {len(store) - 1}\]"):
        embed_store(model, store, rows=[len(store)])


def test_the_gallery_callback_takes_a_text_store_and_its_rows(store):
    passages = np.flatnonzero(~store.is_query[: len(store)])
    gallery = RetrievalGallery(store, rows=passages)
    assert gallery.rows.tolist() == passages.tolist()
    with pytest.raises(ValueError, match="at least one item"):
        RetrievalGallery(store, rows=[])
