"""benchmarks/threads.py: the settings it compares, and a --quick smoke run (no timing asserted)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.benchmarks.helpers import load_benchmark

ROOT = Path(__file__).resolve().parents[2]


def _threads_module():
    return load_benchmark("threads")


def test_one_thread_is_always_measured_as_the_baseline() -> None:
    threads = _threads_module()
    assert threads.thread_settings(None, 2) == ["1", "2", None]
    assert threads.thread_settings(None, 8) == ["1", "2", "8", None]
    assert threads.thread_settings([4, 2], 8) == ["1", "2", "4", None]


def test_thread_counts_below_one_are_refused() -> None:
    with pytest.raises(ValueError, match=r"--threads must be integers >= 1, got \[0\]"):
        _threads_module().thread_settings([0], 2)


@pytest.mark.timeout(240)
def test_quick_run_writes_json_and_md(tmp_path: Path) -> None:
    command = [sys.executable, str(ROOT / "benchmarks" / "threads.py"), "--quick", "--threads", "1"]
    out = subprocess.run(
        [*command, "--out", str(tmp_path)], cwd=ROOT, capture_output=True, text=True, timeout=230
    )
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    data = json.loads((tmp_path / "threads_quick.json").read_text())
    assert [row["omp_num_threads"] for row in data["rows"]] == ["1", "unset (the CLI's choice)"]
    assert data["ratio"] > 0 and all(row["median_fit_s"] > 0 for row in data["rows"])
    assert "| OMP_NUM_THREADS |" in (tmp_path / "threads_quick.md").read_text()
