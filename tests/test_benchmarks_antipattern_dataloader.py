"""Smoke tests of benchmarks/antipattern.py and benchmarks/dataloader.py in --quick mode (no timing asserted)."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import pytest

BENCHMARKS = Path(__file__).resolve().parents[1] / "benchmarks"


def _load(name: str):
    if str(BENCHMARKS) not in sys.path:
        sys.path.insert(0, str(BENCHMARKS))  # the scripts import their shared harness, benchmarks/_common.py
    spec = importlib.util.spec_from_file_location(f"_bench_{name}", BENCHMARKS / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


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
