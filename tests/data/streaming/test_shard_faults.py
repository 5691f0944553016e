"""``data: {name: streaming}`` on a converted folder that changed, a cache that is stale or misplaced, and bad
options: each is one line naming the file or option and the fix, and what is read is the file's rows (every
compression, rows larger than a shard, a cache left by a killed run or by another conversion)."""

from __future__ import annotations

import gc
import json
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
import yaml

pytest.importorskip("streaming")

from composer_dynsample.data import DatasetSplits
from composer_dynsample.data.store import TensorStore
from composer_dynsample.data.streaming import (
    StreamingDataError,
    close_readers,
    convert_to_mds,
    load_streaming,
)
from tests.cli.helpers import one_line_error
from tests.data.streaming.helpers import assert_same_batches, mined_pairs_config, pairs_splits, some_batches

ROOT = Path(__file__).resolve().parents[3]


@pytest.fixture(autouse=True)
def _forget_readers():
    yield
    close_readers()
    gc.collect()  # Streaming lets a cache folder be opened again once its dataset is gone


@pytest.fixture
def converted(tmp_path):
    """``(file splits, converted folder)``: 40 pairs in shards of 2 kB."""
    splits = pairs_splits(tmp_path, count=40)
    return splits, convert_to_mds(splits, tmp_path / "mds", shard_size="2kb")


def _assert_same_rows(splits, streamed) -> None:
    for name in ("train", "test"):
        want, got = getattr(splits, name), getattr(streamed, name)
        assert len(got) == len(want) and torch.equal(want.labels, got.labels)
        assert_same_batches(want, got, some_batches(len(want), count=2))


def _shards(folder: Path) -> list[Path]:
    return sorted(folder.glob("shard.*"))


def _tamper(out: Path) -> None:
    shard = _shards(out / "train")[0]
    data = bytearray(shard.read_bytes())
    data[-8:] = bytes(255 - b for b in data[-8:])
    shard.write_bytes(bytes(data))


def _swap(first: Path, second: Path) -> None:
    parked = first.with_name("parked")
    first.rename(parked)
    second.rename(first)
    parked.rename(second)


@pytest.mark.parametrize(
    ("damage", "expected"),
    [
        (_tamper, r"train/shard\.00000\.mds\.zstd: its xxh3_64 hash is not the one index\.json records"),
        (
            lambda out: _swap(*_shards(out / "train")[:2]),
            r"train/shard\.0000[01]\.mds\.zstd: its xxh3_64 hash",
        ),
        (
            lambda out: _shards(out / "train")[0].unlink(),
            r"train/shard\.00000\.mds\.zstd: could not download",
        ),
    ],
)
def test_a_changed_shard_is_one_line_naming_it(converted, tmp_path, damage, expected):
    splits, out = converted
    damage(out)
    streamed = load_streaming(str(out), tmp_path / "local", download_retry=0)
    with pytest.raises(StreamingDataError, match=expected) as caught:
        streamed.train.pad(np.arange(len(splits.train)))
    assert "\n" not in str(caught.value)


@pytest.mark.parametrize(
    ("damage", "expected"),
    [
        (lambda out: (out / "train" / "rows.npz").unlink(), r"train/rows\.npz: no such file"),
        (lambda out: _swap(out / "train" / "rows.npz", out / "test" / "rows.npz"), r"rows\.npz: its SHA-256"),
        (
            lambda out: _swap(out / "train" / "index.json", out / "test" / "index.json"),
            r"index\.json: its SHA-256",
        ),
        (lambda out: (out / "manifest.json").write_text("{"), r"manifest\.json: not JSON"),
        (lambda out: shutil.rmtree(out), r"manifest\.json: no such file; is .* a folder written by convert"),
    ],
)
def test_a_changed_or_missing_folder_is_one_line_at_load(converted, tmp_path, damage, expected):
    _, out = converted
    damage(out)
    with pytest.raises(StreamingDataError, match=expected) as caught:
        load_streaming(str(out), tmp_path / "local", download_retry=0)
    assert "\n" not in str(caught.value)


@pytest.mark.parametrize("compression", ["zstd", "zstd:7", "br", "gz", "snappy", None])
def test_every_compression_reads_back_the_file_rows(tmp_path, compression):
    splits = pairs_splits(tmp_path, count=24)
    out = convert_to_mds(splits, tmp_path / "mds", shard_size="1kb", compression=compression)
    assert len(_shards(out / "train")) > 2
    _assert_same_rows(splits, load_streaming(str(out), tmp_path / "local"))


def test_rows_larger_than_a_shard_are_read_back(tmp_path):
    generator = torch.Generator().manual_seed(0)
    big = DatasetSplits(
        TensorStore(torch.randn(8, 1000, generator=generator), torch.arange(8) % 3),
        TensorStore(torch.randn(4, 1000, generator=generator), torch.arange(4) % 3),
        num_classes=3,
        name="big",
    )  # 4 kB a row, shards of 1 kB
    out = convert_to_mds(big, tmp_path / "mds", shard_size="1kb")
    streamed = load_streaming(str(out), tmp_path / "local")
    assert torch.equal(streamed.train.features, big.train.features)
    assert torch.equal(streamed.test.gather(torch.tensor([3, 0])), big.test.features[[3, 0]])


def test_a_cache_of_another_conversion_is_not_read(tmp_path):
    """The remote converted again over the same cache: its shards of the same names were read before."""
    first = pairs_splits(tmp_path / "a", count=40)
    out = convert_to_mds(first, tmp_path / "mds", shard_size="2kb")
    streamed = load_streaming(str(out), tmp_path / "local")
    streamed.train.pad(np.arange(len(first.train)))  # every shard cached
    del streamed
    close_readers()
    gc.collect()
    second = pairs_splits(tmp_path / "b", count=40, max_length=16)
    convert_to_mds(second, out, shard_size="2kb", overwrite=True)
    _assert_same_rows(second, load_streaming(str(out), tmp_path / "local"))


def test_a_cache_left_by_a_killed_run_is_read_again(converted, tmp_path):
    splits, out = converted
    script = (
        "import os, signal, sys\n"
        "import numpy as np\n"
        f"sys.path.insert(0, {str(ROOT)!r})\n"
        "from composer_dynsample.data.streaming import load_streaming\n"
        f"streamed = load_streaming({str(out)!r}, {str(tmp_path / 'local')!r})\n"
        "streamed.train.pad(np.asarray([0, 1]))\n"
        "os.kill(os.getpid(), signal.SIGKILL)\n"
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert done.returncode == -9 and _shards(tmp_path / "local" / "train"), done.stderr
    _assert_same_rows(splits, load_streaming(str(out), tmp_path / "local"))


@pytest.mark.parametrize("where", ["the remote", "inside the remote", "holding the remote as a split"])
def test_a_cache_in_the_converted_folder_is_refused(converted, tmp_path, where):
    """The cache writes and removes shards in its split folders: it read the converted folder as its own before."""
    splits, out = converted
    if where == "holding the remote as a split":  # local/train would be the converted folder
        (tmp_path / "w").mkdir()
        out = out.rename(tmp_path / "w" / "train")
    files = sorted(path.relative_to(out) for path in out.rglob("*"))
    local = {
        "the remote": out,
        "inside the remote": out / "cache",
        "holding the remote as a split": out.parent,
    }
    with pytest.raises(StreamingDataError, match=r"data\.local .* is data\.remote .*, inside it or holds it"):
        load_streaming(str(out), local[where])
    assert sorted(path.relative_to(out) for path in out.rglob("*")) == files
    _assert_same_rows(
        splits, load_streaming(str(out), out.parent.parent)
    )  # a cache holding it elsewhere reads it


@pytest.mark.parametrize(
    ("data", "expected"),
    [
        ({"remote": "{tmp}/missing"}, "missing/manifest.json: no such file"),
        ({"local": "{tmp}/a-file"}, "data.local '{tmp}/a-file': it, or a folder above it, is a file"),
        ({"local": "{tmp}/mds"}, "is data.remote"),
        ({"download_retry": -1}, "data.download_retry must be an integer >= 0, got -1"),
        ({"download_timeout": 0}, "data.download_timeout must be a number > 0, got 0"),
        ({"download_timeout": "soon"}, "data.download_timeout"),
        ({"cache_limit": "lots"}, "data.cache_limit 'lots': give bytes"),
        ({"cache_limit": -1}, "data.cache_limit -1: give bytes"),
        ({"validate_hash": "md5"}, "data.validate_hash must be one of"),
        ({"max_length": 32}, "tokenized to max_length 24, the run asks for 32"),
    ],
)
def test_train_on_a_bad_streaming_section_is_one_line(converted, tmp_path, capsys, data, expected):
    (tmp_path / "a-file").write_text("x")
    streaming = {"name": "streaming", "remote": str(tmp_path / "mds"), "local": str(tmp_path / "cache")}
    streaming.update(
        {key: value.format(tmp=tmp_path) if isinstance(value, str) else value for key, value in data.items()}
    )
    config = tmp_path / "c.yaml"
    config.write_text(
        yaml.safe_dump(mined_pairs_config(streaming, pairs_per_batch=8, workers=0, max_duration="1ba"))
    )
    error = one_line_error(capsys, ["train", str(config), "--run-dir", str(tmp_path / "run")])
    assert expected.format(tmp=tmp_path) in error
    assert json.loads((tmp_path / "mds" / "manifest.json").read_text())[
        "format"
    ]  # the converted folder intact
