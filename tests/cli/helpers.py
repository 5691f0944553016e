"""What the command-line tests share: a text-pairs data section, the train and embed calls, and the check
of a refusal (exit status 2, one line)."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from composer_dynsample.cli.main import main
from tests.data.text.helpers import pair_rows, write_jsonl


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


def write_tiny_pairs_config(folder: Path, data: dict, model: dict, lr: float) -> str:
    """``folder/pairs.yaml``: 32 training and 8 test pairs written into ``folder``, the ``data`` and
    ``model`` sections given, 8 pairs a batch, AdamW at ``lr``, 2 batches, no evaluation; its path."""
    write_jsonl(folder / "train.jsonl", pair_rows(32, seed=0))
    write_jsonl(folder / "test.jsonl", pair_rows(8, seed=1))
    config = {
        "seed": 0,
        "data": data,
        "model": model,
        "sampler": {"name": "pk", "classes_per_batch": 8, "samples_per_class": 2},
        "optimizer": {"name": "adamw", "lr": lr},
        "evaluation": {"interval": None, "ks": [1, 5]},
        "trainer": {"max_duration": "2ba", "progress_bar": False},
        "loggers": {},
    }
    path = folder / "pairs.yaml"
    path.write_text(yaml.safe_dump(config))
    return str(path)
