"""Helpers shared by the miner benchmarks.

``import_mining`` imports ``composer_dynsample.mining`` without running ``composer_dynsample/__init__.py``:
the package's ``__init__`` imports Composer (seconds on a small CPU), which the miner benchmarks pay
in every memory-measuring subprocess while the miners need nothing from it. A bare parent module with
the package's ``__path__`` lets the submodules import normally; without the package installed this
falls back to a plain import.
"""

from __future__ import annotations

import importlib.util
import sys
import types


def import_mining() -> types.ModuleType:
    """Return ``composer_dynsample.mining``, skipping the package's ``__init__`` when it is not loaded yet."""
    if "composer_dynsample" not in sys.modules:
        spec = importlib.util.find_spec("composer_dynsample")
        if spec is not None and spec.submodule_search_locations:
            parent = types.ModuleType("composer_dynsample")
            parent.__path__ = list(spec.submodule_search_locations)
            sys.modules["composer_dynsample"] = parent
    import composer_dynsample.mining as mining

    return mining


def proc_status_kib(key: str) -> int | None:
    """A ``/proc/self/status`` field in KiB (``VmRSS``, ``VmHWM``, ...), or ``None`` where unavailable."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith(key + ":"):
                    return int(line.split()[1])
    except OSError:
        return None
    return None
