"""The checks of :class:`~composer_dynsample.HardNegativeMining`, as functions of their own.

:func:`check_strategy` and :func:`parse_schedule` validate what the algorithm is built with.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping

from composer.core import Time, TimeUnit

from composer_dynsample.validation import did_you_mean, parse_time

__all__ = ["check_strategy", "parse_schedule"]


def check_strategy(name: object, strategies: Collection[str], where: str = "strategy") -> str:
    """Return ``name`` if it is one of ``strategies``, else raise a ``ValueError`` with the closest name.

    Example:
        >>> check_strategy("semihard", ["batch_hard", "semi_hard"])
        Traceback (most recent call last):
            ...
        ValueError: strategy must be one of ['batch_hard', 'semi_hard'], got 'semihard'. Did you mean 'semi_hard'?
    """
    if not isinstance(name, str) or name not in strategies:
        raise ValueError(
            f"{where} must be one of {sorted(strategies)}, got {name!r}.{did_you_mean(name, strategies)}"
        )
    return name


def parse_schedule(strategy: str | Mapping[str, str], strategies: Collection[str]) -> list[tuple[Time, str]]:
    """A strategy name or a ``{time string: name}`` schedule as ``[(start, name), ...]`` sorted by start.

    The schedule must start at zero and use one time unit. Every name must be one of ``strategies``.

    Example:
        >>> schedule = parse_schedule({"40ep": "batch_hard", "0ep": "semi_hard"}, ["batch_hard", "semi_hard"])
        >>> [(str(start), name) for start, name in schedule]
        [('0ep', 'semi_hard'), ('40ep', 'batch_hard')]
    """
    if isinstance(strategy, str):
        entries = [(Time(0, TimeUnit.BATCH), check_strategy(strategy, strategies))]
    elif isinstance(strategy, Mapping) and strategy:
        entries = [
            (parse_time("strategy schedule key", key), check_strategy(name, strategies, f"strategy[{key!r}]"))
            for key, name in strategy.items()
        ]
    else:
        raise ValueError(
            f"strategy must be a strategy name or a non-empty mapping of time strings to names, got {strategy!r}."
        )
    if len({start.unit for start, _ in entries}) > 1:
        raise ValueError(
            f"a strategy schedule must use one time unit for all its keys, got {list(dict(strategy))}."
        )
    entries.sort(key=lambda entry: int(entry[0].value))
    if int(entries[0][0].value) != 0:
        raise ValueError(
            f"a strategy schedule must say what runs from the start (a key like '0ep'), got {list(dict(strategy))}."
        )
    return entries
