"""The tokenizer a text run was trained with, kept as ``RUN_DIR/tokenizer.json`` beside its checkpoints.

``train`` writes it (:func:`write_run_tokenizer`); a run that continues or evaluates a checkpoint reads
it back (:func:`run_tokenizer`), so its model meets the token ids it was trained on.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

__all__ = ["TOKENIZER_FILE", "run_tokenizer", "write_run_tokenizer"]

#: The file of a run directory that holds the tokenizer its text model was trained with.
TOKENIZER_FILE = "tokenizer.json"


def run_tokenizer(cfg: Mapping[str, Any]) -> Path | None:
    """The ``tokenizer.json`` of the run a config continues or evaluates, if it has one.

    That is the run directory of ``trainer.load_path`` (a checkpoint's run directory, where ``train``
    wrote it) when one is set, else ``run_dir`` (a run resumed by ``trainer.autoresume``). A fresh run
    has none: ``--overwrite`` removes the file with the rest of a previous run.
    """
    trainer = cfg.get("trainer") or {}
    load_path = trainer.get("load_path") if isinstance(trainer, Mapping) else None
    if load_path is not None:
        if "://" in str(load_path):
            return None
        folder = Path(os.path.realpath(Path(str(load_path)).expanduser())).parent
        folder = folder.parent if folder.name == "checkpoints" else folder
    elif cfg.get("run_dir"):
        folder = Path(str(cfg.get("run_dir"))).expanduser()
    else:
        return None
    path = folder / TOKENIZER_FILE
    return path if path.is_file() else None


def write_run_tokenizer(splits: Any, run_dir: Path) -> Path | None:
    """Write the tokenizer of text ``splits`` to ``run_dir/tokenizer.json`` (atomically); ``None`` for other data."""
    info = getattr(splits, "info", None)
    source = getattr(info, "tokenizer_path", None)
    if source is None:
        return None
    target = run_dir / TOKENIZER_FILE
    if target.is_file() and os.path.samefile(source, target):
        return target
    run_dir.mkdir(parents=True, exist_ok=True)
    tmp = target.with_name(f".{TOKENIZER_FILE}.{os.getpid()}.tmp")
    tmp.write_bytes(Path(source).read_bytes())
    os.replace(tmp, target)
    return target
