"""The plugin in a Composer user's own script: each wiring mistake is refused where it happens, in one line
naming the fix, before anything is trained on the wrong thing (each of these ran on, or failed far away,
before its check)."""

from __future__ import annotations

import warnings

import pytest
import torch
from composer import Trainer
from composer.core import Callback, Event, State
from composer.loggers import Logger
from composer.models import ComposerModel
from torch.utils.data import DataLoader, TensorDataset

from composer_dynsample import (
    EmbeddingTable,
    HardClassPKBatchSampler,
    HardNegativeMining,
    MinedBatch,
    PKBatchSampler,
    SetSamplerEpoch,
)
from composer_dynsample.losses import TripletMarginLoss, mined_loss
from composer_dynsample.mining import BatchHardMiner
from composer_dynsample.samplers import build_dataloader
from tests.algorithms.helpers import make_data

FEATURES, LABELS = make_data()


class OwnModel(ComposerModel):
    """A user's own model: an MLP whose loss takes what HardNegativeMining hands it, the way ``how`` says."""

    def __init__(self, how: str = "mined_loss") -> None:
        super().__init__()
        self.net = torch.nn.Sequential(torch.nn.Linear(6, 16), torch.nn.ReLU(), torch.nn.Linear(16, 8))
        self.loss_fn, self.how, self.losses = TripletMarginLoss(margin=0.2), how, []

    def forward(self, batch):
        return torch.nn.functional.normalize(self.net(batch[0]), dim=1)

    def loss(self, outputs, batch):
        if self.how == "mined_loss":  # without the algorithm: every tuple of the batch
            plain = not isinstance(outputs, MinedBatch)
            value = self.loss_fn(outputs, batch[1]) if plain else mined_loss(self.loss_fn, outputs)
        elif self.how == "ignores_tuples":
            value = self.loss_fn(outputs.embeddings, outputs.labels)
        else:  # written for tensors
            value = self.loss_fn(outputs, batch[1])
        self.losses.append(float(value))
        return value


class Batches(Callback):
    def __init__(self) -> None:
        self.count = 0

    def run_event(self, event: Event, state: State, logger: Logger) -> None:
        if event == Event.AFTER_DATALOADER:
            self.count += 1


def fit(loader, *, model=None, algorithms=(), callbacks=(), duration="2ep", **kwargs):
    model = model or OwnModel()
    seen = Batches()
    trainer = Trainer(
        model=model, train_dataloader=loader, optimizers=torch.optim.SGD(model.parameters(), lr=0.05),
        algorithms=list(algorithms), callbacks=[*callbacks, seen], max_duration=duration, progress_bar=False,
        **kwargs,
    )  # fmt: skip
    trainer.fit()
    return trainer, model, seen


def sampler(**options):
    return PKBatchSampler(LABELS, classes_per_batch=4, samples_per_class=4, seed=0, **options)


@pytest.mark.parametrize("where", ["callback", "algorithm"])
def test_a_batch_sampler_given_as_sampler_is_refused_before_the_first_batch(where):
    loader = DataLoader(TensorDataset(FEATURES, LABELS), sampler=sampler())
    seen = Batches()
    extra = (
        {"callbacks": [SetSamplerEpoch(), seen]}
        if where == "callback"
        else {"algorithms": [HardNegativeMining("batch_hard")], "callbacks": [seen]}
    )
    model = OwnModel()
    trainer = Trainer(model=model, train_dataloader=loader, max_duration="1ep", progress_bar=False, **extra)
    with pytest.raises(ValueError, match=r"PKBatchSampler as sampler=.*pass it as batch_sampler="):
        trainer.fit()
    assert seen.count == 0


def test_a_loss_written_for_tensors_given_the_mined_batch_names_the_call():
    embeddings = torch.nn.functional.normalize(torch.randn(8, 4, generator=torch.Generator().manual_seed(0)))
    labels = torch.arange(8) % 4
    mined = MinedBatch(embeddings, labels, BatchHardMiner()(embeddings, labels))
    with pytest.raises(TypeError, match=r"got the MinedBatch.*mined_loss\(loss_fn, outputs\)"):
        TripletMarginLoss()(mined, labels)
    with pytest.raises(TypeError, match=r"takes the \(B, D\) embeddings as a tensor, got list"):
        TripletMarginLoss()([[0.0]], labels)
    with pytest.raises(TypeError, match="takes the MinedBatch HardNegativeMining puts"):
        mined_loss(TripletMarginLoss(), embeddings)
    value = mined_loss(TripletMarginLoss(margin=0.2), mined)
    expected = TripletMarginLoss(margin=0.2)(embeddings, labels, mined.indices_tuple)
    assert torch.equal(value, expected)
    loader = build_dataloader(TensorDataset(FEATURES, LABELS), sampler())
    with pytest.raises(TypeError, match="got the MinedBatch"):
        fit(loader, model=OwnModel("tensors"), algorithms=[HardNegativeMining("batch_hard")], duration="1ba")


def test_a_loss_that_never_reads_the_mined_tuples_is_warned_once():
    loader = build_dataloader(TensorDataset(FEATURES, LABELS), sampler())
    with pytest.warns(UserWarning, match=r"never read the tuples batch_hard mined.*mined_loss") as caught:
        fit(loader, model=OwnModel("ignores_tuples"), algorithms=[HardNegativeMining("batch_hard")])
    assert sum("never read the tuples" in str(w.message) for w in caught) == 1
    with warnings.catch_warnings():
        warnings.simplefilter("error", UserWarning)
        fit(
            build_dataloader(TensorDataset(FEATURES, LABELS), sampler()),
            algorithms=[HardNegativeMining("batch_hard")],
        )


def test_sampler_labels_longer_than_the_dataset_are_refused_when_the_loader_is_built():
    longer = PKBatchSampler(torch.cat([LABELS, LABELS[:16]]), classes_per_batch=4, samples_per_class=4)
    with pytest.raises(ValueError, match=r"built on 144 labels .* the dataset holds 128 samples"):
        build_dataloader(TensorDataset(FEATURES, LABELS), longer)
    plain = DataLoader(TensorDataset(FEATURES, LABELS), batch_sampler=longer)  # built by hand: refused at fit
    with pytest.raises(ValueError, match="built on 144 labels"):
        fit(plain, callbacks=[SetSamplerEpoch()], device_train_microbatch_size=16)


class Resize(Callback):
    """Shrinks or grows the dataset at the end of the first epoch."""

    def __init__(self, dataset: TensorDataset, rows: int) -> None:
        self.dataset, self.rows = dataset, rows

    def epoch_end(self, state: State, logger: Logger) -> None:
        features = torch.cat([FEATURES, FEATURES])[: self.rows]
        self.dataset.tensors = (features, torch.cat([LABELS, LABELS])[: self.rows])


@pytest.mark.parametrize(
    ("rows", "effect"), [(100, "past its end"), (160, "32 new samples would never be drawn")]
)
def test_a_dataset_that_changes_length_between_epochs_is_refused_at_the_epoch_start(rows, effect):
    dataset = TensorDataset(FEATURES.clone(), LABELS.clone())
    loader = build_dataloader(dataset, sampler())
    with pytest.raises(
        ValueError, match=rf"held 128 samples at the start of the fit and holds {rows} at epoch 1: .*{effect}"
    ):
        fit(loader, callbacks=[SetSamplerEpoch(), Resize(dataset, rows)])


def test_a_mid_epoch_resume_on_other_data_of_the_same_batch_count_is_refused(tmp_path):
    first, _, _ = fit(
        build_dataloader(TensorDataset(FEATURES, LABELS), sampler()), callbacks=[SetSamplerEpoch()],
        save_folder=str(tmp_path), save_interval="3ba", duration="6ba",
    )  # fmt: skip
    first.close()
    shuffled = LABELS[torch.randperm(LABELS.numel(), generator=torch.Generator().manual_seed(1))]
    other = PKBatchSampler(shuffled, classes_per_batch=4, samples_per_class=4, seed=0)
    assert len(other) == len(sampler())  # the same batch count: Composer's own checks pass
    seen = Batches()
    model = OwnModel()
    trainer = Trainer(
        model=model, train_dataloader=build_dataloader(TensorDataset(FEATURES, shuffled), other),
        optimizers=torch.optim.SGD(model.parameters(), lr=0.05), callbacks=[SetSamplerEpoch(), seen],
        max_duration="2ep", progress_bar=False, load_path=str(tmp_path / "ep0-ba3-rank0.pt"),
    )  # fmt: skip
    with pytest.raises(ValueError, match=r"middle of epoch 0 \(batch 3\).*the sampler's labels differ"):
        trainer.fit()
    assert seen.count == 0


@pytest.mark.parametrize("microbatch", [4, 2])
@pytest.mark.parametrize("where", ["algorithm", "embedding_table"])
def test_microbatches_of_single_classes_are_refused_at_fit_start_where_tuples_are_mined(microbatch, where):
    """What mines in the microbatch refuses single-class ones: the mining algorithm, and the embedding table
    that hands a hard-class sampler its centroids (its hard classes would never meet in a microbatch)."""
    if where == "algorithm":
        batches, extra = sampler, {"algorithms": [HardNegativeMining("batch_hard")]}
    else:
        batches = lambda: HardClassPKBatchSampler(LABELS, 4, 4, seed=0)  # noqa: E731
        extra = {"algorithms": [EmbeddingTable(warm_start=False)]}
    loader = build_dataloader(TensorDataset(FEATURES, LABELS), batches())
    with pytest.raises(
        ValueError,
        match=rf"device_train_microbatch_size={microbatch} cuts each batch of 4 classes x 4 samples",
    ):
        fit(loader, device_train_microbatch_size=microbatch, **extra)
    if where == "algorithm":  # (the table's runs with whole-batch microbatches are its own tests')
        fit(
            build_dataloader(TensorDataset(FEATURES, LABELS), batches()),
            device_train_microbatch_size=8,
            duration="1ba",
            **extra,
        )


def test_the_epoch_callback_leaves_single_class_microbatches_to_composer():
    """SetSamplerEpoch alone with a loss that needs no negative in the microbatch: Composer trains it."""
    model = OwnModel()
    model.loss = lambda outputs, batch: outputs.pow(2).mean()  # a per-row loss: any microbatch trains
    _, _, seen = fit(
        build_dataloader(TensorDataset(FEATURES, LABELS), sampler()),
        model=model,
        callbacks=[SetSamplerEpoch()],
        device_train_microbatch_size=4,
        duration="1ep",
    )
    assert seen.count == len(sampler())


def test_build_dataloader_is_importable_where_the_docs_place_it():
    from composer_dynsample import build_dataloader as top
    from composer_dynsample.samplers import BatchSamplerDataLoader
    from composer_dynsample.samplers import build_dataloader as in_samplers

    assert top is in_samplers and isinstance(
        in_samplers(TensorDataset(LABELS), sampler()), BatchSamplerDataLoader
    )


def test_replacement_of_a_one_sample_class_is_warned():
    labels = torch.cat([LABELS, torch.tensor([99])])
    with pytest.warns(
        UserWarning, match=r"1 of 9 classes have a single sample: .* holds that one index 4 times"
    ):
        PKBatchSampler(labels, classes_per_batch=4, samples_per_class=4, small_classes="replace")
