"""``python -m benchmarks``: every benchmark listed with its question, one run by name, a wrong name refused."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _suite(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "benchmarks", *args], cwd=ROOT, capture_output=True, text=True, timeout=120
    )


def test_the_listing_names_every_benchmark_with_its_question():
    listed = _suite()
    assert listed.returncode == 0, listed.stderr
    lines = listed.stdout.splitlines()[1:]
    names = {line.split()[0] for line in lines}
    scripts = {path.stem for path in (ROOT / "benchmarks").glob("[a-z]*.py")} - {"report"}
    assert names == scripts
    assert all(line.rstrip().endswith((".", "?")) for line in lines)  # each a question or a sentence
    finetune = next(line for line in lines if line.startswith("finetune_code "))
    assert " min " in finetune  # the stored run's own total_s


def test_a_benchmark_runs_by_name_and_a_wrong_name_is_one_line():
    helped = _suite("threads", "--help")
    assert helped.returncode == 0 and "--quick" in helped.stdout
    wrong = _suite("nosuch")
    assert wrong.returncode == 2 and wrong.stderr.strip().splitlines() == [
        "python -m benchmarks: no benchmark 'nosuch'; run python -m benchmarks to list them."
    ]
