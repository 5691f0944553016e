"""The lines ``train`` ends with: what it trained, counted in the unit of ``trainer.max_duration``, and a
warning when a mined-negatives sampler had no snapshot of the model in the whole run."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

pytest.importorskip("tokenizers")

from composer_dynsample.cli.main import main
from tests.cli.helpers import MINED, latest_checkpoint, write_bag_pairs_config, write_pairs

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")

PK = {"name": "pk", "classes_per_batch": 8, "samples_per_class": 2}
NO_SNAPSHOT = (
    "warning: the mined_negatives sampler had no snapshot of the model during this run, so every anchor's "
    "negatives were random; set algorithms.embedding_table.warm_start: true (on the command line: "
    "algorithms.embedding_table.warm_start=true) to mine them from the first step."
)


def _train(config: str, run_dir: Path, *overrides: str) -> None:
    main(["train", config, *overrides, "--quiet", "--run-dir", str(run_dir)])


def _summary(out: str) -> str:
    """The one summary line of a run's stdout."""
    (line,) = [line for line in out.splitlines() if line.startswith("trained ")]
    return line


def _warnings(err: str) -> list[str]:
    return [line for line in err.splitlines() if line.startswith("warning: ")]


def test_a_run_in_batches_is_counted_in_batches(tmp_path, capsys):
    write_pairs(tmp_path)
    config = write_bag_pairs_config(tmp_path, PK)  # 32 pairs, 8 a batch: 4 batches an epoch
    _train(config, tmp_path / "run", "trainer.max_duration=2ba")
    assert _summary(capsys.readouterr().out).startswith("trained 2 batches to batch 2 in ")
    load = f"trainer.load_path={latest_checkpoint(tmp_path / 'run')}"
    _train(config, tmp_path / "more", "trainer.max_duration=3ba", load)
    assert _summary(capsys.readouterr().out).startswith("trained 1 batch (resumed at batch 2) to batch 3 in ")


def test_a_run_in_epochs_is_still_counted_in_epochs(tmp_path, capsys):
    write_pairs(tmp_path)
    _train(write_bag_pairs_config(tmp_path, PK), tmp_path / "run")  # 1ep
    assert _summary(capsys.readouterr().out).startswith("trained 1 epoch to epoch 1 in ")


def test_a_mined_run_without_a_snapshot_warns_naming_warm_start(tmp_path, capsys):
    write_pairs(tmp_path)
    config = write_bag_pairs_config(tmp_path, MINED, algorithms={"embedding_table": {}})
    _train(config, tmp_path / "run", "trainer.max_duration=1ba")
    assert _warnings(capsys.readouterr().err) == [NO_SNAPSHOT]
    metrics = json.loads((tmp_path / "run" / "metrics.json").read_text())
    assert metrics["embedding_table"][-1]["sampler"]["snapshots"] == []  # what the warning says


@pytest.mark.parametrize(
    "table",
    ["algorithms.embedding_table={warm_start: true}", "algorithms.embedding_table={feed_sampler: false}"],
    ids=["warm_start", "random_on_purpose"],
)
def test_a_warm_or_deliberately_random_mined_run_does_not_warn(tmp_path, capsys, table):
    write_pairs(tmp_path)
    config = write_bag_pairs_config(tmp_path, MINED, algorithms={"embedding_table": {}})
    _train(config, tmp_path / "run", "trainer.max_duration=1ba", table)
    assert _warnings(capsys.readouterr().err) == []
    history = json.loads((tmp_path / "run" / "metrics.json").read_text())["embedding_table"]
    snapshots = history[-1].get("sampler", {}).get("snapshots", [])
    assert len(snapshots) == (1 if "warm_start" in table else 0)
