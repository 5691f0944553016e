"""The embedding table feeds HardClassPKBatchSampler through the Trainer, and a resumed epoch is the same epoch."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch
from composer import Trainer

from composer_dynsample import (
    EmbeddingModel,
    EmbeddingTable,
    GatherCollate,
    HardNegativeMining,
    IndexDataset,
    PKBatchSampler,
    SetSamplerEpoch,
    TensorStore,
    build_dataloader,
)
from composer_dynsample.samplers.hard_class import HardClassPKBatchSampler
from composer_dynsample.samplers.neighbours import NeighbourBatchSampler
from tests.common import IndexRecorder

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")


def store(class_ids: torch.Tensor | None = None) -> TensorStore:
    gen = torch.Generator().manual_seed(0)
    labels = torch.arange(240) % 20  # 20 classes of 12: 240 / (4 x 3) = 20 batches an epoch
    centres = torch.randn(20, 6, generator=gen) * 2
    features = centres[labels] + torch.randn(240, 6, generator=gen)
    return TensorStore(features, labels if class_ids is None else class_ids[labels])


def make_run(tmp_path, sampler_class=HardClassPKBatchSampler, *, table=True, class_ids=None, **kwargs):
    data = store(class_ids)
    torch.manual_seed(0)
    model = EmbeddingModel(torch.nn.Linear(6, 4))
    sampler = sampler_class(data.labels, 4, 3 if sampler_class is not NeighbourBatchSampler else 1, seed=3)
    recorder = IndexRecorder()
    algorithms = [HardNegativeMining("semi_hard")] + ([EmbeddingTable()] if table else [])
    trainer = Trainer(
        model=model,
        train_dataloader=build_dataloader(IndexDataset(data.labels), sampler, collate_fn=GatherCollate(data)),
        optimizers=torch.optim.SGD(model.parameters(), lr=0.05),
        algorithms=algorithms,
        callbacks=[recorder, SetSamplerEpoch()],
        max_duration=kwargs.pop("max_duration", "3ep"),
        progress_bar=False,
        seed=0,
        **kwargs,
    )
    return trainer, sampler, recorder


@pytest.mark.parametrize("sampler_class", [HardClassPKBatchSampler, NeighbourBatchSampler])
def test_labels_need_not_be_0_to_c_minus_1(tmp_path, sampler_class):
    # Negative and huge class ids in the same order: the very batches of the 0..19 run. Before, the table
    # indexed centroids by raw label and raised at the first epoch start.
    ids = torch.cat([torch.tensor([-3]), torch.arange(18) * 7, torch.tensor([10**9])])
    trainer, _, sparse = make_run(tmp_path, sampler_class, class_ids=ids)
    dense_trainer, _, dense = make_run(tmp_path, sampler_class)
    trainer.fit()
    dense_trainer.fit()
    assert sparse.in_order() == dense.in_order() and len(sparse.in_order()) > 40


def test_from_the_second_epoch_the_batches_follow_the_tables_centroids(tmp_path):
    trainer, sampler, recorder = make_run(tmp_path)
    plain_trainer, _, plain = make_run(tmp_path, PKBatchSampler, table=False)
    trainer.fit()
    plain_trainer.fit()
    assert recorder.epoch(0) == plain.epoch(0)  # before any centroids: P x K's batches
    assert recorder.epoch(1) != plain.epoch(1)
    assert sampler.snapshot_fingerprint() != ""
    # Every batch of a hard epoch is still P = 4 classes x K = 3 samples.
    labels = store().labels
    for batch in recorder.epoch(2):
        classes = labels[batch].view(4, 3)
        assert bool((classes == classes[:, :1]).all()) and len(set(classes[:, 0].tolist())) == 4


def test_a_mid_epoch_resume_trains_the_uninterrupted_batches(tmp_path):
    trainer, _, full = make_run(tmp_path, save_folder=str(tmp_path / "ck"), save_interval="7ba")
    trainer.fit()
    trainer.close()
    # Batch 28 is epoch 1, batch 8: the epoch's centroids come back from the checkpoint.
    resumed_trainer, sampler, resumed = make_run(
        tmp_path, load_path=str(tmp_path / "ck" / "ep1-ba28-rank0.pt")
    )
    resumed_trainer.fit()
    assert resumed.in_order() == full.in_order()[28:]
    assert sampler.snapshot_fingerprint() != ""


def test_without_the_snapshot_the_resumed_epoch_would_differ(tmp_path):
    """The check above can fail: a sampler resumed without its centroids builds another epoch, which the
    epoch's plan saved in the checkpoint refuses before a batch is trained."""
    trainer, _, _ = make_run(tmp_path, save_folder=str(tmp_path / "ck"), save_interval="7ba")
    trainer.fit()
    trainer.close()
    checkpoint = torch.load(tmp_path / "ck" / "ep1-ba28-rank0.pt", weights_only=False)
    (table_state,) = [state for name, state in checkpoint["state"]["algorithms"] if "EmbeddingTable" in name]
    table_state["sampler"] = None
    torch.save(checkpoint, tmp_path / "no-snapshot.pt")
    resumed_trainer, _, resumed = make_run(tmp_path, load_path=str(tmp_path / "no-snapshot.pt"))
    with pytest.raises(ValueError, match=r"middle of epoch 1 .*the epoch's global batches differ"):
        resumed_trainer.fit()
    assert resumed.in_order() == []


def test_a_sampler_built_from_other_labels_is_named():
    labels = store().labels
    table = EmbeddingTable(num_items=240)
    table.write(torch.arange(240), torch.randn(240, 4), step=0)
    table._sampler = HardClassPKBatchSampler(torch.where(labels == 19, 99, labels), 4, 3)
    state = SimpleNamespace(train_dataloader=build_dataloader(IndexDataset(labels), table._sampler))
    with pytest.raises(ValueError, match=r"classes the sampler was not built with \(e.g. \[19\]\)"):
        table._feed_sampler(state, logger=None)
