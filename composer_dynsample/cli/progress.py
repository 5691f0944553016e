"""Whether ``train`` prints progress lines (:class:`~composer_dynsample.callbacks.ProgressLines`).

With stdout not a terminal (``nohup ... > log``, CI) Composer's progress bar is off, so ``train`` adds a
``ProgressLines`` callback, with its defaults, unless ``--quiet`` is given or the config names one itself
(``callbacks.progress_lines``, with its own settings, or ``null`` for none). ``--quiet`` drops a
configured one too, as it turns off a configured progress bar. On a terminal the bar is left as it is.
"""

from __future__ import annotations

import sys
from typing import Any

__all__ = ["REGISTERED_NAME", "set_progress_lines"]

#: The callback's name in the ``callbacks`` section.
REGISTERED_NAME = "progress_lines"


def _names_progress_lines(label: str, keys: Any) -> bool:
    """Whether a ``callbacks`` entry (on or ``null``) is progress lines: by its label or its ``_component_``."""
    component = keys.get("_component_") if hasattr(keys, "get") else None
    if component is not None:
        return str(component) == REGISTERED_NAME or str(component).endswith("ProgressLines")
    return label == REGISTERED_NAME


def _stdout_is_terminal() -> bool:
    try:
        return sys.stdout is not None and sys.stdout.isatty()
    except (AttributeError, ValueError):  # no isatty, or a closed stream
        return False


def set_progress_lines(run: Any, quiet: bool) -> None:
    """Add progress lines to a built run's callbacks when stdout is not a terminal, or drop them (``quiet``).

    The callback is added after the Trainer is built, so a checkpoint it resumes needs no state for it.

    Args:
        run (TrainingRun): A run from :func:`~composer_dynsample.config.build_run`, before its fit.
        quiet (bool): ``--quiet``: no progress lines, the config's included.
    """
    from composer_dynsample.callbacks.progress_lines import ProgressLines

    state = run.trainer.state
    if quiet:
        state.callbacks = [item for item in state.callbacks if not isinstance(item, ProgressLines)]
        return
    entries = run.config.get("callbacks") or {}
    configured = any(_names_progress_lines(str(label), keys) for label, keys in entries.items())
    if configured or _stdout_is_terminal():
        return
    state.callbacks.append(ProgressLines())
