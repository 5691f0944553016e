"""benchmarks/text_loader.py: its goals, the tokenizer's thread pool it records, and a --quick smoke run."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.benchmarks.helpers import load_benchmark
from tests.benchmarks.quick_runs import run_quick


def _text_loader():
    return load_benchmark("text_loader")


def _figures(tokenize_s: float, ratio: float, anonymous_mib: float) -> tuple[dict, dict, dict]:
    code_search = {"tokenize_s": tokenize_s, "reread_s": 0.01}
    steps = {"step_per_dataloader_batch": ratio, "step_per_collate": 2 * ratio}
    memory = {"pairs": 1000, "tokens_per_text": 128, "open_anon_mib": anonymous_mib, "collate_anon_mib": 0.0}
    return code_search, steps, memory


def test_goals_hold_strictly_below_their_time_and_memory_bounds_and_at_the_ratio_bound() -> None:
    goals = _text_loader().goals(*_figures(tokenize_s=10.0, ratio=10.0, anonymous_mib=199.9))
    met = {goal["key"]: goal["met"] for goal in goals}
    assert met == {"tokenize": False, "reread": True, "dataloader": True, "collate": True, "memory": True}
    assert [goal["bound"] for goal in goals] == ["< 10 s", "< 1 s", ">= 10x", ">= 10x", "< 200 MiB"]
    goals = _text_loader().goals(*_figures(tokenize_s=9.99, ratio=9.9, anonymous_mib=200.0))
    met = {goal["key"]: goal["met"] for goal in goals}
    assert met == {"tokenize": True, "reread": True, "dataloader": False, "collate": True, "memory": False}


@pytest.mark.parametrize(
    ("environment", "threads"),
    [
        ({}, 2),
        ({"TOKENIZERS_PARALLELISM": "false"}, 1),
        ({"TOKENIZERS_PARALLELISM": "true", "RAYON_NUM_THREADS": "3"}, 3),
    ],
)
def test_the_tokenizer_thread_pool_follows_its_environment(
    monkeypatch: pytest.MonkeyPatch, environment: dict[str, str], threads: int
) -> None:
    monkeypatch.delenv("TOKENIZERS_PARALLELISM", raising=False)
    monkeypatch.delenv("RAYON_NUM_THREADS", raising=False)
    monkeypatch.setattr("os.sched_getaffinity", lambda pid: {0, 1}, raising=False)
    for key, value in environment.items():
        monkeypatch.setenv(key, value)
    pool = _text_loader().tokenizer_threads()
    assert pool["threads"] == threads
    assert pool["TOKENIZERS_PARALLELISM"] == environment.get("TOKENIZERS_PARALLELISM", "unset")


@pytest.mark.timeout(240)
def test_quick_run_writes_json_and_md(tmp_path: Path) -> None:
    run_quick("text_loader", tmp_path, timeout=230)
    data = json.loads((tmp_path / "text_loader_quick.json").read_text())
    steps, code_search = data["loader_vs_step"], data["code_search"]
    assert data["ratio"] == steps["step_per_dataloader_batch"] > 0
    # P follows the corpus (the standard library of the running Python), never the interpreter's release
    classes, per_class = (int(part) for part in steps["batch"].split(" x "))
    assert 2 <= classes <= 256 and per_class == 2 and classes <= code_search["pairs"] // 2
    assert (steps["rows"], steps["torch_threads"]) == (2 * classes, 1)
    assert {goal["key"] for goal in data["goals"]} == {
        "tokenize",
        "reread",
        "dataloader",
        "collate",
        "memory",
    }
    assert code_search["texts"] > 256 and code_search["tokens"] > code_search["texts"]
    assert code_search["tokenize_s"] > 0 and code_search["reread_s"] > 0
    table = (tmp_path / "text_loader_quick.md").read_text()
    assert "| measure | value | goal |" in table and "training step / DataLoader batch" in table
