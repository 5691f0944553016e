"""The checks of one argument's value: integers, floats, booleans, choices, generators, and the words of
their messages (:func:`describe`, :func:`did_you_mean`). See :mod:`composer_dynsample.validation`."""

from __future__ import annotations

import difflib
import math
import numbers
import sys
from collections.abc import Collection, Iterable
from typing import TYPE_CHECKING, TypeVar

import numpy as np

if TYPE_CHECKING:
    import torch

_T = TypeVar("_T")

__all__ = [
    "InputTypeError",
    "check_bool",
    "check_choice",
    "check_float",
    "check_generator",
    "check_instance",
    "check_int",
    "check_keywords",
    "describe",
    "did_you_mean",
    "is_int",
]


class InputTypeError(TypeError, ValueError):
    """An argument has the wrong type: both a ``TypeError`` and a ``ValueError``, so callers that catch
    either (configs catch ``ValueError``, Python convention says ``TypeError``) see it."""


def is_int(value: object) -> bool:
    """Whether ``value`` is an integer (Python or numpy), not a ``bool``."""
    return isinstance(value, (int, np.integer)) and not isinstance(value, (bool, np.bool_))


def _range_text(minimum: float | None, maximum: float | None, *, strict: tuple[bool, bool]) -> str:
    if minimum is not None and maximum is not None:
        left, right = "(" if strict[0] else "[", ")" if strict[1] else "]"
        return f" in {left}{minimum}, {maximum}{right}"
    if minimum is not None:
        return f" {'>' if strict[0] else '>='} {minimum}"
    if maximum is not None:
        return f" {'<' if strict[1] else '<='} {maximum}"
    return ""


def _in_range(value: float, minimum: float | None, maximum: float | None, strict: tuple[bool, bool]) -> bool:
    if minimum is not None and (value < minimum or (strict[0] and value == minimum)):
        return False
    return not (maximum is not None and (value > maximum or (strict[1] and value == maximum)))


def check_int(
    name: str,
    value: object,
    *,
    minimum: int | None = None,
    maximum: int | None = None,
    allow_none: bool = False,
) -> int | None:
    """Return ``int(value)`` if it is an integer within ``[minimum, maximum]``, else raise ``ValueError``.

    Args:
        name (str): The argument's name, as the caller knows it.
        value (object): The value to check.
        minimum (int, optional): The smallest valid value. Default: no bound.
        maximum (int, optional): The largest valid value. Default: no bound.
        allow_none (bool): Return ``None`` for ``None`` instead of raising. Default: ``False``.

    Example:
        >>> check_int("rank", np.int64(1), minimum=0, maximum=1)
        1
        >>> check_int("rank", 2, minimum=0, maximum=1)
        Traceback (most recent call last):
            ...
        ValueError: rank must be an integer in [0, 1], got 2.
    """
    if value is None and allow_none:
        return None
    if not is_int(value) or not _in_range(int(value), minimum, maximum, (False, False)):  # type: ignore[arg-type]
        valid = _range_text(minimum, maximum, strict=(False, False))
        raise ValueError(f"{name} must be an integer{valid}, got {value!r}.")
    return int(value)  # type: ignore[arg-type]


def check_float(
    name: str,
    value: object,
    *,
    minimum: float | None = None,
    maximum: float | None = None,
    strict_minimum: bool = False,
    strict_maximum: bool = False,
    finite: bool = True,
) -> float:
    """Return ``float(value)`` if it is a real number within the bounds, else raise ``ValueError``.

    Args:
        name (str): The argument's name.
        value (object): The value to check (``int``, ``float`` or a numpy real; not ``bool``).
        minimum (float, optional): Lower bound. Default: none.
        maximum (float, optional): Upper bound. Default: none.
        strict_minimum (bool): Exclude ``minimum`` itself. Default: ``False``.
        strict_maximum (bool): Exclude ``maximum`` itself. Default: ``False``.
        finite (bool): Reject NaN and infinities. Default: ``True``.

    Example:
        >>> check_float("pct_start", 0.25, minimum=0, maximum=1, strict_minimum=True, strict_maximum=True)
        0.25
        >>> check_float("dropout", 1.0, minimum=0, maximum=1, strict_maximum=True)
        Traceback (most recent call last):
            ...
        ValueError: dropout must be a number in [0, 1), got 1.0.
    """
    strict = (strict_minimum, strict_maximum)
    valid = _range_text(minimum, maximum, strict=strict)
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, numbers.Real):
        raise ValueError(f"{name} must be a number{valid}, got {value!r}.")
    number = float(value)
    if finite and not math.isfinite(number):
        raise ValueError(f"{name} must be a finite number{valid}, got {value!r}.")
    if not math.isnan(number) and not _in_range(number, minimum, maximum, strict):
        raise ValueError(f"{name} must be a number{valid}, got {value!r}.")
    return number


def check_bool(name: str, value: object) -> bool:
    """Return ``value`` if it is a ``bool``, else raise ``ValueError`` (``1`` and ``"yes"`` are not).

    Example:
        >>> check_bool("normalize", True)
        True
    """
    if not isinstance(value, (bool, np.bool_)):
        raise ValueError(f"{name} must be true or false, got {value!r}.")
    return bool(value)


def check_generator(name: str, value: object) -> torch.Generator | None:
    """Return ``value`` if it is a ``torch.Generator`` or ``None``, else raise :class:`InputTypeError`.

    Example:
        >>> check_generator("generator", 0)
        Traceback (most recent call last):
            ...
        composer_dynsample.validation.values.InputTypeError: generator must be a torch.Generator or None, got an object of type int.
    """
    import torch

    if value is not None and not isinstance(value, torch.Generator):
        raise InputTypeError(f"{name} must be a torch.Generator or None, got {describe(value)}.")
    return value


def check_instance(name: str, value: object, kind: type[_T]) -> _T:
    """Return ``value`` if it is a ``kind``, else raise ``TypeError`` naming both types.

    Example:
        >>> check_instance("store", [], dict)
        Traceback (most recent call last):
            ...
        TypeError: store must be a dict, got list.
    """
    if not isinstance(value, kind):
        raise TypeError(f"{name} must be a {kind.__name__}, got {type(value).__name__}.")
    return value


def check_choice(name: str, value: object, choices: Iterable[str]) -> str:
    """Return ``value`` if it is one of ``choices``, else raise ``ValueError`` listing them.

    Example:
        >>> check_choice("gather", "all", ("autograd", "constant"))
        Traceback (most recent call last):
            ...
        ValueError: gather must be one of ('autograd', 'constant'), got 'all'.
    """
    options = tuple(choices)
    if not isinstance(value, str) or value not in options:
        raise ValueError(f"{name} must be one of {options}, got {value!r}.")
    return value


def check_keywords(function: str, given: Iterable[str], keywords: type | Collection[str]) -> None:
    """Refuse a keyword that ``function``'s ``**options`` does not take, as Python refuses an unknown keyword
    of a written-out parameter list (a ``TypeError``), and name the close one.

    Args:
        function (str): The callable's name, as the user called it.
        given (Iterable[str]): The keywords the call gave.
        keywords (type | Collection[str]): The ``TypedDict`` of the keywords it takes (its ``**options:
            Unpack[keywords]``, PEP 692), or their names.

    Example:
        >>> from typing import TypedDict
        >>> class Shard(TypedDict, total=False):
        ...     rank: int
        ...     seed: int
        >>> check_keywords("sampler", ["seed"], Shard)
        >>> check_keywords("sampler", ["sed"], Shard)
        Traceback (most recent call last):
            ...
        TypeError: sampler() got an unexpected keyword argument 'sed'. Did you mean 'seed'?
    """
    known = (
        keywords.__required_keys__ | keywords.__optional_keys__  # type: ignore[attr-defined]
        if isinstance(keywords, type)
        else keywords
    )
    for key in given:
        if key not in known:
            raise TypeError(
                f"{function}() got an unexpected keyword argument {key!r}.{did_you_mean(key, sorted(known))}"
            )


def did_you_mean(value: object, options: Iterable[str]) -> str:
    """``" Did you mean 'x'?"`` for the option closest to a misspelt ``value``, else ``""``.

    Example:
        >>> did_you_mean("semihard", ("batch_hard", "semi_hard"))
        " Did you mean 'semi_hard'?"
        >>> did_you_mean("triplet", ("batch_hard", "semi_hard"))
        ''
    """
    if not isinstance(value, str):
        return ""
    matches = difflib.get_close_matches(value, list(options), n=1, cutoff=0.6)
    return f" Did you mean {matches[0]!r}?" if matches else ""


def describe(value: object) -> str:
    """A short description of a value for error messages: a tensor's shape and dtype, else its type."""
    torch = sys.modules.get("torch")  # no tensor exists unless torch has been imported
    if torch is not None and isinstance(value, torch.Tensor):
        return f"a tensor of shape {tuple(value.shape)} and dtype {value.dtype}"
    return f"an object of type {type(value).__name__}"
