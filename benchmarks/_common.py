"""The harness every benchmark shares: arguments, interleaved timing, peak memory, machine, writers, plots.

A benchmark script states its question in its docstring, measures, and hands a result dict and a
markdown table to :func:`write_results`, which writes ``results/NAME.json`` and ``results/NAME.md``
(``NAME_quick.*`` for ``--quick`` smoke runs, which git ignores) and, given a plot function, the PNG.
Timings are side by side in one process (:func:`time_interleaved`), never absolute goals.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.metadata
import json
import os
import platform
import shlex
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any

RESULTS = Path(__file__).parent / "results"
ROOT = Path(__file__).resolve().parent.parent


def parser(doc: str | None, *, quick_help: str, threads: int | None = None) -> argparse.ArgumentParser:
    """The arguments every benchmark takes: ``--quick``, ``--out`` and (given a default) ``--threads``."""
    parser = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help=quick_help)
    parser.add_argument("--out", type=Path, default=RESULTS)
    if threads is not None:
        parser.add_argument(
            "--threads", type=int, default=threads, help=f"torch.set_num_threads (default {threads})"
        )
    return parser


def time_interleaved(fns: dict[str, Callable[[], object]], rounds: int, warmup: int = 1) -> dict[str, float]:
    """Median seconds per call of each function, timing every function once per round, in turn.

    Interleaving spreads the noise of a shared machine over all the functions alike, so their ratio
    holds even when the absolute times drift.
    """
    for fn in fns.values():
        for _ in range(warmup):
            fn()
    samples: dict[str, list[float]] = {name: [] for name in fns}
    for _ in range(rounds):
        for name, fn in fns.items():
            start = time.perf_counter()
            fn()
            samples[name].append(time.perf_counter() - start)
    return {name: statistics.median(values) for name, values in samples.items()}


def in_units(seconds: dict[str, float], unit: str = "ms", digits: int = 3) -> dict[str, float]:
    """Each of ``seconds`` (the medians of :func:`time_interleaved`, say) as ``NAME_ms`` (or ``NAME_us``),
    rounded to ``digits``, for a result row.

    Example:
        >>> in_units({"step": 0.0123456, "mine": 0.0004}), in_units({"call": 2.5e-6}, "us", 1)
        ({'step_ms': 12.346, 'mine_ms': 0.4}, {'call_us': 2.5})
    """
    scale = {"ms": 1e3, "us": 1e6}[unit]
    return {f"{name}_{unit}": round(value * scale, digits) for name, value in seconds.items()}


def rounds_for_budget(fns: dict[str, Callable[[], object]], budget_s: float, max_rounds: int) -> int:
    """Call each function once (the warm-up) and return how many interleaved rounds fit ``budget_s``."""
    start = time.perf_counter()
    for fn in fns.values():
        fn()
    per_round = time.perf_counter() - start
    return max(3, min(max_rounds, int(budget_s / max(per_round, 1e-6))))


def peak_growth_bytes(call: Callable[[], object]) -> int:
    """How far one call raises the process's peak resident memory, in bytes.

    Meant for a fresh worker process (see :func:`run_worker`) that has warmed the code path at a tiny
    size: the peak (``VmHWM``) is reset to the current RSS first where Linux allows it, else the growth
    of ``ru_maxrss`` is taken.
    """
    import resource

    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")  # reset VmHWM to the current RSS
        before = proc_status_kib("VmRSS")
    except OSError:
        before = None
    if before is not None:
        out = call()
        growth_kib = (proc_status_kib("VmHWM") or 0) - before
    else:
        start = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        out = call()
        growth_kib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - start
        growth_kib //= 1024 if sys.platform == "darwin" else 1  # ru_maxrss is in bytes on macOS
    del out
    return growth_kib * 1024


def proc_status_kib(key: str) -> int | None:
    """A ``/proc/self/status`` field in KiB (``VmRSS``, ``VmHWM``, ...), or ``None`` where unavailable."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith(key + ":"):
                    return int(line.split()[1])
    except OSError:
        return None
    return None


def run_worker(
    script: Path, flag: str, *values: object, timeout: float = 600, env: dict[str, str] | None = None
) -> dict[str, Any]:
    """Run ``script flag values...`` in a fresh process and return the JSON it prints last.

    Peak memory (``VmHWM``) is only meaningful in a process that did nothing else: each measurement
    gets its own. ``env`` adds environment variables for the worker.
    """
    command = [sys.executable, str(script), flag, *map(str, values)]
    environment = {**os.environ, **(env or {})}
    output = subprocess.run(
        command, capture_output=True, text=True, check=True, timeout=timeout, env=environment
    ).stdout
    return json.loads(output.strip().splitlines()[-1])


def load_average() -> tuple[float, float, float] | None:
    """The 1, 5 and 15 minute load averages, recorded beside timings (``None`` where unavailable)."""
    return os.getloadavg() if hasattr(os, "getloadavg") else None


def machine_info(torch_threads: bool = True) -> str:
    """One line naming the machine: CPU, cores, (if asked) torch's thread count, Python, torch, Composer."""
    import torch

    cpu = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as f:
            cpu = next((line.split(":", 1)[1].strip() for line in f if line.startswith("model name")), cpu)
    except OSError:
        pass
    parts = [
        f"{cpu}, {os.cpu_count()} cores",
        f"python {platform.python_version()}",
        f"torch {torch.__version__}",
    ]
    with contextlib.suppress(importlib.metadata.PackageNotFoundError):
        parts.append(f"composer {importlib.metadata.version('mosaicml')}")
    if torch_threads:
        parts.insert(1, f"{torch.get_num_threads()} torch threads")
    return ", ".join(parts)


class LoadWatch:
    """The load averages when a benchmark starts (at construction) and when it reports, with the machine."""

    def __init__(self) -> None:
        self.before = load_average()

    def note(self) -> str:
        """A line for the results' notes: the load averages before and now."""
        now = load_average()
        return (
            f"load average {self.before} before, {now} after (other work on this machine slows every timing)"
        )

    def fields(self) -> dict[str, Any]:
        """The result's ``load_average`` (before and now) and ``machine`` (:func:`machine_info`)."""
        return {"load_average": [self.before, load_average()], "machine": machine_info()}


#: Composer's name of each device a benchmark's ``--device`` (torch's name) takes: Composer calls CUDA ``gpu``.
COMPOSER_DEVICES = {"cpu": "cpu", "cuda": "gpu", "mps": "mps"}
#: Composer's ``trainer.precision`` of each ``--precision`` a benchmark takes.
COMPOSER_PRECISIONS = {"fp32": "fp32", "bf16": "amp_bf16", "fp16": "amp_fp16"}


def trainer_overrides(device: str, precision: str = "fp32") -> list[str]:
    """The ``composer-dynsample`` overrides that run on a benchmark's ``--device`` at its ``--precision``.

    Both are always given: without ``trainer.device`` Composer takes any GPU it sees, and on a GPU its
    default precision is ``amp_fp16``, so a CPU run and a float32 run must say so.

    Args:
        device (str): torch's name of the device: ``cpu``, ``cuda`` or ``mps``.
        precision (str): ``fp32``, ``bf16`` or ``fp16`` (autocast, on CUDA only). Default: ``fp32``.

    Returns:
        list[str]: ``trainer.device=...`` and ``trainer.precision=...``.

    Raises:
        ValueError: If ``device`` or ``precision`` is unknown, or a mixed precision is asked off CUDA.

    Example:
        >>> trainer_overrides("cuda", "bf16")
        ['trainer.device=gpu', 'trainer.precision=amp_bf16']
    """
    if device not in COMPOSER_DEVICES:
        raise ValueError(f"device must be one of {sorted(COMPOSER_DEVICES)}, got {device!r}.")
    if precision not in COMPOSER_PRECISIONS:
        raise ValueError(f"precision must be one of {sorted(COMPOSER_PRECISIONS)}, got {precision!r}.")
    if precision != "fp32" and device != "cuda":
        raise ValueError(
            f"precision {precision!r} runs on CUDA only (Composer's autocast); got device {device!r}."
        )
    return [
        f"trainer.device={COMPOSER_DEVICES[device]}",
        f"trainer.precision={COMPOSER_PRECISIONS[precision]}",
    ]


def write_results(
    out: Path,
    name: str,
    quick: bool,
    result: dict[str, Any],
    table: str,
    *,
    notes: Sequence[str] = (),
    plot: Callable[[Path], None] | None = None,
) -> dict[str, Any]:
    """Write ``NAME.json`` (the result, with the command that made it under ``command`` unless the result
    names its own), ``NAME.md`` (the table, then the notes) and ``NAME.png``."""
    out.mkdir(parents=True, exist_ok=True)
    stem = f"{name}_quick" if quick else name
    result = {**result, "command": result.get("command") or command_line()}
    (out / f"{stem}.json").write_text(json.dumps(result, indent=2) + "\n")
    (out / f"{stem}.md").write_text("\n\n".join([table, *notes]) + "\n")
    if plot is not None:
        plot(out / f"{stem}.png")
    return result


def merged_recipes(
    stored: Path, recipes: dict, seeds: Sequence[int], order: Iterable[str], *, keep_others: bool = False
) -> dict:
    """``--merge``: the recipes of the result stored at ``stored`` (run with the same seeds), ``recipes``
    replacing theirs, in ``order``; stored names outside ``order`` follow it with ``keep_others``, else
    they are dropped.

    Without a stored result, ``recipes`` as they are.
    """
    if not stored.exists():
        return recipes
    result = json.loads(stored.read_text())
    if result["seeds"] != seeds:
        raise SystemExit(f"--merge: {stored} was run with seeds {result['seeds']}, this run with {seeds}.")
    merged = {**result["recipes"], **recipes}
    names = [name for name in order if name in merged]
    if keep_others:
        names += [name for name in merged if name not in names]
    return {name: merged[name] for name in names}


def ablation_folder(out: Path, question: str) -> Path:
    """Where the runs that answer ``question`` go below the results folder ``out``: ``out/ablations/QUESTION``
    (the headline results stay in ``out`` itself; ``results/ablations/README.md`` indexes the questions)."""
    return out / "ablations" / question


def command_line(argv: Sequence[str] | None = None) -> str:
    """The command that runs this process's benchmark, as a person types it from the repository root:
    ``python benchmarks/NAME.py ARGS``, paths inside the repository relative to it."""
    argv = list(sys.argv if argv is None else argv)
    words = []
    for word in argv[1:]:
        path = Path(word)
        if path.is_absolute() and path.resolve().is_relative_to(ROOT):
            word = str(path.resolve().relative_to(ROOT))
        words.append(word)
    script = Path(argv[0])
    script = script.resolve().relative_to(ROOT) if script.resolve().is_relative_to(ROOT) else script
    return shlex.join(["python", str(script), *words])


def markdown_table(header: Sequence[str], align: str, rows: Sequence[Sequence[object]]) -> str:
    """A markdown table; ``align`` holds one character per column, ``l`` or ``r``."""
    marks = ["---:" if a == "r" else "---" for a in align]
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join(marks) + "|"]
    lines += ["| " + " | ".join(str(cell) for cell in row) + " |" for row in rows]
    return "\n".join(lines)


def goal_table(goals: Sequence[dict[str, Any]]) -> str:
    """The markdown table of ``goals``, each a ``{"goal", "measured", "met"}`` record."""
    return markdown_table(
        ["goal", "measured", "met"],
        "lll",
        [[g["goal"], g["measured"], "yes" if g["met"] else "NO"] for g in goals],
    )


def save_figure(figure: Any, path: Path, *, rect: tuple[float, float, float, float] | None = None) -> None:
    """Lay out, save at the benchmarks' resolution, and close a matplotlib figure."""
    import matplotlib.pyplot as plt

    figure.tight_layout(rect=rect) if rect is not None else figure.tight_layout()
    figure.savefig(path, dpi=110)
    plt.close(figure)


def label_axes(ax: Any, xlabel: str, ylabel: str, title: str, *, log: bool = True) -> None:
    """Axis labels, title and a light grid (log-scaled when asked) for a benchmark plot."""
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    ax.grid(True, which="both", alpha=0.3)
    if log:
        ax.set_yscale("log")
