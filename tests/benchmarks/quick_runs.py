"""A benchmark script's ``--quick`` smoke run, as the tests start it: a subprocess from the repository root."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def run_quick(script: str, out: Path, *, timeout: float) -> subprocess.CompletedProcess:
    """Run ``benchmarks/SCRIPT.py --quick --out OUT``; it must exit 0 (else its output's tail is shown)."""
    command = [sys.executable, str(ROOT / "benchmarks" / f"{script}.py"), "--quick", "--out", str(out)]
    done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=timeout)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return done
