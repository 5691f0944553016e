"""Image folders: classes from sub-folders, Pillow modes and bit depths, sizes, hidden files."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from composer_dynsample.data import images as images_module
from composer_dynsample.data import load_file, load_image_folder, stratified_split


def write_images(root, counts, size=(6, 5)):
    from PIL import Image

    for class_name, count in counts.items():
        (root / class_name).mkdir(parents=True)
        for i in range(count):
            Image.new("RGB", (size[1], size[0]), color=(10 * i, 100, 200)).save(
                root / class_name / f"{i}.png"
            )


def test_image_folder(tmp_path):
    pytest.importorskip("PIL")
    write_images(tmp_path / "flat", {"cat": 5, "ant": 5})
    (tmp_path / "flat" / "cat" / "notes.txt").write_text("ignored")
    splits = load_file(tmp_path / "flat")
    assert (len(splits.train), len(splits.test), splits.num_classes, splits.name) == (8, 2, 2, "flat")
    assert splits.train.feature_shape == (1, 6, 5)
    assert splits.train.features.min() >= 0.0 and splits.train.features.max() <= 1.0
    rgb = load_image_folder(tmp_path / "flat", grayscale=False, size=(4, 4), test_fraction=0.4)
    assert rgb.train.feature_shape == (3, 4, 4) and len(rgb.test) == 4

    write_images(tmp_path / "presplit" / "train", {"a": 2, "b": 2})
    write_images(tmp_path / "presplit" / "test", {"a": 1, "b": 1})
    presplit = load_image_folder(tmp_path / "presplit")
    assert (len(presplit.train), len(presplit.test)) == (4, 2)
    assert presplit.test.labels.tolist() == [0, 1]

    write_images(tmp_path / "mixed", {"a": 2})
    write_images(tmp_path / "mixed_b", {"b": 1}, size=(7, 7))
    (tmp_path / "mixed_b" / "b").rename(tmp_path / "mixed" / "b")
    with pytest.raises(ValueError, match=r"differs from earlier images .* pass size=\(H, W\)"):
        load_image_folder(tmp_path / "mixed")
    (tmp_path / "empty").mkdir()
    with pytest.raises(ValueError, match="expected one sub-directory per class"):
        load_image_folder(tmp_path / "empty")
    with pytest.raises(FileNotFoundError, match="no such directory"):
        load_image_folder(tmp_path / "missing")


def test_image_folder_scales_16_bit_png_by_its_bit_depth(tmp_path):
    from PIL import Image

    values = {"a": [0, 1000, 30000], "b": [40000, 65535, 12345]}
    for class_name, levels in values.items():
        (tmp_path / class_name).mkdir()
        for i, level in enumerate(levels):
            Image.fromarray(np.full((4, 6), level, np.uint16)).save(tmp_path / class_name / f"{i}.png")
    assert Image.open(tmp_path / "a" / "1.png").mode.startswith("I")
    expected = sorted(v / 65535 for levels in values.values() for v in levels)
    for grayscale, size in ((True, None), (False, None), (True, (2, 3))):
        splits = load_image_folder(tmp_path, grayscale=grayscale, size=size, test_fraction=0.4)
        features = torch.cat([splits.train.features, splits.test.features])
        channels, height, width = (1 if grayscale else 3), *(size or (4, 6))
        assert features.shape == (6, channels, height, width)
        per_image = features.flatten(1)
        assert torch.allclose(per_image.min(1).values, per_image.max(1).values)  # uniform images
        assert per_image[:, 0].sort().values.tolist() == pytest.approx(expected, abs=1e-6)


def test_image_folder_wide_integer_images():
    from PIL import Image

    image = Image.fromarray(np.array([[0, 32768], [65535, 1]], np.int32))  # Pillow mode "I"
    assert image.mode == "I"
    file = Path("x.png")
    array = images_module._image_to_array(file, image, None, True)
    np.testing.assert_allclose(array, [[0, 32768 / 65535], [1, 1 / 65535]], rtol=1e-6)
    assert images_module._image_to_array(file, image, None, False).shape == (2, 2, 3)
    too_wide = Image.fromarray(np.array([[0, 70000]], np.int32))
    with pytest.raises(ValueError, match=r"x\.png: integer image .* values in \[0, 70000\]"):
        images_module._image_to_array(file, too_wide, None, True)


@pytest.mark.parametrize("mode", ["L", "RGB", "RGBA", "P", "LA", "1"])
def test_image_folder_8_bit_modes_are_scaled_by_255(tmp_path, mode):
    from PIL import Image

    rng = np.random.default_rng(0)
    files = []
    for class_name in ("a", "b"):
        (tmp_path / class_name).mkdir()
        for i in range(3):
            image = Image.fromarray(rng.integers(0, 256, (5, 7, 3), dtype=np.uint8)).convert(mode)
            files.append(tmp_path / class_name / f"{i}.png")
            image.save(files[-1])
    for grayscale, size in ((True, None), (False, None), (True, (3, 4)), (False, (4, 3))):
        target = "L" if grayscale else "RGB"
        expected = []
        for file in files:
            with Image.open(file) as image:
                image = image.convert(target)
                image = image.resize((size[1], size[0])) if size else image
                array = np.asarray(image, dtype=np.float32) / 255.0
            expected.append(array[None] if grayscale else array.transpose(2, 0, 1))
        splits = load_image_folder(tmp_path, grayscale=grayscale, size=size, test_fraction=0.5, seed=1)
        order = np.concatenate(stratified_split(np.repeat([0, 1], 3), 0.5, seed=1))
        loaded = torch.cat([splits.train.features, splits.test.features])
        assert torch.equal(loaded, torch.from_numpy(np.stack(expected)[order]))


@pytest.mark.parametrize("size", [8, 0, (0, 4), (4,), (4, 4, 4), (4.0, 4), (True, 4), "44", (-1, 2)])
def test_image_folder_rejects_a_bad_size(tmp_path, size):
    write_images(tmp_path, {"a": 2, "b": 2})
    with pytest.raises(ValueError, match=r"size must be None or a pair of integers >= 1 \(H, W\), got"):
        load_image_folder(tmp_path, size=size)


def test_image_folder_size_as_a_list_or_numpy_integers(tmp_path):
    write_images(tmp_path, {"a": 3, "b": 3})
    assert load_image_folder(tmp_path, size=[3, 4]).train.feature_shape == (1, 3, 4)
    assert load_image_folder(tmp_path, size=(np.int64(2), 5)).train.feature_shape == (1, 2, 5)
    with pytest.raises(ValueError, match=r"got 8; for a square image pass \(8, 8\)"):
        load_image_folder(tmp_path, size=8)


def test_image_folder_skips_hidden_and_empty_folders(tmp_path):
    write_images(tmp_path / "flat", {".ipynb_checkpoints": 2, "a": 5, "b": 5})
    (tmp_path / "flat" / "empty").mkdir()
    (tmp_path / "flat" / "notes").mkdir()
    (tmp_path / "flat" / "notes" / "readme.txt").write_text("not an image")
    splits = load_image_folder(tmp_path / "flat")
    assert splits.num_classes == 2
    assert sorted(set(splits.train.labels.tolist()) | set(splits.test.labels.tolist())) == [0, 1]
    assert len(splits.train) + len(splits.test) == 10
    (tmp_path / "flat" / "a" / "._0.png").write_bytes(b"macOS resource fork")  # hidden files too
    again = load_image_folder(tmp_path / "flat")
    assert torch.equal(again.train.features, splits.train.features)

    write_images(tmp_path / "presplit" / "train", {".hidden": 1, "a": 2, "b": 2})
    write_images(tmp_path / "presplit" / "test", {"a": 1, "b": 1})
    (tmp_path / "presplit" / "test" / "c").mkdir()  # empty in both splits: not a class
    presplit = load_image_folder(tmp_path / "presplit")
    assert presplit.num_classes == 2 and presplit.test.labels.tolist() == [0, 1]

    write_images(tmp_path / "hidden_only", {".ipynb_checkpoints": 2})
    with pytest.raises(ValueError, match="expected one sub-directory per class"):
        load_image_folder(tmp_path / "hidden_only")
    write_images(tmp_path / "half" / "train", {"a": 2})
    with pytest.raises(ValueError, match=r"it has train/ but a pre-split folder needs both"):
        load_image_folder(tmp_path / "half")


def png_header(path, width, height):
    """A PNG that declares ``width x height`` 1-bit pixels and holds none: a few bytes on disk."""
    import struct
    import zlib

    def chunk(kind, data):
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))

    header = struct.pack(">IIBBBBB", width, height, 1, 0, 0, 0, 0)
    path.write_bytes(b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + chunk(b"IEND", b""))


@pytest.mark.parametrize("side", [40_000, 10_000])
def test_a_decompression_bomb_is_refused_in_one_line(tmp_path, side):
    from PIL import Image

    # 40000^2 is beyond twice Pillow's limit (its DecompressionBombError escaped as a traceback);
    # 10000^2 is beyond the limit alone, where Pillow warns and then decodes 10^8 pixels.
    write_images(tmp_path, {"a": 2, "b": 2})
    bomb = tmp_path / "b" / "bomb.png"
    png_header(bomb, side, side)
    with pytest.raises(ValueError) as info:
        load_file(tmp_path)
    assert str(info.value) == (
        f"{bomb}: refused as a possible decompression bomb: {side * side} pixels, more than Pillow's "
        f"limit of {Image.MAX_IMAGE_PIXELS} (PIL.Image.MAX_IMAGE_PIXELS); resize the image, or raise "
        "that limit if you trust the file."
    )
