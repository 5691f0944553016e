"""HardNegativeMining inside a real Composer Trainer on one process."""

from __future__ import annotations

import warnings

import pytest
import torch
from composer import Trainer
from composer.core import Callback, Event, State
from composer.loggers import InMemoryLogger, Logger
from pytorch_metric_learning import losses as pml_losses
from torch.utils.data import TensorDataset
from torchmetrics import Metric

from composer_dynsample import (
    ContrastiveLoss,
    EmbeddingModel,
    HardNegativeMining,
    MinedBatch,
    PKBatchSampler,
    TripletMarginLoss,
    build_dataloader,
)
from composer_dynsample.mining import BatchHardMiner, build_miner
from tests.algorithms.helpers import (
    DIM,
    NUM,
    CountingEncoder,
    assert_first_batch_refused,
    make_data,
    make_trainer,
)


class Recorder(Callback):
    """Runs after the algorithm at AFTER_FORWARD (the engine runs algorithms first) and keeps what it saw."""

    def __init__(self) -> None:
        self.mined: list[MinedBatch] = []
        self.losses: list[torch.Tensor] = []

    def after_forward(self, state: State, logger: Logger) -> None:
        self.mined.append(state.outputs)

    def after_loss(self, state: State, logger: Logger) -> None:
        self.losses.append(state.loss.detach().clone())


def test_mines_the_forward_embeddings_once_per_batch_without_extra_forward():
    recorder = Recorder()
    trainer, encoder, sampler = make_trainer(HardNegativeMining("batch_hard"), callbacks=[recorder])
    trainer.fit()
    steps = 2 * len(sampler)
    assert encoder.calls == steps  # no extra forward pass for mining
    assert len(recorder.mined) == steps
    for mined in recorder.mined:
        assert isinstance(mined, MinedBatch) and mined.strategy == "batch_hard"
        assert mined.embeddings.requires_grad  # the loss still trains through them
        expected = BatchHardMiner()(mined.embeddings.detach(), mined.labels)
        assert all(torch.equal(a, b) for a, b in zip(mined.indices_tuple, expected))
    # The loss is the triplet loss on exactly those tuples.
    last = recorder.mined[-1]
    reference = TripletMarginLoss(0.2)(last.embeddings.detach(), last.labels, last.indices_tuple)
    assert torch.allclose(recorder.losses[-1], reference)


def test_logs_mining_statistics_every_step():
    in_memory = InMemoryLogger()
    trainer, _, sampler = make_trainer(HardNegativeMining("semi_hard"), loggers=[in_memory])
    trainer.fit()
    for key in (
        "num_tuples",
        "active_fraction",
        "positive_distance",
        "negative_distance",
        "embedding_spread",
    ):
        assert len(in_memory.data[f"mining/{key}"]) == 2 * len(sampler), key
    fractions = [float(v) for _, v in in_memory.data["mining/active_fraction"]]
    assert all(0.0 <= f <= 1.0 for f in fractions)


def test_schedule_switches_strategy_at_the_given_time():
    recorder = Recorder()
    algorithm = HardNegativeMining({"0ep": "semi_hard", "1ep": "batch_hard"})
    trainer, _, sampler = make_trainer(algorithm, callbacks=[recorder])
    trainer.fit()
    strategies = [m.strategy for m in recorder.mined]
    assert strategies == ["semi_hard"] * len(sampler) + ["batch_hard"] * len(sampler)


def test_pairs_strategy_with_contrastive_loss_and_a_pml_loss():
    for loss in (ContrastiveLoss(), pml_losses.ContrastiveLoss()):
        recorder = Recorder()
        trainer, _, _ = make_trainer(HardNegativeMining("multi_similarity"), loss=loss, callbacks=[recorder])
        trainer.fit()
        assert all(len(m.indices_tuple) == 4 for m in recorder.mined)
        assert all(torch.isfinite(v) for v in recorder.losses)


def test_pml_triplet_loss_consumes_the_tuples():
    recorder = Recorder()
    trainer, _, _ = make_trainer(
        HardNegativeMining("batch_hard"), loss=pml_losses.TripletMarginLoss(margin=0.2), callbacks=[recorder]
    )
    trainer.fit()
    last = recorder.mined[-1]
    expected = pml_losses.TripletMarginLoss(margin=0.2)(
        last.embeddings.detach(), last.labels, last.indices_tuple
    )
    assert torch.allclose(recorder.losses[-1], expected)


class LabelCount(Metric):
    """A tiny metric fed (embeddings, labels): counts the labels it saw."""

    def __init__(self) -> None:
        super().__init__()
        self.add_state("seen", default=torch.tensor(0), dist_reduce_fx="sum")

    def update(self, embeddings: torch.Tensor, labels: torch.Tensor) -> None:
        self.seen += labels.numel()

    def compute(self) -> torch.Tensor:
        return self.seen


def test_train_metrics_keep_working():
    trainer, _, _ = make_trainer(
        HardNegativeMining("semi_hard"),
        max_duration="1ep",
        model_kwargs={"train_metrics": {"seen": LabelCount()}},
    )
    trainer.fit()
    assert int(trainer.state.train_metric_values["seen"]) == 16  # computed per batch: one batch of 4 x 4


def test_a_batch_with_nothing_to_mine_gives_a_zero_loss_with_a_graph():
    embeddings = torch.nn.functional.normalize(torch.randn(6, 4)).requires_grad_()
    labels = torch.zeros(6, dtype=torch.int64)  # no negatives anywhere
    tuples = BatchHardMiner()(embeddings.detach(), labels)
    assert all(t.numel() == 0 for t in tuples)
    loss = TripletMarginLoss()(embeddings, labels, tuples)
    assert loss.item() == 0.0 and loss.requires_grad
    loss.backward()
    assert torch.equal(embeddings.grad, torch.zeros_like(embeddings))


class NaNEncoder(CountingEncoder):
    def forward(self, x):
        out = super().forward(x)
        return out * float("nan") if self.calls == 2 else out


def test_nonfinite_embeddings_raise_a_clear_error():
    trainer, _, _ = make_trainer(
        HardNegativeMining(), encoder=NaNEncoder(), model_kwargs={"normalize": False}
    )
    with pytest.raises(ValueError, match="embeddings at batch 1 contain NaN or inf"):
        trainer.fit()


def test_nonfinite_embeddings_can_skip_the_step():
    in_memory = InMemoryLogger()
    trainer, _, _ = make_trainer(
        HardNegativeMining(on_nonfinite="skip"),
        encoder=NaNEncoder(),
        loggers=[in_memory],
        max_duration="3ba",
        model_kwargs={"normalize": False},
    )
    trainer.fit()
    assert [float(v) for _, v in in_memory.data["mining/skipped"]] == [0.0, 1.0, 0.0]


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"strategy": "hardest"}, "strategy must be one of"),
        ({"strategy": {"2ep": "batch_hard"}}, "must say what runs from the start"),
        ({"strategy": {"0ep": "semi_hard", "100ba": "batch_hard"}}, "one time unit"),
        ({"strategy": {"0ep": "semi_hard", "soon": "batch_hard"}}, "Composer time string"),
        ({"cross_rank": True}, "cross_rank=True needs an explicit gather"),
        ({"gather": "autograd"}, "only applies with cross_rank=True"),
        ({"distance": "manhattan"}, "manhattan"),
        ({"on_nonfinite": "ignore"}, "on_nonfinite must be one of"),
        ({"memory_size": -1}, "memory_size must be an integer >= 0"),
        (
            {"miner_kwargs": {"semihard": {}}},
            r"a miner_kwargs key must be one of \[.*\], got 'semihard'\. Did you mean 'semi_hard'\?$",
        ),
        (
            {"strategy": "semihard"},
            r"strategy must be one of \[.*\], got 'semihard'\. Did you mean 'semi_hard'\?$",
        ),
        (
            {"strategy": {"0ep": "semi_hard", "10ep": "batchhard"}},
            r"strategy\['10ep'\] must be one of \[.*\], got 'batchhard'\. Did you mean 'batch_hard'\?$",
        ),
        # Checked when built, not when a later epoch's strategy first runs (it raised mid-training).
        (
            {"miner_kwargs": {"batch_hard": {"margn": 0.2}}},
            r"miner_kwargs\['batch_hard'\] has unknown keys \['margn'\]",
        ),
        (
            {"miner_kwargs": {"semi_hard": {"distance": "cosine"}}},
            r"unknown keys \['distance'\]; semi_hard takes",
        ),
        (
            {"miner_kwargs": {"hard_topk": {"k": 0}}},
            r"miner_kwargs\['hard_topk'\]: k must be an integer >= 1",
        ),
        (
            {"miner_kwargs": {"semi_hard": {"fallback": "any"}}},
            r"miner_kwargs\['semi_hard'\]: fallback must be",
        ),
    ],
)
def test_bad_configuration_raises_clear_errors(kwargs, match):
    with pytest.raises(ValueError, match=match):
        HardNegativeMining(**kwargs)


@pytest.mark.parametrize("strategy", ["random_triplets", "distance_weighted"])
def test_checking_miner_kwargs_leaves_the_global_rng_alone(strategy):
    # The check mines four rows; a random strategy used to draw from the global generator there.
    torch.manual_seed(0)
    expected = torch.rand(3)
    torch.manual_seed(0)
    HardNegativeMining(strategy, miner_kwargs={strategy: {}})
    assert torch.equal(torch.rand(3), expected)


def test_missing_labels_name_what_was_looked_for():
    features, labels = make_data()

    class DictBatches(TensorDataset):
        def __getitem__(self, i):
            return {"features": self.tensors[0][i], "target": self.tensors[1][i]}

    model = EmbeddingModel(CountingEncoder(), labels_key="target")
    assert_first_batch_refused(
        model,
        build_dataloader(DictBatches(features, labels), PKBatchSampler(labels, 4, 4)),
        HardNegativeMining(),
        match=r"state.batch\['labels'\].*keys \['features', 'target'\].*Set labels_key",
    )


def test_the_device_batch_is_measured_at_after_dataloader_without_requiring_labels_yet():
    """Another algorithm may add the labels after the dataloader; only AFTER_FORWARD insists on them."""
    algorithm = HardNegativeMining("batch_hard")
    trainer, _, _ = make_trainer(algorithm, max_duration="1ba")
    trainer.state.batch = {"features": torch.randn(6, DIM)}
    algorithm.apply(Event.AFTER_DATALOADER, trainer.state, trainer.logger)
    assert algorithm._device_rows is None
    trainer.state.batch = {"features": torch.randn(6, DIM), "labels": torch.arange(6)}
    algorithm.apply(Event.AFTER_DATALOADER, trainer.state, trainer.logger)
    assert algorithm._device_rows == 6


def test_wrong_label_dtype_is_rejected():
    algorithm = HardNegativeMining()
    features, labels = make_data()
    trainer, _, _ = make_trainer(algorithm, max_duration="1ba")
    trainer.state.outputs = torch.randn(4, 3)
    trainer.state.batch = (features[:4], labels[:4].float())
    with pytest.raises(ValueError, match="labels must be a 1-D integer tensor"):
        algorithm.apply(None, trainer.state, trainer.logger)


def test_collapse_warns_once():
    class Constant(CountingEncoder):
        def forward(self, x):
            return super().forward(x) * 0 + 1.0

    trainer, _, _ = make_trainer(HardNegativeMining("batch_hard"), encoder=Constant())
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        trainer.fit()
    assert sum("have collapsed" in str(w.message) for w in caught) == 1


@pytest.mark.parametrize("memory_size", [0, 16])
def test_collapse_warns_again_after_the_embeddings_spread_out_and_names_the_memory(memory_size):
    """Collapsed first outputs (batch 0), spread (batches 1-2), collapsed again (batches 3+): two warnings."""

    class Phases(CountingEncoder):
        def forward(self, x):
            out = super().forward(x)
            return out * 0 + 1.0 if self.calls == 1 or self.calls > 3 else out

    algorithm = HardNegativeMining("semi_hard", memory_size=memory_size)
    trainer, _, _ = make_trainer(algorithm, encoder=Phases(), max_duration="6ba")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        trainer.fit()
    messages = [str(w.message) for w in caught if "have collapsed" in str(w.message)]
    assert [m.split(" at batch ")[1].split(")")[0] for m in messages] == ["0", "3"]
    assert all(("memory_start" in m) == bool(memory_size) for m in messages)


def test_memory_joins_the_pool_after_its_start_and_holds_detached_rows():
    recorder = Recorder()
    algorithm = HardNegativeMining("batch_hard", memory_size=40, memory_start="2ba")
    trainer, _, _ = make_trainer(algorithm, callbacks=[recorder], max_duration="5ba")
    trainer.fit()
    pool_sizes = [None if m.ref_embeddings is None else m.ref_embeddings.shape[0] for m in recorder.mined]
    # Batches 0-1: no memory. Batch 2: filled after mining, so still empty. Then 16, 32, capped at 40 rows.
    assert pool_sizes == [None, None, None, 16 + 16, 16 + 32]
    assert len(algorithm.memory) == 40 and not algorithm.memory.embeddings.requires_grad
    # Anchors never pair with themselves through the pool.
    for m in recorder.mined[3:]:
        anchors, positives, _ = m.indices_tuple
        assert not bool((positives == anchors).any())


def test_memory_is_checkpointed_and_a_resumed_run_continues_exactly(tmp_path):
    def run(**kwargs):
        recorder = Recorder()
        algorithm = HardNegativeMining("batch_hard", memory_size=48, memory_start="1ba")
        trainer, _, _ = make_trainer(algorithm, callbacks=[recorder], max_duration="2ep", seed=3, **kwargs)
        trainer.fit()
        return algorithm, recorder

    full_algorithm, full = run(save_folder=str(tmp_path), save_interval="5ba")
    resumed_algorithm, resumed = run(load_path=str(tmp_path / "ep0-ba5-rank0.pt"))
    assert len(resumed.mined) == len(full.mined) - 5
    for a, b in zip(full.mined[5:], resumed.mined):
        assert all(torch.equal(x, y) for x, y in zip(a.indices_tuple, b.indices_tuple))
        assert torch.allclose(a.ref_embeddings, b.ref_embeddings, atol=1e-6)
    assert torch.allclose(full_algorithm.memory.embeddings, resumed_algorithm.memory.embeddings, atol=1e-6)
    assert torch.equal(full_algorithm.memory.labels, resumed_algorithm.memory.labels)


def test_resuming_memory_into_an_algorithm_without_memory_is_an_error():
    with_memory = HardNegativeMining(memory_size=8)
    with_memory.memory.enqueue(torch.ones(2, 3), torch.tensor([0, 1]))
    with pytest.raises(ValueError, match="pass the same memory_size to resume"):
        HardNegativeMining().load_state_dict(with_memory.state_dict())


def test_memory_moves_to_the_embeddings_device_before_it_joins_the_pool(monkeypatch):
    # Without a GPU, spy on CrossBatchMemory.to: each time the memory joins the pool it is first moved
    # to the embeddings' device (a resumed memory sits on the CPU until then).
    from composer_dynsample import CrossBatchMemory

    moves, original = [], CrossBatchMemory.to

    def spy(self, device):
        moves.append(torch.device(device))
        return original(self, device)

    monkeypatch.setattr(CrossBatchMemory, "to", spy)
    algorithm = HardNegativeMining("batch_hard", memory_size=40)
    trainer, _, _ = make_trainer(algorithm, max_duration="3ba")
    trainer.fit()
    # Three enqueues and two reads of a non-empty memory, all to the embeddings' device.
    assert moves == [torch.device("cpu")] * 5


def _spread_reference(embeddings, distance):
    """Mean pairwise distance over distinct ordered pairs, in float64, zero rows at distance 0 under cosine."""
    x = embeddings.double()
    total, count = 0.0, x.shape[0]
    for i in range(count):
        for j in range(count):
            if i == j:
                continue
            if distance == "cosine":
                ni, nj = x[i].norm(), x[j].norm()
                total += 0.0 if ni == 0 or nj == 0 else float(1 - x[i] @ x[j] / (ni * nj))
            else:
                total += float((x[i] - x[j]).pow(2).sum())
    return total / (count * (count - 1))


@pytest.mark.parametrize("zero_rows", [0, 3, 8])
@pytest.mark.parametrize("distance", ["cosine", "squared_euclidean"])
def test_embedding_spread_matches_a_float64_loop_and_zero_rows_count_as_collapsed(distance, zero_rows):
    from composer_dynsample.mining.statistics import (
        embedding_spread,
    )

    x = torch.randn(8, 5, generator=torch.Generator().manual_seed(3))
    x[:zero_rows] = 0.0
    assert float(embedding_spread(x, distance)) == pytest.approx(_spread_reference(x, distance), abs=1e-5)
    if zero_rows == 8:
        assert float(embedding_spread(x, distance)) == 0.0


def test_collapse_warns_for_all_zero_embeddings_under_cosine_and_not_for_a_healthy_batch():
    class Zero(CountingEncoder):
        def forward(self, x):
            return super().forward(x) * 0

    for encoder, expected in ((Zero(), 1), (CountingEncoder(), 0)):
        trainer, _, _ = make_trainer(HardNegativeMining("semi_hard", on_nonfinite="skip"), encoder=encoder)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            trainer.fit()
        assert sum("have collapsed" in str(w.message) for w in caught) == expected


@pytest.mark.parametrize("scale", [1e19, 1e30])
@pytest.mark.parametrize("distance", ["cosine", "euclidean", "squared_euclidean"])
def test_statistics_of_huge_float32_embeddings_are_the_float64_ones(distance, scale):
    # Before, they were inf or NaN, and the cosine spread of rows whose norms overflow came out 0: a
    # false collapse warning.
    from composer_dynsample.mining.statistics import mining_statistics

    generator = torch.Generator().manual_seed(4)
    embeddings = (torch.randn(16, 4, generator=generator, dtype=torch.float64) * scale).float()
    labels = torch.arange(16) % 4
    tuples = BatchHardMiner(distance=distance)(embeddings, labels)
    ours = mining_statistics(embeddings, embeddings, tuples, distance=distance)
    reference = mining_statistics(embeddings.double(), embeddings.double(), tuples, distance=distance)
    assert len({value.dtype for value in ours.values()}) == 1  # they are stacked into one tensor
    for name, value in ours.items():
        assert bool(torch.isfinite(value)), name
        assert float(value) == pytest.approx(float(reference[name]), rel=1e-5), name
    assert float(ours["embedding_spread"]) > 0


def test_build_miner_suggests_the_closest_strategy_name():
    with pytest.raises(ValueError, match=r"got 'batchhard'\. Did you mean 'batch_hard'\?$"):
        build_miner("batchhard")


def _nothing_mined_warnings(trainer, caplog) -> tuple[list[str], list[str]]:
    with warnings.catch_warnings(record=True) as caught, caplog.at_level("WARNING"):
        warnings.simplefilter("always")
        trainer.fit()
    found = [str(w.message) for w in caught if "found no tuple" in str(w.message)]
    return found, [r.getMessage() for r in caplog.records if "found no tuple" in r.getMessage()]


def test_batches_of_one_sample_per_class_warn_once_that_nothing_trains(caplog):
    # Before, P x 1 batches mined nothing at every step, the loss was zero and the run said nothing.
    _, labels = make_data()
    sampler = PKBatchSampler(labels, 4, 1, require_positive_pairs=False)  # 32 batches of 4 classes x 1
    trainer, _, _ = make_trainer(HardNegativeMining("semi_hard"), max_duration="1ep", sampler=sampler)
    found, logged = _nothing_mined_warnings(trainer, caplog)
    assert len(found) == 1 and logged == found
    assert "semi_hard found no tuple in 20 consecutive steps (through batch 20)" in found[0]
    assert "No label occurs twice in the batch of 4 rows" in found[0] and "samples_per_class" in found[0]


def test_batches_of_one_label_warn_after_an_epoch_shorter_than_the_patience(caplog):
    features, _ = make_data()
    labels = torch.zeros(NUM, dtype=torch.int64)
    model = EmbeddingModel(CountingEncoder())
    trainer = Trainer(
        model=model,
        train_dataloader=torch.utils.data.DataLoader(TensorDataset(features, labels), batch_size=16),
        optimizers=torch.optim.SGD(model.parameters(), lr=0.05),
        algorithms=[HardNegativeMining("batch_hard")],
        max_duration="2ep",
        progress_bar=False,
    )
    found, logged = _nothing_mined_warnings(trainer, caplog)
    assert len(found) == 1 and len(logged) == 1
    assert "in 8 consecutive steps (through batch 8)" in found[0]  # one epoch of 8 batches
    assert "Every row of the batch of 16 rows has the same label, so there is no negative" in found[0]


def test_a_run_that_mines_tuples_does_not_warn_that_nothing_trains(caplog):
    trainer, _, _ = make_trainer(HardNegativeMining("batch_hard"), max_duration="3ep")
    found, logged = _nothing_mined_warnings(trainer, caplog)
    assert found == [] and logged == []
