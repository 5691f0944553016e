"""benchmarks/finetune_ablation.py: every variant is a valid config that changes what it names, and the gathered
table compares the best online variant with the best offline one beyond two standard errors."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import pytest

from composer_dynsample.config.checks import check_config
from composer_dynsample.config.loading import load_config
from tests.benchmarks.helpers import load_benchmark

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")


@pytest.fixture(scope="module")
def model_folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from tests.models.folders import save_sentence_folder

    return save_sentence_folder(tmp_path_factory.mktemp("model") / "st", pooling="mean", max_seq_length=24)


def test_every_variant_is_a_valid_config_of_the_switch_it_names(tmp_path: Path, model_folder: Path) -> None:
    pytest.importorskip("bm25s")  # finetune_code imports quality_code, which needs it
    ablation, finetune = load_benchmark("finetune_ablation"), load_benchmark("finetune_code")
    args = argparse.Namespace(batch=16, window=8, refresh_every=20)
    data = {"train": {"path": str(tmp_path / "train.jsonl")}, "test": {"path": str(tmp_path / "test.jsonl")}}
    built = {}
    for name, variant in ablation.VARIANTS.items():
        overrides = [o.replace("{model}", str(model_folder)) for o in variant.overrides]
        cfg = load_config(
            finetune.CONFIG,
            [
                f"model.encoder.path={model_folder}", "evaluation.at_start=false", finetune.data_override(data, 24),
                *finetune.ours_overrides(variant.recipe, args), *overrides,
            ],
        )  # fmt: skip
        check_config(cfg)
        built[name] = cfg
        if variant.recipe == ablation.IN_BATCH:  # no mining: the batch's passages are the negatives
            assert cfg.sampler.name == "pk" and "embedding_table" not in cfg.algorithms, name
            continue
        offline = variant.recipe == ablation.OFFLINE
        assert (cfg.sampler.get("max_snapshots") == 1) is offline, name
        assert cfg.algorithms.embedding_table.warm_start is True, name
    assert built["online_softmax"].sampler.sampling == "softmax"
    assert built["online_margin_005"].sampler.max_relative_similarity == 0.95
    assert built["online_fresh"].algorithms.embedding_table.fresh_upcoming is True
    assert built["online_stalest"].algorithms.embedding_table.fresh_rows_per_step == 64
    assert (built["online_window"].sampler.skip_top, built["online_window"].sampler.window) == (10, 40)
    for name in ("online_frozen", "offline_frozen"):
        encoder = built[name].model.encoder
        assert encoder.name == "two_tower" and encoder.frozen_passages is True
        assert encoder.query_encoder.path == encoder.passage_encoder.path == str(model_folder)
    assert built["online_frozen"].algorithms.embedding_table.fresh_upcoming is True
    assert list(built["in_batch_matryoshka"].model.loss.matryoshka_dims) == [384, 256, 128, 64]
    assert "matryoshka_dims" not in built["in_batch"].model.loss
    assert list(built["in_batch"].evaluation.matryoshka_dims) == [384, 256, 128, 64]


def _stored(folder: Path, stem: str, recipe: str, values: list[float]) -> None:
    report = load_benchmark("_finetune_report")
    runs = [{"seed": seed, **dict.fromkeys(report.METRICS, value)} for seed, value in enumerate(values)]
    summary = report.summarise(runs)
    result = {"recipes": {recipe: summary}, "data": {"corpus_sha256": {"train.jsonl": "x"}}, "options": {}}
    folder.mkdir(parents=True, exist_ok=True)
    (folder / f"{stem}.json").write_text(json.dumps(result))


def test_the_gathered_table_reports_the_best_online_against_the_best_offline(tmp_path: Path) -> None:
    ablation = load_benchmark("finetune_ablation")
    variants = ablation.VARIANTS
    # --out is the results folder; the variants and the gathered table live in its ablations/finetune_recipe.
    folder = tmp_path / "ablations" / "finetune_recipe"
    _stored(folder, variants["offline"].stem, ablation.OFFLINE, [0.690, 0.691, 0.689])
    _stored(folder, variants["offline_softmax"].stem, ablation.OFFLINE, [0.692, 0.693, 0.691])
    _stored(folder, variants["online"].stem, ablation.ONLINE, [0.694, 0.695, 0.693])
    _stored(folder, variants["online_fresh"].stem, ablation.ONLINE, [0.700, 0.701, 0.699])
    ablation.main(["--out", str(tmp_path), "--report"])
    result = json.loads((folder / "finetune_code_ablation.json").read_text())
    assert result["best"] == {ablation.ONLINE: "online_fresh", ablation.OFFLINE: "offline_softmax"}
    (goal,) = result["goals"]
    assert goal["verdict"] == "met" and goal["value"].startswith("+0.0080")  # 2 SE: 2 x sqrt(2) x 0.000577
    table = (folder / "finetune_code_ablation.md").read_text()
    assert "| online_fresh | online |" in table and "+0.0060 (beyond 2 SE" in table  # against plain online
    assert (folder / "finetune_code_ablation.png").stat().st_size > 0
    _stored(folder, variants["offline_softmax"].stem, ablation.OFFLINE, [0.698, 0.703, 0.700])
    ablation.main(["--out", str(tmp_path), "--report"])
    (goal,) = json.loads((folder / "finetune_code_ablation.json").read_text())["goals"]
    assert goal["verdict"] == "missed"
    # Another length: its own stems (STEM_sN) and its own gathered table.
    _stored(folder, variants["online"].stem + "_s187", ablation.ONLINE, [0.70, 0.71, 0.70])
    ablation.main(["--out", str(tmp_path), "--report", "--steps", "187"])
    longer = json.loads((folder / "finetune_code_ablation_s187.json").read_text())
    assert list(longer["variants"]) == ["online"] and longer["variants"]["online"]["stem"].endswith("_s187")


def test_a_run_s_mining_record_is_its_snapshots_false_negative_shares_and_drift() -> None:
    report = load_benchmark("_finetune_report")
    snapshot = {"kept": 100.0, "above_positive": 20.0, "duplicate": 1.0, "same_query": 0.0, "margin": 3.0}
    metrics = {
        "embedding_table": [
            {"rows_encoded": 10, "fresh_rows_measured": 4.0, "fresh_drift": 0.1, "sampler": {"snapshots": [snapshot]}},
            {"rows_encoded": 5, "fresh_rows_measured": 12.0, "fresh_drift": 0.02,
             "sampler": {"snapshots": [{**snapshot, "above_positive": 10.0}]}},
        ]
    }  # fmt: skip
    record = report.mining_record(metrics)
    assert record["above_positive"] == [0.2, 0.1] and record["snapshots"] == 2 and record["margin"] == 6
    assert record["rows_encoded"] == 15 and record["fresh_drift"] == pytest.approx((0.4 + 0.24) / 16)
    assert report.mining_record({"embedding_table": None}) is None


def test_the_in_batch_variants_report_their_metrics_at_each_matryoshka_dimension(tmp_path: Path) -> None:
    ablation, report = load_benchmark("finetune_ablation"), load_benchmark("_finetune_report")
    for name, full, small in (("in_batch", 0.70, 0.60), ("in_batch_matryoshka", 0.69, 0.66)):
        metrics = [
            {
                **{key.replace("@", "_at_"): full for key in report.METRICS},
                "matryoshka": {
                    dim: {"csn_mrr": small + 0.01 * seed, "mrr_at_10": small - 0.1} for dim in ("256", "64")
                },
            }
            for seed in range(3)
        ]
        runs = [{"seed": seed, **report.scores(values)} for seed, values in enumerate(metrics)]
        assert runs[0]["dims"]["64"] == {"csn_mrr": small, "mrr@10": pytest.approx(small - 0.1)}
        summary = report.summarise(runs)
        assert summary["dims"]["64"]["csn_mrr"] == pytest.approx(small + 0.01)
        assert summary["dims"]["64"]["csn_mrr_se"] == pytest.approx(0.01 / 3**0.5)
        result = {
            "recipes": {ablation.IN_BATCH: summary},
            "data": {"corpus_sha256": {"t": "x"}},
            "options": {},
        }
        folder = tmp_path / "ablations" / "finetune_recipe"
        folder.mkdir(parents=True, exist_ok=True)
        (folder / f"{ablation.VARIANTS[name].stem}.json").write_text(json.dumps(result))
    ablation.main(["--out", str(tmp_path), "--report", "--variants", "in_batch", "in_batch_matryoshka"])
    table = (tmp_path / "ablations" / "finetune_recipe" / "finetune_code_ablation.md").read_text()
    assert "| in_batch_matryoshka | in-batch | Matryoshka InfoNCE at 384/256/128/64 |" in table
    row = next(line for line in table.splitlines() if line.startswith("| in_batch_matryoshka |"))
    assert "0.6700 +- 0.0058" in row and "0.5600 +- 0.0000" in row  # CSN MRR and MRR@10 at 64 dims
    assert "-0.0100 (beyond 2 SE 0.0000)" in row  # against plain in-batch, its recipe's baseline
    assert "CSN MRR at full | CSN MRR at 256 | CSN MRR at 64 | MRR@10 at full" in table
    # A run without dimensions has no per-dimension entry, and its summary none.
    plain = report.summarise(
        [{"seed": 0, **report.scores({k.replace("@", "_at_"): 0.5 for k in report.METRICS})}]
    )
    assert "dims" not in plain and report.dims_table({"x": plain}) == ""
