"""The dataset loaders: MNIST-1D, digits and user files (image folders: test_images.py)."""

from __future__ import annotations

import contextlib
import os
import random
import signal

import numpy as np
import pytest
import torch

from composer_dynsample.data import (
    DatasetSplits,
    default_cache_dir,
    load_digits,
    load_file,
    load_mnist1d,
    stratified_split,
)
from composer_dynsample.data import mnist1d as datasets_module


@pytest.fixture(scope="module")
def mnist1d_cache(tmp_path_factory):
    """Generate MNIST-1D once for the module (about 4-6 s) in a private cache directory."""
    pytest.importorskip("mnist1d")
    cache_dir = tmp_path_factory.mktemp("mnist1d_cache")
    np.random.seed(123)
    random.seed(123)
    numpy_before, python_before = np.random.get_state()[1].copy(), random.getstate()
    splits = load_mnist1d(cache_dir=cache_dir)
    assert np.array_equal(np.random.get_state()[1], numpy_before), "global numpy RNG state was changed"
    assert random.getstate() == python_before, "global random state was changed"
    return cache_dir, splits


def test_mnist1d_sizes(mnist1d_cache):
    cache_dir, splits = mnist1d_cache
    assert isinstance(splits, DatasetSplits) and splits.name == "mnist1d" and splits.num_classes == 10
    assert splits.train.features.shape == (4000, 40) and splits.test.features.shape == (1000, 40)
    assert splits.train.features.dtype == torch.float32 and splits.train.labels.dtype == torch.int64
    assert set(splits.train.labels.tolist()) == set(range(10)) == set(splits.test.labels.tolist())
    assert (cache_dir / "mnist1d_seed42.npz").is_file()


def test_mnist1d_second_call_reads_the_cache(mnist1d_cache, monkeypatch):
    cache_dir, splits = mnist1d_cache

    def fail(seed):
        raise AssertionError("regenerated although the cache exists")

    monkeypatch.setattr(datasets_module, "_generate_mnist1d", fail)
    again = load_mnist1d(cache_dir=cache_dir)
    assert torch.equal(again.train.features, splits.train.features)
    assert torch.equal(again.test.labels, splits.test.labels)


def test_mnist1d_bad_cache_is_regenerated(tmp_path, monkeypatch):
    (tmp_path / "mnist1d_seed7.npz").write_bytes(b"not an npz")
    fake = {
        "features": np.zeros((4000, 40), np.float32),
        "labels": np.arange(4000) % 10,
        "test_features": np.zeros((1000, 40), np.float32),
        "test_labels": np.arange(1000) % 10,
    }
    monkeypatch.setattr(datasets_module, "_generate_mnist1d", lambda seed: fake)
    splits = load_mnist1d(seed=7, cache_dir=tmp_path)
    assert len(splits.train) == 4000
    with np.load(tmp_path / "mnist1d_seed7.npz") as cached:
        assert cached["features"].shape == (4000, 40)
    with pytest.raises(ValueError, match=r"seed must be an integer >= 0, got -1"):
        load_mnist1d(seed=-1, cache_dir=tmp_path)


def test_default_cache_dir_honours_the_environment(monkeypatch, tmp_path):
    monkeypatch.setenv("COMPOSER_DYNSAMPLE_CACHE", str(tmp_path / "explicit"))
    assert default_cache_dir() == tmp_path / "explicit"
    monkeypatch.delenv("COMPOSER_DYNSAMPLE_CACHE")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert default_cache_dir() == tmp_path / "xdg" / "composer_dynsample"


def test_digits_sizes():
    pytest.importorskip("sklearn")
    splits = load_digits()
    assert (len(splits.train), len(splits.test)) == (1438, 359)
    assert splits.train.feature_shape == (64,) and splits.num_classes == 10 and splits.name == "digits"
    assert splits.train.features.min() == 0.0 and splits.train.features.max() == 1.0
    counts = torch.bincount(splits.test.labels)
    assert counts.min() >= 34 and counts.max() <= 37  # stratified: about 20 % of each class
    again = load_digits()
    assert torch.equal(again.test.features, splits.test.features)  # deterministic


def test_stratified_split():
    labels = np.repeat(np.arange(3), [10, 5, 1])
    train, test = stratified_split(labels, 0.2, seed=3)
    assert np.bincount(labels[test], minlength=3).tolist() == [2, 1, 0]
    assert sorted(np.concatenate([train, test]).tolist()) == list(range(16))
    assert np.all(np.diff(train) > 0) and np.all(np.diff(test) > 0)
    assert np.array_equal(stratified_split(labels, 0.2, seed=3)[1], test)
    assert np.array_equal(stratified_split(labels, np.float32(0.2), seed=3)[1], test)  # numpy reals too
    for bad in (0, 1, 1.5, True, "0.2"):
        with pytest.raises(ValueError, match="test_fraction must be a number in"):
            stratified_split(labels, bad)


# --- user files ---


def write_npz(path, **arrays):
    np.savez(path, **arrays)
    return path


def test_load_npz_with_and_without_a_test_split(tmp_path):
    features, labels = np.random.rand(20, 3).astype(np.float64), np.arange(20) % 4
    split_file = write_npz(
        tmp_path / "split.npz",
        features=features,
        labels=labels,
        test_features=features[:5],
        test_labels=labels[:5],
    )
    splits = load_file(split_file)
    assert (len(splits.train), len(splits.test), splits.num_classes, splits.name) == (20, 5, 4, "split")
    assert splits.train.features.dtype == torch.float32
    with pytest.raises(ValueError, match="test_fraction must be None"):
        load_file(split_file, test_fraction=0.3)

    whole = load_file(
        write_npz(tmp_path / "whole.npz", features=features, labels=labels), test_fraction=0.4, name="mine"
    )
    assert (len(whole.train), len(whole.test), whole.name) == (12, 8, "mine")
    default = load_file(tmp_path / "whole.npz")
    assert len(default.test) == 4
    images = load_file(
        write_npz(
            tmp_path / "images.npz", features=np.zeros((10, 1, 4, 4), np.uint8), labels=np.arange(10) % 2
        )
    )
    assert images.train.feature_shape == (1, 4, 4)


def test_load_pt(tmp_path):
    path = tmp_path / "data.pt"
    torch.save({"features": torch.randn(10, 2), "labels": torch.arange(10) % 2}, path)
    splits = load_file(path, test_fraction=0.2)
    assert (len(splits.train), len(splits.test), splits.num_classes) == (8, 2, 2)
    torch.save([torch.zeros(2)], tmp_path / "list.pt")
    with pytest.raises(ValueError, match=r"list\.pt: expected a dict with keys 'features' and 'labels'"):
        load_file(tmp_path / "list.pt")
    (tmp_path / "junk.pt").write_bytes(b"junk")
    with pytest.raises(ValueError, match=r"junk\.pt: could not load with torch\.load"):
        load_file(tmp_path / "junk.pt")


@pytest.mark.parametrize(
    ("arrays", "match"),
    [
        (
            {"features": np.zeros((4, 2))},
            r"missing key\(s\) \['labels'\]; expected 'features' \(N, \.\.\.\) and 'labels'",
        ),
        ({"x": np.zeros((4, 2)), "y": np.zeros(4, int)}, r"missing key\(s\) \['features', 'labels'\]"),
        (
            {"features": np.zeros(4), "labels": np.zeros(4, int)},
            r"'features' must be at least 2-D \(N, \.\.\.\), got shape \(4,\)",
        ),
        (
            {"features": np.zeros((4, 2)), "labels": np.zeros(4)},
            "'labels' must have an integer dtype, got float64",
        ),
        (
            {"features": np.zeros((4, 2)), "labels": np.zeros((4, 1), int)},
            r"'labels' must be 1-D \(N,\), got shape \(4, 1\)",
        ),
        (
            {"features": np.zeros((4, 2)), "labels": np.zeros(3, int)},
            "'labels' has 3 entries but 'features' has 4 rows",
        ),
        (
            {"features": np.array([[0.0, np.nan]] * 4), "labels": np.zeros(4, int)},
            "'features' must be finite, but row 0",
        ),
        (
            {"features": np.zeros((4, 2), bool), "labels": np.zeros(4, int)},
            "'features' must hold real numbers, got dtype bool",
        ),
        (
            {"features": np.zeros((4, 2)), "labels": np.zeros(4, int), "test_features": np.zeros((2, 2))},
            "must be given together",
        ),
        (
            {
                "features": np.zeros((4, 2)),
                "labels": np.zeros(4, int),
                "test_features": np.zeros((2, 3)),
                "test_labels": np.zeros(2, int),
            },
            r"'test_features' rows have shape \(3,\) but 'features' rows have \(2,\)",
        ),
        (
            {
                "features": np.zeros((4, 2)),
                "labels": np.zeros(4, int),
                "test_features": np.zeros((2, 2)),
                "test_labels": np.zeros(3, int),
            },
            "'test_labels' has 3 entries",
        ),
    ],
)
def test_malformed_npz_names_the_file_and_the_expectation(tmp_path, arrays, match):
    path = write_npz(tmp_path / "bad.npz", **arrays)
    with pytest.raises(ValueError, match=match) as info:
        load_file(path)
    assert str(path) in str(info.value)


def test_missing_unsupported_and_unreadable_files(tmp_path):
    with pytest.raises(FileNotFoundError, match=r"nope\.npz: no such file"):
        load_file(tmp_path / "nope.npz")
    (tmp_path / "data.csv").write_text("1,2\n")
    with pytest.raises(ValueError, match=r"unsupported file type '\.csv'; expected \.npz, \.pt or \.pth"):
        load_file(tmp_path / "data.csv")
    (tmp_path / "broken.npz").write_bytes(b"garbage")
    with pytest.raises(ValueError, match=r"broken\.npz: "):
        load_file(tmp_path / "broken.npz")
    np.savez(
        tmp_path / "objects.npz", features=np.array([{"a": 1}] * 4, dtype=object), labels=np.zeros(4, int)
    )
    with pytest.raises(ValueError, match="without pickle"):
        load_file(tmp_path / "objects.npz")


@contextlib.contextmanager
def deadline(seconds):
    """Raise TimeoutError in the main thread after ``seconds`` (a blocking open() is interrupted)."""

    def expire(signum, frame):
        raise TimeoutError(f"still running after {seconds} s")

    previous = signal.signal(signal.SIGALRM, expire)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="needs named pipes")
@pytest.mark.parametrize("name", ["pipe.npz", "pipe.pt", "pipe"])
def test_a_named_pipe_is_refused_at_once(tmp_path, name):
    # Opening a FIFO blocks until a writer comes; the data path was opened and the run hung.
    fifo = tmp_path / name
    os.mkfifo(fifo)
    with deadline(10), pytest.raises(ValueError) as info:
        load_file(fifo)
    assert str(info.value) == (
        f"{fifo}: not a regular file (a named pipe, FIFO); "
        "expected an .npz, .pt or .pth file, or a directory of images."
    )


# --- unreadable files and unusual dtypes (image folders: test_images.py) ---


def npz_bytes(**arrays):
    import io

    buffer = io.BytesIO()
    np.savez(buffer, **arrays)
    return buffer.getvalue()


def corrupt_npz(kind, good):
    """A broken ``.npz``: cut in half, a flipped byte inside an array (a CRC mismatch), or empty."""
    if kind == "truncated":
        return good[: len(good) // 2]
    if kind == "bad_crc":
        marker = np.full(16, 7.25).tobytes()  # the stored (uncompressed) bytes of the features
        at = good.index(marker) + 8
        return good[:at] + bytes([good[at] ^ 0xFF]) + good[at + 1 :]
    return b""


@pytest.mark.parametrize("kind", ["truncated", "bad_crc", "empty"])
def test_corrupt_npz_names_the_file(tmp_path, kind):
    good = npz_bytes(features=np.full((8, 2), 7.25), labels=np.arange(8) % 2)
    path = tmp_path / f"{kind}.npz"
    path.write_bytes(corrupt_npz(kind, good))
    with pytest.raises(ValueError, match=r"not a readable \.npz file") as info:
        load_file(path)
    assert str(path) in str(info.value)


def test_npy_named_npz_names_the_file(tmp_path):
    np.save(tmp_path / "array.npy", np.zeros((3, 3)))
    path = (tmp_path / "array.npy").rename(tmp_path / "array.npz")
    with pytest.raises(ValueError, match=r"array\.npz: not a readable \.npz file \(it holds a single \.npy"):
        load_file(path)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float8_e4m3fn])
def test_load_pt_with_features_numpy_cannot_hold(tmp_path, dtype):
    features = torch.linspace(-2, 2, 20).reshape(10, 2).to(dtype)
    torch.save({"features": features, "labels": torch.arange(10) % 2}, tmp_path / "low.pt")
    splits = load_file(tmp_path / "low.pt", test_fraction=0.2)
    assert splits.train.features.dtype == torch.float32
    loaded = torch.cat([splits.train.features, splits.test.features])
    assert sorted(loaded.flatten().tolist()) == sorted(features.float().flatten().tolist())  # exact
    torch.save({"features": features, "labels": (torch.arange(10) % 2).to(dtype)}, tmp_path / "bad.pt")
    with pytest.raises(ValueError, match=rf"bad\.pt: 'labels' must have an integer dtype, got {dtype}"):
        load_file(tmp_path / "bad.pt")


@pytest.mark.parametrize("kind", ["truncated", "bad_crc", "npy"])
def test_mnist1d_truncated_or_corrupt_cache_is_regenerated(tmp_path, monkeypatch, kind):
    fake = {
        "features": np.full((4000, 40), 7.25, np.float32),
        "labels": np.arange(4000) % 10,
        "test_features": np.zeros((1000, 40), np.float32),
        "test_labels": np.arange(1000) % 10,
    }
    path = tmp_path / "mnist1d_seed3.npz"
    if kind == "npy":
        np.save(tmp_path / "cache.npy", fake["features"])
        (tmp_path / "cache.npy").rename(path)
    else:
        good = npz_bytes(**{**fake, "features": fake["features"].astype(np.float64)})
        path.write_bytes(corrupt_npz(kind, good))
    calls = []
    monkeypatch.setattr(datasets_module, "_generate_mnist1d", lambda seed: calls.append(seed) or fake)
    splits = load_mnist1d(seed=3, cache_dir=tmp_path)
    assert calls == [3] and len(splits.train) == 4000
    with np.load(path) as cached:  # the cache was rewritten
        assert np.array_equal(cached["features"], fake["features"])
