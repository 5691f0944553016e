"""The one way the tests import a benchmark script.

The scripts in ``benchmarks/`` import their shared harness (``_common``) and each other by name, as when
run from that folder; so the folder goes on ``sys.path`` (at the end: nothing installed is shadowed)
and the script is imported by name, once, like any module.
"""

from __future__ import annotations

import importlib
import sys
from pathlib import Path
from types import ModuleType

ROOT = Path(__file__).resolve().parents[2]
BENCHMARKS = ROOT / "benchmarks"


def load_benchmark(name: str) -> ModuleType:
    """The module of ``benchmarks/NAME.py``.

    Example:
        >>> load_benchmark("report").__name__
        'report'
    """
    if str(BENCHMARKS) not in sys.path:
        sys.path.append(str(BENCHMARKS))
    module = importlib.import_module(name)
    if Path(module.__file__ or "").resolve().parent != BENCHMARKS:
        raise ImportError(f"{name!r} resolved to {module.__file__}, not benchmarks/{name}.py: a name clash.")
    return module
