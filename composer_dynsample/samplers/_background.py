"""Refresh searches that run beside training: ``MinedNegativesPKBatchSampler(refresh_in_background=True)``.

The rows are copied in the calling thread when a search starts, at a point of the iteration fixed in
advance, and searched in a daemon thread (torch, numpy and faiss release the GIL while they compute). The
sampler joins each search at the step boundary fixed when it started, so a late search makes the rank
wait there and never changes what was searched; an error in the thread is raised again at the join.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

import numpy as np
import torch

from composer_dynsample.samplers._candidates import CorpusCandidates

#: ``(rows, valid) -> candidates``: the sampler's search, run in the thread.
Search = Callable[[torch.Tensor, Any], CorpusCandidates]
#: ``(epoch, segment)``: the epoch and the segment of ``refresh_every`` batches a search applies from.
Key = tuple[int, int]
HANDOVER = "the snapshot handed over at an epoch start"


def frozen(values: Any) -> Any:
    """A CPU copy of ``values`` (a tensor, an array or ``None``) that later writes to them cannot change."""
    if values is None:
        return None
    if isinstance(values, torch.Tensor):
        return values.detach().to("cpu", copy=True)
    return np.array(values, copy=True)


class BackgroundSearch:
    """One search of a frozen copy of the rows, in a daemon thread; :meth:`result` waits for it.

    Args:
        search (Callable): ``(rows, valid) -> CorpusCandidates``, run in the thread.
        rows (torch.Tensor): The ``(N, D)`` rows to search, copied now, in the calling thread.
        valid (torch.Tensor | numpy.ndarray, optional): Which rows hold an embedding, copied now too.
        name (str): The refresh, as the error of a failed search names it.
    """

    def __init__(self, search: Search | None, rows: Any, valid: Any, name: str) -> None:
        self.name = name
        self._found: CorpusCandidates | None = None
        self._error: BaseException | None = None
        self._thread: threading.Thread | None = None
        if search is not None:
            self._thread = threading.Thread(
                target=self._run,
                args=(search, frozen(rows), frozen(valid)),
                name=f"composer_dynsample refresh ({name})",
                daemon=True,  # an interrupted run exits without waiting for it
            )
            self._thread.start()

    @classmethod
    def finished(cls, found: CorpusCandidates, name: str) -> BackgroundSearch:
        """A search already done (restored from a checkpoint): :meth:`result` returns ``found``."""
        search = cls(None, None, None, name)
        search._found = found
        return search

    def _run(self, search: Search, rows: torch.Tensor, valid: Any) -> None:
        try:
            self._found = search(rows, valid)
        except BaseException as error:  # raised again in the calling thread by result()
            self._error = error

    def result(self) -> CorpusCandidates:
        """Wait for the search; its candidates, or its error again as one line that names the refresh.

        Returns:
            CorpusCandidates: What the sampler's search found in the frozen rows.
        """
        if self._thread is not None:
            self._thread.join()
        if self._error is not None:
            first = (str(self._error).strip().splitlines() or [""])[0]
            raise RuntimeError(
                f"MinedNegativesPKBatchSampler: the background refresh of {self.name} failed: "
                f"{type(self._error).__name__}: {first} (refresh_in_background=False runs the same search "
                "inline, where it fails at the step it runs)."
            ) from self._error
        return self._found  # type: ignore[return-value]  # set when the thread ended without error

    def __getstate__(self) -> dict[str, Any]:
        """A copy (pickle, ``copy.deepcopy``) waits for the search and holds its result."""
        return {"name": self.name, "found": self.result()}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__init__(None, None, None, state["name"])  # type: ignore[misc]
        self._found = state["found"]


class BackgroundRefreshes:
    """The searches a sampler runs beside training: each under the ``(epoch, segment)`` it applies from,
    and the one handed over at an epoch start (:attr:`handover`), whose epoch the next ``set_epoch`` names."""

    def __init__(self, handover: dict[str, np.ndarray] | None = None) -> None:
        self.running: dict[Key, BackgroundSearch] = {}
        self.handover: BackgroundSearch | None = None
        if handover is not None:  # a checkpoint's
            self.handover = BackgroundSearch.finished(CorpusCandidates(**handover), HANDOVER)

    def busy(self) -> bool:
        """Whether a search was started and not joined yet."""
        return bool(self.running) or self.handover is not None

    def start(self, key: Key, search: Search, rows: torch.Tensor, valid: Any) -> None:
        """Search a frozen copy of ``rows`` beside training, for the epoch's segment of ``key``."""
        self.running[key] = BackgroundSearch(search, rows, valid, f"epoch {key[0]}, segment {key[1]}")

    def hand_over(self, search: Search, rows: torch.Tensor, valid: Any) -> None:
        """Search a frozen copy of an epoch start's ``rows`` beside training; see :meth:`assign`."""
        self.handover = BackgroundSearch(search, rows, valid, HANDOVER)

    def assign(self, epoch: int) -> None:
        """The search handed over (if any) applies from ``epoch``'s segment 1; earlier epochs' searches,
        left running by an iteration that stopped before their boundary, are dropped."""
        self.running = {key: search for key, search in self.running.items() if key[0] >= epoch}
        if self.handover is not None:
            self.handover.name = f"epoch {epoch}, segment 1 (handed over at the epoch start)"
            self.running[(epoch, 1)] = self.handover
            self.handover = None

    def join(self, epoch: int, segment: int | None = None) -> list[tuple[Key, CorpusCandidates]]:
        """Wait for ``epoch``'s searches (of one ``segment``, or all of them) and hand them over, in
        segment order.

        Returns:
            list[tuple[Key, CorpusCandidates]]: Each search's key and result; none are running any more.
        """
        keys = sorted(key for key in self.running if key[0] == epoch and segment in (None, key[1]))
        return [(key, self.running.pop(key).result()) for key in keys]

    def handover_state(self) -> dict[str, np.ndarray] | None:
        """The search handed over and not assigned yet, waited for, as a checkpoint holds it."""
        return None if self.handover is None else self.handover.result()._asdict()
