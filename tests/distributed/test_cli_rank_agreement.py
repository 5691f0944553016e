"""Ranks given different configs are refused at start, in one line, on every rank.

The ``world_size(2)`` tests run ``train`` inside the 2 processes of the launcher
(``python -m composer.cli.launcher -n 2 --master_port PORT -m pytest tests/distributed/...``); the last
test is a single-process one that starts the launcher itself with the real command line, where the
override ``data.seed=${oc.decode:${oc.env:RANK}}``, the same argument on both processes, resolves to 0
on rank 0 and 1 on rank 1.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from composer.utils import dist, get_device
from omegaconf import OmegaConf

from composer_dynsample.cli.commands import train
from composer_dynsample.config import ConfigError
from composer_dynsample.config.ranks import check_same_config_on_every_rank, flatten_config
from tests.distributed._helpers import shared_tmp_dir

ROOT = Path(__file__).resolve().parents[2]
YAMLS = ROOT / "yamls"
ERROR = (
    "composer-dynsample train: error: config: ranks [1] disagree with rank 0 on the resolved config "
    "(data.seed: 0 on rank 0, 1 on rank 1). Give every rank the same config file and the same overrides."
)
two_ranks = pytest.mark.world_size(2)


def rank() -> int:
    if not dist.is_initialized():  # the first Trainer of the session has not run yet
        dist.initialize_dist(get_device(None))
    return dist.get_global_rank()


@two_ranks
def test_the_cli_refuses_a_config_that_differs_on_one_rank():
    run_dir = shared_tmp_dir(prefix="dynsample-agree-") / "digits"
    overrides = ["trainer.progress_bar=false", "trainer.max_duration=2ba", f"data.seed={rank()}"]
    with pytest.raises(
        ConfigError,
        match=r"ranks \[1\] disagree with rank 0 on the resolved config \(data\.seed: 0 on rank 0, 1 on rank 1\)",
    ) as error:
        train(YAMLS / "digits_quick.yaml", overrides, run_dir=run_dir)
    every_rank = dist.all_gather_object(str(error.value))
    assert every_rank[0] == every_rank[1] and "\n" not in every_rank[0]
    assert not (run_dir / "config.yaml").exists()


@two_ranks
def test_the_cli_accepts_the_same_config_written_differently():
    run_dir = shared_tmp_dir(prefix="dynsample-agree-") / "digits"
    # One rank says it with an override, the other leaves the file's value: the resolved configs are equal.
    overrides = ["trainer.progress_bar=false", "trainer.max_duration=1ba", "evaluation.interval=null"]
    overrides += ["sampler.classes_per_batch=8"] if rank() == 1 else []
    metrics = train(YAMLS / "digits_quick.yaml", overrides, run_dir=run_dir)
    assert metrics["batches"] == 1 and np.isfinite(metrics["recall_at_1"])


def test_flatten_config_gives_dotted_leaves():
    config = {"data": {"name": "digits", "seed": 1}, "model": {"encoder": {"dims": [1, 2]}}, "loggers": {}}
    assert flatten_config(config) == {
        "data.name": "digits",
        "data.seed": 1,
        "model.encoder.dims": [1, 2],
        "loggers": {},
    }


def test_the_config_check_does_nothing_on_one_rank(monkeypatch):
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    check_same_config_on_every_rank(OmegaConf.create({"seed": 0, "trainer": {"device": "no-such"}}))
    assert issubclass(ConfigError, ValueError)


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def test_a_seed_given_to_one_rank_only_is_refused_in_one_line_on_every_rank(tmp_path):
    logs = tmp_path / "logs"
    logs.mkdir()
    command = [
        sys.executable, "-m", "composer.cli.launcher", "-n", "2", "--master_port", str(free_port()),
        "--stdout", str(logs / "rank{rank}.stdout"), "--stderr", str(logs / "rank{rank}.stderr"),
        "-m", "composer_dynsample", "train", "yamls/digits_quick.yaml", "--quiet",
        "trainer.max_duration=2ba", "evaluation.interval=null", "data.seed=${oc.decode:${oc.env:RANK}}",
        "--run-dir", str(tmp_path / "run"),
    ]  # fmt: skip
    result = subprocess.run(
        command,
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "OMP_NUM_THREADS": "1"},
    )
    assert result.returncode != 0
    # Rank 0 writes to the launcher's stderr; the launcher then echoes the other ranks' output.
    rank_zero = result.stderr.split("----------Begin global rank", 1)[0]
    rank_one = (logs / "rank1.stderr").read_text()
    for errors in (rank_zero, rank_one):
        assert ERROR in errors.splitlines()
        assert "Traceback" not in errors
    assert not (tmp_path / "run").exists()  # refused before any rank wrote anything
