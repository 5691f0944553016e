"""A target's parameters as a config section sees them, and the plain values their annotations admit.

:func:`parameters` is the signature of a class's ``__init__`` or a function, with ``**options:
Unpack[Keywords]`` (PEP 692) standing as the ``TypedDict``'s keys, so a section's keys are checked against
the keywords a target hands on as well as its own. :func:`wrong_kind` says when a YAML value (a number, a
string, a boolean, null, a list) is of a kind a parameter's annotation, or its default, rules out.
"""

from __future__ import annotations

import inspect
import numbers
import types
import typing
from collections.abc import Callable, Mapping, Sequence
from typing import Any

__all__ = ["parameters", "type_hints", "unpacked_keywords", "wrong_kind"]


def parameters(target: Callable[..., Any]) -> Mapping[str, inspect.Parameter]:
    """The parameters of a class's ``__init__`` or a function, without ``self``; ``**options:
    Unpack[Keywords]`` (PEP 692) stands as the ``TypedDict``'s keys (:func:`unpacked_keywords`)."""
    try:
        found = dict(inspect.signature(target).parameters)
    except (TypeError, ValueError):  # builtins without a signature: accept any keyword
        return {"kwargs": inspect.Parameter("kwargs", inspect.Parameter.VAR_KEYWORD)}
    found.pop("self", None)
    variadic = [p for p in found.values() if p.kind is inspect.Parameter.VAR_KEYWORD]
    keywords = unpacked_keywords(type_hints(target).get(variadic[0].name)) if variadic else None
    if keywords is not None:
        del found[variadic[0].name]
        found.update((p.name, p) for p in keywords)
    return found


def unpacked_keywords(annotation: Any) -> list[inspect.Parameter] | None:
    """The keywords of ``**options: Unpack[Keywords]``, the ``TypedDict``'s keys as keyword-only parameters
    with their annotations and a default the callee applies (``...``); ``None`` for any other annotation.

    Example:
        >>> from typing import TypedDict, Unpack
        >>> class Shard(TypedDict, total=False):
        ...     rank: int
        >>> [str(p) for p in unpacked_keywords(Unpack[Shard])]
        ['rank: int = Ellipsis']
    """
    if typing.get_origin(annotation) is not typing.Unpack:
        return None
    (keywords,) = typing.get_args(annotation)
    if not typing.is_typeddict(keywords):
        return None
    try:
        hints = typing.get_type_hints(keywords)
    except Exception:  # forward references that do not resolve: the keys without their types
        hints = dict.fromkeys(keywords.__annotations__, inspect.Parameter.empty)
    kind = inspect.Parameter.KEYWORD_ONLY
    return [inspect.Parameter(name, kind, default=..., annotation=hint) for name, hint in hints.items()]


_KINDS: dict[Any, str] = {bool: "bool", int: "int", float: "float", str: "str", type(None): "null"}
_WORDS = {
    "int": "an integer",
    "float": "a number",
    "bool": "true or false",
    "str": "a string",
    "list": "a list",
}


def _is_tensor_class(annotation: Any) -> bool:
    """``torch.Tensor`` in a union such as AdamW's ``lr: float | Tensor``: no YAML value is one."""
    return (
        inspect.isclass(annotation)
        and annotation.__name__ == "Tensor"
        and annotation.__module__.startswith("torch")
    )


def _kinds(annotation: Any) -> set[str] | None:
    """The plain value kinds an annotation admits, or ``None`` when it admits anything we cannot tell."""
    if annotation in _KINDS:
        kinds = {_KINDS[annotation]}
        return kinds | {"int"} if "float" in kinds else kinds
    origin = typing.get_origin(annotation)
    if origin in (typing.Union, types.UnionType):
        found: set[str] = set()
        for member in typing.get_args(annotation):
            if _is_tensor_class(member):
                continue
            kinds = _kinds(member)
            if kinds is None:
                return None
            found |= kinds
        return found
    if origin in (list, tuple, Sequence) or annotation in (list, tuple):
        return {"list"}
    if origin is typing.Literal:
        return {_KINDS.get(type(value), "other") for value in typing.get_args(annotation)}
    return None  # tensors, modules, Any, user classes: not ours to judge


def _kind(value: Any) -> str:
    if isinstance(value, bool):
        return "bool"
    if isinstance(value, numbers.Integral):
        return "int"
    if isinstance(value, numbers.Real):
        return "float"
    if isinstance(value, (list, tuple)):
        return "list"
    return _KINDS.get(type(value), "other")


def _expected(parameter: inspect.Parameter, hints: Mapping[str, Any]) -> set[str] | None:
    if parameter.name in hints:
        return _kinds(hints[parameter.name])
    if parameter.default is ...:  # a key of **options: Unpack[Keywords], its annotation resolved
        return _kinds(parameter.annotation)
    default = parameter.default
    if default is inspect.Parameter.empty or default is None:
        return None
    kinds = _kinds(type(default))
    # An un-annotated float default (lr=1e-3) also takes ints; an int default may mean a float too.
    return kinds | {"int", "float"} if kinds and kinds & {"int", "float"} else kinds


def type_hints(target: Callable[..., Any]) -> Mapping[str, Any]:
    """The resolved annotations of a class's ``__init__`` or a function; ``{}`` where they do not resolve."""
    function = target.__init__ if inspect.isclass(target) else target  # type: ignore[misc]
    try:
        return typing.get_type_hints(function)
    except Exception:  # forward references that do not resolve: fall back to the defaults' types
        return {}


def wrong_kind(parameter: inspect.Parameter, hints: Mapping[str, Any], value: Any) -> str | None:
    """``"must be a number, got 'fast' (a string)"`` when ``value``'s kind is one ``parameter`` rules out by its
    annotation (``hints``, or its own once unpacked) or, without one, by its default's type; else ``None``.

    Example:
        >>> wrong_kind(inspect.Parameter("lr", inspect.Parameter.KEYWORD_ONLY, default=0.1), {}, "fast")
        "must be a number, got 'fast' (a string)"
    """
    expected = _expected(parameter, hints)
    kind = _kind(value)
    if expected is None or kind == "other" or kind in expected or (kind == "bool" and "int" in expected):
        return None
    shown = expected - {"int"} if "float" in expected else expected  # "a number" covers integers
    words = [_WORDS[name] for name in sorted(shown) if name in _WORDS]
    wanted = " or ".join(words + (["null"] if "null" in expected else [])) or "something else"
    return f"must be {wanted}, got {value!r} ({_WORDS.get(kind, kind)})"
