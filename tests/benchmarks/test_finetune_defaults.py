"""benchmarks/finetune_defaults.py and benchmarks/_corpora.py: the gathered table's paired differences, the
commands a variant runs, and the training subset of whole queries."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.benchmarks.helpers import load_benchmark

pytest.importorskip("bm25s")  # finetune_defaults imports _finetune_report, whose harness imports quality_code


def _stored(folder: Path, stem: str, recipes: dict[str, list[float]]) -> None:
    runs = {
        name: [{"seed": seed, "csn_mrr": value} for seed, value in enumerate(values)]
        for name, values in recipes.items()
    }
    summary = {
        name: {
            "runs": entries,
            "csn_mrr": sum(v["csn_mrr"] for v in entries) / len(entries),
            "csn_mrr_se": 0.001,
        }
        for name, entries in runs.items()
    }
    (folder / f"{stem}.json").write_text(
        json.dumps({"recipes": summary, "data": {"corpus_sha256": {"train.jsonl": "x"}}})
    )


def test_the_table_pairs_a_variant_with_the_plain_recipe_seed_by_seed(tmp_path, monkeypatch):
    defaults = load_benchmark("finetune_defaults")
    report = load_benchmark("_finetune_report")
    monkeypatch.setattr(defaults, "FOLDER", tmp_path)
    ours, st = report.OURS_IN_BATCH, report.ST_IN_BATCH
    _stored(tmp_path, "code_split1_base", {ours: [0.70, 0.72, 0.71], st: [0.71, 0.71, 0.71]})
    _stored(tmp_path, "code_split1_clip", {ours: [0.71, 0.73, 0.72]})  # +0.01 on every seed
    result, text = defaults.gather(["code:1"], quick=False)
    assert result["corpora"]["code:1"]["variants"]["clip"][0] == pytest.approx(0.72)
    clip_row = next(line for line in text.splitlines() if "gradient clipping" in line)
    assert "+0.0100 +- 0.0000" in clip_row  # the paired difference has no spread; the unpaired one would


def test_a_variant_runs_finetune_code_with_its_overrides(monkeypatch):
    defaults = load_benchmark("finetune_defaults")
    calls = []
    monkeypatch.setattr(defaults.subprocess, "run", lambda command, check: calls.append(command))
    defaults.run("code:1", "st_defaults", [0, 1, 2], quick=False)
    defaults.run("docstring", "base", [0], quick=True, keep_st=True)
    first, second = calls
    assert first[first.index("--corpus") + 1 : first.index("--corpus") + 4] == ["code", "--split-seed", "1"]
    assert first[first.index("--override") + 1 :] == list(defaults.VARIANTS["st_defaults"][1])
    assert (
        "--merge" in second
        and "--quick" in second
        and len(second[second.index("--recipes") + 1 : second.index("--seeds")]) == 1
    )


def test_the_training_subset_draws_whole_queries():
    corpora = load_benchmark("_corpora")
    rows = [
        {"anchor": f"query {i // 3 if i < 30 else i}"} for i in range(100)
    ]  # 10 queries of 3 pairs, 70 alone
    chosen = corpora._subset(rows, 40)
    assert len(chosen) == 40 and chosen == sorted(chosen)
    by_query: dict[str, int] = {}
    for index in chosen:
        by_query[rows[index]["anchor"]] = by_query.get(rows[index]["anchor"], 0) + 1
    shared = [count for query, count in by_query.items() if int(query.split()[1]) < 10]
    assert sum(count != 3 for count in shared) <= 1  # whole groups (the last one drawn may be cut at 40)
    assert corpora._subset(rows, None) == list(range(100)) and corpora._subset(rows, 40) == chosen


def test_the_mined_variant_trains_both_tools_mined_recipes_and_compares_them(tmp_path, monkeypatch):
    defaults = load_benchmark("finetune_defaults")
    report = load_benchmark("_finetune_report")
    calls = []
    monkeypatch.setattr(defaults.subprocess, "run", lambda command, check: calls.append(command))
    defaults.run("docstring", "mined", [0, 1, 2], quick=False)
    (command,) = calls
    assert command[command.index("--recipes") + 1 : command.index("--seeds")] == [
        report.OURS_OFFLINE,
        report.ST_MINED,
    ]
    # Ours pinned to the recipe it was measured with (clipping, NT-Xent), whatever the YAML holds since.
    assert command[command.index("--override") + 1 :] == [*defaults._PLAIN, defaults._CLIP]
    monkeypatch.setattr(defaults, "FOLDER", tmp_path)
    _stored(tmp_path, "docstring_base", {report.OURS_IN_BATCH: [0.6, 0.6], report.ST_IN_BATCH: [0.6, 0.6]})
    _stored(tmp_path, "docstring_mined", {report.OURS_OFFLINE: [0.65, 0.67], report.ST_MINED: [0.64, 0.64]})
    result, text = defaults.gather(["docstring"], quick=False)
    assert result["corpora"]["docstring"]["variants"]["mined"][0] == pytest.approx(0.66)
    ours_row = next(line for line in text.splitlines() if report.OURS_OFFLINE in line)
    assert "+0.0200 +- " in ours_row  # against sentence-transformers' mined recipe, not its in-batch one


def test_the_mined_symmetric_variant_is_paired_with_the_mined_run_and_compared_with_theirs(
    tmp_path, monkeypatch
):
    defaults = load_benchmark("finetune_defaults")
    report = load_benchmark("_finetune_report")
    monkeypatch.setattr(defaults, "FOLDER", tmp_path)
    ours, st = report.OURS_IN_BATCH, report.ST_IN_BATCH
    _stored(tmp_path, "code_base", {ours: [0.70, 0.72, 0.71], st: [0.71, 0.71, 0.71]})
    _stored(tmp_path, "code_mined", {report.OURS_OFFLINE: [0.74, 0.75, 0.76], report.ST_MINED: [0.75] * 3})
    _stored(tmp_path, "code_mined_symmetric", {report.OURS_OFFLINE: [0.76, 0.77, 0.78]})  # +0.02 each seed
    result, text = defaults.gather(["code"], quick=False)
    assert result["corpora"]["code"]["variants"]["mined_symmetric"][0] == pytest.approx(0.77)
    row = next(line for line in text.splitlines() if "mined once, clipping and the loss both ways" in line)
    assert "+0.0200 +- 0.0000 (against mined once)" in row and row.rstrip(" |").endswith(
        "0.0028"
    )  # 2 SE of two


def test_every_variant_pins_the_recipe_it_changes():
    """A stored variant is rebuilt by its command whatever the YAML adopts later: each variant's overrides
    start from the pinned recipe (no clipping, NT-Xent) and name everything it changes."""
    defaults = load_benchmark("finetune_defaults")
    assert defaults._PLAIN == (
        "algorithms.gradient_clipping=null", "model.loss.negatives=pool", "model.loss.symmetric=false"
    )  # fmt: skip
    for name, (_, overrides) in defaults.VARIANTS.items():
        assert overrides[: len(defaults._PLAIN)] == defaults._PLAIN, name


def test_running_one_corpus_keeps_every_stored_corpus_in_the_gathered_table(tmp_path, monkeypatch):
    """``--corpora docstring`` runs that corpus alone; the table it writes is still the whole comparison."""
    defaults = load_benchmark("finetune_defaults")
    report = load_benchmark("_finetune_report")
    monkeypatch.setattr(defaults, "FOLDER", tmp_path)
    ours, st = report.OURS_IN_BATCH, report.ST_IN_BATCH
    for corpus in ("docstring", "code"):
        _stored(tmp_path, f"{corpus}_base", {ours: [0.70, 0.72, 0.71], st: [0.71, 0.71, 0.71]})
    defaults.main(["--corpora", "docstring", "--report"])
    gathered = json.loads((tmp_path / "finetune_defaults.json").read_text())
    assert set(gathered["corpora"]) == {"docstring", "code"}
