"""``composer-dynsample convert`` used wrongly: a bad option, a folder that holds the convert's own input, a
convert killed or interrupted midway, twice into one folder; each is one line (exit 2; 130 for Ctrl-C) and
leaves no folder that looks complete, and converting from shards gives the file's rows."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

pytest.importorskip("streaming")

from composer_dynsample.cli import convert as cli_convert
from composer_dynsample.cli.main import main
from composer_dynsample.data.streaming import StreamingDataError, close_readers, load_streaming
from tests.cli.helpers import one_line_error, pairs_data
from tests.data.streaming.helpers import assert_same_batches, mined_pairs_config, pairs_splits, some_batches

ROOT = Path(__file__).resolve().parents[3]


def _config(folder: Path, data: dict | None = None) -> str:
    """``folder/c.yaml``: a mined-pairs config of ``data`` (default: ``folder``'s pairs files)."""
    path = folder / "c.yaml"
    config = mined_pairs_config(data or pairs_data(folder), pairs_per_batch=8, workers=0, max_duration="1ba")
    path.write_text(yaml.safe_dump(config))
    return str(path)


def _convert(config: str, out: Path, *options: str) -> list[str]:
    return ["convert", config, "--to", "mds", str(out), *options]


@pytest.fixture
def pairs(tmp_path):
    """``(file splits, config)``: pairs files in ``tmp_path``, loaded as the config's data section loads them."""
    splits = pairs_splits(tmp_path, count=40)
    yield splits, _config(tmp_path)
    close_readers()


def _assert_same_rows(splits, out: Path, local: Path) -> None:
    streamed = load_streaming(str(out), local)
    for name in ("train", "test"):
        want, got = getattr(splits, name), getattr(streamed, name)
        assert (len(got), got.num_rows) == (len(want), want.num_rows)
        assert_same_batches(want, got, some_batches(len(want), count=2))


@pytest.mark.parametrize(
    ("options", "expected"),
    [
        (["--shard-size", "0"], "--shard-size '0': give bytes (at least 1024)"),
        (["--shard-size", "-5"], "--shard-size '-5': give bytes"),
        (["--shard-size", "garbage"], "--shard-size 'garbage': give bytes"),
        (["--compression", "lzma"], "--compression 'lzma': give zstd, zstd:LEVEL (1 to 22)"),
        (
            ["--compression", "zstd:99"],
            "--compression 'zstd:99': give zstd",
        ),  # once left tokenizer.json behind
        (["--compression", "zstd:fast"], "--compression 'zstd:fast': give zstd"),
        (["--compression", ""], "--compression '': give zstd"),
    ],
)
def test_a_bad_option_is_one_line_before_the_data_is_loaded(tmp_path, capsys, options, expected):
    config = _config(tmp_path)  # no data files: the options are refused before the data section is read
    error = one_line_error(capsys, _convert(config, tmp_path / "out", *options))
    assert expected in error
    assert not (tmp_path / "out").exists()


def test_an_unknown_format_names_the_one_written(tmp_path, capsys):
    error = one_line_error(capsys, ["convert", _config(tmp_path), "--to", "parquet", str(tmp_path / "out")])
    assert "--to 'parquet'" in error and "give --to mds OUT" in error
    assert not (tmp_path / "out").exists()


def test_overwriting_its_own_source_is_refused_and_the_source_kept(pairs, tmp_path, capsys):
    splits, config = pairs
    main(_convert(config, tmp_path / "mds"))
    manifest = (tmp_path / "mds" / "manifest.json").read_bytes()
    streaming = {"name": "streaming", "remote": str(tmp_path / "mds"), "local": str(tmp_path / "cache-a")}
    (tmp_path / "s").mkdir()
    from_shards = _config(tmp_path / "s", streaming)
    error = one_line_error(
        capsys, _convert(from_shards, tmp_path / "mds", "--overwrite")
    )  # deleted it before
    assert "data.remote" in error and "is that folder or inside it" in error
    assert (tmp_path / "mds" / "manifest.json").read_bytes() == manifest
    _assert_same_rows(splits, tmp_path / "mds", tmp_path / "check")
    inside = {**streaming, "local": str(tmp_path / "out" / "cache")}  # the source's cache inside OUT
    error = one_line_error(capsys, _convert(_config(tmp_path / "s", inside), tmp_path / "out"))
    assert "data.local" in error and not (tmp_path / "out").exists()
    own_tokenizer = pairs_data(tmp_path, tokenizer=str(tmp_path / "mds" / "tokenizer.json"))
    error = one_line_error(
        capsys, _convert(_config(tmp_path / "s", own_tokenizer), tmp_path / "mds", "--overwrite")
    )
    assert "data.tokenizer" in error and (tmp_path / "mds" / "manifest.json").read_bytes() == manifest


def test_a_second_convert_or_an_overwrite_of_other_files_is_refused(pairs, tmp_path, capsys):
    _, config = pairs
    main(_convert(config, tmp_path / "mds"))
    manifest = (tmp_path / "mds" / "manifest.json").read_bytes()
    error = one_line_error(capsys, _convert(config, tmp_path / "mds"))
    assert "it exists" in error and "--overwrite" in error
    assert (tmp_path / "mds" / "manifest.json").read_bytes() == manifest
    (tmp_path / "notes").mkdir()
    (tmp_path / "notes" / "keep.txt").write_text("x")
    error = one_line_error(capsys, _convert(config, tmp_path / "notes", "--overwrite"))  # rmtree'd it before
    assert "holds 'keep.txt', which convert does not write" in error
    assert (tmp_path / "notes" / "keep.txt").read_text() == "x"


def test_converting_from_shards_gives_the_file_rows(pairs, tmp_path):
    splits, config = pairs
    main(_convert(config, tmp_path / "mds", "--shard-size", "2kb"))
    streaming = {"name": "streaming", "remote": str(tmp_path / "mds"), "local": str(tmp_path / "cache-a")}
    (tmp_path / "s").mkdir()
    main(_convert(_config(tmp_path / "s", streaming), tmp_path / "again", "--compression", "none"))
    _assert_same_rows(splits, tmp_path / "again", tmp_path / "check")


class _CtrlC:
    """A progress report that stops the convert as Ctrl-C does, after the first rows are written."""

    def __call__(self, split: str, done: int, total: int) -> None:
        raise KeyboardInterrupt


@pytest.mark.parametrize("existing", [False, True])
def test_ctrl_c_mid_write_leaves_no_folder(pairs, tmp_path, capsys, monkeypatch, existing):
    _, config = pairs
    out = tmp_path / "mds"
    if existing:
        main(_convert(config, out))
    monkeypatch.setattr(cli_convert, "_Progress", _CtrlC)
    capsys.readouterr()
    with pytest.raises(SystemExit) as stop:
        main(_convert(config, out, "--overwrite"))
    error = capsys.readouterr().err.strip()
    assert stop.value.code == 130 and len(error.splitlines()) == 1, error
    assert "interrupted; no half-written" in error  # was "nothing saved since the last checkpoint"
    assert not out.exists()  # the tokenizer and the first shards were left before


def test_a_convert_killed_midway_is_refused_by_train_then_replaced(pairs, tmp_path, capsys):
    splits, config = pairs
    out = tmp_path / "mds"
    script = (
        "import os, signal, sys\n"
        f"sys.path.insert(0, {str(ROOT)!r})\n"
        "from pathlib import Path\n"
        "from composer_dynsample.data.streaming import convert_to_mds\n"
        "from tests.data.streaming.helpers import pairs_splits\n"
        "def kill(split, done, total):\n"
        "    os.kill(os.getpid(), signal.SIGKILL)\n"
        f"convert_to_mds(pairs_splits(Path({str(tmp_path)!r}), count=40), {str(out)!r}, progress=kill)\n"
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert done.returncode == -9, done.stderr
    assert (out / "train").is_dir() and not (out / "manifest.json").exists()
    with pytest.raises(StreamingDataError, match="a convert that did not finish"):
        load_streaming(str(out), tmp_path / "cache-lib")
    streaming = {"name": "streaming", "remote": str(out), "local": str(tmp_path / "cache")}
    (tmp_path / "s").mkdir()
    train = ["train", _config(tmp_path / "s", streaming), "--run-dir", str(tmp_path / "run")]
    error = one_line_error(capsys, train)
    assert "did not finish" in error and "convert again with --overwrite" in error
    assert "it exists" in one_line_error(capsys, _convert(config, out))
    main(_convert(config, out, "--overwrite"))
    _assert_same_rows(splits, out, tmp_path / "check")
    assert os.listdir(out) and (out / "manifest.json").is_file()


def test_a_folder_made_by_another_convert_meanwhile_is_left_to_it(pairs, tmp_path, capsys, monkeypatch):
    """Two converts into one folder at once: the second finds it made while it loaded the data."""
    from composer_dynsample.config import builders

    _, config = pairs
    out, load = tmp_path / "mds", builders.build_data

    def load_while_another_writes(cfg):
        (out / "train").mkdir(parents=True)
        (out / "train" / "theirs").write_text("x")
        return load(cfg)

    monkeypatch.setattr(builders, "build_data", load_while_another_writes)
    error = one_line_error(capsys, _convert(config, out))
    assert "exists; give another folder, or --overwrite" in error
    assert (out / "train" / "theirs").read_text() == "x"  # removed, as a folder this convert began, before
