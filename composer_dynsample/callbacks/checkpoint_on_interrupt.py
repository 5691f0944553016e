"""Save a checkpoint at the next batch end when the process is asked to stop (Ctrl-C, ``SIGTERM``)."""

from __future__ import annotations

import contextlib
import signal
import sys
import threading
from collections.abc import Callable, Iterator, Sequence
from types import FrameType

import torch
from composer.core import Callback, State
from composer.loggers import Logger

from composer_dynsample.distributed import all_reduce_sum, get_world_size

__all__ = ["CheckpointOnInterrupt", "TrainingInterrupted"]


class TrainingInterrupted(Exception):
    """Training stopped on a signal, after every rank saved a checkpoint at the same batch.

    Attributes:
        signal_number (int): The signal (``signal.SIGINT``, ``signal.SIGTERM``).
        checkpoint (str | None): The checkpoint this rank saved (``None`` on ranks that save no file).
        batch (int): The batches trained, counted from the start of training.
        epoch (int): The epochs completed.
        batch_in_epoch (int): The batches trained in the epoch under way.
    """

    def __init__(
        self, signal_number: int, checkpoint: str | None, batch: int, epoch: int, batch_in_epoch: int
    ) -> None:
        self.signal_number, self.checkpoint = signal_number, checkpoint
        self.batch, self.epoch, self.batch_in_epoch = batch, epoch, batch_in_epoch
        super().__init__(f"{self.where}; saved {checkpoint}")

    @property
    def where(self) -> str:
        """``interrupted by SIGINT after 30 batches (1 epoch and 8 batches)``."""
        name = signal.Signals(self.signal_number).name
        epochs = f"{self.epoch} epoch{'s' * (self.epoch != 1)} and {self.batch_in_epoch} batches"
        return f"interrupted by {name} after {self.batch} batches ({epochs})"

    @property
    def exit_code(self) -> int:
        """``128 + signal``, the shell's convention: ``130`` for ``SIGINT``, ``143`` for ``SIGTERM``."""
        return 128 + self.signal_number


class CheckpointOnInterrupt(Callback):
    """On ``SIGINT`` or ``SIGTERM``, save a checkpoint at the next batch end on every rank, then stop.

    The signal handler only notes the signal; at ``BATCH_CHECKPOINT`` (after the batch's evaluation, where
    Composer's own checkpoints are saved) the ranks agree with one all-reduce whether any of them was
    signalled, so that all save the same batch and none waits for a rank that left. ``save`` writes the
    checkpoint on every rank and returns the file this rank wrote; then :class:`TrainingInterrupted` is
    raised out of ``Trainer.fit``. A mid-epoch checkpoint resumes exactly (with
    :class:`~composer_dynsample.SetSamplerEpoch`). The same signal a second time stops at once (Ctrl-C
    twice), without a checkpoint.

    The handlers are installed only inside :meth:`catching_signals` (around ``fit``); elsewhere the
    callback does nothing, on every rank alike.

    Args:
        save (Callable[[], str | None], optional): Saves the checkpoint; e.g.
            ``trainer.save_checkpoint_to_save_folder`` followed by the path. Can be set after construction
            (the Trainer exists only then). Default: ``None`` (stop without saving).
        signals (Sequence[int]): The signals caught. Default: ``(SIGINT, SIGTERM)``.

    Example:
        >>> callback = CheckpointOnInterrupt()
        >>> with callback.catching_signals():
        ...     pass  # trainer.fit()
    """

    def __init__(
        self,
        save: Callable[[], str | None] | None = None,
        signals: Sequence[int] = (signal.SIGINT, signal.SIGTERM),
    ) -> None:
        self.save = save
        self.signals = tuple(int(number) for number in signals)
        self.received: int | None = None
        self._active = False

    def _handle(self, number: int, frame: FrameType | None) -> None:
        if self.received == number:  # the same signal again: stop now
            if number == signal.SIGINT:
                raise KeyboardInterrupt
            sys.exit(128 + number)
        if self.received is None:
            self.received = number

    @contextlib.contextmanager
    def catching_signals(self) -> Iterator[None]:
        """Catch the signals inside the block; the previous handlers come back after.

        Python handles signals in the main thread only: elsewhere the block runs without catching them.
        """
        if threading.current_thread() is not threading.main_thread():
            yield
            return
        previous = {number: signal.getsignal(number) for number in self.signals}
        self._active, self.received = True, None
        for number in self.signals:
            signal.signal(number, self._handle)
        try:
            yield
        finally:
            self._active = False
            for number, handler in previous.items():
                signal.signal(number, handler)

    def _agreed_signal(self, state: State) -> int | None:
        """The signal to stop on, when any rank received one; one all-reduce when there are many ranks."""
        counts = torch.zeros(len(self.signals), dtype=torch.int64)
        if self.received is not None:
            counts[self.signals.index(self.received)] = 1
        if get_world_size() > 1:
            counts = all_reduce_sum(state.device.tensor_to_device(counts)).cpu()
        if not bool(counts.any()):
            return None
        return self.received or self.signals[int(torch.nonzero(counts)[0])]

    def batch_checkpoint(self, state: State, logger: Logger) -> None:
        if not self._active:
            return
        number = self._agreed_signal(state)
        if number is None:
            return
        checkpoint = self.save() if self.save is not None else None
        timestamp = state.timestamp
        raise TrainingInterrupted(
            number, checkpoint, int(timestamp.batch), int(timestamp.epoch), int(timestamp.batch_in_epoch)
        )
