"""check_checkpoint reads a file with torch's weights-only unpickler and this project's short allow-list."""

from __future__ import annotations

import datetime
import random
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
        (None, "does not exist or is not a file"),
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
    with pytest.raises(CheckpointError, match="is not a file"):
        check_checkpoint(tmp_path)
