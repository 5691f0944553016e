"""HardNegativeMining reads no tensor on the host between two logging steps; what it logs is what it did.

Before, every step read the finiteness flag (``all_ranks_finite``: ``.item()``), the statistics
(``.tolist()``) and, in the miner, the embeddings' finiteness, their largest entry and the positives' count:
on a GPU each read waits for the whole queue.
"""

from __future__ import annotations

import math
import os

import pytest
import torch
from composer import Trainer
from composer.core import DataSpec
from composer.loggers import InMemoryLogger

from composer_dynsample import (
    BagOfTokensEncoder,
    EmbeddingModel,
    HardNegativeMining,
    InfoNCELoss,
    PKBatchSampler,
    build_dataloader,
)
from composer_dynsample.mining.step import HEALTH_NONFINITE, HEALTH_TOO_LARGE, step_health
from composer_dynsample.testing import HostReadCounter, HostReadsPerStep
from tests.algorithms.helpers import VOCAB, PairsTexts, TextCollate

BATCHES_PER_EPOCH = 6  # 96 rows in batches of 8 pairs


class NaNAt(torch.nn.Module):
    """The package's bag of tokens, whose output is NaN at the ``bad``-th forward (counted from 1)."""

    def __init__(self, bad: int, scale: float = float("nan")) -> None:
        super().__init__()
        self.encoder = BagOfTokensEncoder(vocab_size=VOCAB, token_dim=8)
        self.bad, self.scale, self.calls = bad, scale, 0

    def forward(self, features: dict) -> torch.Tensor:
        self.calls += 1
        out = self.encoder(features)
        return out * self.scale if self.calls == self.bad else out


def _trainer(
    algorithm: HardNegativeMining, *, encoder=None, callbacks=(), loggers=(), duration="2ep"
) -> Trainer:
    data = PairsTexts()
    sampler = PKBatchSampler(data.labels, classes_per_batch=8, samples_per_class=2, seed=0)
    loader = build_dataloader(data, sampler, collate_fn=TextCollate(data))
    torch.manual_seed(0)
    encoder = encoder or BagOfTokensEncoder(vocab_size=VOCAB, token_dim=8)
    model = EmbeddingModel(encoder, loss=InfoNCELoss(temperature=0.05), normalize=False)
    return Trainer(
        model=model,
        train_dataloader=DataSpec(loader, get_num_samples_in_batch=lambda batch: len(batch["indices"])),
        optimizers=torch.optim.AdamW(model.parameters(), lr=1e-2),
        algorithms=[algorithm],
        callbacks=list(callbacks),
        loggers=list(loggers),
        max_duration=duration,
        progress_bar=False,
    )


def test_no_step_between_two_logging_steps_reads_a_tensor_on_the_host():
    with HostReadCounter() as counter:
        per_step = HostReadsPerStep(counter)
        algorithm = HardNegativeMining("batch_hard", duplicate_key="text_hash", log_interval=4)
        _trainer(algorithm, callbacks=[per_step]).fit()
    ours = [sum(n for (who, _), n in step.items() if who == "composer_dynsample") for step in per_step.steps]
    # Reads at BATCH_END every 4 batches (counted from 1), and at EPOCH_END, after the step (batch 6).
    logging = {4, 8, 12}
    assert len(ours) == 2 * BATCHES_PER_EPOCH
    assert [n for batch, n in enumerate(ours, 1) if batch not in logging] == [0] * 9
    assert [ours[batch - 1] for batch in sorted(logging)] == [1, 1, 1]  # one transfer each


def test_the_logged_statistics_are_the_means_of_the_steps_since_the_last_read():
    logged = {}
    for interval in (1, 4):
        logger = InMemoryLogger()
        algorithm = HardNegativeMining("batch_hard", duplicate_key="text_hash", log_interval=interval)
        _trainer(algorithm, loggers=[logger]).fit()
        logged[interval] = logger.data
    windows = [(0, 4), (4, 6), (6, 8), (8, 12)]  # read every 4 batches and at each epoch's end (6, 12)
    for name in ("positive_distance", "negative_distance", "num_tuples", "duplicate_negatives_dropped"):
        every_step = [float(v) for _, v in logged[1][f"mining/{name}"]]
        assert len(every_step) == 12
        means = [sum(every_step[a:b]) / (b - a) for a, b in windows]
        assert [float(v) for _, v in logged[4][f"mining/{name}"]] == pytest.approx(means, rel=1e-6), name


@pytest.mark.parametrize("interval", [1, 4])
def test_nan_embeddings_raise_at_the_next_read_naming_the_first_such_batch(interval):
    algorithm = HardNegativeMining("batch_hard", log_interval=interval)
    trainer = _trainer(algorithm, encoder=NaNAt(bad=2))
    with pytest.raises(ValueError, match="the embeddings at batch 1 contain NaN or inf"):
        trainer.fit()
    assert int(trainer.state.timestamp.batch) == (2 if interval == 1 else 4)


def test_entries_too_large_for_float32_distances_raise_and_skip_mines_them_in_float64():
    trainer = _trainer(HardNegativeMining("batch_hard", log_interval=2), encoder=NaNAt(bad=1, scale=1e20))
    with pytest.raises(ValueError, match="at batch 0 hold entries too large for float32 distances"):
        trainer.fit()
    # on_nonfinite="skip" checks on the host, where the float64 fallback of working_dtype still applies.
    skipping = _trainer(
        HardNegativeMining("batch_hard", on_nonfinite="skip"), encoder=NaNAt(bad=1, scale=1e20)
    )
    skipping.fit(duration="1ba")


def test_step_health_flags_nan_inf_and_float32_overflow_by_the_working_dtype_bound():
    assert int(step_health(torch.ones(3, 4))) == 0
    assert int(step_health(torch.tensor([[1.0, float("inf")]]))) == HEALTH_NONFINITE
    assert int(step_health(torch.tensor([[1.0, float("nan")]]))) == HEALTH_NONFINITE
    dim = 16
    bound = math.sqrt(torch.finfo(torch.float32).max / (4 * dim))
    below, above = torch.full((1, dim), bound * 0.99), torch.full((1, dim), bound * 1.01)
    assert int(step_health(below)) == 0 and int(step_health(above)) == HEALTH_TOO_LARGE
    assert int(step_health(above.double())) == 0  # float64 distances hold it
    assert int(step_health(torch.zeros(0, dim))) == 0


def test_nothing_mined_warns_at_the_read_after_the_patience_is_reached(recwarn):
    data = PairsTexts()
    # One label only: no negative anywhere, batch_hard finds nothing, every step.
    data.labels = torch.zeros_like(data.labels)
    loader = torch.utils.data.DataLoader(data, batch_size=16, collate_fn=TextCollate(data))
    torch.manual_seed(0)
    model = EmbeddingModel(BagOfTokensEncoder(vocab_size=VOCAB, token_dim=8), normalize=False)
    Trainer(
        model=model,
        train_dataloader=DataSpec(loader, get_num_samples_in_batch=lambda batch: len(batch["indices"])),
        optimizers=torch.optim.SGD(model.parameters(), lr=0.1),
        algorithms=[HardNegativeMining("batch_hard", log_interval=4)],
        max_duration="2ep",
        progress_bar=False,
    ).fit()
    found = [str(w.message) for w in recwarn if "found no tuple" in str(w.message)]
    # The epoch has 6 batches (shorter than the patience of 20): the run reaches 6 by the read at batch 6.
    assert len(found) == 1 and "found no tuple in 6 consecutive steps (through batch 6)" in found[0]


def test_the_host_read_counter_counts_by_caller_and_restores_the_tensor_methods():
    before = {name: torch.Tensor.__dict__.get(name) for name in ("item", "tolist", "__bool__")}
    with HostReadCounter() as counter:
        x = torch.arange(3)
        x.sum().item(), x.tolist(), bool(x.any()), float(x[0]), int(x[1]), x.cpu()
        with pytest.raises(RuntimeError, match="already counting"):
            HostReadCounter().__enter__()
    assert counter.by_origin() == {"other": 6}
    assert {name: torch.Tensor.__dict__.get(name) for name in before} == before
    assert torch.arange(2).sum().item() == 1 and counter.total() == 6  # no longer counting


def test_a_read_from_composers_own_folder_is_composers_wherever_it_is_installed(monkeypatch, tmp_path):
    # Composer installed with pip --target (no site-packages in its path), as on a machine without an index.
    from composer_dynsample import testing

    folder = tmp_path / "site" / "composer"
    folder.mkdir(parents=True)
    monkeypatch.setattr(testing, "_COMPOSER", str(folder) + os.sep)
    source = folder / "trainer.py"
    source.write_text("def read(x):\n    return x.item()\n")
    scope: dict = {}
    exec(compile(source.read_text(), str(source), "exec"), scope)
    neighbour = tmp_path / "site" / "composer_extras.py"  # a package whose name starts alike is not Composer
    neighbour.write_text("def read(x):\n    return x.item()\n")
    other: dict = {}
    exec(compile(neighbour.read_text(), str(neighbour), "exec"), other)
    with HostReadCounter() as counter:
        scope["read"](torch.ones(()))
        other["read"](torch.ones(()))
    assert counter.by_origin() == {"composer": 1, "other": 1}
    assert ("composer", "composer/trainer.py:2", "item") in counter.sites
