"""``composer-dynsample train``: a short real run writes its report and checkpoint, and resumes from it."""

from __future__ import annotations

import json
import struct
from pathlib import Path

import pytest
from omegaconf import OmegaConf

from composer_dynsample.cli import main

DIGITS = str(Path(__file__).resolve().parents[1] / "yamls" / "digits_quick.yaml")
QUIET = ["trainer.progress_bar=false"]
KEYS = ("recall_at_1", "recall_at_5", "map_at_r", "r_precision")

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")


def png_size(path: Path) -> tuple[int, int]:
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n", f"{path} is not a PNG"
    assert data[12:16] == b"IHDR"
    return struct.unpack(">II", data[16:24])


@pytest.fixture(scope="module")
def first_run(tmp_path_factory):
    run_dir = tmp_path_factory.mktemp("digits") / "run"
    main(
        [
            "train",
            DIGITS,
            *QUIET,
            "trainer.max_duration=4ep",
            "evaluation.interval=2ep",
            "--run-dir",
            str(run_dir),
        ]
    )
    return run_dir, json.loads((run_dir / "metrics.json").read_text())


def test_a_run_writes_metrics_plot_config_and_checkpoint(first_run, capsys):
    run_dir, metrics = first_run
    for key in KEYS:
        assert 0.0 <= metrics[key] <= 1.0, key
    assert metrics["recall_at_1"] > 0.7  # chance is 0.1; 4 epochs of digits reach about 0.95
    assert metrics["recall_at_5"] >= metrics["recall_at_1"]
    assert metrics["wall_time_s"] > 0 and metrics["seed"] == 0 and metrics["epochs"] == 4
    assert metrics["num_queries"] == 359 and metrics["gallery_size"] == 1438 and metrics["world_size"] == 1
    assert [entry["epoch"] for entry in metrics["eval_history"]] == [2, 4]
    width, height = png_size(run_dir / "embeddings.png")
    assert width >= 400 and height >= 300
    assert (run_dir / "embeddings.png").stat().st_size > 10_000  # a scatter of 359 points, not a blank image
    saved = OmegaConf.load(run_dir / "config.yaml")
    assert saved.trainer.max_duration == "4ep" and saved.run_dir == str(run_dir)
    checkpoint = Path(metrics["checkpoint"])
    assert checkpoint.is_file() and checkpoint.parent == run_dir / "checkpoints"
    assert (run_dir / "checkpoints" / "latest-rank0.pt").exists()


def test_resume_continues_from_the_checkpoint(first_run, tmp_path):
    run_dir, first = first_run
    resumed_dir = tmp_path / "resumed"
    main(
        [
            "train",
            DIGITS,
            *QUIET,
            "trainer.max_duration=6ep",
            "evaluation.interval=2ep",
            f"trainer.load_path={run_dir / 'checkpoints' / 'latest-rank0.pt'}",
            "--run-dir",
            str(resumed_dir),
        ]
    )
    resumed = json.loads((resumed_dir / "metrics.json").read_text())
    assert (resumed["resumed_from_epoch"], resumed["resumed_from_batch"]) == (4, first["batches"])
    assert resumed["epochs"] == 6 and resumed["batches"] == first["batches"] // 4 * 6
    assert [entry["epoch"] for entry in resumed["eval_history"]] == [2, 4, 6]  # the history is checkpointed
    assert resumed["recall_at_1"] > 0.7


def test_the_pipeline_runs_with_worker_processes(tmp_path):
    main(["train", DIGITS, *QUIET, "trainer.max_duration=2ep", "dataloader.num_workers=2",
          "dataloader.persistent_workers=true", "evaluation.interval=null", "--run-dir", str(tmp_path)])  # fmt: skip
    metrics = json.loads((tmp_path / "metrics.json").read_text())
    assert metrics["epochs"] == 2 and metrics["recall_at_1"] > 0.5
    assert OmegaConf.load(tmp_path / "config.yaml").dataloader.num_workers == 2


def test_command_line_errors_exit_with_a_message(tmp_path, capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(["train", DIGITS, "optimizer.lrr=1", "--run-dir", str(tmp_path)])
    assert exit_info.value.code == 2
    assert "unknown key 'lrr'" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["train", DIGITS, "not-an-override", "--run-dir", str(tmp_path)])
    assert "'not-an-override' is not of the form key.path=value" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["train", str(tmp_path / "missing.yaml")])
    assert "does not exist" in capsys.readouterr().err
    assert not (tmp_path / "metrics.json").exists()
