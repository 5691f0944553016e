"""What the command-line tests share: a text-pairs data section, and the train and embed calls."""

from __future__ import annotations

from pathlib import Path

from composer_dynsample.cli import main


def pairs_data(folder: Path, **data: object) -> dict:
    """The ``data`` section for ``folder``'s ``train.jsonl`` and ``test.jsonl`` pairs (tiny tokenizer, cached
    in ``folder``), with ``data`` replacing or adding entries."""
    return {
        "name": "pairs",
        "path": str(folder / "train.jsonl"),
        "test_path": str(folder / "test.jsonl"),
        "max_length": 24,
        "vocab_size": 200,
        "cache_dir": str(folder / "cache"),
        **data,
    }


def latest_checkpoint(run_dir: Path) -> str:
    """The path of rank 0's latest checkpoint of the run in ``run_dir``."""
    return str(run_dir / "checkpoints" / "latest-rank0.pt")


def train_unevaluated(config: str, max_duration: str, run_dir: Path) -> None:
    """``composer-dynsample train CONFIG`` for ``max_duration``, without evaluation, into ``run_dir``."""
    options = [f"trainer.max_duration={max_duration}", "evaluation.interval=null"]
    main(["train", config, *options, "--run-dir", str(run_dir)])


def embed_input(config: str, checkpoint: str, source: Path, out: Path) -> None:
    """``composer-dynsample embed CONFIG --checkpoint CHECKPOINT --input SOURCE --out OUT``."""
    main(["embed", config, "--checkpoint", checkpoint, "--input", str(source), "--out", str(out)])
