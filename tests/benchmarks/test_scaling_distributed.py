"""Smoke tests of benchmarks/miners_scaling.py and benchmarks/distributed.py in --quick mode.

Each script runs in a subprocess (miners_scaling forks its memory workers from a server process,
distributed launches its own ranks). No timing is asserted: only that the run succeeds and writes its
.json (with a positive ``ratio``), .md and .png. The all-gather ranks' wait is tested on its own: one
rank that fails ends the other instead of leaving it waiting for its peer.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.benchmarks.helpers import load_benchmark

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.timeout(240)
@pytest.mark.parametrize("name", ["miners_scaling", "distributed"])
def test_quick_run_writes_json_md_png(name: str, tmp_path: Path) -> None:
    out = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / f"{name}.py"), "--quick", "--out", str(tmp_path)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=230,
        check=False,
    )
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    assert "goal:" in out.stdout and "measured:" in out.stdout
    stem = f"{name}_quick"
    data = json.loads((tmp_path / f"{stem}.json").read_text())
    assert isinstance(data["ratio"], (int, float)) and data["ratio"] > 0
    assert data["ratio_meaning"]
    assert "|" in (tmp_path / f"{stem}.md").read_text()
    assert (tmp_path / f"{stem}.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    if name == "miners_scaling":
        miners = {row["miner"] for row in data["rows"]}
        assert miners == {
            "matmul",
            "batch_hard",
            "semi_hard",
            "hard_topk",
            "distance_weighted",
            "multi_similarity",
        }
        assert all(row["peak_mib"] is not None and row["peak_mib"] >= 0 for row in data["rows"])
    else:
        assert {row["world_size"] for row in data["training"]} == {1, 2}
        assert all(row["steps_per_s"] > 0 for row in data["training"])
        assert data["all_gather"] and all(row["gather_autograd_ms"] > 0 for row in data["all_gather"])


def test_a_failed_rank_ends_the_others_at_once(tmp_path: Path) -> None:
    distributed = load_benchmark("distributed")
    logs = [tmp_path / "rank0.log", tmp_path / "rank1.log"]
    scripts = ["import sys; sys.stderr.write('rank 0 broke'); sys.exit(3)", "import time; time.sleep(120)"]
    procs = [
        subprocess.Popen([sys.executable, "-c", script], stderr=log.open("w"))
        for script, log in zip(scripts, logs)
    ]
    start = time.monotonic()
    errors = distributed.wait_for_ranks(procs, logs, timeout=100)
    assert time.monotonic() - start < 30
    assert errors[0] == "rank 0 exited 3: rank 0 broke"
    assert errors[1].startswith("rank 1 exited -9")
