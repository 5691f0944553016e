"""Composer time strings (``"2ep"``, ``"500ba"``, ``"0.5dur"``) checked without importing Composer, and parsed
into a ``composer.core.Time`` when asked. See :mod:`composer_dynsample.validation`."""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import TYPE_CHECKING

from composer_dynsample.validation.values import is_int

if TYPE_CHECKING:
    from composer.core import Time, TimeUnit

__all__ = ["check_time", "parse_time"]


_TIME_STRING = re.compile(r"^\s*(\d+(?:\.\d*)?|\.\d+)(?:e([+-]?\d+))?\s*([a-z]+)\s*$")
_EXAMPLES = {"ep": "2ep", "ba": "500ba", "sp": "10000sp", "tok": "1000tok", "dur": "0.5dur"}


def check_time(
    name: str, value: object, units: Sequence[str] = ("ep", "ba", "sp", "tok")
) -> tuple[float, str]:
    """Check a Composer time string without importing Composer: ``(value, unit)``, or a ``ValueError``.

    ``"2ep"``, ``"500ba"``, ``"1e4sp"``, ``"0.5dur"``: a number and one of ``units`` (Composer's unit
    names); a bare non-negative integer counts epochs. Counts other than durations must be whole.

    Example:
        >>> check_time("max_duration", "60ep"), check_time("interval", 3)
        ((60.0, 'ep'), (3.0, 'ep'))
        >>> check_time("interval", "1dur", ("ep", "ba"))
        Traceback (most recent call last):
            ...
        ValueError: interval must be a Composer time string such as '2ep', '500ba', got '1dur'.
    """
    allowed = tuple(units)
    if is_int(value) and int(value) >= 0 and "ep" in allowed:  # type: ignore[arg-type]
        return float(value), "ep"  # type: ignore[arg-type]
    match = _TIME_STRING.match(value) if isinstance(value, str) else None
    if match is not None:
        number = float(match.group(1)) * 10 ** int(match.group(2) or 0)
        if match.group(3) in allowed and (match.group(3) == "dur" or number == int(number)):
            return number, match.group(3)
    shown = "', '".join(_EXAMPLES.get(unit, f"1{unit}") for unit in allowed)
    raise ValueError(f"{name} must be a Composer time string such as '{shown}', got {value!r}.")


def parse_time(name: str, value: object, units: Sequence[TimeUnit | str] | None = None) -> Time:
    """Parse a Composer time string (``"2ep"``, ``"500ba"``, ``"10000sp"``) into a ``Time``; see :func:`check_time`.

    Args:
        name (str): The argument's name.
        value (object): A time string, a ``composer.core.Time`` or a non-negative int (epochs).
        units (Sequence[TimeUnit | str], optional): The units allowed. Default: epochs, batches, samples,
            tokens.

    Example:
        >>> parse_time("memory_start", "2ep")
        Time(2, TimeUnit.EPOCH)
        >>> parse_time("interval", "1dur")
        Traceback (most recent call last):
            ...
        ValueError: interval must be a Composer time string such as '2ep', '500ba', '10000sp', '1000tok', got '1dur'.
    """
    allowed = tuple(getattr(unit, "value", unit) for unit in (units or ("ep", "ba", "sp", "tok")))
    if type(value).__name__ == "Time" and getattr(getattr(value, "unit", None), "value", None) in allowed:
        return value  # type: ignore[return-value]
    number, unit = check_time(name, value, allowed)
    from composer.core import Time, TimeUnit

    return Time(number if unit == "dur" else int(number), TimeUnit(unit))
