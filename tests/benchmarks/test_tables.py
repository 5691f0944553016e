"""The benchmarks' table builders rewrite the committed ``results/NAME.md`` from ``results/NAME.json``.

report.py and the README read both files, so a refactor of a script's writer must keep their format:
each table function, given the stored result, reproduces the stored markdown byte for byte.
"""

from __future__ import annotations

import json
from pathlib import Path
from types import ModuleType

from tests.benchmarks.helpers import load_benchmark

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"
RESULTS = BENCHMARKS / "results"


def _load(name: str) -> ModuleType:
    return load_benchmark(name)


def _stored(name: str) -> tuple[dict, str]:
    return json.loads((RESULTS / f"{name}.json").read_text()), (RESULTS / f"{name}.md").read_text()


def test_miners_tables_and_goals_match_the_stored_results() -> None:
    miners = _load("miners")
    for name in ("miners", "ablations/miner_threads/miners_threads1"):
        result, markdown = _stored(name)
        assert miners.tables(result["rows"], result["memory"], result["goals"]) + "\n" == markdown
        assert miners.goal_rows(result["rows"], result["memory"]) == result["goals"]


def test_miners_scaling_tables_and_summary_match_the_stored_results() -> None:
    scaling = _load("miners_scaling")
    result, markdown = _stored("miners_scaling")
    goal, measured, worst = scaling.summary(
        result["rows"], result["config"]["batches"][-1], result["config"]["pools"][-1]
    )
    assert (goal, measured, worst["over_matmul"]) == (result["goal"], result["measured"], result["ratio"])
    assert f"{scaling.tables(result['rows'])}\n\ngoal: {goal}\n\nmeasured: {measured}\n" == markdown


def test_dataloader_table_matches_the_stored_results() -> None:
    result, markdown = _stored("dataloader")
    assert markdown.startswith(_load("dataloader").ratio_table(result["results"]) + "\n\nSteady state: ")


def test_distributed_tables_and_summary_match_the_stored_results() -> None:
    distributed = _load("distributed")
    result, markdown = _stored("distributed")
    rounds = int(markdown.split("median of ")[1].split()[0])
    gather = {"rows": result["all_gather"], "rounds": rounds}
    table = distributed.tables(result["training"], gather, result["caption"], result["config"]["quick"])
    goal, measured, ratio = distributed.summary(result["training"], result["all_gather"])
    assert (goal, measured, round(ratio, 3)) == (result["goal"], result["measured"], result["ratio"])
    assert f"{table}\n\ngoal: {goal}\n\nmeasured: {measured}\n" == markdown


def test_threads_table_matches_the_stored_results() -> None:
    result, markdown = _stored("threads")
    assert markdown == f"{_load('threads').threads_table(result['rows'])}\n\nmeasured: {result['measured']}\n"


def test_chunking_table_matches_the_stored_results() -> None:
    chunking = _load("chunking")
    result, markdown = _stored("chunking")
    assert markdown == "\n\n".join([chunking.table(result["rows"]), f"measured: {result['measured']}"]) + "\n"
