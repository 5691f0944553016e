"""The checks on names that moved to another module: the old name still works, with a warning."""

from __future__ import annotations

from collections.abc import Iterable
from types import ModuleType

import pytest


def assert_moved(moves: Iterable[tuple[ModuleType, ModuleType, str]], *, then: str = "") -> None:
    """Each ``(old, new, name)``: ``old.name`` is ``new.name``, with a DeprecationWarning that matches
    ``moved to NEW.NAME`` and then ``then``."""
    for old, new, name in moves:
        with pytest.warns(DeprecationWarning, match=f"moved to {new.__name__}.{name}{then}"):
            assert getattr(old, name) is getattr(new, name)


def assert_no_such_name(module: ModuleType) -> None:
    """A name that never existed is still an AttributeError."""
    with pytest.raises(AttributeError):
        module.no_such_name  # noqa: B018
