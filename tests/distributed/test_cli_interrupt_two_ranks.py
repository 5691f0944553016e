"""A signal that reaches one rank of two stops both at the same batch, each with its checkpoint saved.

Run with ``bash tests/run_distributed.sh 2`` (``python -m composer.cli.launcher -n 2 ... -m pytest``).
"""

from __future__ import annotations

import os
import signal
from pathlib import Path

import pytest
from composer.core import Callback, State
from composer.loggers import Logger
from composer.utils import dist

from composer_dynsample.cli.commands import Interrupted, train
from tests.distributed._helpers import shared_tmp_dir

pytestmark = [pytest.mark.world_size(2), pytest.mark.filterwarnings("ignore::UserWarning")]

YAMLS = Path(__file__).resolve().parents[2] / "yamls"


class SignalRankOneAt(Callback):
    """Sends SIGTERM to rank 1 alone after one batch; rank 0 never sees a signal."""

    def __init__(self, batch: int) -> None:
        self.batch = batch

    def batch_end(self, state: State, logger: Logger) -> None:
        if dist.get_global_rank() == 1 and int(state.timestamp.batch) == self.batch:
            os.kill(os.getpid(), signal.SIGTERM)


def test_one_signalled_rank_stops_both_at_the_same_batch():
    run_dir = shared_tmp_dir(prefix="dynsample-interrupt-") / "run"
    overrides = [
        "trainer.progress_bar=false",
        "trainer.max_duration=20ba",
        "evaluation.interval=null",
        f"callbacks.signal={{_component_: {__name__}.SignalRankOneAt, batch: 3}}",
    ]
    with pytest.raises(Interrupted) as stop:
        train(YAMLS / "digits_quick.yaml", overrides, run_dir=run_dir)
    assert stop.value.exit_code == 128 + signal.SIGTERM
    assert "interrupted by SIGTERM after 3 batches" in str(stop.value)
    every_rank = dist.all_gather_object(str(stop.value).split(";")[0])
    assert every_rank[0] == every_rank[1]  # the same batch on both ranks
    if dist.get_global_rank() == 0:
        assert stop.value.checkpoint == str(run_dir / "checkpoints" / "ep0-ba3-rank0.pt")
        assert Path(stop.value.checkpoint).is_file() and not (run_dir / "metrics.json").exists()
        resume = str(stop.value).split("resume with: ", 1)[1]
        assert resume.startswith("composer -n 2 -m composer_dynsample train ")
        assert f"trainer.load_path={stop.value.checkpoint} --run-dir {run_dir}" in resume
