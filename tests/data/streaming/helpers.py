"""Data sets converted to MDS shards for the streaming tests, and the comparison of two splits' batches."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch

from composer_dynsample.data import GatherCollate, TextCollate
from composer_dynsample.data.text.pairs import load_pairs
from tests.cli.helpers import BAG, latest_checkpoint
from tests.data.text.helpers import pair_rows, write_jsonl


def pairs_splits(folder: Path, count: int = 120, **options: object):
    """Pairs with given negatives (train) and a separate test file, loaded as ``data: {name: pairs}`` loads them."""
    folder.mkdir(parents=True, exist_ok=True)
    write_jsonl(folder / "train.jsonl", pair_rows(count, seed=0, negatives=True))
    write_jsonl(folder / "test.jsonl", pair_rows(24, seed=1))
    options = {"cache_dir": folder / "cache", "max_length": 24, "vocab_size": 200, **options}
    return load_pairs(folder / "train.jsonl", test_path=folder / "test.jsonl", **options)


def assert_same_batches(file_store, streamed_store, batches: list[list[int]]) -> None:
    """Every batch collated from the streamed split equals the file's, tensor for tensor."""
    text = hasattr(file_store, "text_ids")
    for rows in batches:
        collate = TextCollate if text else GatherCollate
        want, got = collate(file_store)(rows), collate(streamed_store)(rows)
        assert want.keys() == got.keys()
        for key, value in want.items():
            pairs = value.items() if isinstance(value, dict) else [(key, value)]
            for name, tensor in pairs:
                other = got[key][name] if isinstance(value, dict) else got[key]
                assert tensor.dtype == other.dtype and torch.equal(tensor, other), (key, name)


def some_batches(size: int, count: int = 6, seed: int = 0) -> list[list[int]]:
    rng = np.random.default_rng(seed)
    return [rng.permutation(size)[: min(size, 11)].tolist() for _ in range(count)]


def mined_pairs_config(data: dict, *, pairs_per_batch: int, workers: int, **trainer: object) -> dict:
    """A train config of mined negatives from the warm embedding table on ``data``, 2 epochs unless ``trainer``
    says otherwise."""
    return {
        "data": data,
        "model": {"encoder": BAG, "loss": {"name": "info_nce"}},
        "sampler": {"name": "mined_negatives", "pairs_per_batch": pairs_per_batch, "negatives_per_anchor": 1},
        "algorithms": {"embedding_table": {"warm_start": True}},  # its warm start gathers every rank's share
        "optimizer": {"name": "adamw", "lr": 0.01},
        "dataloader": {"num_workers": workers},
        "trainer": {"max_duration": "2ep", "progress_bar": False, **trainer},
    }


def timeless(value):
    """``value`` (metrics) without its timings, which differ between any two runs."""
    if isinstance(value, dict):
        return {k: timeless(v) for k, v in value.items() if "second" not in k and "time" not in k}
    return [timeless(v) for v in value] if isinstance(value, list) else value


def run_weights(run_dir: Path) -> dict:
    """The model weights of a run's latest checkpoint."""
    return torch.load(latest_checkpoint(run_dir), weights_only=False)["state"]["model"]
