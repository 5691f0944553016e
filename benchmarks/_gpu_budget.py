"""Checks run in a worker process under deadlines, for ``gpu.py``: a check past its share is stopped.

The parent starts a worker (``gpu.py --events-to FILE ...``) as the leader of its own process group. The
worker imports torch and creates the CUDA context once, then runs its checks one after the other and
appends one JSON event a line to FILE: ``ready`` (with the machine and CUDA it found), then ``start`` and
``done`` (with the result) for each check. The parent follows FILE and kills the whole process group (the
worker, its DataLoader workers, the ranks it launched) when the running check outlives its share, when
the worker is not ready within its start-up share, or when the run's total is spent; that check is
recorded as ``timed_out`` and a fresh worker runs the checks left. A worker that dies during a check (a
crash, the kernel's out-of-memory killer) leaves that check an ``error``; after a check ends in
``error`` the worker exits by itself (a CUDA error can leave its context unusable) and a fresh one runs
the rest.

One worker for many checks, not a process per check: a process's start-up on the GPU machine is seconds
of imports (torch; 18 s with Composer), paid once here instead of once per check; CUDA state is per
process, so a fresh worker after a kill starts clean.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TextIO

# Kept from the total for writing the report after the last check: the whole run, parent included,
# stays within the total.
REPORT_S = 2.0
POLL_S = 0.05


@dataclass(frozen=True)
class Budget:
    """Seconds: a worker's start-up, each check's share, and the whole run (report included).

    Example:
        >>> Budget(10, {"miners": 30}, 60).scaled(2).shares_s
        {'miners': 60}
    """

    start_s: float
    shares_s: Mapping[str, float]
    total_s: float

    def scaled(self, factor: float) -> Budget:
        """Every share and the total times ``factor`` (``--budget`` on a slower or faster machine)."""
        if not factor > 0:
            raise ValueError(f"the budget's scale must be > 0, got {factor}.")
        shares = {name: share * factor for name, share in self.shares_s.items()}
        return Budget(self.start_s * factor, shares, self.total_s * factor)


@dataclass
class Run:
    """What the workers reported: each check's result, the first ``ready`` event, each start-up's seconds."""

    results: dict[str, dict] = field(default_factory=dict)
    ready: dict[str, Any] = field(default_factory=dict)
    starts_s: list[float] = field(default_factory=list)


def emitter(path: Path) -> Callable[..., None]:
    """The worker's side: a function appending ``{"event": EVENT, **fields}`` as one line to ``path``."""
    stream = path.open("a")

    def emit(event: str, **fields: Any) -> None:
        stream.write(json.dumps({"event": event, **fields}, default=_plain) + "\n")
        stream.flush()

    return emit


def _plain(value: Any) -> Any:
    """A numpy or torch scalar in a result as its Python value (json cannot write them), else its text."""
    return value.item() if hasattr(value, "item") else str(value)


def run_with_deadlines(
    names: Sequence[str], budget: Budget, command: Callable[[list[str], Path], list[str]]
) -> Run:
    """Run the checks ``names`` in workers started by ``command(checks, events_file)``, under ``budget``.

    Every check of ``names`` gets a result: the worker's, or ``timed_out`` / ``error`` (the module's rules). Each check
    prints ``NAME: STATUS in S s`` to stderr as it ends.
    """
    run, pending = Run(), list(names)
    end = time.monotonic() + budget.total_s - REPORT_S
    with tempfile.TemporaryDirectory(prefix="gpu-check-") as folder:
        for worker in range(len(names) + 1):  # each worker ends at least one check, or all of them
            if not pending:
                break
            if time.monotonic() >= end:
                why = f"not started: the run's {_seconds(budget.total_s)} s were spent"
                for name in pending:
                    _record(run, name, _timed_out(why, 0))
                break
            events = Path(folder) / f"worker-{worker}.jsonl"
            events.touch()
            _follow_worker(run, pending, budget, end, command(list(pending), events), events)
    run.results = {name: run.results[name] for name in names}
    return run


def _follow_worker(
    run: Run, pending: list[str], budget: Budget, end: float, command: list[str], events: Path
) -> None:
    """Start one worker and follow its events until it exits or is killed; ``pending`` loses what ended."""
    process = subprocess.Popen(command, start_new_session=True)
    launched = since = time.monotonic()
    ready, current, ended = False, None, 0
    with events.open() as stream:
        try:
            while True:
                exited = process.poll() is not None  # before reading: every event it wrote is then read
                for event in _new_events(stream):
                    now = time.monotonic()
                    if event["event"] == "ready":
                        ready = True
                        run.ready = run.ready or event
                        run.starts_s.append(round(now - launched, 1))
                        print(f"worker: ready in {now - launched:.1f} s", file=sys.stderr, flush=True)
                    elif event["event"] == "start":
                        current = event["check"]
                    elif event["event"] == "done":
                        _record(run, event["check"], event["result"])
                        pending.remove(event["check"])
                        current, ended = None, ended + 1
                    since = now
                if exited:
                    break
                share = budget.shares_s[current] if current else budget.start_s
                if time.monotonic() > min(since + share, end):
                    _kill(process)
                    _stopped(run, pending, current, ready, since, budget, end)
                    return
                time.sleep(POLL_S)
        finally:
            _kill(process)  # what the worker left running; the worker too if the parent was interrupted
    code = process.returncode
    how = f"was killed by signal {-code}" if code < 0 else f"exited with code {code}"
    if current is not None:
        _record(run, current, {"status": "error", "reason": f"the worker process {how} during this check",
                               "seconds": round(time.monotonic() - since, 1)})  # fmt: skip
        pending.remove(current)
    elif not ended:  # never ready, or no progress: another worker would do the same
        for name in list(pending):
            _record(run, name, {"status": "error", "reason": f"the worker process {how} before running it"})
        pending.clear()


def _new_events(stream: TextIO) -> list[dict]:
    """The complete lines appended to the events file since the last call (a partial line waits)."""
    events = []
    while True:
        position = stream.tell()
        line = stream.readline()
        if not line.endswith("\n"):
            stream.seek(position)
            return events
        events.append(json.loads(line))


def _stopped(
    run: Run, pending: list[str], current: str | None, ready: bool, since: float, budget: Budget, end: float
) -> None:
    """Record the check that was running as ``timed_out``; all pending ones if none was (a worker that
    does not start or go on would do the same again)."""
    now = time.monotonic()
    spent = f"stopped when the run's {_seconds(budget.total_s)} s were spent" if now >= end else None
    if current is None:
        state = "not ready" if not ready else "idle between checks"
        why = spent or f"the worker process was {state} for {_seconds(budget.start_s)} s (its start-up share)"
        for name in list(pending):
            _record(run, name, _timed_out(why, 0))
        pending.clear()
        return
    why = spent or f"stopped after {_seconds(budget.shares_s[current])} s, its share"
    _record(run, current, _timed_out(why, now - since))
    pending.remove(current)


def _seconds(value: float) -> str:
    """Seconds as a reason states them: ``0.5``, ``2.7``, ``300``."""
    return f"{round(value, 1):g}"


def _timed_out(reason: str, seconds: float) -> dict:
    return {"status": "timed_out", "reason": reason, "seconds": round(seconds, 1)}


def _record(run: Run, name: str, result: dict) -> None:
    """Keep a check's result and print its status and seconds as it ends."""
    run.results[name] = result
    if result["status"] == "skipped":
        line = f"{name}: skipped ({result.get('reason', '')})"
    else:
        line = f"{name}: {result['status']} in {result.get('seconds', 0):.1f} s"
        if result["status"] in ("timed_out", "error"):
            line += f" ({result.get('reason', '')})"
    print(line, file=sys.stderr, flush=True)


def _kill(process: subprocess.Popen) -> None:
    """Kill the worker's process group (it leads one: its DataLoader workers, ranks), then reap the worker."""
    with contextlib.suppress(ProcessLookupError):  # the group is gone already
        os.killpg(process.pid, signal.SIGKILL)
    process.wait()
