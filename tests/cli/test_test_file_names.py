"""The results of an evaluation on a separate test file (``data.test_path``) are named by that file: the
metrics table, ``metrics.json`` and ``eval.json`` say ``mine_test``, not the training file's ``mine_train``."""

from __future__ import annotations

import json

import pytest

pytest.importorskip("tokenizers")

from composer_dynsample.cli.main import main
from tests.cli.helpers import BAG, latest_checkpoint, pairs_data, write_run_config
from tests.data.text.helpers import pair_rows, write_jsonl

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")


def title(stdout: str) -> str:
    """The metrics table's heading: the line above its ``metric`` header."""
    lines = stdout.splitlines()
    return lines[next(i for i, line in enumerate(lines) if line.startswith("metric ")) - 1]


def test_the_results_of_a_test_file_name_it(tmp_path, capsys):
    write_jsonl(tmp_path / "mine_train.jsonl", pair_rows(32, seed=0))
    write_jsonl(tmp_path / "mine_test.jsonl", pair_rows(8, seed=1))
    data = pairs_data(
        tmp_path, path=str(tmp_path / "mine_train.jsonl"), test_path=str(tmp_path / "mine_test.jsonl")
    )
    model = {"normalize": True, "encoder": BAG, "loss": {"name": "info_nce", "temperature": 0.1}}
    sampler = {"name": "pk", "classes_per_batch": 8, "samples_per_class": 2}
    config = write_run_config(
        tmp_path / "pairs.yaml", data=data, model=model, sampler=sampler, ks=[1, 5], max_duration="2ba"
    )
    capsys.readouterr()
    main(["train", config, "--run-dir", str(tmp_path / "run")])
    trained = title(capsys.readouterr().out)
    assert trained.startswith("mine_test: final retrieval metrics of 8 test queries"), trained
    metrics = json.loads((tmp_path / "run" / "metrics.json").read_text())
    assert (metrics["dataset"], metrics["train_dataset"]) == ("mine_test", "mine_train")

    main(["eval", config, "--checkpoint", latest_checkpoint(tmp_path / "run")])
    assert title(capsys.readouterr().out) == "mine_test: latest-rank0.pt"
    assert json.loads((tmp_path / "run" / "eval.json").read_text())["dataset"] == "mine_test"
