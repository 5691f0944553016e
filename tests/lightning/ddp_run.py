"""Lightning runs on 2 CPU ranks for test_two_ranks.py: ``python -m tests.lightning.ddp_run OUT RUN [RUN ...]``.

Lightning's DDP launcher starts rank 1 itself by running the same command again, so both ranks do every
run in order, sharing one process group. Each run writes ``OUT/<run>/rank<r>.json``: the batches the
rank trained, ``{"epoch": [[batch_idx, indices], ...]}``, or ``{"error": "TypeError: ..."}`` when the
fit raised.

Runs:
    callback: 3 epochs with ``SetSamplerEpoch``.
    plain: 3 epochs without it (Lightning alone).
    checkpointed: 2 epochs with the callback, saving a checkpoint after every epoch and after step 8
        (epoch 1, batch 2 of 6).
    resume-boundary, resume-mid: resume ``checkpointed`` at the end of epoch 0 or at step 8, to 3 epochs.
    default: Lightning's default ``use_distributed_sampler=True``.
    early: the sampler built before ``trainer.fit`` starts the process group (the first run).
    mismatch: rank 1's sampler has another seed.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any

from lightning.pytorch.callbacks import ModelCheckpoint

from composer_dynsample.lightning import SetSamplerEpoch
from tests.lightning.common import RecordingModel, make_sampler, make_trainer


def _callbacks(run: str, out: Path) -> list[Any]:
    if run in ("plain", "default"):
        return []
    if run != "checkpointed":
        return [SetSamplerEpoch()]
    return [
        SetSamplerEpoch(),
        ModelCheckpoint(dirpath=out / "epochs", save_top_k=-1, every_n_epochs=1),
        ModelCheckpoint(dirpath=out / "steps", save_top_k=-1, every_n_train_steps=8),
    ]


def _checkpoint(out: Path, run: str) -> str | None:
    if not run.startswith("resume-"):
        return None
    folder, name = (
        ("epochs", "epoch=0-step=6.ckpt") if run == "resume-boundary" else ("steps", "epoch=1-step=8.ckpt")
    )
    return str(out / "checkpointed" / folder / name)


def fit(out: Path, run: str) -> None:
    """Do one run and write this rank's batches (or the error) to ``out/run/rank<r>.json``."""
    folder = out / run
    if run == "early":  # as a script would: rank 0 sees no WORLD_SIZE yet, rank 1 no RANK
        model = RecordingModel(sampler=make_sampler())
    elif run == "mismatch":
        model = RecordingModel(seed=int(os.environ.get("LOCAL_RANK", "0")))
    else:
        model = RecordingModel()
    trainer = make_trainer(
        2 if run == "checkpointed" else 3,
        devices=2,
        strategy="ddp",
        default_root_dir=str(folder),
        enable_checkpointing=run == "checkpointed",
        use_distributed_sampler=run == "default",  # True is Lightning's default
        callbacks=_callbacks(run, folder),
    )
    try:
        trainer.fit(model, ckpt_path=_checkpoint(out, run))
        result: dict[str, Any] = {str(epoch): batches for epoch, batches in model.seen.items()}
    except Exception as error:  # the test reads it
        result = {"error": f"{type(error).__name__}: {error}"}
    folder.mkdir(parents=True, exist_ok=True)
    (folder / f"rank{trainer.global_rank}.json").write_text(json.dumps(result))


if __name__ == "__main__":
    for name in sys.argv[2:]:
        fit(Path(sys.argv[1]), name)
