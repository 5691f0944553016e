"""The glyphs data set: class counts after merging, disjoint classes, determinism and the cache checks."""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pytest
import torch

from composer_dynsample.data.glyphs import (
    FACES,
    GlyphCacheError,
    GlyphSplits,
    load_glyphs,
    merge_homoglyphs,
    render_glyphs,
)

_CACHE_NAME = "glyphs_v1.npz"


@pytest.fixture(scope="module")
def cache_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A cache directory holding one freshly rendered cache file (rendered once for the module)."""
    directory = tmp_path_factory.mktemp("glyphs")
    splits = load_glyphs(cache_dir=directory)
    seconds = splits.info.generation_seconds
    assert seconds is not None
    print(
        f"\nglyphs: rendered in {seconds:.2f} s; {splits.num_classes} classes "
        f"({splits.info.num_train_classes} train, {splits.num_classes - splits.info.num_train_classes} test), "
        f"{splits.info.num_merged} homoglyphs merged"
    )
    return directory


@pytest.fixture(scope="module")
def splits(cache_dir: Path) -> GlyphSplits:
    return load_glyphs(cache_dir=cache_dir)


@pytest.fixture
def cache_copy(cache_dir: Path, tmp_path: Path) -> Path:
    """A private copy of the cache file, free to damage."""
    shutil.copy(cache_dir / _CACHE_NAME, tmp_path / _CACHE_NAME)
    return tmp_path


def _rewrite(directory: Path, **changes: np.ndarray) -> None:
    path = directory / _CACHE_NAME
    with np.load(path) as loaded:
        arrays = {key: loaded[key] for key in loaded.files}
    arrays.update(changes)
    np.savez(path, **arrays)


def test_shapes_dtypes_and_range(splits: GlyphSplits):
    for store in (splits.train, splits.test):
        assert store.features.dtype == torch.float32 and store.labels.dtype == torch.int64
        assert store.feature_shape == (1, 32, 32)
        assert store.features.min() >= 0 and store.features.max() <= 1
        assert bool((store.features.flatten(1).amax(1) > 0).all())  # no empty rendering
    assert splits.name == "glyphs" and splits.num_classes == len(splits.info.code_points)
    assert splits.test_protocol == "leave_one_out"
    counts = torch.bincount(torch.cat([splits.train.labels, splits.test.labels]))
    assert len(counts) == splits.num_classes and bool((counts == len(FACES)).all())  # >= 8 per class


def test_class_counts_after_merging(cache_dir: Path, splits: GlyphSplits):
    with np.load(cache_dir / _CACHE_NAME) as loaded:
        rendered = len(loaded["code_points"])
    assert rendered >= 700  # 727 with matplotlib 3.11's fonts, none of them empty
    assert splits.num_classes + splits.info.num_merged == rendered
    assert 600 <= splits.num_classes <= rendered


def test_train_and_test_classes_are_disjoint_halves(splits: GlyphSplits):
    info, num_train = splits.info, splits.info.num_train_classes
    assert torch.equal(splits.train.labels.unique(), torch.arange(num_train))
    assert torch.equal(splits.test.labels.unique(), torch.arange(num_train, splits.num_classes))
    assert abs(num_train - splits.num_classes / 2) <= 1
    train_points, test_points = set(info.code_points[:num_train]), set(info.code_points[num_train:])
    assert not train_points & test_points and len(train_points | test_points) == splits.num_classes
    assert list(info.code_points[:num_train]) == sorted(train_points)  # labels in code point order


def test_the_split_follows_the_seed(cache_dir: Path, splits: GlyphSplits):
    again, other = load_glyphs(0, cache_dir), load_glyphs(1, cache_dir)
    assert again.info.code_points == splits.info.code_points
    assert torch.equal(again.train.features, splits.train.features)
    assert other.info.code_points != splits.info.code_points
    assert sorted(other.info.code_points) == sorted(splits.info.code_points)


def test_rendering_is_deterministic(cache_dir: Path):
    first, second = render_glyphs(), render_glyphs()
    with np.load(cache_dir / _CACHE_NAME) as cached:
        for key in ("images", "code_points", "images_sha256", "font_sha256"):
            assert np.array_equal(first[key], second[key]) and np.array_equal(first[key], cached[key])


def test_cache_round_trip(cache_dir: Path, splits: GlyphSplits):
    loaded = load_glyphs(cache_dir=cache_dir)
    assert loaded.info.generation_seconds is None  # read, not rendered
    assert torch.equal(loaded.train.features, splits.train.features)
    assert torch.equal(loaded.test.labels, splits.test.labels)
    assert loaded.info.images_sha256 == splits.info.images_sha256
    assert len(loaded.info.font_sha256) == len(FACES)


def test_a_cache_from_other_fonts_is_an_error_that_says_so(cache_copy: Path):
    with np.load(cache_copy / _CACHE_NAME) as loaded:
        hashes = loaded["font_sha256"].copy()
    hashes[12] = "0" * 64
    _rewrite(cache_copy, font_sha256=hashes)
    with pytest.raises(GlyphCacheError, match=r"different font build.*STIXGeneral\.ttf.*regenerate=True"):
        load_glyphs(cache_dir=cache_copy)
    regenerated = load_glyphs(cache_dir=cache_copy, regenerate=True)
    assert regenerated.info.generation_seconds is not None
    assert load_glyphs(cache_dir=cache_copy).info.font_sha256[12] != "0" * 64


def test_a_cache_from_another_freetype_is_an_error(cache_copy: Path):
    _rewrite(cache_copy, freetype_version=np.asarray("0.0.1"))
    with pytest.raises(GlyphCacheError, match=r"rendered by FreeType 0\.0\.1.*regenerate=True"):
        load_glyphs(cache_dir=cache_copy)


def test_a_corrupted_cache_is_an_error(cache_copy: Path):
    with np.load(cache_copy / _CACHE_NAME) as loaded:
        images = loaded["images"].copy()
    images[3, 5, 16, 16] ^= 1
    _rewrite(cache_copy, images=images)
    with pytest.raises(GlyphCacheError, match=r"corrupted.*Delete .*glyphs_v1\.npz or pass regenerate=True"):
        load_glyphs(cache_dir=cache_copy)


def test_a_cache_of_another_recipe_version_is_an_error(cache_copy: Path):
    _rewrite(cache_copy, version=np.asarray(0))
    with pytest.raises(GlyphCacheError, match=r"not a version-1 glyphs cache \(version 0\)"):
        load_glyphs(cache_dir=cache_copy)


def test_an_unreadable_cache_is_an_error(cache_copy: Path):
    path = cache_copy / _CACHE_NAME
    path.write_bytes(path.read_bytes()[:1000])
    with pytest.raises(GlyphCacheError, match="not a readable glyphs cache"):
        load_glyphs(cache_dir=cache_copy)


def test_homoglyphs_are_merged_into_the_lowest_code_point(cache_dir: Path, splits: GlyphSplits):
    present, merged = set(splits.info.code_points), dict(splits.info.merged)
    assert splits.info.num_merged == len(merged) > 0
    # Latin A / Greek Alpha are identical in 15 faces, Latin a / Cyrillic a in the 12 DejaVu faces.
    assert 0x41 in present and 0x391 not in present and merged[0x391] == 0x41
    assert 0x61 in present and 0x430 not in present and merged[0x430] == 0x61
    assert all(kept in present and kept < dropped for dropped, kept in merged.items())
    assert not present & set(merged)
    # What stays has no homoglyph left: merging again removes nothing.
    with np.load(cache_dir / _CACHE_NAME) as loaded:
        rows = np.searchsorted(loaded["code_points"], sorted(present))
        assert merge_homoglyphs(loaded["images"][rows], 12)[1] == []


def test_strict_merging_needs_all_sixteen_faces(cache_dir: Path, splits: GlyphSplits):
    strict = load_glyphs(cache_dir=cache_dir, homoglyph_faces=16)
    assert 0 < strict.info.num_merged < splits.info.num_merged
    assert strict.num_classes + strict.info.num_merged == splits.num_classes + splits.info.num_merged
    with np.load(cache_dir / _CACHE_NAME) as loaded:
        images, points = loaded["images"], loaded["code_points"]
    for dropped, kept in strict.info.merged:  # bit-equal in every face
        a, b = np.searchsorted(points, [dropped, kept])
        assert np.array_equal(images[a], images[b])
    assert 0x391 in strict.info.code_points  # Alpha differs from A in STIX General regular


def test_merge_homoglyphs_groups_transitively():
    images = np.zeros((4, 3, 2, 2), dtype=np.uint8)  # 4 classes, 3 faces
    images[1, 2] = 1  # 1 equals 0 in faces 0 and 1
    images[2, 0] = 1
    images[2, 2] = 1  # 2 equals 1 in faces 1 and 2, but 0 in face 1 only
    images[3] = 7  # 3 differs everywhere
    keep, merged = merge_homoglyphs(images, 2)
    assert keep.tolist() == [0, 3] and merged == [(1, 0), (2, 0)]  # 2 joins 0 through 1
    keep, merged = merge_homoglyphs(images, 3)
    assert keep.tolist() == [0, 1, 2, 3] and merged == []


def test_fewer_train_faces_per_class(cache_dir: Path, splits: GlyphSplits):
    harder = load_glyphs(cache_dir=cache_dir, faces_per_class=4)
    num_train = harder.info.num_train_classes
    assert len(harder.train) == 4 * num_train and len(harder.test) == len(splits.test)
    assert bool((torch.bincount(harder.train.labels) == 4).all())
    faces = harder.info.train_faces.reshape(num_train, 4)
    assert (np.diff(faces, axis=1) > 0).all() and len({tuple(row) for row in faces}) > 1  # varies by class
    assert np.array_equal(
        faces, load_glyphs(cache_dir=cache_dir, faces_per_class=4).info.train_faces.reshape(-1, 4)
    )
    # Each chosen face is the full data set's image of that class and face.
    label, face = 5, int(faces[5, 2])
    full_row = int(torch.nonzero(splits.train.labels == label)[face])
    assert torch.equal(harder.train.features[5 * 4 + 2], splits.train.features[full_row])


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"seed": -1}, "seed must be an integer >= 0"),
        ({"test_fraction": 1.0}, r"test_fraction must be a number in \(0, 1\)"),
        ({"faces_per_class": 17}, r"faces_per_class must be an integer in \[1, 16\]"),
        ({"homoglyph_faces": 0}, r"homoglyph_faces must be an integer in \[1, 16\]"),
        ({"regenerate": "yes"}, "regenerate must be true or false"),
    ],
)
def test_bad_arguments_are_named(cache_dir: Path, kwargs, match):
    with pytest.raises(ValueError, match=match):
        load_glyphs(cache_dir=cache_dir, **kwargs)
