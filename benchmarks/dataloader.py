"""Loader throughput: the index-only pipeline against a per-sample ``__getitem__``, same sampler and batch.

* **index-only**: ``IndexDataset`` (``__getitem__`` returns ``(index, label)``) + ``GatherCollate`` over a
  preloaded ``TensorStore``: one ``index_select`` per batch.
* **per-sample**: ``__getitem__`` builds one sample's feature tensor (``torch.tensor(features[i])`` from a
  numpy array) and the default collate stacks B of them.

Both read batches of 256 from the same ``PKBatchSampler`` (cycled over epochs with ``set_epoch``), for
``num_workers`` 0, 1, 2 (fork, ``persistent_workers=True``, ``prefetch_factor=2``) and ``pin_memory``
off/on (pinning needs CUDA: without it the pinned rows are skipped, not timed). Data: MNIST-1D-sized
(4000 x 40, 10 classes) and a larger synthetic store (200k x 128, 1000 classes).

Timing is **steady state**: each loader first runs a warm-up of ``warmup`` batches (which starts the
worker processes; that start-up cost is reported separately as ``first_batch_s``), then the next
``batches`` batches are timed. Batches are only fetched, not used.

    python benchmarks/dataloader.py [--quick] [--out benchmarks/results] [--threads 1]
"""

from __future__ import annotations

import time
import warnings
from pathlib import Path

import numpy as np
import torch
from _common import machine_info, markdown_table, save_figure, write_results
from _common import parser as make_parser

from composer_dynsample import PKBatchSampler
from composer_dynsample.data import GatherCollate, IndexDataset, TensorStore

BATCH = 256


class PerSampleDataset(torch.utils.data.Dataset):
    """The usual map-style dataset: one feature tensor per ``__getitem__``, stacked by the default collate."""

    def __init__(self, features: np.ndarray, labels: np.ndarray) -> None:
        self.features, self.labels = features, labels

    def __len__(self) -> int:
        return len(self.labels)

    def __getitem__(self, index: int) -> dict:
        return {
            "index": index,
            "features": torch.tensor(self.features[index]),
            "labels": int(self.labels[index]),
        }


class CyclingBatches(torch.utils.data.Sampler):
    """Yield ``num_batches`` batches from a ``PKBatchSampler``, moving to the next epoch when one ends."""

    def __init__(self, sampler: PKBatchSampler, num_batches: int) -> None:
        self.sampler, self.num_batches, self.epoch = sampler, num_batches, 0

    def __len__(self) -> int:
        return self.num_batches

    def __iter__(self):
        produced = 0
        while produced < self.num_batches:
            self.sampler.set_epoch(self.epoch)
            for batch in self.sampler:
                yield batch
                produced += 1
                if produced == self.num_batches:
                    return
            self.epoch += 1


def make_data(n: int, dim: int, classes: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    return rng.standard_normal((n, dim), dtype=np.float32), np.arange(n, dtype=np.int64) % classes


def measure(
    pipeline: str,
    features: np.ndarray,
    labels: np.ndarray,
    store: TensorStore,
    workers: int,
    pin: bool,
    warmup: int,
    batches: int,
) -> dict:
    classes = int(labels.max()) + 1
    per_batch = 8 if classes < 64 else 64  # P x K = 8 x 32 (10 classes) or 64 x 4
    sampler = PKBatchSampler(labels, per_batch, BATCH // per_batch, num_replicas=1, rank=0, seed=0)
    if pipeline == "index-only":
        dataset, collate = IndexDataset(store.labels), GatherCollate(store)
    else:
        dataset, collate = PerSampleDataset(features, labels), None
    kwargs = {"persistent_workers": True, "prefetch_factor": 2, "multiprocessing_context": "fork"}
    loader = torch.utils.data.DataLoader(
        dataset,
        batch_sampler=CyclingBatches(sampler, warmup + batches),
        collate_fn=collate,
        num_workers=workers,
        pin_memory=pin,
        **(kwargs if workers else {}),
    )
    start = time.perf_counter()
    iterator = iter(loader)
    first = next(iterator)
    first_batch_s = time.perf_counter() - start
    assert first["features"].shape == (BATCH, features.shape[1])
    for _ in range(warmup - 1):
        next(iterator)
    start = time.perf_counter()
    count = 0
    for batch in iterator:
        count += batch["features"].shape[0]
    elapsed = time.perf_counter() - start
    del iterator, loader  # shuts the workers down
    return {
        "pipeline": pipeline,
        "workers": workers,
        "pin_memory": pin,
        "samples": count,
        "seconds": round(elapsed, 4),
        "samples_per_s": round(count / elapsed, 1),
        "first_batch_s": round(first_batch_s, 4),
    }


def plot(path: Path, results: dict[str, list[dict]]) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, axes = plt.subplots(1, len(results), figsize=(6 * len(results), 4.5), squeeze=False)
    for ax, (data_name, rows) in zip(axes[0], results.items()):
        configs = sorted({(r["workers"], r["pin_memory"]) for r in rows})
        width = 0.38
        for offset, (pipeline, colour) in enumerate((("index-only", "C0"), ("per-sample", "C3"))):
            values = [
                next(
                    (
                        r["samples_per_s"]
                        for r in rows
                        if r["pipeline"] == pipeline and (r["workers"], r["pin_memory"]) == c
                    ),
                    0,
                )
                for c in configs
            ]
            positions = np.arange(len(configs)) + (offset - 0.5) * width
            ax.bar(positions, values, width, label=pipeline, color=colour)
        ax.set_xticks(
            np.arange(len(configs)),
            [f"{w} workers\npin {'on' if p else 'off'}" for w, p in configs],
            fontsize=8,
        )
        ax.set_yscale("log")
        ax.set_ylabel("samples / s (log)")
        ax.set_title(f"{data_name}, batch {BATCH}, steady state")
        ax.legend()
    save_figure(figure, path)


def measure_all(
    datasets: dict[str, tuple[int, int, int]],
    worker_counts: tuple[int, ...],
    pins: tuple[bool, ...],
    warmup: int,
    batches: int,
) -> dict[str, list[dict]]:
    """Per data set: both pipelines for every (workers, pin_memory), steady-state samples/s."""
    results: dict[str, list[dict]] = {}
    for data_name, (n, dim, classes) in datasets.items():
        features, labels = make_data(n, dim, classes)
        store = TensorStore(torch.from_numpy(features), torch.from_numpy(labels))
        rows = []
        for workers in worker_counts:
            for pin in pins:
                for pipeline in ("index-only", "per-sample"):
                    with warnings.catch_warnings():
                        warnings.simplefilter("ignore", UserWarning)
                        rows.append(measure(pipeline, features, labels, store, workers, pin, warmup, batches))
        results[data_name] = rows
    return results


def pair(rows: list[dict], workers: int, pin: bool) -> tuple[dict, dict]:
    """The index-only and the per-sample row of one (workers, pin_memory) setting."""
    fast, slow = (
        next(r for r in rows if r["pipeline"] == p and r["workers"] == workers and r["pin_memory"] == pin)
        for p in ("index-only", "per-sample")
    )
    return fast, slow


def ratio_table(results: dict[str, list[dict]]) -> str:
    """One line per (data, workers, pin_memory): both pipelines' samples/s, their ratio, first batch."""
    body = []
    for data_name, rows in results.items():
        for workers, pin in dict.fromkeys((r["workers"], r["pin_memory"]) for r in rows):
            fast, slow = pair(rows, workers, pin)
            body.append(
                [
                    data_name,
                    workers,
                    "on" if pin else "off",
                    f"{fast['samples_per_s']:,.0f}",
                    f"{slow['samples_per_s']:,.0f}",
                    f"{fast['samples_per_s'] / slow['samples_per_s']:.1f}x",
                    f"{fast['first_batch_s']:.3f} / {slow['first_batch_s']:.3f}",
                ]
            )
    header = [
        "data",
        "workers",
        "pin_memory",
        "index-only (samples/s)",
        "per-sample (samples/s)",
        "ratio",
        "first batch index-only / per-sample (s)",
    ]
    return markdown_table(header, "lrlrrrr", body)


def main(argv: list[str] | None = None) -> dict:
    parser = make_parser(__doc__, quick_help="small stores, few batches: a smoke test", threads=1)
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)

    cuda = torch.cuda.is_available()
    large = "synthetic 20k x 128" if args.quick else "synthetic 200k x 128"
    datasets = {
        "MNIST-1D-sized 4000 x 40": (4000, 40, 10),
        large: (20_000 if args.quick else 200_000, 128, 1000),
    }
    warmup, batches, worker_counts = (2, 5, (0, 1)) if args.quick else (5, 300, (0, 1, 2))
    results = measure_all(datasets, worker_counts, (False, True) if cuda else (False,), warmup, batches)
    notes = [
        f"Steady state: {batches} batches of {BATCH} timed after {warmup} warm-up batches (worker start-up "
        "excluded; it is in the first-batch column). Workers: fork, persistent, prefetch_factor 2."
    ]
    if not cuda:
        notes.append("CUDA is not available: pin_memory=True would be a no-op here, so it was not measured.")
    table = ratio_table(results) + "\n\n" + "\n".join(notes)

    fast, slow = pair(results[large], 0, False)
    ratio = fast["samples_per_s"] / slow["samples_per_s"]
    goal = "the index-only loader faster than a per-sample __getitem__ (ratio > 1) at num_workers=0, larger store"
    print(table)
    print(
        f"\ngoal: {goal}\nmeasured: {ratio:.1f}x on {large} ({fast['samples_per_s']:,.0f} vs "
        f"{slow['samples_per_s']:,.0f} samples/s)"
    )
    result = {
        "ratio": round(ratio, 2),
        "ratio_meaning": f"index-only / per-sample samples/s at num_workers=0, pin_memory off, on {large}",
        "goal": goal,
        "batch": BATCH,
        "warmup_batches": warmup,
        "timed_batches": batches,
        "cuda": cuda,
        "pin_memory_note": None if cuda else "no CUDA: pin_memory=True not measured (a no-op without CUDA)",
        "results": results,
        "machine": machine_info(),
    }
    return write_results(
        args.out, "dataloader", args.quick, result, table, plot=lambda path: plot(path, results)
    )


if __name__ == "__main__":
    main()
