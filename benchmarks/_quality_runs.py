"""One training run of the quality benchmarks: a ``composer-dynsample train`` process per (config, seed).

``quality.py`` and ``quality_glyphs.py`` keep :func:`run_one`'s row of retrieval metrics;
``quality_code.py`` and ``quality_mined.py`` read the run's ``metrics.json`` from :func:`run_command`.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def run_command(
    config: str, seed: int, run_dir: Path, overrides: list[str], threads: int
) -> tuple[dict, float]:
    """Train ``config`` with ``seed=S`` in a fresh process; its ``metrics.json`` and the process's seconds."""
    env = {**os.environ, "OMP_NUM_THREADS": str(threads), "MKL_NUM_THREADS": str(threads)}
    command = [
        sys.executable,
        "-m",
        "composer_dynsample",
        "train",
        str(ROOT / config),
        f"seed={seed}",
        "trainer.progress_bar=false",
        *overrides,
        "--run-dir",
        str(run_dir),
    ]
    start = time.perf_counter()
    completed = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True)
    seconds = time.perf_counter() - start
    if completed.returncode != 0:
        sys.stderr.write(completed.stdout[-4000:] + completed.stderr[-4000:])
        raise RuntimeError(f"{config} seed {seed} failed with exit code {completed.returncode}")
    return json.loads((run_dir / "metrics.json").read_text()), seconds


def run_one(config: str, seed: int, run_dir: Path, overrides: list[str], threads: int) -> dict:
    """:func:`run_command`'s run as a row: the seed, Recall@1/5, MAP@R, R-precision, the seconds and epochs."""
    metrics, seconds = run_command(config, seed, run_dir, overrides, threads)
    return {
        "seed": seed,
        "recall_at_1": metrics["recall_at_1"],
        "recall_at_5": metrics["recall_at_5"],
        "map_at_r": metrics["map_at_r"],
        "r_precision": metrics["r_precision"],
        "fit_s": metrics["wall_time_s"],
        "process_s": round(seconds, 2),
        "epochs": metrics["epochs"],
    }
