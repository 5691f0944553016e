"""Ctrl-C, SIGTERM and a second ``train`` on the same run directory, with real processes.

An interrupted run saves a checkpoint at the batch it reached and prints the command that resumes it; the
resumed run ends where the uninterrupted run ends. While a run trains, a second ``train`` on its directory
is refused, naming the first.
"""

from __future__ import annotations

import json
import os
import shlex
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from composer.core import Callback, State
from composer.loggers import Logger

from composer_dynsample.cli.main import main

ROOT = Path(__file__).resolve().parents[2]
DIGITS = "yamls/digits_quick.yaml"
SHORT = ["trainer.max_duration=2ep", "evaluation.interval=null", "--quiet"]
ENV = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)}

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")


class SignalAt(Callback):
    """Sends this process a signal at the end of one batch: Ctrl-C at a known point of training."""

    def __init__(self, batch: int, signal_number: int = int(signal.SIGINT)) -> None:
        self.batch, self.signal_number = batch, signal_number

    def batch_end(self, state: State, logger: Logger) -> None:
        if int(state.timestamp.batch) == self.batch:
            os.kill(os.getpid(), self.signal_number)


def train_process(*args: str) -> subprocess.CompletedProcess:
    command = [sys.executable, "-m", "composer_dynsample", "train", DIGITS, *args]
    return subprocess.run(command, cwd=ROOT, env=ENV, capture_output=True, text=True, timeout=300)


def model_weights(checkpoint: Path) -> dict[str, torch.Tensor]:
    return torch.load(checkpoint, map_location="cpu", weights_only=False)["state"]["model"]


def test_ctrl_c_saves_the_batch_reached_and_the_printed_command_resumes_it_exactly(tmp_path):
    """SIGINT after batch 30 of 44 (mid-epoch): exit 130, one line; its command trains batches 31-44 and
    ends with the weights and metrics of the run that was never interrupted."""
    reference = train_process(*SHORT, "--run-dir", str(tmp_path / "reference"))
    assert reference.returncode == 0, reference.stderr[-3000:]
    run_dir = tmp_path / "run{rank}#1"  # a name Composer would misread: the checkpoint must stay inside
    signal_at = "callbacks.signal_at={_component_: tests.cli.test_interrupt.SignalAt, batch: 30}"
    interrupted = train_process(*SHORT, signal_at, "--run-dir", str(run_dir))
    assert interrupted.returncode == 130, interrupted.stderr[-3000:]
    lines = [line for line in interrupted.stderr.splitlines() if line.startswith("composer-dynsample")]
    checkpoint = run_dir / "checkpoints" / "ep1-ba30-rank0.pt"
    assert len(lines) == 1 and lines[0].startswith(
        f"composer-dynsample train: interrupted by SIGINT after 30 batches (1 epoch and 8 batches); "
        f"saved {checkpoint}; resume with: composer-dynsample train {DIGITS} "
    ), interrupted.stderr[-3000:]
    assert checkpoint.is_file() and not (run_dir / "metrics.json").exists()
    command = shlex.split(lines[0].split("resume with: ", 1)[1])
    assert command[command.index("--run-dir") + 1] == str(run_dir)
    resumed = train_process(
        *command[3:]
    )  # the printed command, run as it is (after "composer-dynsample train CONFIG")
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    first, second = (
        json.loads((folder / "metrics.json").read_text()) for folder in (tmp_path / "reference", run_dir)
    )
    assert (second["resumed_from_batch"], second["batches"]) == (30, first["batches"]) == (30, 44)
    for key in ("recall_at_1", "map_at_r", "r_precision"):
        assert second[key] == first[key], key
    expected = model_weights(tmp_path / "reference" / "checkpoints" / "latest-rank0.pt")
    got = model_weights(run_dir / "checkpoints" / "latest-rank0.pt")
    assert expected.keys() == got.keys() and all(torch.equal(expected[key], got[key]) for key in expected)


def wait_for(condition, what: str, process: subprocess.Popen, timeout: float = 120.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if process.poll() is not None:
            raise AssertionError(f"the training process ended before {what}: {process.communicate()}")
        if time.monotonic() > deadline:
            process.kill()
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.1)


def test_a_second_train_on_a_busy_run_dir_is_refused_and_sigterm_saves_the_first(tmp_path, capsys):
    """A trains; B (this process, even with --overwrite) is refused in one line naming A's pid and
    removes nothing; SIGTERM then stops A with a checkpoint, exit 143, and releases the directory."""
    run_dir = tmp_path / "run"
    command = [sys.executable, "-m", "composer_dynsample", "train", DIGITS, "trainer.max_duration=100000ep",
               "trainer.save_interval=1ep", "evaluation.interval=null", "--quiet", "--run-dir", str(run_dir)]  # fmt: skip
    first = subprocess.Popen(
        command, cwd=ROOT, env=ENV, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    try:
        wait_for(lambda: any((run_dir / "checkpoints").glob("ep*.pt")), "its first checkpoint", first)
        before = sorted(path.name for path in run_dir.iterdir())
        with pytest.raises(SystemExit) as exit_info:
            main(
                [
                    "train",
                    DIGITS,
                    "trainer.max_duration=1ep",
                    "--overwrite",
                    "--quiet",
                    "--run-dir",
                    str(run_dir),
                ]
            )
        err = capsys.readouterr().err.strip().splitlines()
        assert exit_info.value.code == 2 and len(err) == 1, err
        assert err[0].startswith(
            f"composer-dynsample train: error: '{run_dir}' is in use by another training run (pid {first.pid} on "
        ), err[0]
        assert "wait for it to end, or choose another --run-dir." in err[0]
        assert sorted(path.name for path in run_dir.iterdir()) == before  # --overwrite removed nothing
        first.send_signal(signal.SIGTERM)
        _, stderr = first.communicate(timeout=120)
    finally:
        if first.poll() is None:
            first.kill()
    assert first.returncode == 143, stderr[-3000:]
    lines = [line for line in stderr.splitlines() if line.startswith("composer-dynsample")]
    assert len(lines) == 1 and lines[0].startswith(
        "composer-dynsample train: interrupted by SIGTERM after "
    ), lines
    saved = Path(lines[0].split("; saved ", 1)[1].split("; resume with: ", 1)[0])
    assert saved.is_file() and saved.parent == run_dir / "checkpoints"
    assert not (run_dir / "train.lock").exists()


def test_a_lock_file_left_by_a_dead_process_is_no_obstacle(tmp_path):
    """The lock is the open file's: a train.lock a killed process left behind holds nothing."""
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    (run_dir / "train.lock").write_text(
        "pid 999999 on elsewhere since 2020-01-01T00:00:00: composer-dynsample train\n"
    )
    main(["train", str(ROOT / DIGITS), "trainer.max_duration=1ep", "evaluation.interval=null", "--quiet",
          "--run-dir", str(run_dir)])  # fmt: skip
    assert json.loads((run_dir / "metrics.json").read_text())["epochs"] == 1
    assert not (run_dir / "train.lock").exists()
