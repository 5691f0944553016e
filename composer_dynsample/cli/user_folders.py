"""What the command line sets up so that a command writes only its named folders and the user's cache.

Composer imports matplotlib, and importing matplotlib creates its config folder
(``$XDG_CONFIG_HOME/matplotlib``, by default ``~/.config/matplotlib``) when it is missing, though a command
only draws plots with the defaults. :func:`matplotlib_config_in_cache` points ``MPLCONFIGDIR`` at
matplotlib's cache folder instead (``$XDG_CACHE_HOME/matplotlib``, where its font list goes anyway) when
the user has no config folder and sets no ``MPLCONFIGDIR``: a user's own settings are read as before.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

__all__ = ["matplotlib_config_in_cache"]


def matplotlib_config_in_cache() -> str | None:
    """Set ``MPLCONFIGDIR`` to matplotlib's cache folder if it is unset and matplotlib's config folder is
    missing (Linux and FreeBSD, where matplotlib follows the XDG folders); return what was set."""
    if os.environ.get("MPLCONFIGDIR") or not sys.platform.startswith(("linux", "freebsd")):
        return None
    config = Path(os.environ.get("XDG_CONFIG_HOME") or Path.home() / ".config", "matplotlib")
    if config.is_dir():
        return None
    cache = str(Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache", "matplotlib"))
    os.environ["MPLCONFIGDIR"] = cache
    return cache
