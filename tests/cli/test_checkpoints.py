"""The command line refuses a broken checkpoint file in one line, exit status 2, and never hangs on one."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
import torch

from composer_dynsample.cli.main import main

ROOT = Path(__file__).resolve().parents[2]
DIGITS = str(ROOT / "yamls" / "digits_quick.yaml")

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory) -> Path:
    """A real checkpoint of a one-epoch digits run."""
    run_dir = tmp_path_factory.mktemp("digits") / "run"
    main(["train", DIGITS, "trainer.max_duration=1ep", "evaluation.interval=null", "--quiet", "--run-dir",
          str(run_dir)])  # fmt: skip
    return (run_dir / "checkpoints" / "latest-rank0.pt").resolve()


def refusal(argv: list[str], capsys) -> str:
    """The one line of stderr of a command that exits with status 2."""
    with pytest.raises(SystemExit) as exit_info:
        main(argv)
    err = capsys.readouterr().err.strip().splitlines()
    assert exit_info.value.code == 2 and len(err) == 1, err
    return err[0]


def cut_record(checkpoint: Path, target: Path, keep: int) -> Path:
    """``checkpoint`` with its first storage record (the first layer's weight) cut to ``keep`` bytes."""
    with zipfile.ZipFile(checkpoint) as original, zipfile.ZipFile(target, "w", zipfile.ZIP_STORED) as copy:
        for info in original.infolist():
            data = original.read(info)
            copy.writestr(info.filename, data[:keep] if info.filename.endswith("/data/0") else data)
    return target


def test_eval_refuses_a_checkpoint_whose_weight_record_is_cut(checkpoint, tmp_path, capsys):
    """Loaded, the weight would be filled from memory past the record: garbage metrics with exit 0."""
    path = cut_record(checkpoint, tmp_path / "cut.pt", 4)
    line = refusal(["eval", DIGITS, "--checkpoint", str(path), "--out", str(tmp_path / "eval.json")], capsys)
    assert line.startswith("composer-dynsample eval: error: ") and str(path) in line, line
    assert "record 'archive/data/0' holds 4 bytes" in line and "(32768 bytes)" in line, (
        line
    )  # 128 x 64 floats
    assert not (tmp_path / "eval.json").exists()


def test_train_refuses_to_resume_from_a_cut_record(checkpoint, tmp_path, capsys):
    path = cut_record(checkpoint, tmp_path / "cut.pt", 4)
    line = refusal(["train", DIGITS, "trainer.max_duration=2ep", f"trainer.load_path={path}", "--quiet",
                    "--run-dir", str(tmp_path / "run")], capsys)  # fmt: skip
    assert str(path) in line and "holds 4 bytes" in line, line


@pytest.mark.parametrize("command", ["eval", "train"])
def test_a_fifo_is_refused_at_once_even_when_trusted(tmp_path, command):
    """Opening a FIFO waits for a writer: the command would hang instead of answering."""
    fifo = tmp_path / "checkpoint.pt"
    os.mkfifo(fifo)
    if command == "eval":
        argv = ["eval", DIGITS, "--checkpoint", str(fifo), "--out", str(tmp_path / "eval.json")]
    else:
        argv = ["train", DIGITS, f"trainer.load_path={fifo}", "--run-dir", str(tmp_path / "run")]
    result = subprocess.run(
        [sys.executable, "-m", "composer_dynsample", *argv, "--trust-checkpoint"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=240,
        env={**os.environ, "OMP_NUM_THREADS": "1"},
    )
    err = result.stderr.strip().splitlines()
    assert result.returncode == 2 and len(err) == 1, result.stderr[-3000:]
    assert f"checkpoint {str(fifo)!r} is a FIFO (named pipe), not a regular file" in err[0], err[0]


@pytest.mark.parametrize("trust", [[], ["--trust-checkpoint"]], ids=["checked", "trusted"])
@pytest.mark.parametrize("name", ["zero", "loop"])
def test_a_device_or_a_symlink_loop_is_one_line(tmp_path, capsys, name, trust):
    if name == "zero":
        path, expected = Path("/dev/zero"), "is a character device, not a regular file"
    else:
        path, expected = tmp_path / "loop.pt", "is a symbolic link loop"
        path.symlink_to(tmp_path / "back.pt")
        (tmp_path / "back.pt").symlink_to(path)
    line = refusal(
        ["eval", DIGITS, "--checkpoint", str(path), "--out", str(tmp_path / "e.json"), *trust], capsys
    )
    assert f"checkpoint {str(path)!r} {expected}" in line, line


def test_weights_that_are_not_finite_are_refused_naming_the_parameter(checkpoint, tmp_path, capsys):
    """Evaluated, NaN weights end in a traceback about NaN embeddings; Recall@K of them means nothing."""
    state = torch.load(checkpoint, weights_only=False)
    name = next(iter(state["state"]["model"]))
    state["state"]["model"][name][0, 0] = float("nan")
    path = tmp_path / "diverged.pt"
    torch.save(state, path)
    line = refusal(["eval", DIGITS, "--checkpoint", str(path), "--out", str(tmp_path / "eval.json")], capsys)
    assert str(path) in line and f"model parameter {name!r} has 1 NaN or infinite value(s)" in line, line


@pytest.mark.parametrize("name", ["ck{rank}.pt", "ck{run_name}.pt", "ck{unknown}.pt", "ck{.pt"])
def test_format_fields_in_a_checkpoint_path_are_taken_as_they_are(checkpoint, tmp_path, capsys, name):
    """Composer reads '{rank}' and the like in load_path as format fields: the file checked is the one loaded."""
    path = Path(shutil.copy(checkpoint, tmp_path / name))
    decoy = tmp_path / "ck0.pt"  # what '{rank}' would become on rank 0
    decoy.write_bytes(b"not the file that was checked")
    out = tmp_path / "eval.json"
    main(["eval", DIGITS, "--checkpoint", str(path), "--out", str(out)])
    assert out.is_file()
    capsys.readouterr()
