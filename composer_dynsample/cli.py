"""The ``composer-dynsample`` command line."""

from __future__ import annotations

import argparse
import json
import time
from collections.abc import Sequence
from pathlib import Path

__all__ = ["main"]


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


def main(argv: Sequence[str] | None = None) -> None:
    """Entry point of ``composer-dynsample`` and ``python -m composer_dynsample``."""
    parser = argparse.ArgumentParser(prog="composer-dynsample", description=__doc__)
    commands = parser.add_subparsers(dest="command", required=True)
    demo_parser = commands.add_parser("demo", help="a short training run on bundled data with the samplers")
    demo_parser.add_argument("--run-dir", type=Path, default=Path("runs/demo"))
    demo_parser.add_argument("--epochs", type=int, default=8)
    demo_parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    if args.command == "demo":
        demo(args.run_dir, epochs=args.epochs, seed=args.seed)
