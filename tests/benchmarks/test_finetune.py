"""benchmarks/finetune_code.py: its recipes are valid configs of the fine-tuning recipe, and its summary."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import pytest

from composer_dynsample.config.checks import check_config
from composer_dynsample.config.loading import load_config
from tests.benchmarks.helpers import load_benchmark


def _args(**values: object) -> argparse.Namespace:
    defaults = {"batch": 16, "window": 8, "refresh_every": 20, "steps": 60, "train_pairs": 3000}
    return argparse.Namespace(**{**defaults, "test_queries": 1000, "max_length": 128, "threads": 2, **values})


@pytest.fixture(scope="module")
def model_folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from tests.models.folders import save_sentence_folder

    return save_sentence_folder(tmp_path_factory.mktemp("model") / "st", pooling="mean", max_seq_length=24)


@pytest.mark.parametrize("recipe", ["in-batch", "offline", "online"])
def test_each_of_this_project_s_recipes_is_a_valid_config(
    recipe: str, tmp_path: Path, model_folder: Path
) -> None:
    pytest.importorskip("bm25s")  # quality_code, which the benchmark imports, needs it at import
    finetune, report = load_benchmark("finetune_code"), load_benchmark("_finetune_report")
    name = {"in-batch": report.OURS_IN_BATCH, "offline": report.OURS_OFFLINE, "online": report.OURS_ONLINE}
    data = {"train": {"path": str(tmp_path / "train.jsonl")}, "test": {"path": str(tmp_path / "test.jsonl")}}
    overrides = [finetune.data_override(data, 24), *finetune.ours_overrides(name[recipe], _args())]
    cfg = load_config(
        finetune.CONFIG, [f"model.encoder.path={model_folder}", "evaluation.at_start=false", *overrides]
    )
    check_config(cfg)
    if recipe == "in-batch":
        assert cfg.sampler.name == "pk" and cfg.sampler.classes_per_batch == 16
    else:
        assert cfg.sampler.name == "mined_negatives" and cfg.algorithms.embedding_table.warm_start is True
        assert cfg.sampler.pairs_per_batch == 16 and cfg.sampler.negatives_per_anchor == 1
        assert (cfg.sampler.get("max_snapshots"), cfg.sampler.get("refresh_every")) == (
            (1, None) if recipe == "offline" else (None, 20)
        )


def test_the_summary_is_the_mean_and_standard_error_over_seeds() -> None:
    pytest.importorskip("bm25s")
    report = load_benchmark("_finetune_report")
    runs = [
        {
            "seed": seed,
            "s_per_step": 1.0 + seed,
            "peak_rss_mib": 100,
            **dict.fromkeys(report.METRICS, value),
        }
        for seed, value in enumerate([0.5, 0.7])
    ]
    summary = report.summarise(runs)
    assert summary["csn_mrr"] == pytest.approx(0.6) and summary["csn_mrr_se"] == pytest.approx(0.1)
    assert summary["s_per_step"] == 1.5 and summary["peak_rss_mib"] == 100
    text = report.table({report.OURS_IN_BATCH: summary}, [0, 1], vars(_args()))
    assert "| this project, in-batch (InfoNCE) | 0.6000 +- 0.1000 |" in text and "| 1.50 | - | 100 |" in text
    assert "runs with" not in text.splitlines()[0]
    # An --override run says what its runs were given beyond the recipe, in the caption.
    overridden = report.table(
        {report.OURS_IN_BATCH: summary}, [0, 1], vars(_args(override=["model.loss.negatives=passages"]))
    )
    assert "this project's runs with `model.loss.negatives=passages`." in overridden.splitlines()[0]


def _recipe(report, mean: float, se: float, s_per_step: float = 1.0) -> dict:
    return {
        "runs": [{"csn_mrr": mean}] * 3, "s_per_step": s_per_step, "peak_rss_mib": 100.0,
        **{m: mean for m in report.METRICS}, **{f"{m}_se": se for m in report.METRICS},
    }  # fmt: skip


def test_the_goals_compare_recipes_beyond_two_standard_errors_and_report_rewrites_the_table(tmp_path):
    pytest.importorskip("bm25s")
    report = load_benchmark("_finetune_report")
    recipes = {
        report.ZERO_SHOT: _recipe(report, 0.60, 0.0),
        report.ST_IN_BATCH: _recipe(report, 0.700, 0.003, s_per_step=2.0),
        report.OURS_IN_BATCH: _recipe(report, 0.705, 0.003, s_per_step=2.5),
        report.OURS_OFFLINE: _recipe(report, 0.712, 0.003),  # +0.007, 2 SE of the difference 0.0085
        report.OURS_ONLINE: _recipe(report, 0.725, 0.003),
    }
    lines = report.goals(recipes)
    assert lines[0] == "Every fine-tuned recipe beats zero-shot: met."
    verdicts = {line.split(":")[0]: line.rsplit(": ", 1)[1] for line in lines[1:-1]}
    assert verdicts[f"{report.OURS_OFFLINE} - {report.OURS_IN_BATCH}"] == "missed."
    assert verdicts[f"{report.OURS_ONLINE} - {report.OURS_IN_BATCH}"] == "met."
    assert verdicts[f"{report.OURS_ONLINE} - {report.OURS_OFFLINE}"] == "met."
    assert verdicts[f"{report.OURS_IN_BATCH} - {report.ST_IN_BATCH}"] == "met."
    assert lines[-1].startswith("In-batch step, this project / sentence-transformers: 1.25x the time, 1.00x")
    assert report.headline_ratio(recipes) == pytest.approx(0.725 / 0.705)
    stored = {"recipes": recipes, "seeds": [0, 1, 2], "options": vars(_args())}
    (tmp_path / "finetune_code.json").write_text(json.dumps(stored))
    load_benchmark("finetune_code").main(["--report", "--out", str(tmp_path)])
    assert "goal > 2 SE: met" in (tmp_path / "finetune_code.md").read_text()
    assert (tmp_path / "finetune_code.png").stat().st_size > 0
    assert json.loads((tmp_path / "finetune_code.json").read_text())["ratio"] == pytest.approx(0.725 / 0.705)


def test_the_gpu_size_s_commands_are_valid_configs(tmp_path: Path, model_folder: Path) -> None:
    pytest.importorskip("bm25s")
    finetune, report = load_benchmark("finetune_code"), load_benchmark("_finetune_report")
    args = _args(
        batch=128, steps=203, refresh_every=67, eval_batch=256, device="cuda", precision="bf16", max_length=24
    )
    data = {"train": {"path": str(tmp_path / "train.jsonl")}, "test": {"path": str(tmp_path / "test.jsonl")}}
    for recipe in (report.OURS_IN_BATCH, report.OURS_OFFLINE, report.OURS_ONLINE):
        command = finetune.ours_command(recipe, 0, model_folder, data, args, tmp_path / "run")
        cfg = load_config(finetune.CONFIG, command[command.index(str(finetune.CONFIG)) + 1 : -2])
        check_config(cfg)
        assert (cfg.trainer.device, cfg.trainer.precision, cfg.trainer.max_duration) == (
            "gpu",
            "amp_bf16",
            "203ba",
        )
        assert cfg.trainer.save_folder is None and cfg.evaluation.gallery_batch_size == 256
    command = finetune.eval_command(model_folder, data, args, tmp_path / "eval.json")
    cfg = load_config(finetune.CONFIG, command[command.index(str(finetune.CONFIG)) + 1 : -2])
    check_config(cfg)
    assert (cfg.trainer.device, cfg.trainer.precision) == ("gpu", "fp32")  # scored in float32 on the GPU


def test_the_gpu_size_s_step_goal_is_half_sentence_transformers_time_and_a_25_ms_moonshot() -> None:
    report = load_benchmark("_finetune_report")
    recipes = {
        report.ST_IN_BATCH: _recipe(report, 0.700, 0.003, s_per_step=0.060),
        report.OURS_IN_BATCH: _recipe(report, 0.701, 0.003, s_per_step=0.027),
    }
    lines = report.goals(recipes, {"size": "gpu", "precision": "bf16", "batch": 128, "max_length": 128})
    assert lines[-1] == (
        "In-batch step, this project / sentence-transformers, both in bf16 autocast: 0.45x the time (goal <= 0.5x: "
        "met); this project's step 27 ms at 128 pairs x 128 tokens (moonshot <= 25 ms: missed)."
    )
    assert lines[0].endswith("goal within 2 SE: met.")


def test_one_seed_judges_no_goal_of_standard_errors_and_the_caption_counts_the_epochs(tmp_path: Path) -> None:
    report = load_benchmark("_finetune_report")
    one = {
        report.OURS_OFFLINE: {**_recipe(report, 0.8085, 0.0), "runs": [{"seed": 0}]},
        report.OURS_ONLINE: {**_recipe(report, 0.8106, 0.0), "runs": [{"seed": 0}]},
    }
    assert report.goals(one) == [
        f"{report.OURS_ONLINE} - {report.OURS_OFFLINE}: +0.0021; goal > 2 SE: not judged (one seed, no standard "
        "error)."
    ]
    options = {
        **vars(_args(batch=128, train_pairs=41117)),
        "size": "gpu",
        "precision": "bf16",
        "device": "cuda",
    }
    assert "321 steps of 128 pairs (one epoch)" in report.table(one, [0], {**options, "steps": 321})
    assert "963 steps of 128 pairs (3.0 epochs)" in report.table(one, [0], {**options, "steps": 963})
    args = argparse.Namespace(steps=None, refresh_every=None, batch=128, epochs=3)
    load_benchmark("finetune_code").one_epoch(args, 41117)
    assert (args.steps, args.refresh_every, args.train_pairs) == (963, 321, 41117)


@pytest.mark.parametrize("quick", [False, True])
def test_merge_keeps_the_stored_recipes_of_the_same_size_quick_runs_too(tmp_path: Path, quick: bool) -> None:
    finetune, report = load_benchmark("finetune_code"), load_benchmark("_finetune_report")
    options = vars(_args())
    stored = {
        "recipes": {report.OURS_IN_BATCH: _recipe(report, 0.70, 0.003)},
        "seeds": [0, 1, 2],
        "options": options,
    }
    name = "finetune_code_quick" if quick else "finetune_code"
    (tmp_path / f"{name}.json").write_text(json.dumps(stored))
    args = argparse.Namespace(out=tmp_path, name="finetune_code", quick=quick, merge=True)
    new = {
        "recipes": {report.ST_IN_BATCH: _recipe(report, 0.71, 0.003)},
        "options": options,
        "st_mining": None,
    }
    finetune._write(args, new, [0, 1, 2])
    assert list(json.loads((tmp_path / f"{name}.json").read_text())["recipes"]) == [
        report.ST_IN_BATCH, report.OURS_IN_BATCH,
    ]  # fmt: skip
