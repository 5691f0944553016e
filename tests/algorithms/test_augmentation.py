"""Batched augmentation: determinism per (seed, epoch, batch), batching, dtypes, training only, resume."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch
from composer.core import Callback, Event, State
from composer.loggers import Logger
from composer.models import ComposerModel
from torch.utils.data import DataLoader

from composer_dynsample.algorithms.augmentation import (
    BatchAugmentation,
    augmentation_generator,
    random_affine,
)
from composer_dynsample.data import GatherCollate, IndexDataset, TensorStore
from tests.common import sgd_trainer

RANGES = {"rotation": 20.0, "scale": 0.2, "translate": 0.1, "shear": 10.0, "noise": 0.05}


def _images(n: int = 6, size: int = 16) -> torch.Tensor:
    images = torch.zeros(n, 1, size, size)
    images[:, :, size // 4 : 3 * size // 4, size // 2 - 1 : size // 2 + 1] = 1.0  # a centred bar
    return images + 0.1 * torch.rand(images.shape, generator=torch.Generator().manual_seed(0))


def test_draws_depend_on_seed_epoch_batch_and_rank_only():
    images = _images()
    key = (3, 2, 5, 0)
    first = random_affine(images, augmentation_generator(*key), **RANGES)
    assert torch.equal(first, random_affine(images, augmentation_generator(*key), **RANGES))
    for other in ((4, 2, 5, 0), (3, 3, 5, 0), (3, 2, 6, 0), (3, 2, 5, 1)):
        assert not torch.allclose(first, random_affine(images, augmentation_generator(*other), **RANGES))


def test_every_image_of_a_batch_gets_its_own_transform():
    images = _images(1).expand(8, -1, -1, -1).contiguous()
    out = random_affine(images, 0, rotation=30, translate=0.1)
    assert not any(torch.allclose(out[0], out[i]) for i in range(1, 8))


def test_all_ranges_zero_is_the_identity():
    images = _images()
    assert random_affine(images, 1) is images
    # The resampling itself is exact at identity: pixel centres map to pixel centres.
    nearly = random_affine(images, 1, rotation=1e-9)
    assert torch.allclose(nearly, images, atol=1e-5)


def test_rotation_keeps_the_ink_and_translation_moves_it_within_range():
    images = torch.zeros(16, 1, 32, 32)
    images[:, :, 12:20, 12:20] = 1.0
    rotated = random_affine(images, 0, rotation=45)
    assert torch.allclose(rotated.sum((1, 2, 3)), images.sum((1, 2, 3)), rtol=0.02)
    shifted = random_affine(images, 0, translate=0.25)
    grid = torch.arange(32, dtype=torch.float32)
    centre_x = (shifted.sum((1, 2)) * grid).sum(-1) / shifted.sum((1, 2, 3))
    centre_y = (shifted.sum((1, 3)) * grid).sum(-1) / shifted.sum((1, 2, 3))
    for centre in (centre_x, centre_y):
        offset = centre - 15.5
        assert bool((offset.abs() <= 0.25 * 32 + 1e-3).all()) and offset.std() > 1
    scaled = random_affine(images, 0, scale=0.5)
    ratio = scaled.sum((1, 2, 3)) / images.sum((1, 2, 3))  # area grows with the scale squared
    assert bool(((ratio > 0.25 - 0.05) & (ratio < 2.25 + 0.05)).all()) and ratio.std() > 0.1


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16, torch.float16])
def test_shape_dtype_and_device_are_kept(dtype):
    images = _images().to(dtype)
    out = random_affine(images, 0, **RANGES)
    assert out.shape == images.shape and out.dtype == dtype and out.device == images.device
    flat = random_affine(images[:, 0], 0, **RANGES)  # (N, H, W)
    assert flat.shape == images[:, 0].shape and torch.equal(flat, out[:, 0])


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_a_cuda_batch_is_augmented_on_cuda_with_the_same_transforms():
    images = _images()
    geometric = {key: value for key, value in RANGES.items() if key != "noise"}
    on_gpu = random_affine(images.cuda(), 0, **geometric)
    assert on_gpu.device.type == "cuda"
    assert torch.allclose(on_gpu.cpu(), random_affine(images, 0, **geometric), atol=1e-5)
    noisy = random_affine(images.cuda(), 0, **RANGES)
    assert torch.equal(noisy, random_affine(images.cuda(), 0, **RANGES))


@pytest.mark.parametrize(
    ("kwargs", "error", "match"),
    [
        ({"rotation": -1}, ValueError, r"rotation must be a number in \[0, 180\], got -1"),
        ({"scale": 1.0}, ValueError, r"scale must be a number in \[0, 1\), got 1.0"),
        ({"translate": 2}, ValueError, r"translate must be a number in \[0, 1\]"),
        ({"shear": float("nan")}, ValueError, "shear must be a finite number"),
        ({"noise": -0.1}, ValueError, "noise must be a number >= 0"),
        (
            {"images": torch.zeros(2, 3, dtype=torch.int64)},
            TypeError,
            "images must be a floating-point tensor",
        ),
        ({"images": torch.zeros(2, 3)}, ValueError, r"images must be \(N, C, H, W\) or \(N, H, W\)"),
        ({"generator": "seed"}, TypeError, "generator must be a CPU torch.Generator or an int seed"),
    ],
)
def test_bad_arguments_are_named(kwargs, error, match):
    arguments = {"images": _images(), "generator": 0, **kwargs}
    with pytest.raises(error, match=match):
        random_affine(**arguments)


def test_bad_algorithm_arguments_fail_at_construction():
    with pytest.raises(ValueError, match="rotation must be a number"):
        BatchAugmentation(rotation=-5)
    with pytest.raises(ValueError, match="seed must be an integer >= 0"):
        BatchAugmentation(seed=-1)
    with pytest.raises(ValueError, match="epoch must be an integer >= 0"):
        augmentation_generator(0, -1, 0)


# --- Through the Composer Trainer -------------------------------------------------------------------


class _TinyModel(ComposerModel):
    """A linear model on dict batches that records the features of every evaluation batch."""

    def __init__(self) -> None:
        super().__init__()
        self.linear = torch.nn.Linear(16, 2)
        self.eval_features: list[torch.Tensor] = []

    def forward(self, batch):
        return self.linear(batch["features"].flatten(1))

    def loss(self, outputs, batch):
        return outputs.pow(2).mean()

    def eval_forward(self, batch, outputs=None):
        self.eval_features.append(batch["features"].clone())
        return self(batch)

    def get_metrics(self, is_train=False):
        return {}

    def update_metric(self, batch, outputs, metric):
        pass


class _TrainBatches(Callback):
    """Records the features the forward pass receives, keyed by (epoch, batch in epoch)."""

    def __init__(self) -> None:
        self.features: dict[tuple[int, int], torch.Tensor] = {}

    def before_forward(self, state: State, logger: Logger) -> None:
        key = (int(state.timestamp.epoch), int(state.timestamp.batch_in_epoch))
        self.features[key] = state.batch["features"].clone()


_STORE = TensorStore(
    torch.rand(24, 1, 4, 4, generator=torch.Generator().manual_seed(0)), torch.arange(24) % 6
)


def _loader() -> DataLoader:
    return DataLoader(
        IndexDataset(_STORE.labels), batch_size=4, shuffle=False, collate_fn=GatherCollate(_STORE)
    )


def _fit(tmp_path: Path, algorithm: BatchAugmentation, **kwargs) -> tuple[_TinyModel, _TrainBatches]:
    torch.manual_seed(0)
    model, recorder = _TinyModel(), _TrainBatches()
    trainer = sgd_trainer(
        model,
        _loader(),
        lr=0.0,
        algorithms=[algorithm],
        callbacks=[recorder],
        max_duration="2ep",
        seed=7,
        **kwargs,
    )
    trainer.fit()
    trainer.close()
    return model, recorder


def test_the_trainer_augments_training_batches_only(tmp_path: Path):
    algorithm = BatchAugmentation(**RANGES)
    assert algorithm.match(Event.AFTER_DATALOADER, None) and not algorithm.match(
        Event.EVAL_BEFORE_FORWARD, None
    )
    model, recorder = _fit(tmp_path, algorithm, eval_dataloader=_loader(), eval_interval="1ep")
    assert sorted(recorder.features) == [(e, b) for e in range(2) for b in range(6)]
    for (epoch, batch), seen in recorder.features.items():
        raw = _STORE.features[4 * batch : 4 * batch + 4]
        expected = random_affine(raw, augmentation_generator(7, epoch, batch), **RANGES)  # the Trainer's seed
        assert torch.equal(seen, expected)
    assert len(model.eval_features) == 2 * 6
    assert all(
        torch.equal(seen, _STORE.features[4 * (i % 6) : 4 * (i % 6) + 4])
        for i, seen in enumerate(model.eval_features)
    )


def test_a_resumed_run_sees_the_same_augmented_batches(tmp_path: Path):
    _, full = _fit(tmp_path / "full", BatchAugmentation(seed=3, **RANGES))
    _fit(
        tmp_path / "first",
        BatchAugmentation(seed=3, **RANGES),
        save_folder=str(tmp_path / "ckpt"),
        save_interval="3ba",
    )
    checkpoint = tmp_path / "ckpt" / "ep0-ba3-rank0.pt"
    assert checkpoint.is_file()
    _, resumed = _fit(tmp_path / "resumed", BatchAugmentation(seed=3, **RANGES), load_path=str(checkpoint))
    assert sorted(resumed.features) == [(0, 3), (0, 4), (0, 5)] + [
        (1, b) for b in range(6)
    ]  # mid-epoch resume
    for key, seen in resumed.features.items():
        assert torch.equal(seen, full.features[key])
    assert not torch.allclose(full.features[0, 0], full.features[1, 0])  # each epoch its own draws


def test_a_missing_features_key_is_named(tmp_path: Path):
    with pytest.raises(ValueError, match=r"state.batch\['images'\] and found NoneType; set features_key"):
        _fit(tmp_path, BatchAugmentation(rotation=5, features_key="images"))


def test_generator_seeds_are_well_mixed():
    # Neighbouring (epoch, batch) pairs give unrelated streams: no two of 100 first draws coincide.
    firsts = {
        float(torch.rand(1, generator=augmentation_generator(0, e, b))) for e in range(10) for b in range(10)
    }
    assert len(firsts) == 100 and not math.isnan(sum(firsts))
