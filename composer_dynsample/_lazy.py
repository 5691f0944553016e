"""Lazy module attributes (PEP 562): re-exports imported from their module on first use."""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping, Sequence
from typing import Any


def lazy_exports(
    package: str, modules: Mapping[str, str | Sequence[str]], namespace: dict[str, Any]
) -> tuple[Callable[[str], Any], Callable[[], list[str]]]:
    """``__getattr__`` and ``__dir__`` for a package that re-exports ``{module: names}`` lazily.

    Args:
        package (str): The package's name, for the ``AttributeError`` message.
        modules (Mapping[str, str | Sequence[str]]): Each defining module and the public names it provides,
            as a sequence or one whitespace-separated string.
        namespace (dict): The package's ``globals()``; a name is cached there once imported.

    Example:
        >>> namespace = {}
        >>> getattr_, dir_ = lazy_exports("pkg", {"json": "dumps"}, namespace)
        >>> getattr_("dumps")([1])
        '[1]'
        >>> "dumps" in namespace, dir_()
        (True, ['dumps'])
    """
    owner = {
        name: module
        for module, names in modules.items()
        for name in (names.split() if isinstance(names, str) else names)
    }

    def __getattr__(name: str) -> Any:
        module = owner.get(name)
        if module is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(module), name)
        namespace[name] = value  # later lookups skip __getattr__
        return value

    def __dir__() -> list[str]:
        return sorted({*namespace, *owner} - {"__getattr__", "__dir__"})

    return __getattr__, __dir__
