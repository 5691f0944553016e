"""The package's one way to defer an import: :func:`load` a name from its module when it is first needed.

A package re-exports its public names through :func:`lazy_exports` (PEP 562 ``__getattr__``), and a config
registry entry (:class:`~composer_dynsample.config.components.Lazy`) names its target by module and
attribute; both import through :func:`load`, so ``import composer_dynsample``, ``--help`` and config
errors answer before torch and Composer load.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping, Sequence
from typing import Any

__all__ = ["lazy_exports", "load"]


def load(module: str, attribute: str) -> Any:
    """``module.attribute``, importing ``module`` now if it is not imported yet.

    Example:
        >>> load("json", "dumps")([1])
        '[1]'
    """
    return getattr(importlib.import_module(module), attribute)


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
        value = load(module, name)
        namespace[name] = value  # later lookups skip __getattr__
        return value

    def __dir__() -> list[str]:
        return sorted({*namespace, *owner} - {"__getattr__", "__dir__"})

    return __getattr__, __dir__
