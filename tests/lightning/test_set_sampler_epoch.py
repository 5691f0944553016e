"""The Lightning ``SetSamplerEpoch`` on one process: resumes, refused resumes and the errors users see."""

from __future__ import annotations

import importlib
import re
import sys
from pathlib import Path

import pytest
import torch
from lightning.pytorch.callbacks import ModelCheckpoint

from composer_dynsample.lightning import SetSamplerEpoch
from tests.lightning.common import RecordingModel, make_trainer, planned_batches

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")  # Lightning's advice on tiny runs

PACKAGE = Path(__file__).resolve().parents[2] / "composer_dynsample"


def fit(max_epochs: int, model: RecordingModel, ckpt_path: str | None = None, **kwargs) -> RecordingModel:
    trainer = make_trainer(max_epochs, callbacks=[SetSamplerEpoch(), *kwargs.pop("callbacks", [])], **kwargs)
    trainer.fit(model, ckpt_path=ckpt_path)
    return model


def checkpointed(tmp_path: Path, **checkpoint) -> Path:
    """Train 2 epochs of 12 batches on one rank, saving checkpoints as ``checkpoint`` says; their folder."""
    folder = tmp_path / "checkpoints"
    saver = ModelCheckpoint(dirpath=folder, save_top_k=-1, **checkpoint)
    fit(2, RecordingModel(), callbacks=[saver], enable_checkpointing=True, default_root_dir=str(tmp_path))
    return folder


def test_each_epoch_trains_its_own_planned_batches():
    model = fit(3, RecordingModel())
    for epoch in range(3):
        assert model.batches(epoch) == planned_batches(epoch, rank=0, world_size=1)
    assert model.batches(0) != model.batches(1)


@pytest.mark.parametrize("num_workers", [0, 2])
def test_a_resume_at_an_epoch_boundary_trains_the_uninterrupted_batches(tmp_path, num_workers):
    # With worker processes Lightning's train iterator draws its first batches before any hook runs.
    folder = checkpointed(tmp_path, every_n_epochs=1)
    resumed = fit(3, RecordingModel(num_workers=num_workers), ckpt_path=str(folder / "epoch=0-step=12.ckpt"))
    assert sorted(resumed.seen) == [1, 2]
    for epoch in (1, 2):
        assert resumed.batches(epoch) == planned_batches(epoch, rank=0, world_size=1)


@pytest.mark.parametrize("num_workers", [0, 2])
def test_a_resume_mid_epoch_trains_the_rest_of_the_epoch_once(tmp_path, num_workers):
    folder = checkpointed(tmp_path, every_n_train_steps=17)  # epoch 1 after 5 of its 12 batches
    resumed = fit(2, RecordingModel(num_workers=num_workers), ckpt_path=str(folder / "epoch=1-step=17.ckpt"))
    assert [batch_idx for batch_idx, _ in resumed.seen[1]] == list(range(5, 12))
    assert resumed.batches(1) == planned_batches(1, rank=0, world_size=1)[5:]


def edited_checkpoint(folder: Path, **state) -> str:
    """The mid-epoch checkpoint with the callback's saved state changed as ``state`` says."""
    path = folder / "epoch=1-step=17.ckpt"
    checkpoint = torch.load(path, weights_only=False)
    checkpoint["callbacks"]["SetSamplerEpoch"].update(state)
    edited = folder / "edited.ckpt"
    torch.save(checkpoint, edited)
    return str(edited)


def test_a_mid_epoch_resume_on_another_number_of_ranks_is_refused(tmp_path):
    folder = checkpointed(tmp_path, every_n_train_steps=17)
    assert torch.load(folder / "epoch=1-step=17.ckpt", weights_only=False)["callbacks"][
        "SetSamplerEpoch"
    ] == {
        "world_size": 1,
        "epoch": 1,
        "batches_done": 5,
        "sampler": {"seed": 5, "batch_size": 4, "global_batches": 12},
    }
    with pytest.raises(
        ValueError, match=r"middle of epoch 1 \(after batch 5 of 12\) on 2 rank\(s\), and this run has 1"
    ):
        fit(2, RecordingModel(), ckpt_path=edited_checkpoint(folder, world_size=2))


def test_a_mid_epoch_resume_with_another_sampler_is_refused(tmp_path):
    folder = checkpointed(tmp_path, every_n_train_steps=17)
    with pytest.raises(ValueError, match=r"builds that epoch differently \(seed 5 -> 6\)"):
        fit(2, RecordingModel(seed=6), ckpt_path=str(folder / "epoch=1-step=17.ckpt"))


def test_a_sampler_built_for_another_world_is_refused_with_a_way_out():
    with pytest.raises(
        ValueError, match=re.escape("built with num_replicas=2, rank=1, but it is rank 0 of 1")
    ) as info:
        fit(1, RecordingModel(num_replicas=2, rank=1))
    assert "inside train_dataloader()" in str(info.value)


def test_only_the_lightning_module_imports_lightning(monkeypatch):
    importers = [
        path.relative_to(PACKAGE).as_posix()
        for path in PACKAGE.rglob("*.py")
        if re.search(r"^\s*(import|from)\s+lightning\b", path.read_text(), re.MULTILINE)
    ]
    assert importers == ["lightning.py"]
    monkeypatch.setitem(sys.modules, "lightning", None)
    monkeypatch.setitem(sys.modules, "lightning.pytorch", None)
    monkeypatch.delitem(sys.modules, "composer_dynsample.lightning")
    with pytest.raises(ImportError, match=re.escape("pip install 'composer-dynsample[lightning]'")):
        importlib.import_module("composer_dynsample.lightning")
