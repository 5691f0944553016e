"""How many intra-op threads should one training process use on this machine?

Trains the same short recipe (``composer-dynsample train``, a fresh process each time) with
``OMP_NUM_THREADS`` at each count asked for (default: 1, 2 and every core) and once with it unset,
which is what the command line chooses by itself (:func:`composer_dynsample.cli.commands.set_cpu_threads`),
in interleaved rounds, and reports each setting's median ``trainer.fit()`` time against one thread.

    python benchmarks/threads.py [--quick] [--config yamls/mnist1d_default.yaml] [--epochs 3] [--rounds 3]
        [--threads 2 4]
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from _common import machine_info, markdown_table, write_results
from _common import parser as make_parser

ROOT = Path(__file__).resolve().parents[1]


def train_once(config: str, epochs: int, threads: str | None, run_dir: Path) -> float:
    """Seconds of ``trainer.fit()`` for one run with ``OMP_NUM_THREADS=threads`` (``None``: unset)."""
    env = {key: value for key, value in os.environ.items() if key != "OMP_NUM_THREADS"}
    if threads is not None:
        env["OMP_NUM_THREADS"] = threads
    command = [
        sys.executable,
        "-m",
        "composer_dynsample",
        "train",
        config,
        f"trainer.max_duration={epochs}ep",
        "evaluation.interval=null",
        "trainer.save_folder=null",
        "--quiet",
        "--overwrite",
        "--run-dir",
        str(run_dir),
    ]
    subprocess.run(command, cwd=ROOT, env=env, check=True, capture_output=True, text=True, timeout=1800)
    return float(json.loads((run_dir / "metrics.json").read_text())["wall_time_s"])


def thread_settings(counts: list[int] | None, cores: int) -> list[str | None]:
    """The ``OMP_NUM_THREADS`` values to compare, 1 (the baseline) first and ``None`` (unset) last.

    Without ``counts``: 1, 2 and ``cores``. ``OMP_NUM_THREADS=N`` is how a thread count reaches the
    command line's process: with it set the CLI leaves torch's count alone, and torch starts with N
    intra-op threads (what ``torch.set_num_threads(N)`` would set), so N = ``cores`` is torch's own
    default of every core.

    Raises:
        ValueError: a count below 1.
    """
    if counts is not None and any(count < 1 for count in counts):
        raise ValueError(f"--threads must be integers >= 1, got {counts}")
    chosen = {1, *(counts if counts is not None else (2, cores))}
    return [*(str(count) for count in sorted(chosen)), None]


def _cells(row: dict) -> list[str]:
    """One table line: the setting, its median, every run and its ratio to one thread."""
    runs = ", ".join(f"{t:.1f}" for t in row["fit_s"])
    return [row["omp_num_threads"], f"{row['median_fit_s']:.1f}", runs, f"{row['over_one_thread']:.2f}"]


def threads_table(rows: list[dict]) -> str:
    """The table of ``threads.md``: one line per setting."""
    return markdown_table(
        ["OMP_NUM_THREADS", "median fit (s)", "runs (s)", "time / 1 thread"],
        "lrrr",
        [_cells(r) for r in rows],
    )


def main(argv: list[str] | None = None) -> dict:
    parser = make_parser(__doc__, quick_help="digits_quick, 1 epoch, 1 round: a smoke test")
    parser.add_argument("--config", default=None, help="the recipe (default: yamls/mnist1d_default.yaml)")
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument(
        "--threads",
        nargs="+",
        type=int,
        default=None,
        help="OMP_NUM_THREADS values beside 1 (default: 2 and the number of cores)",
    )
    args = parser.parse_args(argv)
    config = args.config or ("yamls/digits_quick.yaml" if args.quick else "yamls/mnist1d_default.yaml")
    epochs, rounds = (1, 1) if args.quick else (args.epochs, args.rounds)
    cores = os.cpu_count() or 1
    try:
        settings = thread_settings(args.threads, cores)
    except ValueError as error:
        parser.error(str(error))
    times: dict[str, list[float]] = {str(s): [] for s in settings}
    load_before = os.getloadavg()
    with tempfile.TemporaryDirectory(prefix="dynsample-threads-") as work:
        for round_index in range(rounds):
            for setting in settings:
                seconds = train_once(config, epochs, setting, Path(work) / f"run-{setting}")
                times[str(setting)].append(seconds)
                print(
                    f"round {round_index}: OMP_NUM_THREADS={setting or 'unset'}: {seconds:.1f} s", flush=True
                )
    medians = {name: statistics.median(values) for name, values in times.items()}
    rows = [
        {
            "omp_num_threads": name if name != "None" else "unset (the CLI's choice)",
            "fit_s": times[name],
            "median_fit_s": round(medians[name], 2),
            "over_one_thread": round(medians[name] / medians["1"], 3),
        }
        for name in times
    ]
    table = threads_table(rows)
    slowest = max(r["over_one_thread"] for r in rows)
    measured = (
        f"{config}, {epochs} epoch(s), {rounds} interleaved round(s), {cores} cores; load average "
        f"{load_before[0]:.2f} before, {os.getloadavg()[0]:.2f} after"
    )
    print(f"{table}\n\nmeasured: {measured}")
    result = {
        "ratio": slowest,
        "ratio_meaning": "slowest setting's median fit time / one thread's (same recipe, interleaved)",
        "rows": rows,
        "measured": measured,
        "machine": machine_info(torch_threads=False),
        "date": time.strftime("%Y-%m-%d"),
    }
    return write_results(args.out, "threads", args.quick, result, table, notes=[f"measured: {measured}"])


if __name__ == "__main__":
    main()
