"""``composer-dynsample train`` on 2 real processes over gloo, launched by Composer's launcher.

Run with ``bash tests/run_distributed.sh 2`` (``python -m composer.cli.launcher -n 2 ... -m pytest``).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from composer.utils import dist

from composer_dynsample.cli.commands import train
from tests.distributed._helpers import shared_tmp_dir

pytestmark = [pytest.mark.world_size(2), pytest.mark.filterwarnings("ignore::UserWarning")]

YAMLS = Path(__file__).resolve().parents[2] / "yamls"
QUIET = ["trainer.progress_bar=false"]


def test_train_runs_on_two_ranks_and_rank_zero_reports():
    run_dir = shared_tmp_dir(prefix="dynsample-cli-") / "digits"
    overrides = [*QUIET, "trainer.max_duration=6ba", "evaluation.interval=3ba", "trainer.save_interval=3ba"]
    metrics = train(YAMLS / "digits_quick.yaml", overrides, run_dir=run_dir)
    assert metrics["world_size"] == 2 and metrics["batches"] == 6
    assert [entry["batch"] for entry in metrics["eval_history"]] == [3, 6]
    every_rank = dist.all_gather_object(
        {key: metrics[key] for key in ("recall_at_1", "map_at_r", "eval_history")}
    )
    assert every_rank[0] == every_rank[1], "the ranks disagree on the final metrics"
    if dist.get_global_rank() == 0:
        written = json.loads((run_dir / "metrics.json").read_text())
        assert written["recall_at_1"] == pytest.approx(metrics["recall_at_1"])
        assert (run_dir / "embeddings.png").is_file() and (run_dir / "config.yaml").is_file()
        assert (run_dir / "checkpoints" / "latest-rank0.pt").exists()
    assert not (run_dir / "metrics-rank1.json").exists()


def test_the_two_rank_recipe_mines_across_ranks():
    run_dir = shared_tmp_dir(prefix="dynsample-cli-") / "mnist1d"
    overrides = [*QUIET, "trainer.max_duration=2ba", "evaluation.interval=null", "trainer.save_interval=2ba"]
    metrics = train(YAMLS / "mnist1d_two_ranks.yaml", overrides, run_dir=run_dir)
    assert metrics["world_size"] == 2 and metrics["batches"] == 2
    assert 0.0 <= metrics["recall_at_1"] <= 1.0
