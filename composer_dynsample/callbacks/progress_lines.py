"""Plain progress lines for a log file: the step, the epoch, the loss, the speed and the time left.

Composer's progress bar redraws one line of a terminal; written to a file it is noise, so ``train`` turns
it off when stdout is not a terminal, and then nothing appeared until the run ended. :class:`ProgressLines`
prints a line now and then instead, as Hugging Face Trainer's ``logging_steps`` does::

    step 120/600 (epoch 0) loss 0.4123 2.31 steps/s, 3m28s left
    ...
    step 600/600 (end of epoch 4) loss 0.2051 2.35 steps/s, done in 4m15s

``composer-dynsample train`` adds it by itself when stdout is not a terminal (see ``docs/cli.md``); a
config names it ``progress_lines`` (``callbacks: {progress_lines: {every_batches: 50}}``).
"""

from __future__ import annotations

import math
import numbers
import sys
import time
from collections.abc import Mapping, Sequence

from composer.core import Callback, State, TimeUnit
from composer.loggers import Logger
from composer.utils import dist

from composer_dynsample.validation import check_float, check_int

__all__ = ["STATELESS_WARNING", "ProgressLines", "format_seconds"]

#: What Composer warns when a checkpoint written without this callback is resumed with it. It has no
#: state to restore, so the resume is exact: the run's builder silences this warning.
STATELESS_WARNING = r"ProgressLines is not in the state_dict"

#: The fraction of the run's batches between two lines when ``every_batches`` is not given.
DEFAULT_FRACTION = 0.1


def format_seconds(seconds: float) -> str:
    """A duration as ``45s``, ``3m28s`` or ``2h05m``.

    Example:
        >>> format_seconds(45.2), format_seconds(208), format_seconds(7500)
        ('45s', '3m28s', '2h05m')
    """
    whole = max(0, round(seconds))
    if whole < 60:
        return f"{whole}s"
    minutes, secs = divmod(whole, 60)
    if minutes < 60:
        return f"{minutes}m{secs:02d}s"
    hours, minutes = divmod(minutes, 60)
    return f"{hours}h{minutes:02d}m"


class ProgressLines(Callback):
    """Print a plain line every ``every_batches`` batches or every ``every_seconds`` seconds, whichever
    comes first, and one when the fit ends; on rank 0 only, to stdout, flushed at once.

    A line holds the batches trained and the run's total (when ``trainer.max_duration`` is in batches, or in
    epochs of a known length), the epoch under way (counted from 0), the batch's loss, the steps per
    second of this process's fit and the time left at that speed. The loss is the one Composer logs as
    ``loss/train/total`` (the batch's, averaged over the ranks), which Composer has already read from
    the device; where it is missing, ``state.loss`` is read, and only for a line: the steps without one
    read nothing. After a resume the counts go on from the checkpoint's, and the speed is measured from
    the resumed fit's start. A run whose length is in samples or tokens shows no total and estimates the
    time left from the fraction of ``max_duration`` done.

    Args:
        every_batches (int, optional): Print after every this many batches (counted from the run's
            start, so a resumed run prints at the same steps). Default: a tenth of the run's batches,
            or no batch interval when the total is unknown.
        every_seconds (float, optional): Also print when this many seconds passed since the last line
            (or the fit's start); ``None``: never by time. Default: ``30``.

    Example:
        >>> from composer import Trainer
        >>> trainer = Trainer(..., callbacks=[ProgressLines(every_batches=50)])  # doctest: +SKIP
    """

    def __init__(self, every_batches: int | None = None, every_seconds: float | None = 30.0) -> None:
        self.every_batches = check_int("every_batches", every_batches, minimum=1, allow_none=True)
        self.every_seconds = (
            None
            if every_seconds is None
            else check_float("every_seconds", every_seconds, minimum=0, strict_minimum=True)
        )
        self._interval: int | None = self.every_batches
        self._started = self._last_line = 0.0
        self._start_batch = 0
        self._start_fraction = 0.0

    def fit_start(self, state: State, logger: Logger) -> None:
        self._started = self._last_line = time.monotonic()
        self._start_batch = int(state.timestamp.batch)
        self._start_fraction = _elapsed_fraction(state)
        total = _total_batches(state)
        if self.every_batches is None and total is not None:
            self._interval = max(1, math.ceil(total * DEFAULT_FRACTION))

    def batch_end(self, state: State, logger: Logger) -> None:
        if dist.get_global_rank() != 0:
            return
        batch, now = int(state.timestamp.batch), time.monotonic()
        by_batch = self._interval is not None and batch % self._interval == 0
        by_time = self.every_seconds is not None and now - self._last_line >= self.every_seconds
        total = _total_batches(state)
        if not (by_batch or by_time) or (total is not None and batch >= total):
            return  # the last batch's line is the fit's end
        self._last_line = now
        speed, left = self._speed(state, batch, total, now)
        timing = ", ".join(part for part in (speed, left and f"{left} left") if part)
        self._print(state, batch, total, f"(epoch {int(state.timestamp.epoch)})", timing)

    def fit_end(self, state: State, logger: Logger) -> None:
        if dist.get_global_rank() != 0:
            return
        batch, now = int(state.timestamp.batch), time.monotonic()
        epoch, in_epoch = int(state.timestamp.epoch), int(state.timestamp.batch_in_epoch)
        where = f"(end of epoch {epoch - 1})" if in_epoch == 0 and epoch > 0 else f"(epoch {epoch})"
        speed, _ = self._speed(state, batch, None, now)
        timing = ", ".join(part for part in (speed, f"done in {format_seconds(now - self._started)}") if part)
        self._print(state, batch, _total_batches(state), where, timing)

    def _speed(self, state: State, batch: int, total: int | None, now: float) -> tuple[str, str]:
        """``("2.31 steps/s", "3m28s")`` of this fit so far; ``""`` for what is not known yet."""
        seconds, steps = now - self._started, batch - self._start_batch
        if seconds <= 0 or steps <= 0:
            return "", ""
        rate = steps / seconds
        if total is not None:
            left = (total - batch) / rate
        else:  # samples or tokens: the fraction of max_duration done, at this fit's pace
            done = _elapsed_fraction(state)
            pace = (done - self._start_fraction) / seconds
            left = (1.0 - done) / pace if pace > 0 else math.nan
        shown = f"{rate:.0f}" if rate >= 100 else f"{rate:.3g}"
        return f"{shown} steps/s", format_seconds(left) if math.isfinite(left) else ""

    def _print(self, state: State, batch: int, total: int | None, where: str, timing: str) -> None:
        step = f"step {batch}/{total}" if total is not None else f"step {batch}"
        loss = _loss(state)
        words = [step, where, f"loss {loss:.4f}" if loss is not None else "", timing]
        print(" ".join(word for word in words if word), file=sys.stdout, flush=True)


def _total_batches(state: State) -> int | None:
    """The run's batches in all (done and to come), or ``None`` when its length is not in batches or in
    epochs of a known length."""
    duration, stamp = state.max_duration, state.timestamp
    if duration is None:
        return None
    if duration.unit == TimeUnit.BATCH:
        return int(duration.value)
    length = state.dataloader_len
    if duration.unit != TimeUnit.EPOCH or length is None or int(length) <= 0:
        return None
    per_epoch, epoch, in_epoch = int(length), int(stamp.epoch), int(stamp.batch_in_epoch)
    epochs_left = int(duration.value) - epoch
    if epochs_left <= 0:
        return int(stamp.batch)
    return int(stamp.batch) + (epochs_left - 1) * per_epoch + max(0, per_epoch - in_epoch)


def _elapsed_fraction(state: State) -> float:
    """The fraction of ``max_duration`` done, ``0.0`` when Composer cannot tell."""
    try:
        fraction = state.get_elapsed_duration()
    except (AssertionError, RuntimeError, ValueError):
        return 0.0
    return 0.0 if fraction is None else float(fraction.value)


def _loss(state: State) -> float | None:
    """The last batch's loss: Composer's ``loss/train/total`` when it has one, else ``state.loss`` read now."""
    logged = getattr(state, "total_loss_dict", None) or {}
    value = logged.get("loss/train/total") if isinstance(logged, Mapping) else None
    if value is None:
        value = getattr(state, "loss", None)
    if isinstance(value, Mapping):
        value = value["total"] if "total" in value else (sum(value.values()) if value else None)
    elif isinstance(value, Sequence) and not isinstance(value, str):
        value = sum(value) if value else None
    if value is None:
        return None
    if isinstance(value, numbers.Real):
        return float(value)
    try:
        return float(value.detach().float().sum())  # a tensor: the one read of a step with a line
    except (AttributeError, RuntimeError, TypeError, ValueError):
        return None
