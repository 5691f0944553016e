"""Which mining strategy runs when: a strategy name, or ``{time string: name}`` switching at those times."""

from __future__ import annotations

from collections.abc import Collection, Iterator, Mapping, Sequence

from composer.core import Time, Timestamp, TimeUnit

from composer_dynsample.mining.registry import MINERS, check_strategy
from composer_dynsample.validation import parse_time

__all__ = ["StrategySchedule", "parse_schedule", "reached"]


def reached(timestamp: Timestamp, time: Time) -> bool:
    """Whether training has reached ``time`` (in ``time``'s unit) at ``timestamp``."""
    return int(timestamp.get(time.unit)) >= int(time.value)


def parse_schedule(
    strategy: str | Mapping[str, str], strategies: Collection[str] = MINERS
) -> list[tuple[Time, str]]:
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


class StrategySchedule(Sequence[tuple[Time, str]]):
    """The ``(start, name)`` entries of a strategy schedule, sorted by start, and the name at a time.

    Args:
        strategy (str | Mapping[str, str]): A strategy name, or ``{time string: name}`` starting at zero
            in one time unit (see :func:`parse_schedule`).
        strategies (Collection[str]): The valid names. Default: the miners' names.

    Example:
        >>> from composer.core import Timestamp
        >>> schedule = StrategySchedule({"0ep": "semi_hard", "2ep": "batch_hard"})
        >>> schedule.at(Timestamp(epoch=1)), schedule.at(Timestamp(epoch=2)), schedule.names
        ('semi_hard', 'batch_hard', ['semi_hard', 'batch_hard'])
    """

    def __init__(self, strategy: str | Mapping[str, str], strategies: Collection[str] = MINERS) -> None:
        self._entries = parse_schedule(strategy, strategies)

    def __getitem__(self, index: int) -> tuple[Time, str]:  # type: ignore[override]
        return self._entries[index]

    def __len__(self) -> int:
        return len(self._entries)

    def __iter__(self) -> Iterator[tuple[Time, str]]:
        return iter(self._entries)

    @property
    def names(self) -> list[str]:
        """The strategies the schedule runs, each once, in order of first start."""
        return list(dict.fromkeys(name for _, name in self._entries))

    def at(self, timestamp: Timestamp) -> str:
        """The strategy that runs at ``timestamp``: the last one whose start it has reached."""
        current = self._entries[0][1]
        for start, name in self._entries:
            if reached(timestamp, start):
                current = name
        return current
