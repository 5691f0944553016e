"""``EmbeddingTable`` on text batches: the batch's ``index`` key, given negatives left out, a text refresh."""

from __future__ import annotations

import pytest
import torch
from composer import Trainer

pytest.importorskip("tokenizers")

from composer_dynsample import EmbeddingModel, PKBatchSampler, build_dataloader
from composer_dynsample.algorithms.embedding_table import EmbeddingTable
from composer_dynsample.data import IndexDataset
from composer_dynsample.data.text.data_spec import text_data_spec
from composer_dynsample.data.text.pairs import load_pairs
from composer_dynsample.data.text.store import TextCollate
from composer_dynsample.models.embed import embed_store
from composer_dynsample.models.text import BagOfTokensEncoder
from tests.data.text.helpers import write_pairs

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")


@pytest.fixture(scope="module")
def splits(tmp_path_factory):
    folder = tmp_path_factory.mktemp("pairs")
    path = write_pairs(folder / "pairs.jsonl", 40, negatives=True)
    return load_pairs(path, vocab_size=200, max_length=16, cache_dir=folder / "cache")


def _fit(splits, table: EmbeddingTable, duration: str = "1ep") -> tuple[EmbeddingModel, PKBatchSampler]:
    store = splits.train
    torch.manual_seed(0)
    model = EmbeddingModel(BagOfTokensEncoder(vocab_size=store.vocab_size, token_dim=8))
    sampler = PKBatchSampler(store.labels, 4, 2, seed=1)
    loader = build_dataloader(IndexDataset(store.labels), sampler, collate_fn=TextCollate(store))
    trainer = Trainer(
        model=model,
        train_dataloader=text_data_spec(loader),
        optimizers=torch.optim.SGD(model.parameters(), lr=0.0),
        algorithms=[table],
        max_duration=duration,
        progress_bar=False,
        seed=0,
    )
    trainer.fit()
    return model, sampler


def test_text_batches_write_their_sampled_rows_and_never_their_given_negatives(splits):
    store = splits.train
    assert store.num_rows > len(store)  # the batches carry given negatives, rows past the table's end
    table = EmbeddingTable()
    model, _ = _fit(splits, table)
    assert table.rows.shape[0] == len(store)
    written = (table.written_at >= 0).nonzero().view(-1)
    assert len(written) == len(store)  # one epoch of P x K visits every sampled row once
    expected = embed_store(model, store, rows=written)  # lr=0: the weights the forward passes used
    torch.testing.assert_close(table.rows[written], expected, rtol=1e-5, atol=1e-6)


def test_a_refresh_re_embeds_text_rows_from_the_train_collate(splits):
    table = EmbeddingTable(refresh_interval="1ep", refresh_max_age=0)
    model, _ = _fit(splits, table, duration="2ep")
    expected = embed_store(model, splits.train)
    torch.testing.assert_close(table.rows, expected, rtol=1e-5, atol=1e-6)
