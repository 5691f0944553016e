"""What the command-line tests share: the configs and data they write (text pairs, a folder of colour
images), the train and embed calls, and the check of a refusal (exit status 2, one line)."""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

import numpy as np
import pytest
import yaml

from composer_dynsample.cli.main import main
from tests.data.text.helpers import pair_rows, write_jsonl

BAG = {"name": "bag_of_tokens", "token_dim": 16}
MINED = {"name": "mined_negatives", "pairs_per_batch": 8, "negatives_per_anchor": 1}
COLOURS = {"blue": (0, 0, 255), "green": (0, 200, 0), "red": (230, 0, 0), "yellow": (240, 220, 0)}


def pairs_data_without_tokenizer(folder: Path, **data: object) -> dict:
    """The ``data`` section for ``folder``'s ``train.jsonl`` and ``test.jsonl`` pairs, cached in ``folder``,
    with no tokenizer and no max_length unless ``data`` (replacing or adding entries) gives them."""
    return {
        "name": "pairs",
        "path": str(folder / "train.jsonl"),
        "test_path": str(folder / "test.jsonl"),
        "cache_dir": str(folder / "cache"),
        **data,
    }


def pairs_data(folder: Path, **data: object) -> dict:
    """The ``data`` section for ``folder``'s ``train.jsonl`` and ``test.jsonl`` pairs (tiny tokenizer, cached
    in ``folder``), with ``data`` replacing or adding entries."""
    return pairs_data_without_tokenizer(folder, **{"max_length": 24, "vocab_size": 200, **data})


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


def export_huggingface(config: str, checkpoint: str, out: Path) -> None:
    """``composer-dynsample export CONFIG --checkpoint CHECKPOINT --out OUT --format huggingface``."""
    main(["export", config, "--checkpoint", checkpoint, "--out", str(out), "--format", "huggingface"])


def one_line_error(capsys: pytest.CaptureFixture[str], argv: list[str]) -> str:
    """Run the command line on ``argv``: it must exit with status 2 and one line on stderr, returned."""
    capsys.readouterr()  # what came before
    with pytest.raises(SystemExit) as stop:
        main(argv)
    error = capsys.readouterr().err.strip()
    assert stop.value.code == 2, error
    assert len(error.splitlines()) == 1, error
    return error


def write_run_config(
    path: Path, *, data: dict, model: dict, sampler: dict, ks: list[int], max_duration: str, **sections: dict
) -> str:
    """Write a config of seed 0 to ``path``, its path returned: the ``data``, ``model`` and ``sampler``
    sections and any other ``sections``, AdamW at lr 0.01 unless ``sections`` give an ``optimizer``, no
    evaluation during training (``evaluation.ks`` ``ks``), ``max_duration`` without a progress bar, no
    loggers."""
    config = {
        "seed": 0,
        "data": data,
        "model": model,
        "sampler": sampler,
        "optimizer": {"name": "adamw", "lr": 0.01},
        "evaluation": {"interval": None, "ks": ks},
        "trainer": {"max_duration": max_duration, "progress_bar": False},
        "loggers": {},
        **sections,
    }
    path.write_text(yaml.safe_dump(config))
    return str(path)


def write_pairs(folder: Path, train: int = 32, test: int = 8) -> None:
    """``train`` training pairs and ``test`` test pairs as ``folder``'s ``train.jsonl`` and ``test.jsonl``."""
    write_jsonl(folder / "train.jsonl", pair_rows(train, seed=0))
    write_jsonl(folder / "test.jsonl", pair_rows(test, seed=1))


def write_tiny_pairs_config(folder: Path, data: dict, model: dict, lr: float) -> str:
    """``folder/pairs.yaml``: 32 training and 8 test pairs written into ``folder``, the ``data`` and
    ``model`` sections given, 8 pairs a batch, AdamW at ``lr``, 2 batches, no evaluation; its path."""
    write_pairs(folder)
    sampler = {"name": "pk", "classes_per_batch": 8, "samples_per_class": 2}
    optimizer = {"name": "adamw", "lr": lr}
    return write_run_config(
        folder / "pairs.yaml",
        data=data,
        model=model,
        sampler=sampler,
        ks=[1, 5],
        max_duration="2ba",
        optimizer=optimizer,
    )


def write_model_folder_config(folder: Path, encoder: dict, model: dict | None = None, **data: object) -> str:
    """A pairs config of ``folder``'s tiny train and test files (:func:`write_tiny_pairs_config`) with
    ``encoder``, InfoNCE at temperature 0.1 and the other ``model`` entries, AdamW at lr 0.001;
    ``data`` sets no tokenizer and no max_length unless given (a model folder's apply)."""
    sections = {"encoder": encoder, "loss": {"name": "info_nce", "temperature": 0.1}, **(model or {})}
    return write_tiny_pairs_config(folder, pairs_data_without_tokenizer(folder, **data), sections, lr=0.001)


def write_bag_pairs_config(
    folder: Path, sampler: dict, *, algorithms: dict | None = None, **data: object
) -> str:
    """``folder/pairs.yaml``: a bag-of-tokens InfoNCE config of ``folder``'s pairs (:func:`pairs_data` with
    ``data``), the ``sampler`` and ``algorithms`` given, one epoch without evaluation."""
    model = {"normalize": True, "encoder": BAG, "loss": {"name": "info_nce", "temperature": 0.1}}
    return write_run_config(
        folder / "pairs.yaml",
        data=pairs_data(folder, **data),
        model=model,
        sampler=sampler,
        ks=[1, 5],
        max_duration="1ep",
        algorithms=algorithms or {},
    )


def write_colour_folder(root: Path, classes: Iterable[str], per_class: int = 6, seed: int = 0) -> None:
    """``root/<class>/<i>.png``: 12 x 12 images of the class's colour (:data:`COLOURS`) with a little noise."""
    from PIL import Image

    rng = np.random.default_rng(seed)
    for name in classes:
        (root / name).mkdir(parents=True)
        for i in range(per_class):
            noise = rng.integers(-15, 16, (12, 12, 3))
            pixels = np.clip(np.array(COLOURS[name]) + noise, 0, 255).astype(np.uint8)
            Image.fromarray(pixels).save(root / name / f"{i}.png")


def write_image_config(folder: Path, data: dict) -> str:
    """``folder/images.yaml``: a small conv2d model on an image folder (``data``: the ``file`` data
    section's entries), 2 classes x 2 images a batch, 2 batches without evaluation."""
    encoder = {"name": "conv2d", "channels": [8, 8], "num_layers": 2, "strides": [2, 2], "embedding_dim": 8}
    return write_run_config(
        folder / "images.yaml",
        data={"name": "file", **data},
        model={"normalize": True, "encoder": encoder},
        sampler={"name": "pk", "classes_per_batch": 2, "samples_per_class": 2},
        ks=[1],
        max_duration="2ba",
    )


def trained_pairs_run(folder: Path, sampler: dict) -> tuple[Path, str, Path]:
    """A bag-of-tokens pairs run of 2 batches in ``folder`` with ``sampler`` and an embedding table:
    ``(folder, config, run directory)``."""
    from composer_dynsample.cli.main import main

    write_pairs(folder)
    config = write_bag_pairs_config(folder, sampler, algorithms={"embedding_table": {}})
    run_dir = folder / "run"
    main(["train", config, "trainer.max_duration=2ba", "--quiet", "--run-dir", str(run_dir)])
    return folder, config, run_dir
