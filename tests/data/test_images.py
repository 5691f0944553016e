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
    assert splits.train.feature_shape == (3, 6, 5)  # coloured images keep their colour
    assert splits.class_names == ("ant", "cat")
    assert splits.train.features.min() >= 0.0 and splits.train.features.max() <= 1.0
    assert load_file(tmp_path / "flat", grayscale=True).train.feature_shape == (1, 6, 5)
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


# --- colour, gray and class names ---

RED, GREEN = (255, 0, 0), (0, 255, 0)


def write_solid(folder, colours, mode="RGB", size=(4, 3)):
    """One ``size`` (H, W) image per colour in ``folder``, in the Pillow ``mode`` given."""
    from PIL import Image

    folder.mkdir(parents=True, exist_ok=True)
    for i, colour in enumerate(colours):
        Image.new("RGB", (size[1], size[0]), colour).convert(mode).save(folder / f"{i}.png")


def test_colour_classes_keep_their_colour_and_their_names(tmp_path):
    # Read as grayscale, pure red and pure green were two shades of gray (0.30 and 0.59), and the
    # run knew the classes only as numbers.
    write_solid(tmp_path / "red", [RED] * 5)
    write_solid(tmp_path / "green", [GREEN] * 5)
    splits = load_file(tmp_path)
    assert splits.train.feature_shape == (3, 4, 3) and splits.class_names == ("green", "red")
    features = torch.cat([splits.train.features, splits.test.features])
    labels = torch.cat([splits.train.labels, splits.test.labels])
    mean_colour = {
        splits.class_names[label]: features[labels == label].mean((0, 2, 3)).tolist() for label in (0, 1)
    }
    assert mean_colour == {"green": [0.0, 1.0, 0.0], "red": [1.0, 0.0, 0.0]}


@pytest.mark.parametrize("mode", ["L", "1", "LA", "P", "RGB", "RGBA", "I;16"])
@pytest.mark.parametrize("size", [None, (3, 2)])
def test_gray_images_stay_one_channel_as_before(tmp_path, mode, size):
    from PIL import Image

    rng = np.random.default_rng(0)
    for class_name in ("a", "b"):
        (tmp_path / class_name).mkdir()
        for i in range(3):
            gray = rng.integers(0, 256, (5, 4), dtype=np.uint8)
            if mode == "I;16":
                image = Image.fromarray(gray.astype(np.uint16) * 257)
            elif mode in ("1", "P"):  # a 1-bit image, or a palette of grays
                image = Image.fromarray(gray).convert(mode)
            else:  # gray content in every other mode, RGB and RGBA included: equal channels
                image = Image.fromarray(np.repeat(gray[:, :, None], 3, axis=2)).convert(mode)
            image.save(tmp_path / class_name / f"{i}.png")
    default = load_image_folder(tmp_path, size=size)
    forced = load_image_folder(tmp_path, size=size, grayscale=True)
    assert default.train.feature_shape[0] == 1
    assert torch.equal(default.train.features, forced.train.features)
    assert torch.equal(default.test.features, forced.test.features)


def test_one_coloured_image_makes_every_image_three_channels(tmp_path):
    write_solid(tmp_path / "gray", [(90, 90, 90)] * 3, mode="L")
    write_solid(tmp_path / "mixed", [(90, 90, 90), (90, 90, 90), (90, 90, 91)])
    splits = load_image_folder(tmp_path, test_fraction=0.34)
    features = torch.cat([splits.train.features, splits.test.features])
    assert features.shape == (6, 3, 4, 3)
    assert (features * 255).round().flatten(2)[:, :, 0].tolist().count([90.0, 90.0, 90.0]) == 5


def test_presplit_folders_agree_on_the_channels(tmp_path):
    write_solid(tmp_path / "train" / "a", [(10, 10, 10)] * 2, mode="L")
    write_solid(tmp_path / "train" / "b", [(20, 20, 20)] * 2, mode="L")
    write_solid(tmp_path / "test" / "a", [RED])
    write_solid(tmp_path / "test" / "b", [(20, 20, 20)], mode="L")
    splits = load_image_folder(tmp_path)
    assert splits.train.feature_shape == splits.test.feature_shape == (3, 4, 3)
    assert splits.train.features[0, :, 0, 0].tolist() == pytest.approx([10 / 255] * 3)
    gray = load_image_folder(tmp_path, grayscale=True)
    assert gray.train.feature_shape == gray.test.feature_shape == (1, 4, 3)


def test_grayscale_and_size_are_refused_for_array_files(tmp_path):
    np.savez(tmp_path / "data.npz", features=np.zeros((4, 2)), labels=np.arange(4) % 2)
    with pytest.raises(ValueError) as info:
        load_file(tmp_path / "data.npz", grayscale=True, size=[8, 8])
    assert str(info.value) == (
        f"{tmp_path / 'data.npz'}: grayscale=True and size=[8, 8] apply to a directory of images only, "
        "not to a .npz file; leave them out."
    )
    write_solid(tmp_path / "images" / "a", [RED] * 2)
    with pytest.raises(ValueError, match=r"grayscale must be true or false, got 'yes'"):
        load_image_folder(tmp_path / "images", grayscale="yes")


def test_class_names_hold_one_string_per_class():
    from composer_dynsample.data import DatasetSplits, TensorStore

    store = TensorStore(torch.zeros(2, 1), [0, 1])
    assert DatasetSplits(store, store, 2, "toy", class_names=["a", "b"]).class_names == ("a", "b")
    assert DatasetSplits(store, store, 2, "toy").class_names is None
    with pytest.raises(ValueError, match=r"class_names must hold one string per class \(2\), got \['a'\]"):
        DatasetSplits(store, store, 2, "toy", class_names=["a"])


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
    assert load_image_folder(tmp_path, size=[3, 4]).train.feature_shape == (3, 3, 4)
    assert load_image_folder(tmp_path, size=(np.int64(2), 5)).train.feature_shape == (3, 2, 5)
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
