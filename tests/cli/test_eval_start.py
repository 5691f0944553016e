"""The starting model measured: ``eval`` without ``--checkpoint`` and ``train`` with ``evaluation.at_start``."""

from __future__ import annotations

import contextlib
import io
import json
import random
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch
import yaml

pytest.importorskip("tokenizers")

from composer_dynsample.cli.main import main
from composer_dynsample.cli.reporting import format_metrics_table
from tests.cli.helpers import latest_checkpoint, pairs_data
from tests.data.text.helpers import pair_rows, write_jsonl

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")

RANKING = ("mrr", "mrr_at_10", "recall_at_1", "recall_at_5", "ndcg_at_10", "csn_mrr")
BERT = {"model_type": "bert", "hidden_size": 16, "num_hidden_layers": 1, "num_attention_heads": 2,
        "intermediate_size": 32, "max_position_embeddings": 32}  # fmt: skip


def pairs_config(folder: Path) -> dict:
    """A tiny random-init BERT (dropout on: the training draws from torch's global generator) on pairs."""
    return {
        "seed": 3,
        "data": pairs_data(folder),
        "model": {"normalize": True, "encoder": {"name": "transformer", "config": BERT, "embedding_dim": 8},
                  "loss": {"name": "info_nce", "temperature": 0.1}},
        "sampler": {"name": "pk", "classes_per_batch": 8, "samples_per_class": 2},
        "optimizer": {"name": "adamw", "lr": 0.01},
        "evaluation": {"interval": None, "ks": [1, 5]},
        "trainer": {"max_duration": "2ba", "progress_bar": False},
        "loggers": {},
    }  # fmt: skip


def write_config(folder: Path) -> str:
    """:func:`pairs_config` as ``folder/pairs.yaml``."""
    path = folder / "pairs.yaml"
    path.write_text(yaml.safe_dump(pairs_config(folder)))
    return str(path)


def _drawing(function):
    """``function`` that first draws from Python's, numpy's and torch's global generators, as an
    evaluation that used them would: the training must not see it."""

    def wrapper(*args, **kwargs):
        random.random(), np.random.rand(), torch.rand(1)
        if torch.cuda.is_available():
            torch.rand(1, device="cuda")
        return function(*args, **kwargs)

    return wrapper


def _train(args: list[str]) -> str:
    """``composer-dynsample train ARGS``; its standard output."""
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        main(["train", *args])
    return out.getvalue()


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """The same 2-batch run with and without ``evaluation.at_start``, and ``eval`` without a checkpoint.

    The evaluation draws from the global generators (see :func:`_drawing`) in every run here.
    """
    import composer_dynsample.config.evaluation as evaluation

    folder = tmp_path_factory.mktemp("eval_start")
    write_jsonl(folder / "train.jsonl", pair_rows(48, seed=0))
    write_jsonl(folder / "test.jsonl", pair_rows(12, seed=1))
    config = write_config(folder)
    with pytest.MonkeyPatch.context() as patch:
        patch.chdir(folder)  # the default run directory, runs/pairs, lands here
        patch.setattr(evaluation, "final_metrics", _drawing(evaluation.final_metrics))
        table = _train([config, "evaluation.at_start=true", "--run-dir", str(folder / "start")])
        _train([config, "--run-dir", str(folder / "plain")])
        out = io.StringIO()
        with contextlib.redirect_stdout(out):
            main(["eval", config])
    read = lambda path: json.loads(path.read_text())  # noqa: E731
    return {
        "folder": folder,
        "config": config,
        "start": read(folder / "start" / "metrics.json"),
        "plain": read(folder / "plain" / "metrics.json"),
        "eval": read(folder / "runs" / "pairs" / "eval-start.json"),
        "table": table,
        "eval_table": out.getvalue(),
    }


def test_eval_without_a_checkpoint_scores_the_model_train_starts_from(runs):
    at_start, evaluated = runs["start"]["at_start"], runs["eval"]
    assert evaluated["checkpoint"] is None and evaluated["dataset"] == runs["start"]["dataset"]
    assert set(at_start) == {*RANKING, "queries_without_positive", "num_queries"}
    for key in (*RANKING, "num_queries"):
        assert evaluated[key] == pytest.approx(at_start[key], abs=1e-6), key
    assert at_start["mrr"] != pytest.approx(runs["start"]["mrr"], abs=1e-6)  # training changed the model
    # Only the json: no checkpoint folder, nothing else in the default run directory.
    assert sorted(path.name for path in (runs["folder"] / "runs" / "pairs").iterdir()) == ["eval-start.json"]
    assert "the model as built (no checkpoint)" in runs["eval_table"] and "MRR@10" in runs["eval_table"]


def test_at_start_leaves_the_training_as_it_was(runs):
    start, plain = runs["start"], runs["plain"]
    assert plain["at_start"] is None and plain["at_start_time_s"] is None and start["at_start_time_s"] >= 0
    for key in (*RANKING, "batches"):
        assert start[key] == plain[key], key  # bit-identical, not approximately
    weights = [
        torch.load(latest_checkpoint(runs["folder"] / name), weights_only=False)["state"]["model"]
        for name in ("start", "plain")
    ]
    assert list(weights[0]) == list(weights[1])
    for name, tensor in weights[0].items():
        assert torch.equal(tensor, weights[1][name]), name


def test_the_table_shows_the_starting_model_beside_the_final_one(runs):
    lines = runs["table"].splitlines()
    header = next(line for line in lines if line.startswith("metric"))
    assert header.split() == ["metric", "at", "start", "final"]
    row = next(line for line in lines if line.startswith("MRR@10"))
    assert row.split()[-2:] == [
        f"{runs['start']['at_start']['mrr_at_10']:.4f}",
        f"{runs['start']['mrr_at_10']:.4f}",
    ]


def test_a_resumed_run_reports_the_start_it_recorded_without_scoring_again(runs, tmp_path, monkeypatch):
    import composer_dynsample.config.evaluation as evaluation

    calls = []
    real = evaluation.final_metrics

    def counted(*args, **kwargs):
        calls.append(1)
        return real(*args, **kwargs)

    monkeypatch.setattr(evaluation, "final_metrics", counted)
    run_dir = Path(shutil.copytree(runs["folder"] / "start", tmp_path / "start"))
    resume = [f"trainer.load_path={latest_checkpoint(run_dir)}", "trainer.max_duration=3ba"]
    _train([runs["config"], "evaluation.at_start=true", *resume, "--run-dir", str(run_dir), "--quiet"])
    metrics = json.loads((run_dir / "metrics.json").read_text())
    assert len(calls) == 1 and metrics["resumed_from_batch"] == 2 and metrics["batches"] == 3  # the final one
    assert metrics["at_start"] == runs["start"]["at_start"] and metrics["at_start_time_s"] is None


def test_format_metrics_table_with_a_start_column():
    final = {"mrr": 0.75, "recall_at_1": float("nan"), "queries_without_positive": 1, "num_queries": 4}
    table = format_metrics_table(final, title="t", start={"mrr": 0.5}).splitlines()
    assert table[1:] == [
        "metric    at start   final",
        "--------  --------  ------",
        "MRR         0.5000  0.7500",
        "Recall@1       n/a     n/a",
        "1 of 4 queries have no item of their class in the gallery: every metric leaves them out.",
    ]


def test_eval_help_and_a_missing_config_need_no_checkpoint(tmp_path, capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(["eval", "--help"])
    assert exit_info.value.code == 0 and "Without --checkpoint" in capsys.readouterr().out
    with pytest.raises(SystemExit) as exit_info:
        main(["eval", str(tmp_path / "missing.yaml")])
    assert exit_info.value.code == 2 and "missing.yaml" in capsys.readouterr().err
    with pytest.raises(SystemExit) as exit_info:
        main(["embed", str(tmp_path / "missing.yaml"), "--out", str(tmp_path / "e.npz")])
    assert exit_info.value.code == 2 and "--checkpoint" in capsys.readouterr().err  # embed still needs one


def test_an_at_start_value_that_is_not_a_boolean_is_one_line(runs, capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(["train", runs["config"], "evaluation.at_start=often", "--run-dir", str(runs["folder"] / "x")])
    assert exit_info.value.code == 2
    assert "evaluation.at_start must be of type bool" in capsys.readouterr().err


def test_digits_eval_without_a_checkpoint_equals_train_at_start(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    config = str(Path(__file__).resolve().parents[2] / "yamls" / "digits_quick.yaml")
    quick = ["trainer.max_duration=1ba", "evaluation.interval=null"]
    _train([config, *quick, "evaluation.at_start=true", "--run-dir", str(tmp_path / "run"), "--quiet"])
    out = tmp_path / "start.json"
    with contextlib.redirect_stdout(io.StringIO()):
        main(["eval", config, *quick, "--out", str(out)])
    at_start, evaluated = (
        json.loads((tmp_path / "run" / "metrics.json").read_text())["at_start"],
        json.loads(out.read_text()),
    )
    assert {key for key in at_start if key.startswith("recall_at_")} and "map_at_r" in at_start
    for key, value in at_start.items():
        assert evaluated[key] == pytest.approx(value, abs=1e-6), key
    assert not (tmp_path / "runs").exists()  # with --out nothing is written in the run directory


@pytest.mark.world_size(2)
def test_every_rank_scores_the_start_and_rank_zero_writes():
    """On 2 ranks: every rank scores the same starting model, equal to ``eval`` without a checkpoint;
    the training is the same as without ``at_start``. Run with ``bash tests/run_distributed.sh 2``."""
    from composer.utils import dist

    from composer_dynsample.cli.commands import evaluate, train
    from tests.distributed._helpers import shared_tmp_dir

    folder = shared_tmp_dir(prefix="dynsample-eval-start-")
    if dist.get_global_rank() == 0:
        write_jsonl(folder / "train.jsonl", pair_rows(64, seed=0))
        write_jsonl(folder / "test.jsonl", pair_rows(13, seed=1))
    dist.barrier()
    config = pairs_config(folder)
    with_start = train(
        {**config, "evaluation": {**config["evaluation"], "at_start": True}}, run_dir=folder / "a"
    )
    without = train(config, run_dir=folder / "b")
    evaluated = evaluate(config, out=folder / "start.json")
    every_rank = dist.all_gather_object(with_start["at_start"])
    assert every_rank[0] == every_rank[1], "the ranks disagree on the starting model's metrics"
    for key in RANKING:
        assert evaluated[key] == pytest.approx(with_start["at_start"][key], abs=1e-6), key
        assert with_start[key] == without[key], key
    if dist.get_global_rank() == 0:
        written = json.loads((folder / "a" / "metrics.json").read_text())
        assert written["at_start"] == with_start["at_start"] and written["world_size"] == 2
        assert json.loads((folder / "start.json").read_text())["checkpoint"] is None
