"""``EmbeddingTable(warm_start=True)``: the training set encoded by the starting model before the first step,
so mined negatives start with the first epoch; the rows, the random states, the cost and the resume."""

from __future__ import annotations

import contextlib
import copy
import json

import pytest
import torch
from composer import Callback
from composer.loggers import InMemoryLogger

from composer_dynsample import (
    EmbeddingModel,
    HardNegativeMining,
    PKBatchSampler,
    SetSamplerEpoch,
    build_dataloader,
)
from composer_dynsample.algorithms.embedding_table import EmbeddingTable
from composer_dynsample.algorithms.embedding_table import encodings as table_module  # the warm start's module
from composer_dynsample.data import GatherCollate, IndexDataset, TensorStore
from composer_dynsample.samplers.mined_negatives import MinedNegativesPKBatchSampler
from tests.common import IndexRecorder, sgd_trainer

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")

PAIRS, P = 48, 4  # 12 batches an epoch of 4 pairs x (2 + 2 negatives)


class AtFitStart(Callback):
    """The table's rows and stamps right after the table's FIT_START (callbacks run after algorithms)."""

    def __init__(self, table: EmbeddingTable) -> None:
        self.table, self.rows, self.written_at = table, None, None

    def fit_start(self, state, logger) -> None:
        if self.table.rows is not None:
            self.rows, self.written_at = self.table.rows.clone(), self.table.written_at.clone()


class Jitter:
    """A random augmentation of the features, drawn from the global torch generator."""

    def __call__(self, features: torch.Tensor) -> torch.Tensor:
        return features + 0.1 * torch.randn_like(features)


def pairs_store() -> TensorStore:
    """48 pairs of 6-dimensional features around 8 topics: rows 2k and 2k + 1 are pair k."""
    gen = torch.Generator().manual_seed(0)
    pairs = (torch.randn(8, 6, generator=gen) * 2)[torch.arange(PAIRS) % 8] + torch.randn(
        PAIRS, 6, generator=gen
    )
    features = pairs.repeat_interleave(2, 0) + 0.3 * torch.randn(2 * PAIRS, 6, generator=gen)
    return TensorStore(features, torch.arange(2 * PAIRS) // 2)


def mined_sampler(store: TensorStore) -> MinedNegativesPKBatchSampler:
    is_passage = torch.arange(2 * PAIRS) % 2 == 1
    return MinedNegativesPKBatchSampler(
        store.labels, P, 2, is_passage=is_passage, window=4, max_relative_similarity=None, seed=3
    )


def model_with_dropout() -> EmbeddingModel:
    """Dropout and BatchNorm: what eval mode switches off and leaves untouched."""
    torch.manual_seed(0)
    layers = [torch.nn.Linear(6, 16), torch.nn.BatchNorm1d(16), torch.nn.Dropout(0.5), torch.nn.Linear(16, 4)]
    return EmbeddingModel(torch.nn.Sequential(*layers))


def run(store, sampler, table, *, collate=None, callbacks=(), loggers=(), **options):
    """A Trainer over ``store`` in ``sampler``'s batches; returns it, its batch recorder and its model."""
    model = model_with_dropout()
    recorder = IndexRecorder()
    loader = build_dataloader(IndexDataset(store.labels), sampler, collate_fn=collate or GatherCollate(store))
    trainer = sgd_trainer(
        model,
        loader,
        lr=0.05,
        algorithms=[HardNegativeMining("semi_hard"), table],
        callbacks=[recorder, SetSamplerEpoch(), *callbacks],
        loggers=list(loggers),
        **{"max_duration": "2ep", "seed": 0, **options},
    )
    return trainer, recorder, model


def test_the_warm_rows_equal_a_direct_encoding_of_the_texts_by_the_starting_model(tmp_path):
    pytest.importorskip("tokenizers")
    from composer_dynsample.data.text.data_spec import text_data_spec
    from composer_dynsample.data.text.pairs import load_pairs
    from composer_dynsample.data.text.store import TextCollate
    from composer_dynsample.models.text import BagOfTokensEncoder
    from tests.data.text.helpers import write_pairs

    path = write_pairs(tmp_path / "pairs.jsonl", 40, negatives=True)
    store = load_pairs(path, vocab_size=200, max_length=16, cache_dir=tmp_path / "cache").train
    torch.manual_seed(0)
    model = EmbeddingModel(BagOfTokensEncoder(vocab_size=store.vocab_size, token_dim=8, dropout=0.5))
    start = copy.deepcopy(model).eval()
    table, logger = EmbeddingTable(warm_start=True, refresh_batch_size=7), InMemoryLogger()
    probe = AtFitStart(table)
    sampler = PKBatchSampler(store.labels, 4, 2, seed=1)
    loader = build_dataloader(IndexDataset(store.labels), sampler, collate_fn=TextCollate(store))
    sgd_trainer(
        model,
        text_data_spec(loader),
        lr=0.5,
        algorithms=[table],
        callbacks=[probe],
        loggers=[logger],
        max_duration="1ep",
        seed=0,
    ).fit()
    with torch.no_grad():  # every sampled text in one batch, given negatives left out
        features = TextCollate(store, negatives=False)(list(range(len(store))))["features"]
        expected = start.embed(features)
    assert probe.rows.shape == (len(store), expected.shape[1])
    torch.testing.assert_close(probe.rows, expected, rtol=1e-5, atol=1e-5)
    assert bool((probe.written_at == 0).all())  # every row, stamped with the step it was encoded at
    assert table.warm_start_cost["rows_encoded"] == len(store) and table.warm_start_cost["seconds"] > 0
    assert [value for _, value in logger.data["embedding_table/warm_start_rows"]] == [float(len(store))]
    assert [record["rows_encoded"] for record in table.history] == [len(store)]


@pytest.mark.parametrize("warm", [True, False])
def test_the_first_epochs_negatives_are_mined_only_with_a_warm_start(warm):
    store = pairs_store()
    start = model_with_dropout().eval()
    sampler, table = mined_sampler(store), EmbeddingTable(warm_start=warm)
    probe = AtFitStart(table)
    trainer, recorder, _ = run(store, sampler, table, callbacks=[probe])
    trainer.fit()
    counts = [record["sampler"] for record in table.history]
    encoded = [record["rows_encoded"] for record in table.history]
    if not warm:  # the first epoch's negatives are random passages: no anchor has an embedding
        assert counts[0]["no_embedding"] == PAIRS and counts[1]["no_embedding"] == 0
        assert encoded == [0, 0] and table.warm_start_cost is None and probe.rows is None
        return
    assert counts[0]["no_embedding"] == 0 and counts[0]["random"] < PAIRS * 2
    assert encoded == [2 * PAIRS, 0]  # then the forward pass alone feeds the table
    with torch.no_grad():
        torch.testing.assert_close(probe.rows, start.embed(store.features), rtol=1e-5, atol=1e-6)
    # The first epoch's batches are the plan of a sampler handed the warm rows at its start.
    reference = mined_sampler(store)
    reference.update_neighbours(probe.rows)
    reference.set_epoch(0)
    assert recorder.epoch(0) == reference.global_batches(0).tolist()


def jitter_run(warm: bool):
    store = TensorStore(torch.randn(64, 6, generator=torch.Generator().manual_seed(1)), torch.arange(64) % 8)
    sampler = PKBatchSampler(store.labels, 4, 4, seed=1)
    trainer, recorder, model = run(
        store, sampler, EmbeddingTable(warm_start=warm), collate=GatherCollate(store, transform=Jitter())
    )
    trainer.fit()
    return recorder.in_order(), {name: value.clone() for name, value in model.state_dict().items()}


def test_a_warm_start_changes_neither_the_random_draws_nor_the_weights_of_the_training():
    # The collate's augmentation and the dropout draw from the global generator; the warm start's own
    # draws (the augmentation of the rows it encodes) are put back, and eval mode moves no BatchNorm statistic.
    warm_batches, warm_weights = jitter_run(True)
    cold_batches, cold_weights = jitter_run(False)
    assert warm_batches == cold_batches and len(warm_batches) == 8
    assert warm_weights.keys() == cold_weights.keys()
    assert all(torch.equal(warm_weights[name], cold_weights[name]) for name in warm_weights)


def test_without_the_random_states_put_back_the_weights_would_differ(monkeypatch):
    """The check above can fail: a warm start that kept its draws changes the training that follows."""
    monkeypatch.setattr(table_module, "rng_untouched", contextlib.nullcontext)
    _, warm_weights = jitter_run(True)
    monkeypatch.undo()
    _, cold_weights = jitter_run(False)
    assert not all(torch.equal(warm_weights[name], cold_weights[name]) for name in warm_weights)


@pytest.mark.parametrize("checkpoint", ["ep0-ba5-rank0.pt", "ep1-ba20-rank0.pt"])
def test_a_resumed_run_trains_the_uninterrupted_batches_without_encoding_again(tmp_path, checkpoint):
    store = pairs_store()
    table = EmbeddingTable(warm_start=True)
    options = {"max_duration": "3ep", "save_folder": str(tmp_path / "ck"), "save_interval": "5ba"}
    trainer, full, _ = run(store, mined_sampler(store), table, **options)
    trainer.fit()
    trainer.close()
    done = int(checkpoint.split("-ba")[1].split("-")[0])
    resumed_table, logger = EmbeddingTable(warm_start=True), InMemoryLogger()
    resumed_trainer, resumed, _ = run(
        store,
        mined_sampler(store),
        resumed_table,
        loggers=[logger],
        max_duration="3ep",
        load_path=str(tmp_path / "ck" / checkpoint),
    )
    resumed_trainer.fit()
    assert resumed.in_order() == full.in_order()[done:] and len(full.in_order()) == 36
    assert "embedding_table/warm_start_rows" not in logger.data  # the table came from the checkpoint
    assert resumed_table.warm_start_cost == table.warm_start_cost
    assert [r["rows_encoded"] for r in resumed_table.history] == [2 * PAIRS, 0, 0]
    assert [r["sampler"] for r in resumed_table.history] == [r["sampler"] for r in table.history]
    assert resumed_table.fingerprint() == table.fingerprint()


def test_warm_start_options_and_loaders_it_cannot_encode_are_named():
    with pytest.raises(ValueError, match="warm_start must be true or false, got 'yes'"):
        EmbeddingTable(warm_start="yes")
    store = pairs_store()
    with pytest.raises(ValueError, match=r"warm_start encodes the table.s 200 rows .* which holds 96; pass"):
        run(store, mined_sampler(store), EmbeddingTable(num_items=200, warm_start=True))[0].fit()
    labels = store.labels

    def collate(items):
        return GatherCollate(store)(items)

    with pytest.raises(ValueError, match="warm_start encodes samples from the train loader's GatherCollate"):
        run(store, PKBatchSampler(labels, 4, 2, seed=0), EmbeddingTable(warm_start=True), collate=collate)[
            0
        ].fit()


def test_the_command_line_warm_start_mines_the_first_epoch(tmp_path):
    pytest.importorskip("tokenizers")
    from composer_dynsample.cli.main import main
    from tests.cli.helpers import MINED, write_bag_pairs_config, write_pairs

    write_pairs(tmp_path)
    config = write_bag_pairs_config(tmp_path, MINED, algorithms={"embedding_table": {"warm_start": True}})
    main(["train", config, "--quiet", "--run-dir", str(tmp_path / "run")])
    (record,) = json.loads((tmp_path / "run" / "metrics.json").read_text())["embedding_table"]
    assert record["sampler"]["no_embedding"] == 0 and record["rows_encoded"] == 64  # 32 training pairs


def test_a_run_shorter_than_an_epoch_records_the_warm_start_cost(tmp_path):
    pytest.importorskip("tokenizers")
    from composer_dynsample.cli.main import main
    from tests.cli.helpers import MINED, write_bag_pairs_config, write_pairs

    write_pairs(tmp_path)
    config = write_bag_pairs_config(tmp_path, MINED, algorithms={"embedding_table": {"warm_start": True}})
    main(["train", config, "trainer.max_duration=1ba", "--quiet", "--run-dir", str(tmp_path / "run")])
    metrics = json.loads((tmp_path / "run" / "metrics.json").read_text())
    assert metrics["embedding_table_warm_start"]["rows_encoded"] == 64
    assert metrics["embedding_table_warm_start"]["seconds"] > 0
    # The run ends inside its first epoch: one part-epoch record, with the warm table's snapshot.
    (record,) = metrics["embedding_table"]
    assert record["partial"] is True and record["step"] == 1 and record["epoch"] == 0
    (snapshot,) = record["sampler"]["snapshots"]
    assert snapshot["epoch"] == 0 and snapshot["segment"] == 0 and snapshot["anchors"] > 0
    assert "rank_window" not in record["sampler"]  # the plan's counts are a whole epoch's: left out
