"""One training run of the elastic resume tests: imported by the 2-rank tests, and run as a 1-rank script.

``python -m tests.distributed.elastic_run '<json keyword arguments of train>' OUT.json`` trains on one
rank and writes the batches it trained to ``OUT.json``; :func:`run_on_one_rank` starts it from rank 0
of a 2-rank test with a 1-rank environment, which is how a checkpoint moves between world sizes here.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from collections import Counter
from pathlib import Path
from typing import Any

import torch
from composer import Trainer
from torch.utils.data import DataLoader

from composer_dynsample import PKBatchSampler, SetSamplerEpoch, build_dataloader
from composer_dynsample.samplers.mixed import MixedBatchSampler
from tests.common import BatchRecorder, IndexClassifier, index_dataset

LABELS = torch.arange(192) % 8  # 8 classes of 24: 16 global PK batches of 4 x 3 per epoch

Batches = dict[tuple[int, int], list[int]]


def make_sampler(drop_last: bool = True, mixed: bool = False) -> PKBatchSampler | MixedBatchSampler:
    """16 global batches an epoch: of P x K over ``LABELS``, or (``mixed``) 8 of each half of the indices
    (two sources), every batch from one half, as ``data: {name: mix}`` draws them."""
    if not mixed:
        return PKBatchSampler(LABELS, classes_per_batch=4, samples_per_class=3, seed=5, drop_last=drop_last)
    half = len(LABELS) // 2
    sources = {
        name: PKBatchSampler(part, classes_per_batch=4, samples_per_class=3, seed=6 + i, drop_last=drop_last)
        for i, (name, part) in enumerate((("first", LABELS[:half]), ("second", LABELS[half:])))
    }
    return MixedBatchSampler(sources, [half, half], seed=5, drop_last=drop_last)


def make_trainer(
    loader: DataLoader, max_duration: str = "3ep", **trainer_kwargs: Any
) -> tuple[Trainer, BatchRecorder]:
    """A Trainer of the tiny model on an index loader, with SetSamplerEpoch and a recorder of its batches."""
    recorder = BatchRecorder()
    trainer = Trainer(
        model=IndexClassifier(len(loader.dataset), 8),  # type: ignore[arg-type]
        train_dataloader=loader,
        max_duration=max_duration,
        callbacks=[recorder, SetSamplerEpoch()],
        progress_bar=False,
        **trainer_kwargs,
    )
    return trainer, recorder


def train(max_duration: str, drop_last: bool = True, mixed: bool = False, **trainer_kwargs: Any) -> Batches:
    """Train the tiny model and return the dataset indices of every batch, keyed by (epoch, batch in epoch)."""
    loader = build_dataloader(index_dataset(LABELS), make_sampler(drop_last, mixed))
    trainer, recorder = make_trainer(loader, max_duration, **trainer_kwargs)
    trainer.fit()
    trainer.close()
    return recorder.batches


def epoch_batches(batches: Batches, epoch: int) -> Counter[tuple[int, ...]]:
    """The batches trained in one epoch, as a multiset of index tuples."""
    return Counter(tuple(batch) for (e, _), batch in batches.items() if e == epoch)


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def run_on_one_rank(out: Path, **train_kwargs: Any) -> Batches:
    """Run :func:`train` in a fresh process that is rank 0 of 1 and return the batches it trained."""
    one_rank = {"WORLD_SIZE": "1", "RANK": "0", "LOCAL_RANK": "0", "LOCAL_WORLD_SIZE": "1", "NODE_RANK": "0"}
    env = {**os.environ, **one_rank, "MASTER_PORT": str(_free_port())}
    root = Path(__file__).resolve().parents[2]
    command = [sys.executable, "-m", "tests.distributed.elastic_run", json.dumps(train_kwargs), str(out)]
    subprocess.run(command, env=env, cwd=root, check=True, timeout=300)
    return {(e, b): batch for e, b, batch in json.loads(out.read_text())}


if __name__ == "__main__":
    trained = train(**json.loads(sys.argv[1]))
    Path(sys.argv[2]).write_text(json.dumps([[e, b, batch] for (e, b), batch in sorted(trained.items())]))
