"""Parameter names of a registered class or function, read from its source file without importing it.

Importing an algorithm, a callback, a logger or the ``Trainer`` imports Composer (seconds); reading the
``__init__`` signature from the source takes milliseconds, so :func:`~composer_dynsample.config.check_config`
can name a misspelt key before anything heavy is imported. Where the source does not settle the
signature (an inherited ``__init__``, a compiled module, a name built at run time), the entry accepts
every key here and the builder checks the keys against the imported target as before.
"""

from __future__ import annotations

import ast
import importlib.util
import inspect
from collections.abc import Iterator, Mapping
from functools import lru_cache
from pathlib import Path
from typing import Any

from composer_dynsample.config.components import Lazy, Registered

__all__ = ["SourceRegistry", "source_signature"]

_ANY = inspect.Signature([inspect.Parameter("kwargs", inspect.Parameter.VAR_KEYWORD)])


def _module_file(module: str) -> Path | None:
    """The source file of ``module``, found without executing it or any of its packages."""
    top, *rest = module.split(".")
    spec = importlib.util.find_spec(top)
    if spec is None:
        return None
    if not rest:
        return Path(spec.origin) if spec.origin and spec.origin.endswith(".py") else None
    if not spec.submodule_search_locations:
        return None
    folder = Path(next(iter(spec.submodule_search_locations))).joinpath(*rest)
    for candidate in (folder / "__init__.py", folder.with_suffix(".py")):
        if candidate.is_file():
            return candidate
    return None


@lru_cache(maxsize=64)
def _parse(path: Path) -> ast.Module | None:
    try:
        return ast.parse(path.read_text(encoding="utf-8"))
    except (OSError, SyntaxError, ValueError):
        return None


def _signature(function: ast.FunctionDef, *, method: bool, module: str) -> inspect.Signature:
    args = function.args
    positional = [*args.posonlyargs, *args.args][1 if method else 0 :]
    defaults = [None] * (len(positional) - len(args.defaults)) + list(args.defaults)
    kinds = inspect.Parameter
    params = [
        kinds(a.arg, kinds.POSITIONAL_OR_KEYWORD, default=kinds.empty if d is None else ...)
        for a, d in zip(positional, defaults)
    ]
    if args.vararg is not None:
        params.append(kinds(args.vararg.arg, kinds.VAR_POSITIONAL))
    for a, d in zip(args.kwonlyargs, args.kw_defaults):
        params.append(kinds(a.arg, kinds.KEYWORD_ONLY, default=kinds.empty if d is None else ...))
    if args.kwarg is not None:
        keys = _unpacked(args.kwarg.annotation, module)
        if keys is None:
            params.append(kinds(args.kwarg.arg, kinds.VAR_KEYWORD))
        else:
            params.extend(kinds(key, kinds.KEYWORD_ONLY, default=...) for key in keys)
    return inspect.Signature(params)


def _unpacked(annotation: ast.expr | None, module: str) -> list[str] | None:
    """The keys of ``**options: Unpack[Keywords]`` (PEP 692), read from the ``TypedDict``'s source and its
    bases'; ``None`` for another annotation or a ``TypedDict`` the source does not settle."""
    if not isinstance(annotation, ast.Subscript) or not isinstance(annotation.slice, ast.Name):
        return None
    if _last_name(annotation.value) != "Unpack":  # Unpack, or typing.Unpack
        return None
    return _typed_dict_keys(module, annotation.slice.id, depth=4)


def _last_name(node: ast.expr) -> str | None:
    """``Name`` of ``Name`` and of ``module.Name``."""
    return node.attr if isinstance(node, ast.Attribute) else getattr(node, "id", None)


def _typed_dict_keys(module: str, name: str, depth: int) -> list[str] | None:
    found = _definition(module, name, depth)
    if found is None or not isinstance(found[1], ast.ClassDef):
        return None
    where, node = found
    keys: list[str] = []
    for base in node.bases:
        if _last_name(base) == "TypedDict":
            continue
        inherited = _typed_dict_keys(where, base.id, depth - 1) if isinstance(base, ast.Name) else None
        if inherited is None:
            return None
        keys += inherited
    own = [n.target.id for n in node.body if isinstance(n, ast.AnnAssign) and isinstance(n.target, ast.Name)]
    return keys + own


def _absolute(module: str, node: ast.ImportFrom, is_package: bool) -> str:
    if node.level == 0:
        return node.module or ""
    parts = module.split(".")
    base = parts[: len(parts) - node.level + (1 if is_package else 0)]
    return ".".join([*base, *([node.module] if node.module else [])])


def _definition(module: str, attribute: str, depth: int) -> tuple[str, ast.stmt] | None:
    """The module that defines ``module.attribute`` and its ``def`` or ``class`` statement, following
    ``from ... import`` re-exports at most ``depth`` times."""
    path = _module_file(module)
    tree = None if path is None else _parse(path)
    if tree is None or depth == 0:
        return None
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.ClassDef)) and node.name == attribute:
            return module, node
    for node in tree.body:
        if isinstance(node, ast.ImportFrom):
            for alias in node.names:
                if (alias.asname or alias.name) == attribute:
                    source = _absolute(module, node, path.name == "__init__.py")
                    return _definition(source, alias.name, depth - 1)
    return None


@lru_cache(maxsize=128)
def source_signature(module: str, attribute: str, depth: int = 4) -> inspect.Signature | None:
    """The signature of ``module.attribute`` (a class's ``__init__`` without ``self``, or a function),
    read from source and following ``from ... import`` re-exports; ``None`` where the source does not
    settle it. ``**options: Unpack[Keywords]`` (PEP 692) stands as the keys of the ``TypedDict``.

    Example:
        >>> list(source_signature("composer_dynsample.schedulers", "OneCycleScheduler").parameters)
        ['pct_start', 'div_factor', 'final_div_factor', 'anneal_strategy']
        >>> source_signature("composer_dynsample.schedulers", "NoSuchName") is None
        True
    """
    found = _definition(module, attribute, depth)
    if found is None:
        return None
    where, node = found
    if isinstance(node, ast.FunctionDef):
        return _signature(node, method=False, module=where)
    init = [n for n in node.body if isinstance(n, ast.FunctionDef) and n.name == "__init__"]
    return _signature(init[0], method=True, module=where) if init else None


class _SourceTarget:
    """A stand-in whose ``inspect.signature`` is the one read from source, for :class:`Registered`."""

    def __init__(self, module: str, attribute: str) -> None:
        self.__qualname__ = self.__name__ = attribute
        self.__signature__ = source_signature(module, attribute) or _ANY

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        raise TypeError(f"{self.__qualname__} was read from source for checking; build it from the registry.")


class SourceRegistry(Mapping[str, Registered]):
    """A registry view whose :class:`Lazy` entries carry their source signature instead of being imported.

    Example:
        >>> from composer_dynsample.config.names import SCHEDULERS
        >>> SourceRegistry(SCHEDULERS)["one_cycle"].valid_keys()
        ['anneal_strategy', 'div_factor', 'final_div_factor', 'pct_start']
    """

    def __init__(self, registry: Mapping[str, Registered | Lazy]) -> None:
        self.registry = registry

    def __getitem__(self, name: str) -> Registered:
        entry = self.registry[name]
        if isinstance(entry, Lazy):
            return Registered(
                _SourceTarget(entry.module, entry.attribute), entry.reserved, entry.inferred, entry.extra
            )
        return entry

    def __iter__(self) -> Iterator[str]:
        return iter(self.registry)

    def __len__(self) -> int:
        return len(self.registry)
