"""Smoke tests of benchmarks/antipattern.py and benchmarks/dataloader.py in --quick mode (no timing asserted)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.benchmarks.helpers import load_benchmark

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"


def _load(name: str):
    return load_benchmark(name)


@pytest.mark.parametrize("name", ["antipattern", "dataloader"])
def test_quick_run_writes_json_md_png(name: str, tmp_path: Path) -> None:
    result = _load(name).main(["--quick", "--out", str(tmp_path)])
    stem = f"{name}_quick"
    data = json.loads((tmp_path / f"{stem}.json").read_text())
    assert isinstance(data["ratio"], (int, float)) and data["ratio"] > 0
    assert data["ratio"] == result["ratio"]
    assert (tmp_path / f"{stem}.md").read_text().startswith("|")
    assert (tmp_path / f"{stem}.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"

    if name == "antipattern":
        stale = data["staleness"]
        assert len(stale["staleness_per_step"]) == stale["steps"] > 0
        assert all(value >= 0 for value in stale["staleness_per_step"])
