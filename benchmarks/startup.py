"""How long does ``composer-dynsample train`` take to import what it needs, against torch, Composer and
transformers alone?

Each command is a fresh ``python -c`` process that times its own imports (``time.perf_counter`` around
them; the process's wall time, interpreter start and exit included, is recorded beside it). The commands
run in turn, round after round, after one warm-up run each (the files in the page cache), so load from
other processes hits them alike; the medians are compared. Goal (issue 35, start-up): the training path
imports in at most 1.5x the time of ``import torch, composer, transformers``.

The training path is what ``train`` has imported when ``Trainer.fit`` starts, without the work between
(reading the config and the data, building the model): the command line and its commands, the interrupt
callback, :mod:`composer_dynsample.config.run` (``build_run``), the registry targets the recipe names
(data loader, encoder, loss, sampler, algorithms, callbacks, optimizer, scheduler), what building the
model imports (``transformers.models.bert.modeling_bert``: the model class of an all-MiniLM-L6-v2
folder) and what Composer's engine imports when a run has algorithms (``composer.algorithms``, for its
default ordering passes). Checked against a traced ``train yamls/finetune_code_search.yaml`` and ``train
yamls/mnist1d_default.yaml`` (``sys.modules`` when ``fit`` was entered, with a small BERT folder as
``model.encoder.path``): the import lists below loaded the same modules, but for a codec module the data
files needed.

One more process, ``python -X importtime``, profiles the text recipe's path: the time each package's own
modules take (self time, whoever imported them) and the heaviest imports that enter a package from another
(cumulative: with what they import in turn, so nested entries overlap).

    python benchmarks/startup.py [--quick] [--rounds 7] [--out benchmarks/results]
"""

from __future__ import annotations

import os
import re
import statistics
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Sequence
from pathlib import Path

from _common import load_average, machine_info, markdown_table, write_results
from _common import parser as make_parser

ROOT = Path(__file__).resolve().parents[1]
GOAL = 1.5
BASELINE = "torch + Composer + transformers"
TEXT = "train, text (finetune_code_search)"
# Each command's imports, in the order train makes them.
_COMMON = (
    "composer_dynsample.cli.main",
    "composer_dynsample.cli.commands",
    "composer_dynsample.callbacks.checkpoint_on_interrupt",
    "composer_dynsample.config.run",
)
_RECIPE = (
    "composer_dynsample.losses",
    "composer_dynsample.samplers",
    "composer_dynsample.algorithms",
    "composer_dynsample.callbacks.set_sampler_epoch",
    "torch.optim",
)
COMMANDS: dict[str, tuple[str, ...]] = {
    BASELINE: ("torch", "composer", "transformers"),
    TEXT: (
        *_COMMON,
        "composer_dynsample.data.text.code_search_pairs",
        "composer_dynsample.models.transformer",
        *_RECIPE,
        "transformers.models.bert.modeling_bert",
        "composer.algorithms",
    ),
    "train, mnist1d (mnist1d_default)": (
        *_COMMON,
        "composer_dynsample.data.mnist1d",
        "composer_dynsample.models.encoders",
        "composer_dynsample.models.transformer",  # the model builder asks whether the encoder is one
        *_RECIPE,
        "composer_dynsample.schedulers",
        "composer.algorithms",
    ),
    "command line only (before the config is read)": _COMMON[:2],
}
_PROBE = (
    "import time\nstart, cpu = time.perf_counter(), time.process_time()\n{imports}\n"
    "print(time.perf_counter() - start, time.process_time() - cpu)"
)
# What each run records: the imports' wall and CPU seconds, and the whole process's wall seconds.
_SAMPLES = ("import_s", "import_cpu_s", "process_s")
_IMPORTTIME = re.compile(r"import time:\s+(\d+) \|\s+(\d+) \|( *)(\S+)")


def import_code(modules: Sequence[str]) -> str:
    """The ``python -c`` program that imports ``modules`` and prints the wall and CPU seconds that took."""
    return _PROBE.format(imports="\n".join(f"import {module}" for module in modules))


def run_once(modules: Sequence[str]) -> tuple[float, float, float]:
    """``(import seconds, import CPU seconds, process seconds)`` of one fresh process importing ``modules``."""
    start = time.perf_counter()
    done = subprocess.run(
        [sys.executable, "-c", import_code(modules)], cwd=ROOT, capture_output=True, text=True, timeout=600
    )
    process_s = time.perf_counter() - start
    if done.returncode != 0:
        raise SystemExit(f"importing {', '.join(modules)} failed:\n{done.stderr[-3000:]}")
    import_s, import_cpu_s = map(float, done.stdout.split()[-2:])
    return import_s, import_cpu_s, process_s


def parse_importtime(text: str) -> list[tuple[str, int, int, str | None]]:
    """``(module, self us, cumulative us, importer)`` of each line of ``python -X importtime`` output.

    Example:
        >>> parse_importtime(
        ...     "import time: self [us] | cumulative | imported package\\n"
        ...     "import time:        5 |          5 |   b\\n"
        ...     "import time:       10 |         15 | a\\n"
        ... )
        [('b', 5, 5, 'a'), ('a', 10, 15, None)]
    """
    rows = [
        (m[4], int(m[1]), int(m[2]), len(m[3]) // 2) for m in map(_IMPORTTIME.match, text.splitlines()) if m
    ]
    importers: list[str | None] = [None] * len(rows)
    open_parents: list[tuple[int, str]] = []  # a module's children are printed before it, one level deeper
    for index in range(len(rows) - 1, -1, -1):
        name, _, _, depth = rows[index]
        while open_parents and open_parents[-1][0] >= depth:
            open_parents.pop()
        importers[index] = open_parents[-1][1] if open_parents else None
        open_parents.append((depth, name))
    return [(name, own, total, importers[i]) for i, (name, own, total, _) in enumerate(rows)]


def package_seconds(rows: Sequence[tuple[str, int, int, str | None]], top: int) -> list[dict]:
    """The ``top`` packages by the self time of their modules, in seconds."""
    totals: Counter[str] = Counter()
    for name, own, _, _ in rows:
        totals[name.split(".")[0]] += own
    return [{"package": name, "self_s": round(us / 1e6, 3)} for name, us in totals.most_common(top)]


def heaviest_imports(rows: Sequence[tuple[str, int, int, str | None]], top: int) -> list[dict]:
    """The ``top`` imports by cumulative time among those that enter a package from another (or from the
    command): who pulls in what, e.g. ``torchmetrics`` from ``composer.core.state``.

    Example:
        >>> rows = [("b.x", 5, 5, "a"), ("a.y", 1, 1, "a"), ("a", 10, 16, None)]
        >>> [row["module"] for row in heaviest_imports(rows, 2)]
        ['a', 'b.x']
    """
    entries = [row for row in rows if row[3] is None or row[3].split(".")[0] != row[0].split(".")[0]]
    entries.sort(key=lambda row: -row[2])
    return [
        {"module": name, "cumulative_s": round(total / 1e6, 3), "imported_by": importer or "the command"}
        for name, _, total, importer in entries[:top]
    ]


def importtime_rows(modules: Sequence[str]) -> list[tuple[str, int, int, str | None]]:
    """:func:`parse_importtime` of a fresh ``python -X importtime`` process importing ``modules``."""
    done = subprocess.run(
        [sys.executable, "-X", "importtime", "-c", import_code(modules)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
    )
    return parse_importtime(done.stderr)


def profile(modules: Sequence[str], baseline: Sequence[str], top: int = 12) -> dict:
    """``-X importtime`` of ``modules``: packages by self time, the heaviest imports, and the imports that
    the baseline's own profile lacks (failed optional imports are listed too, in both)."""
    rows = importtime_rows(modules)
    base = {row[0] for row in importtime_rows(baseline)}
    added = [row for row in rows if row[0] not in base]
    return {
        "total_self_s": round(sum(row[1] for row in rows) / 1e6, 3),
        "packages": package_seconds(rows, top),
        "heaviest": heaviest_imports(rows, top),
        "beyond_baseline": {
            "modules": len({row[0] for row in added}),
            "self_s": round(sum(row[1] for row in added) / 1e6, 3),
            "packages": package_seconds(added, 6),
        },
    }


def measure(rounds: int) -> dict[str, dict[str, list[float]]]:
    """Every command's :data:`_SAMPLES`, ``rounds`` interleaved runs after one warm-up run each."""
    for modules in COMMANDS.values():
        run_once(modules)
    samples: dict[str, dict[str, list[float]]] = {name: {key: [] for key in _SAMPLES} for name in COMMANDS}
    for round_index in range(rounds):
        for name, modules in COMMANDS.items():
            values = run_once(modules)
            for key, value in zip(_SAMPLES, values):
                samples[name][key].append(round(value, 3))
            print(
                f"round {round_index}: {name}: {values[0]:.2f} s, {values[1]:.2f} s CPU, {values[2]:.2f} s process",
                flush=True,
            )
    return samples


def startup_tables(rows: Sequence[dict], profiled: dict) -> str:
    """The tables of ``startup.md``: the commands, then the text path's packages and heaviest imports."""
    commands = markdown_table(
        [
            "imports",
            "median (s)",
            "/ baseline",
            "median CPU (s)",
            "CPU / baseline",
            "process (s)",
            "runs (s)",
        ],
        "lrrrrrr",
        [
            [
                r["command"],
                f"{r['median_import_s']:.2f}",
                f"{r['over_baseline']:.2f}",
                f"{r['median_import_cpu_s']:.2f}",
                f"{r['cpu_over_baseline']:.2f}",
                f"{r['median_process_s']:.2f}",
                ", ".join(f"{s:.1f}" for s in r["import_s"]),
            ]
            for r in rows
        ],
    )
    packages = markdown_table(
        ["package (text path)", "self time (s)"],
        "lr",
        [[p["package"], f"{p['self_s']:.2f}"] for p in profiled["packages"]],
    )
    heaviest = markdown_table(
        ["package entered (text path)", "cumulative (s)", "imported by"],
        "lrl",
        [[h["module"], f"{h['cumulative_s']:.2f}", h["imported_by"]] for h in profiled["heaviest"]],
    )
    return "\n\n".join([commands, packages, heaviest])


def main(argv: list[str] | None = None) -> dict:
    parser = make_parser(__doc__, quick_help="one round: a smoke test")
    parser.add_argument("--rounds", type=int, default=7, help="interleaved rounds (default 7)")
    args = parser.parse_args(argv)
    rounds = 1 if args.quick else args.rounds
    if rounds < 1:
        parser.error(f"--rounds must be >= 1, got {rounds}")
    load_before = load_average()
    samples = measure(rounds)
    load_after = load_average()
    medians = {
        name: {key: statistics.median(values) for key, values in s.items()} for name, s in samples.items()
    }
    base = medians[BASELINE]
    rows = [
        {
            "command": name,
            "imports": list(COMMANDS[name]),
            **samples[name],
            **{f"median_{key}": round(value, 3) for key, value in medians[name].items()},
            "over_baseline": round(medians[name]["import_s"] / base["import_s"], 3),
            "cpu_over_baseline": round(medians[name]["import_cpu_s"] / base["import_cpu_s"], 3),
        }
        for name in COMMANDS
    ]
    text = next(row for row in rows if row["command"] == TEXT)
    ratio, cpu_ratio = text["over_baseline"], text["cpu_over_baseline"]  # as the table shows them
    profiled = profile(COMMANDS[TEXT], COMMANDS[BASELINE])
    goal = (
        f"the text recipe's training path imports in <= {GOAL}x the time of torch + Composer + transformers"
    )
    goal_line = (
        f"goal: {goal}: {ratio:.2f}x, {'met' if ratio <= GOAL else 'missed'} (medians of wall time; of CPU "
        f"time {cpu_ratio:.2f}x, which the load of other processes on a shared machine moves less)"
    )
    beyond = profiled["beyond_baseline"]
    before, after = (f"{load[0]:.2f}" if load else "?" for load in (load_before, load_after))
    measured = (
        f"{rounds} interleaved round(s) of fresh processes after one warm-up each, {os.cpu_count()} cores; "
        f"load average {before} before, {after} after"
    )
    notes = [
        goal_line,
        f"beyond the baseline the text path imports {beyond['modules']} modules in {beyond['self_s']:.2f} s "
        f"(self time under -X importtime): "
        + ", ".join(f"{p['package']} {p['self_s']:.2f} s" for p in beyond["packages"]),
        f"measured: {measured}",
    ]
    table = startup_tables(rows, profiled)
    print(f"{table}\n\n" + "\n\n".join(notes))
    result = {
        "ratio": ratio,
        "ratio_meaning": "median import time of train's text path / of import torch, composer, transformers",
        "cpu_ratio": cpu_ratio,
        "goal": f"<= {GOAL}",
        "met": ratio <= GOAL,
        "rows": rows,
        "profile": profiled,
        "measured": measured,
        "machine": machine_info(torch_threads=False),
        "date": time.strftime("%Y-%m-%d"),
    }
    return write_results(args.out, "startup", args.quick, result, table, notes=notes)


if __name__ == "__main__":
    main()
