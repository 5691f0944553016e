"""The tempting way (a model inside ``Dataset.__getitem__``) against this package's design, end to end.

**Wrong way** (the source article's anti-pattern): the model is handed to the dataset, and
``__getitem__(i)`` embeds anchor ``i`` and a set of candidates *one sample at a time* (batch-size-1
forward passes under ``no_grad``, model in eval mode) to pick the farthest same-class candidate (hard
positive) and the nearest other-class candidate (hard negative); it returns the three feature tensors.
A ``DataLoader`` with ``num_workers=0`` (an accelerator cannot be used from forked workers) and the
default collate builds B triplets per step from B ``__getitem__`` calls; the step embeds the 3B
samples and applies the triplet loss.

**This design**: ``IndexDataset`` + ``GatherCollate`` + ``PKBatchSampler`` in the loader; the step is
exactly what ``HardNegativeMining`` does at ``AFTER_FORWARD``: embed the batch once,
the miner (``build_miner(strategy)``) on the detached embeddings, ``TripletMarginLoss`` on the mined
triplets, backward, AdamW step.

Both use the same model (``EmbeddingModel`` around the ``Conv1dEncoder`` of
``yamls/mnist1d_default.yaml``), the same data (MNIST-1D; random data of the same shape with
``--quick``), B anchors per optimizer step and the same number of timed steps, each timed end to end
(fetching the batch, mining, forward, backward, step) after one untimed warm-up step.

Second part, **staleness**: the wrong way with ``num_workers > 0`` (fork). Each worker holds the copy
of the model it was forked with, at iterator creation (the start of every epoch); the model carries a
``version`` buffer that the main process increments at every optimizer step, each sample records the
version it was mined with, and the step reports ``current version - mined version``.

    python benchmarks/antipattern.py [--quick] [--out benchmarks/results] [--threads 1]
"""

from __future__ import annotations

import statistics
import time
from pathlib import Path

import numpy as np
import torch
from _common import machine_info, save_figure, write_results
from _common import parser as make_parser

from composer_dynsample import EmbeddingModel, PKBatchSampler, TripletMarginLoss
from composer_dynsample.data import GatherCollate, IndexDataset, TensorStore, load_mnist1d
from composer_dynsample.mining import build_miner
from composer_dynsample.models.encoders import Conv1dEncoder

MARGIN = 0.2


def build_model(length: int = 40) -> EmbeddingModel:
    """The encoder of ``yamls/mnist1d_default.yaml`` in an ``EmbeddingModel``, with a ``version`` buffer."""
    encoder = Conv1dEncoder(
        input_length=length,
        channels=64,
        num_layers=4,
        kernel_size=5,
        strides=(1, 2, 2, 2),
        norm="batch",
        activation="relu",
        pooling="flatten",
        embedding_dim=64,
    )
    model = EmbeddingModel(encoder, loss=TripletMarginLoss(margin=MARGIN))
    model.register_buffer("version", torch.zeros((), dtype=torch.int64))
    return model


def load_store(quick: bool) -> TensorStore:
    if quick:
        generator = torch.Generator().manual_seed(0)
        return TensorStore(torch.randn(1000, 40, generator=generator), torch.arange(1000) % 10)
    return load_mnist1d().train


class ModelInDataset(torch.utils.data.Dataset):
    """The anti-pattern: ``__getitem__`` embeds the anchor and its candidates one at a time with the model.

    Returns ``(anchor, positive, negative, label, version)`` where ``version`` is the model's optimizer
    step counter as this process sees it. Top-level and picklable, for the ``num_workers > 0`` run.
    """

    def __init__(
        self, store: TensorStore, model: EmbeddingModel, num_positives: int, num_negatives: int
    ) -> None:
        self.features = store.features
        self.labels = store.labels.numpy()
        self.model = model
        self.num_positives, self.num_negatives = num_positives, num_negatives
        self.by_class = {int(c): np.flatnonzero(self.labels == c) for c in np.unique(self.labels)}
        self.others = {c: np.flatnonzero(self.labels != c) for c in self.by_class}

    def __len__(self) -> int:
        return len(self.labels)

    def _embed_one(self, index: int) -> torch.Tensor:
        return self.model.embed(self.features[index][None])[0]

    def __getitem__(self, index: int):
        label = int(self.labels[index])
        rng = np.random.default_rng()
        same = self.by_class[label]
        positives = rng.choice(same[same != index], self.num_positives, replace=False)
        negatives = rng.choice(self.others[label], self.num_negatives, replace=False)
        was_training = self.model.training
        self.model.eval()
        with torch.no_grad():
            anchor = self._embed_one(index)
            pos_dist = torch.stack([1 - anchor @ self._embed_one(int(j)) for j in positives])
            neg_dist = torch.stack([1 - anchor @ self._embed_one(int(j)) for j in negatives])
        self.model.train(was_training)
        positive = int(positives[int(pos_dist.argmax())])
        negative = int(negatives[int(neg_dist.argmin())])
        version = int(self.model.version)
        return self.features[index], self.features[positive], self.features[negative], label, version


class RandomBatches(torch.utils.data.Sampler):
    """``num_batches`` batches of ``batch_size`` random indices (with replacement across batches)."""

    def __init__(self, n: int, batch_size: int, num_batches: int, seed: int = 0) -> None:
        self.n, self.batch_size, self.num_batches, self.seed = n, batch_size, num_batches, seed

    def __len__(self) -> int:
        return self.num_batches

    def __iter__(self):
        generator = torch.Generator().manual_seed(self.seed)
        for _ in range(self.num_batches):
            yield torch.randint(0, self.n, (self.batch_size,), generator=generator).tolist()


def _optimizer(model: torch.nn.Module) -> torch.optim.Optimizer:
    return torch.optim.AdamW(model.parameters(), lr=3e-3, weight_decay=1e-4)


def _bump(model: EmbeddingModel) -> None:
    with torch.no_grad():
        model.version += 1


def _wrong_way_setup(
    store: TensorStore, num_positives: int, num_negatives: int
) -> tuple[EmbeddingModel, torch.optim.Optimizer, TripletMarginLoss, ModelInDataset]:
    """Seeded model, optimizer, loss and the dataset that mines with the model in ``__getitem__``."""
    torch.manual_seed(0)
    model = build_model()
    return (
        model,
        _optimizer(model),
        TripletMarginLoss(margin=MARGIN),
        ModelInDataset(store, model, num_positives, num_negatives),
    )


def _triplet_step(
    model: EmbeddingModel,
    optimizer: torch.optim.Optimizer,
    loss_fn: TripletMarginLoss,
    triplet: tuple[torch.Tensor, torch.Tensor, torch.Tensor],
    labels: torch.Tensor,
) -> None:
    """One optimizer step on (anchor, positive, negative) rows mined by the dataset, then a version bump."""
    batch = len(labels)
    index = torch.arange(batch)
    optimizer.zero_grad(set_to_none=True)
    embeddings = model.embed(torch.cat(triplet))
    loss = loss_fn(embeddings, labels.repeat(3), (index, index + batch, index + 2 * batch))
    loss.backward()
    optimizer.step()
    _bump(model)


def run_wrong_way(store: TensorStore, batch: int, steps: int, num_positives: int, num_negatives: int) -> dict:
    model, optimizer, loss_fn, dataset = _wrong_way_setup(store, num_positives, num_negatives)
    loader = torch.utils.data.DataLoader(
        dataset, batch_sampler=RandomBatches(len(dataset), batch, steps + 1), num_workers=0
    )
    iterator = iter(loader)
    times = []
    for step in range(steps + 1):
        start = time.perf_counter()
        anchor, positive, negative, labels, _ = next(iterator)
        _triplet_step(model, optimizer, loss_fn, (anchor, positive, negative), labels)
        if step:  # step 0 is the warm-up
            times.append(time.perf_counter() - start)
    return _summary("wrong way (model in __getitem__, batch-1 mining)", batch, times)


def run_design(store: TensorStore, batch: int, steps: int, strategy: str, samples_per_class: int) -> dict:
    torch.manual_seed(0)
    model = build_model()
    optimizer = _optimizer(model)
    loss_fn = TripletMarginLoss(margin=MARGIN)
    sampler = PKBatchSampler(
        store.labels, batch // samples_per_class, samples_per_class, num_replicas=1, rank=0, seed=0
    )
    loader = torch.utils.data.DataLoader(
        IndexDataset(store.labels), batch_sampler=sampler, collate_fn=GatherCollate(store), num_workers=0
    )
    kwargs = {"margin": MARGIN} if strategy == "semi_hard" else {}

    def batches():
        epoch = 0
        while True:
            sampler.set_epoch(epoch)
            yield from loader
            epoch += 1

    iterator = batches()
    times = []
    for step in range(steps + 1):
        start = time.perf_counter()
        data = next(iterator)
        optimizer.zero_grad(set_to_none=True)
        embeddings = model(data)
        tuples = build_miner(strategy, kwargs)(embeddings.detach(), data["labels"])
        loss = loss_fn(embeddings, data["labels"], tuples)
        loss.backward()
        optimizer.step()
        _bump(model)
        if step:
            times.append(time.perf_counter() - start)
    return _summary(
        f"this design ({strategy} on the batch, PK {batch // samples_per_class}x{samples_per_class})",
        batch,
        times,
    )


def _summary(name: str, batch: int, times: list[float]) -> dict:
    total = sum(times)
    return {
        "pipeline": name,
        "batch": batch,
        "steps": len(times),
        "median_step_ms": round(statistics.median(times) * 1e3, 2),
        "total_s": round(total, 3),
        "samples_per_s": round(batch * len(times) / total, 1),
    }


def run_staleness(
    store: TensorStore, batch: int, steps: int, num_positives: int, num_negatives: int, workers: int
) -> dict:
    """The wrong way with forked workers: how many optimizer steps old the mining weights are per step."""
    model, optimizer, loss_fn, dataset = _wrong_way_setup(store, num_positives, num_negatives)
    loader = torch.utils.data.DataLoader(
        dataset,
        batch_sampler=RandomBatches(len(dataset), batch, steps),
        num_workers=workers,
        prefetch_factor=2,
        multiprocessing_context="fork",
    )
    staleness = []
    for anchor, positive, negative, labels, versions in loader:
        current = int(model.version)
        staleness.append(current - float(versions.float().mean()))
        _triplet_step(model, optimizer, loss_fn, (anchor, positive, negative), labels)
    return {
        "workers": workers,
        "prefetch_factor": 2,
        "batch": batch,
        "steps": len(staleness),
        "staleness_per_step": staleness,
        "mean_staleness": round(statistics.fmean(staleness), 2),
        "max_staleness": max(staleness),
    }


def plot(path: Path, rows: list[dict], stale: dict) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, (left, right) = plt.subplots(1, 2, figsize=(12, 4.5))
    names = ["wrong way\nmodel in __getitem__"] + [
        "this design\n" + r["pipeline"].split("(", 1)[1].split(" on ")[0] for r in rows[1:]
    ]
    bars = left.bar(
        range(len(rows)), [r["samples_per_s"] for r in rows], color=["C3"] + ["C0"] * (len(rows) - 1)
    )
    left.bar_label(bars, fmt="%.0f")
    left.set_xticks(range(len(rows)), names, fontsize=9)
    left.set_yscale("log")
    left.set_ylabel("anchors per second (log)")
    left.set_title(f"training throughput, B = {rows[0]['batch']}")
    right.plot(range(len(stale["staleness_per_step"])), stale["staleness_per_step"], marker=".")
    right.set_xlabel("optimizer step in the epoch")
    right.set_ylabel("age of the mining weights (steps)")
    right.set_title(
        f"wrong way, {stale['workers']} forked workers: mean {stale['mean_staleness']}, max {stale['max_staleness']:.0f}"
    )
    save_figure(figure, path)


def main(argv: list[str] | None = None) -> dict:
    parser = make_parser(__doc__, quick_help="random data, small batch, 3 steps: a smoke test", threads=1)
    parser.add_argument("--positives", type=int, default=8, help="positive candidates per anchor, wrong way")
    parser.add_argument("--negatives", type=int, default=24, help="negative candidates per anchor, wrong way")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)

    store = load_store(args.quick)
    batch, steps = (32, 3) if args.quick else (256, 12)
    stale_batch, stale_steps = (8, 6) if args.quick else (16, 40)
    k = 4 if args.quick else 32  # MNIST-1D has 10 classes: P x K = 8 x 32 at B = 256

    wrong = run_wrong_way(store, batch, steps, args.positives, args.negatives)
    rows = [wrong] + [run_design(store, batch, steps, s, k) for s in ("semi_hard", "batch_hard")]
    stale = run_staleness(store, stale_batch, stale_steps, args.positives, args.negatives, workers=2)
    ratio = rows[1]["samples_per_s"] / wrong["samples_per_s"]

    lines = [
        "| pipeline | B | timed steps | median step (ms) | anchors/s | vs wrong way |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    lines += [
        f"| {r['pipeline']} | {r['batch']} | {r['steps']} | {r['median_step_ms']:.1f} | "
        f"{r['samples_per_s']:.0f} | {r['samples_per_s'] / wrong['samples_per_s']:.1f}x |"
        for r in rows
    ]
    lines += [
        "",
        f"Wrong way: {args.positives} positive + {args.negatives} negative candidates per anchor, i.e. "
        f"{1 + args.positives + args.negatives} batch-1 forward passes per anchor; num_workers=0.",
        "",
        "| staleness, wrong way with forked workers | workers | prefetch | B | steps | mean (steps) | max (steps) |",
        "|---|---:|---:|---:|---:|---:|---:|",
        f"| weights used for mining, age in optimizer steps | {stale['workers']} | {stale['prefetch_factor']} | "
        f"{stale['batch']} | {stale['steps']} | {stale['mean_staleness']:.1f} | {stale['max_staleness']:.0f} |",
        "",
        "This design mines on the embeddings of the current forward pass: staleness 0 by construction.",
    ]
    table = "\n".join(lines)
    goal = "this design >= 8x the wrong way's anchors/s at B = 256 (the article claims 3-8x)"
    print(table)
    print(
        f"\ngoal: {goal}\nmeasured: {ratio:.1f}x at B = {batch} (semi_hard; batch_hard "
        f"{rows[2]['samples_per_s'] / wrong['samples_per_s']:.1f}x); wrong-way staleness with "
        f"{stale['workers']} workers: mean {stale['mean_staleness']:.1f}, max {stale['max_staleness']:.0f} steps"
    )

    result = {
        "ratio": round(ratio, 2),
        "ratio_meaning": "anchors/s of this design (semi_hard) / anchors/s of the wrong way at the same B; goal >= 8",
        "goal": goal,
        "data": "random (1000, 40), 10 classes" if args.quick else "MNIST-1D train (4000, 40), 10 classes",
        "candidates_per_anchor": {"positives": args.positives, "negatives": args.negatives},
        "rows": rows,
        "staleness": stale,
        "machine": f"{machine_info()}, cuda {torch.cuda.is_available()}",
    }
    return write_results(
        args.out, "antipattern", args.quick, result, table, plot=lambda path: plot(path, rows, stale)
    )


if __name__ == "__main__":
    main()
