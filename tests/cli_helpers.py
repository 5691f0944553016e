"""What the command-line tests share: a text-pairs data section, the train and embed calls, and the check
of a refusal (exit status 2, one line)."""

from __future__ import annotations

from pathlib import Path

import pytest

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


def one_line_error(capsys: pytest.CaptureFixture[str], argv: list[str]) -> str:
    """Run the command line on ``argv``: it must exit with status 2 and one line on stderr, returned."""
    capsys.readouterr()  # what came before
    with pytest.raises(SystemExit) as stop:
        main(argv)
    error = capsys.readouterr().err.strip()
    assert stop.value.code == 2, error
    assert len(error.splitlines()) == 1, error
    return error
