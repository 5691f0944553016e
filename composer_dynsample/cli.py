"""The ``composer-dynsample`` command line.

``composer-dynsample train CONFIG.yaml [key.path=value ...] [--run-dir DIR]`` builds a Composer
``Trainer`` from a YAML config (see :mod:`composer_dynsample.config`) and trains it; it runs unchanged
on many processes under ``composer -n N -m composer_dynsample train ...`` or
``torchrun --nproc_per_node N -m composer_dynsample train ...``. ``composer-dynsample demo`` is a short
classifier run on bundled data.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

__all__ = ["evaluate_run", "main", "train"]


def demo(run_dir: Path, epochs: int = 8, seed: int = 0) -> dict[str, float]:
    """Train a small classifier on scikit-learn's bundled digits with P x K batches and SetSamplerEpoch.

    Shows the sampler and the callback in a real Composer run; writes ``run_dir/metrics.json``.
    """
    import torch
    from composer import Trainer
    from composer.models import ComposerClassifier
    from composer.utils import reproducibility
    from sklearn.datasets import load_digits
    from sklearn.model_selection import train_test_split
    from torch.utils.data import DataLoader, TensorDataset

    from composer_dynsample import PKBatchSampler, SetSamplerEpoch, build_dataloader

    reproducibility.seed_all(seed)
    digits = load_digits()
    features = torch.tensor(digits.data / 16.0, dtype=torch.float32)
    labels = torch.tensor(digits.target, dtype=torch.int64)
    train_idx, test_idx = train_test_split(
        range(len(labels)), test_size=0.2, stratify=labels, random_state=seed
    )
    train = TensorDataset(features[train_idx], labels[train_idx])
    test = TensorDataset(features[test_idx], labels[test_idx])

    sampler = PKBatchSampler(labels[train_idx], classes_per_batch=8, samples_per_class=8, seed=seed)
    network = torch.nn.Sequential(torch.nn.Linear(64, 128), torch.nn.ReLU(), torch.nn.Linear(128, 10))
    model = ComposerClassifier(network, num_classes=10)
    trainer = Trainer(
        model=model,
        train_dataloader=build_dataloader(train, sampler),
        eval_dataloader=DataLoader(test, batch_size=256),
        optimizers=torch.optim.Adam(model.parameters(), lr=3e-3),
        max_duration=f"{epochs}ep",
        callbacks=[SetSamplerEpoch()],
        seed=seed,
    )
    start = time.perf_counter()
    trainer.fit()
    wall = time.perf_counter() - start
    accuracy = float(trainer.state.eval_metric_values["MulticlassAccuracy"])
    metrics = {
        "test_accuracy": round(accuracy, 4),
        "wall_time_s": round(wall, 2),
        "batches_per_epoch": len(sampler),
    }
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / "metrics.json").write_text(json.dumps(metrics, indent=2) + "\n")
    print(
        f"\ndigits demo: test accuracy {accuracy:.4f} after {epochs} epochs ({wall:.1f} s); wrote {run_dir / 'metrics.json'}"
    )
    return metrics


def evaluate_run(run: Any) -> tuple[dict[str, float], Any]:
    """Embed the test queries and the train gallery with the run's current model and score them.

    Every rank computes the same result: the queries and gallery are whole on each rank, and rank 0's
    buffers are broadcast first.

    Args:
        run (TrainingRun): A run from :func:`composer_dynsample.config.build_run`.

    Returns:
        tuple[dict[str, float], torch.Tensor]: ``recall_at_{k}`` per ``k``, ``map_at_r`` and
        ``r_precision`` of the test queries against the train gallery, and the test embeddings.
    """
    from composer_dynsample.callbacks.retrieval_gallery import embed_store
    from composer_dynsample.distributed import broadcast_buffers
    from composer_dynsample.metrics import retrieval_metrics

    model = run.trainer.state.model
    broadcast_buffers(model)  # every rank evaluates rank 0's model (BatchNorm statistics differ per rank)
    gallery = embed_store(model, run.splits.train)
    queries = embed_store(model, run.splits.test)
    values = retrieval_metrics(
        queries,
        run.splits.test.labels.to(queries.device),
        gallery,
        run.splits.train.labels.to(gallery.device),
        ks=run.ks,
        distance=run.distance,
    )
    return {name: float(value) for name, value in values.items()}, queries.cpu()


def _share_cpu_threads() -> None:
    """Split the CPU cores between the ranks of this node unless ``OMP_NUM_THREADS`` says otherwise.

    ``torchrun`` sets ``OMP_NUM_THREADS=1`` per rank; Composer's launcher does not, and N ranks with all
    cores each oversubscribe the CPU (a 6x slower digits run measured on 2 ranks of a 2-core machine).
    """
    import torch

    local_ranks = int(os.environ.get("LOCAL_WORLD_SIZE", "1") or 1)
    if local_ranks > 1 and "OMP_NUM_THREADS" not in os.environ:
        torch.set_num_threads(max(1, (os.cpu_count() or 1) // local_ranks))


def train(
    config: str | os.PathLike[str] | Mapping[str, Any],
    overrides: Sequence[str] = (),
    run_dir: str | os.PathLike[str] | None = None,
) -> dict[str, Any]:
    """Build a run from a config, train it, evaluate it and write its report.

    Every rank builds and trains; rank 0 alone writes ``RUN_DIR/config.yaml`` (before training),
    ``metrics.json`` and ``embeddings.png`` and prints the metrics table. Checkpoints go to
    ``RUN_DIR/checkpoints`` (Composer's ``save_folder``); ``trainer.load_path`` resumes from one.

    Args:
        config (str | os.PathLike | Mapping): A YAML file or the config itself.
        overrides (Sequence[str]): Dotted ``key.path=value`` overrides. Default: none.
        run_dir (str | os.PathLike, optional): The output directory. Default: the config's ``run_dir``,
            else ``runs/<config file stem>``.

    Returns:
        dict[str, Any]: What ``metrics.json`` holds (the same on every rank).

    Raises:
        ConfigError: If the config is wrong.
    """
    from composer.utils import dist

    from composer_dynsample.config import build_run, default_run_dir, load_config, save_config
    from composer_dynsample.reporting import format_metrics_table, plot_embeddings, write_json

    started = time.perf_counter()
    _share_cpu_threads()
    config_path = None if isinstance(config, Mapping) else Path(config)
    cfg = load_config(config, overrides)
    if run_dir is None:
        run_dir = cfg.get("run_dir") or default_run_dir(config_path)
    run = build_run(cfg, run_dir)
    is_rank_zero = dist.get_global_rank() == 0
    if is_rank_zero:
        save_config(run.config, run.run_dir / "config.yaml")
    state = run.trainer.state
    start_batch, start_epoch = int(state.timestamp.batch), int(state.timestamp.epoch)

    fit_start = time.perf_counter()
    run.trainer.fit()
    fit_seconds = time.perf_counter() - fit_start

    final, test_embeddings = evaluate_run(run)
    run.trainer.logger.log_metrics({f"final/{name}": value for name, value in final.items()})
    saved = [str(path) for path in getattr(run.trainer, "saved_checkpoints", [])]
    metrics: dict[str, Any] = {
        **final,
        "wall_time_s": round(fit_seconds, 3),
        "total_time_s": round(time.perf_counter() - started, 3),
        "seed": run.seed,
        "epochs": int(state.timestamp.epoch),
        "batches": int(state.timestamp.batch),
        "resumed_from_epoch": start_epoch,
        "resumed_from_batch": start_batch,
        "max_duration": str(run.config.trainer.max_duration),
        "config": str(config_path) if config_path is not None else None,
        "overrides": list(overrides),
        "run_dir": str(run.run_dir),
        "dataset": run.splits.name,
        "num_queries": len(run.splits.test),
        "gallery_size": len(run.splits.train),
        "world_size": dist.get_world_size(),
        "device": type(state.device).__name__,
        "checkpoint": saved[-1] if saved else None,
        "load_path": run.config.trainer.get("load_path"),
        "eval_history": run.gallery.history if run.gallery is not None else [],
    }
    if is_rank_zero:
        write_json(run.run_dir / "metrics.json", metrics)
        recall = final.get("recall_at_1")
        title = f"{run.splits.name} test embeddings (PCA), epoch {metrics['epochs']}"
        if recall is not None:
            title += f"\nRecall@1 vs train gallery = {recall:.4f}"
        plot_embeddings(test_embeddings, run.splits.test.labels, run.run_dir / "embeddings.png", title=title)
        print(
            "\n"
            + format_metrics_table(
                final,
                title=f"final retrieval metrics: {len(run.splits.test)} {run.splits.name} test queries "
                f"vs {len(run.splits.train)} train items",
            )
        )
        print(f"trained {metrics['epochs']} epochs in {fit_seconds:.1f} s; wrote {run.run_dir}")
    run.trainer.close()
    if dist.is_initialized() and dist.get_world_size() > 1:
        dist.barrier()
    return metrics


def main(argv: Sequence[str] | None = None) -> None:
    """Entry point of ``composer-dynsample`` and ``python -m composer_dynsample``."""
    parser = argparse.ArgumentParser(
        prog="composer-dynsample",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    commands = parser.add_subparsers(dest="command", required=True)
    demo_parser = commands.add_parser("demo", help="a short training run on bundled data with the samplers")
    demo_parser.add_argument("--run-dir", type=Path, default=Path("runs/demo"))
    demo_parser.add_argument("--epochs", type=int, default=8)
    demo_parser.add_argument("--seed", type=int, default=0)
    train_parser = commands.add_parser(
        "train",
        help="train an embedding model from a YAML config",
        description="Train from CONFIG.yaml with dotted key.path=value overrides, e.g. "
        "composer-dynsample train yamls/mnist1d_default.yaml trainer.max_duration=10ep seed=1",
    )
    train_parser.add_argument("config", type=Path, help="the YAML config (see yamls/)")
    train_parser.add_argument("overrides", nargs="*", help="key.path=value overrides, applied in order")
    train_parser.add_argument(
        "--run-dir", type=Path, default=None, help="output directory (default: runs/<config name>)"
    )
    args, extra = parser.parse_known_args(argv)
    if args.command == "demo":
        if extra:
            parser.error(f"unrecognized arguments: {' '.join(extra)}")
        demo(args.run_dir, epochs=args.epochs, seed=args.seed)
    elif args.command == "train":
        not_overrides = [item for item in extra if "=" not in item or item.startswith("-")]
        if not_overrides:
            parser.error(f"unrecognized arguments: {' '.join(not_overrides)}")
        from composer_dynsample.config import ConfigError

        try:
            train(args.config, [*args.overrides, *extra], run_dir=args.run_dir)
        except (ConfigError, FileNotFoundError) as error:
            print(f"composer-dynsample train: error: {error}", file=sys.stderr)
            raise SystemExit(2) from None
