"""check_checkpoint reads a file with torch's weights-only unpickler and this project's short allow-list."""

from __future__ import annotations

import datetime
import os
import random
import zipfile
from pathlib import Path

import numpy as np
import pytest
import torch

from composer_dynsample.checkpoints import CheckpointError, check_checkpoint


def composer_shaped(path: Path) -> Path:
    """What a Composer checkpoint of this project holds: tensors, the torch version, timedeltas, rng states."""
    state = {
        "state": {
            "model": {"encoder.weight": torch.randn(4, 3)},
            "timestamp": {"epoch": 2, "total_wct": datetime.timedelta(seconds=3.5)},
            "integrations": {"torch": torch.__version__},
        },
        "rng": [
            {"python": random.getstate(), "numpy": np.random.get_state(), "torch": torch.get_rng_state()}
        ],
        "metrics": {"flags": np.array([True, False]), "ids": np.arange(3)},
    }
    torch.save(state, path)
    return path


def test_what_a_checkpoint_of_this_project_holds_is_accepted(tmp_path):
    check_checkpoint(composer_shaped(tmp_path / "ok.pt"))


def touch(path: Path) -> None:
    path.touch()


class Marker:
    """Creates a file when unpickled: a harmless stand-in for a checkpoint that runs code."""

    def __init__(self, path: Path, function) -> None:
        self.path = path
        self.function = function

    def __reduce__(self):
        return (self.function, (self.path,))


@pytest.mark.parametrize(
    ("function", "named"),
    [(Path.touch, "getattr"), (touch, "test_checkpoints.touch"), (Path, "pathlib.Path")],
    ids=["method", "function", "class"],
)
@pytest.mark.parametrize("nested", [False, True], ids=["top-level", "nested"])
def test_a_global_outside_the_allow_list_is_refused_before_it_runs(tmp_path, function, named, nested):
    marker = tmp_path / "code-ran"
    path = tmp_path / "crafted.pt"
    payload = Marker(marker, function)
    torch.save({"state": {"model": payload}} if nested else payload, path)
    with pytest.raises(CheckpointError) as error:
        check_checkpoint(path)
    message = str(error.value)
    assert "\n" not in message and str(path) in message and "--trust-checkpoint" in message
    assert f"asks for {named}" in message or f".{named}" in message, message
    assert not marker.exists()


@pytest.mark.parametrize(
    ("content", "expected"),
    [
        (b"", "is empty (0 bytes)"),
        (bytes(range(256)) * 8, "truncated or corrupt"),
        ("truncated", "truncated or corrupt"),
        (None, "does not exist"),
    ],
    ids=["empty", "random", "truncated", "missing"],
)
def test_a_broken_file_is_one_line_naming_it(tmp_path, content, expected):
    path = tmp_path / "broken.pt"
    if content == "truncated":
        data = composer_shaped(tmp_path / "whole.pt").read_bytes()
        path.write_bytes(data[: len(data) * 2 // 3])
    elif content is not None:
        path.write_bytes(content)
    with pytest.raises(CheckpointError) as error:
        check_checkpoint(path)
    message = str(error.value)
    assert "\n" not in message and str(path) in message and expected in message, message


@pytest.mark.parametrize(
    ("content", "holds"),
    [
        ([1, 2, 3], "a list"),
        (torch.nn.Linear(3, 2).state_dict(), "a dict with keys ['weight', 'bias']"),
        ({"state": {"optimizers": {}}}, "a dict with keys ['state']"),
        ({"state": [1]}, "a dict with keys ['state']"),
    ],
    ids=["list", "bare-state-dict", "no-model", "state-not-a-dict"],
)
def test_a_torch_file_that_is_not_a_composer_checkpoint_is_one_line(tmp_path, content, holds):
    """Safe to read, but Composer would fail on it with a KeyError or AttributeError traceback."""
    path = tmp_path / "other.pt"
    torch.save(content, path)
    with pytest.raises(CheckpointError) as error:
        check_checkpoint(path)
    message = str(error.value)
    assert "\n" not in message and str(path) in message, message
    assert f"is not a Composer checkpoint: it holds {holds}, not a dict whose 'state'" in message, message


def test_a_folder_is_not_a_checkpoint(tmp_path):
    with pytest.raises(CheckpointError, match="is a directory, not a regular file"):
        check_checkpoint(tmp_path)


def rewrite(source: Path, target: Path, suffix: str, change) -> Path:
    """A copy of the zip ``source`` whose record ending in ``suffix`` is ``change(bytes)``; ``None`` drops it."""
    with zipfile.ZipFile(source) as original, zipfile.ZipFile(target, "w", zipfile.ZIP_STORED) as copy:
        for info in original.infolist():
            data = original.read(info)
            if info.filename.endswith(suffix):
                data = change(data)
            if data is not None:
                copy.writestr(info.filename, data)
    return target


def test_a_record_shorter_than_its_storage_is_refused_naming_both_sizes(tmp_path):
    """torch would fill the missing bytes of the weight from the memory past the record."""
    whole = composer_shaped(tmp_path / "whole.pt")  # data/0 holds encoder.weight: 4 x 3 floats
    path = rewrite(whole, tmp_path / "cut.pt", "/data/0", lambda data: data[:4])
    with pytest.raises(CheckpointError) as error:
        check_checkpoint(path)
    message = str(error.value)
    assert "\n" not in message and str(path) in message, message
    assert (
        "record 'whole/data/0' holds 4 bytes" in message
        and "FloatStorage of 12 elements (48 bytes)" in message
    )


@pytest.mark.parametrize("kept", [0, 47, 48, 64], ids=["none", "one-byte-short", "exact", "longer"])
def test_a_record_is_refused_exactly_when_shorter_than_declared(tmp_path, kept):
    whole = composer_shaped(tmp_path / "whole.pt")
    path = rewrite(whole, tmp_path / "cut.pt", "/data/0", lambda data: (data + bytes(16))[:kept])
    if kept >= 48:
        check_checkpoint(path)
    else:
        with pytest.raises(CheckpointError, match=f"holds {kept} bytes, but its pickle declares"):
            check_checkpoint(path)


def declared(path: Path, numel: bytes, size: bytes) -> Path:
    """torch.arange(4.) saved, its storage's element count and its size tuple replaced by pickle ints."""
    torch.save({"state": {"model": {"w": torch.arange(4.0)}}}, path)

    def change(pickled: bytes) -> bytes:
        assert pickled.count(b"K\x04t") == 1 and pickled.count(b"K\x04\x85") == 1  # numel 4, size (4,)
        return pickled.replace(b"K\x04t", numel + b"t").replace(b"K\x04\x85", size + b"\x85")

    return rewrite(path, path.with_name("changed.pt"), "/data.pkl", change)


def test_a_huge_declared_storage_over_a_small_record_is_refused(tmp_path):
    """2**34 floats (64 GiB) over a 16-byte record: torch.load(weights_only=True) accepts it as it is."""
    huge = b"\x8a\x05" + (2**34).to_bytes(5, "little")  # LONG1
    path = declared(tmp_path / "small.pt", huge, huge)
    with pytest.raises(CheckpointError) as error:
        check_checkpoint(path)
    message = str(error.value)
    assert "record 'small/data/0' holds 16 bytes" in message, message
    assert f"of {2**34} elements ({2**36} bytes)" in message, message


def test_a_tensor_reaching_past_its_storage_is_refused(tmp_path):
    path = declared(tmp_path / "small.pt", b"K\x04", b"K\x30")  # a (48,) tensor over 4 floats
    with pytest.raises(CheckpointError) as error:
        check_checkpoint(path)
    message = str(error.value)
    assert "\n" not in message and str(path) in message, message
    assert "a tensor of size (48,), stride (1,) and offset 0 reaches element 48 of record " in message
    assert "whose storage holds 4 elements" in message, message


def test_a_record_the_pickle_names_but_the_file_lacks_is_named(tmp_path):
    whole = composer_shaped(tmp_path / "whole.pt")
    path = rewrite(whole, tmp_path / "lacking.pt", "/data/0", lambda data: None)
    with pytest.raises(CheckpointError, match=r"a storage in record 'whole/data/0', which the file does not"):
        check_checkpoint(path)


def test_views_shared_storages_and_every_dtype_are_accepted(tmp_path):
    """Slices, transposes, strided and empty tensors, scalars and storages shared by several tensors."""
    base = torch.arange(20.0)
    model = {
        "slice": base[3:7],
        "transposed": base.view(4, 5).t(),
        "strided": base[::3],
        "empty": torch.zeros(0, 3),
        "scalar": torch.tensor(3.0),
        **{str(dtype): torch.ones(3, dtype=dtype) for dtype in (torch.bfloat16, torch.float64, torch.bool)},
        "int": torch.arange(5),
        "complex": torch.ones(2, dtype=torch.complex64),
    }
    path = tmp_path / "views.pt"
    torch.save({"state": {"model": model}}, path)
    check_checkpoint(path)


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), -float("inf")], ids=["nan", "inf", "-inf"])
def test_weights_that_are_not_finite_are_refused_naming_the_first(tmp_path, bad):
    broken = torch.ones(2, 3)
    broken[1, 2] = bad
    model = {"ok.weight": torch.ones(3), "count": torch.tensor(7), "head.weight": broken, "last": broken}
    path = tmp_path / "diverged.pt"
    torch.save({"state": {"model": model}}, path)
    with pytest.raises(CheckpointError) as error:
        check_checkpoint(path)
    message = str(error.value)
    assert "\n" not in message and str(path) in message, message
    assert "model parameter 'head.weight' has 1 NaN or infinite value(s) of 6" in message, message


def special_paths(tmp_path: Path) -> dict[str, tuple[Path, str]]:
    """Paths that are no regular file, and what the refusal says of each."""
    fifo = tmp_path / "fifo.pt"
    os.mkfifo(fifo)
    loop = tmp_path / "loop.pt"
    loop.symlink_to(tmp_path / "back.pt")
    (tmp_path / "back.pt").symlink_to(loop)
    (tmp_path / "dangling.pt").symlink_to(tmp_path / "gone.pt")
    return {
        "fifo": (fifo, "is a FIFO (named pipe), not a regular file"),
        "zero": (Path("/dev/zero"), "is a character device, not a regular file"),
        "urandom": (Path("/dev/urandom"), "is a character device, not a regular file"),
        "loop": (loop, "is a symbolic link loop"),
        "folder": (tmp_path, "is a directory, not a regular file"),
        "missing": (tmp_path / "missing.pt", "does not exist"),
        "dangling": (tmp_path / "dangling.pt", "does not exist"),
    }


@pytest.mark.timeout(60)
@pytest.mark.parametrize("trusted", [False, True], ids=["checked", "trusted"])
@pytest.mark.parametrize("name", ["fifo", "zero", "urandom", "loop", "folder", "missing", "dangling"])
def test_what_is_not_a_regular_file_is_refused_even_when_trusted(tmp_path, name, trusted):
    """A FIFO would hang the load, a device feed it endless bytes: the path is looked at, never opened."""
    path, expected = special_paths(tmp_path)[name]
    with pytest.raises(CheckpointError) as error:
        check_checkpoint(path, trusted=trusted)
    message = str(error.value)
    assert "\n" not in message and f"checkpoint {str(path)!r} {expected}" in message, message


def test_a_trusted_file_is_not_read(tmp_path):
    marker = tmp_path / "code-ran"
    path = tmp_path / "crafted.pt"
    torch.save({"state": {"model": Marker(marker, touch)}}, path)
    check_checkpoint(path, trusted=True)
    cut = rewrite(composer_shaped(tmp_path / "whole.pt"), tmp_path / "cut.pt", "/data/0", lambda data: b"")
    check_checkpoint(cut, trusted=True)
    assert not marker.exists()


@pytest.mark.filterwarnings("ignore:Duplicate name")
@pytest.mark.parametrize("order", ["short-last", "short-first"])
def test_a_record_given_twice_counts_with_its_shorter_copy(tmp_path, order):
    """A zip may hold a name twice; torch 2.7 reads the last copy, which may be the cut one."""
    whole = composer_shaped(tmp_path / "whole.pt")
    path = tmp_path / "twice.pt"
    with zipfile.ZipFile(whole) as original, zipfile.ZipFile(path, "w") as copy:
        for info in original.infolist():
            data = original.read(info)
            copies = [data, data[:4]] if info.filename.endswith("/data/0") else [data]
            for part in copies if order == "short-last" else copies[::-1]:
                copy.writestr(info.filename, part)
    with pytest.raises(CheckpointError, match="record 'whole/data/0' holds 4 bytes"):
        check_checkpoint(path)
