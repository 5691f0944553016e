"""Regenerate the README's benchmark summary from ``benchmarks/results/*.json``.

Every headline in the README's benchmark summary comes from a results file that a script in this
folder wrote; this script rewrites the text between the ``<!-- benchmarks:start -->`` and
``<!-- benchmarks:end -->`` markers, and every ``<!-- results:NAME -->`` ... ``<!-- /results:NAME -->``
block with ``benchmarks/results/NAME.md``. ``make bench`` runs it last.

    python benchmarks/report.py [--results benchmarks/results] [--readme README.md] [--check]
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path

START, END = "<!-- benchmarks:start -->", "<!-- benchmarks:end -->"

# (results name, script, what the headline ratio is, the goal as stated in the issues)
HEADLINES = [
    (
        "samplers",
        "samplers.py",
        "1 s / one epoch of P x K batches (1M samples, 100k classes)",
        ">= 1 (under 1 s)",
    ),
    ("miners", "miners.py", "PML BatchHardMiner time / our batch_hard at B = 1024", ">= 3"),
    ("overhead", "overhead.py", "largest mining time / training step at B = 256, no memory", "<= 0.05"),
    ("quality", "quality.py", "default recipe's mean Recall@1 on MNIST-1D / 0.97", ">= 1"),
    ("antipattern", "antipattern.py", "anchors/s of this design / model in __getitem__ at B = 256", ">= 8"),
    ("dataloader", "dataloader.py", "index-only / per-sample loader samples/s, 0 workers, 200k x 128", "> 1"),
    ("miners_scaling", "miners_scaling.py", "worst miner / matmul time at B = 4096", "small constant"),
    (
        "distributed",
        "distributed.py",
        "2-rank / 1-rank samples/s, cross-rank mining off (2 shared cores)",
        "report",
    ),
]


def _machine(result: dict) -> str:
    machine = result.get("machine")
    if machine is None and isinstance(result.get("config"), dict):
        machine = result["config"].get("machine")
    if isinstance(machine, dict):
        machine = ", ".join(f"{key} {value}" for key, value in machine.items())
    return str(machine or "not recorded")


def summary(results: Path) -> str:
    """The markdown summary table of every headline ratio found in ``results``."""
    lines = [
        "| benchmark | headline | ratio | goal | machine |",
        "|---|---|---:|---|---|",
    ]
    for name, script, meaning, goal in HEADLINES:
        path = results / f"{name}.json"
        if not path.exists():
            lines.append(f"| `{script}` | {meaning} | not run | {goal} | |")
            continue
        result = json.loads(path.read_text())
        lines.append(
            f"| `{script}` | {meaning} | {float(result['ratio']):.3g} | {goal} | {_machine(result)} |"
        )
    lines.append("")
    lines.append("Full tables: `benchmarks/results/<name>.md`, plots: `benchmarks/results/<name>.png`.")
    return "\n".join(lines)


def fill_tables(text: str, results: Path) -> str:
    """Replace each ``<!-- results:NAME -->`` ... ``<!-- /results:NAME -->`` block with ``results/NAME.md``."""
    for match in reversed(
        list(re.finditer(r"<!-- results:([\w.-]+) -->\n(.*?)<!-- /results:\1 -->", text, re.S))
    ):
        table = (results / f"{match.group(1)}.md").read_text().strip()
        block = f"<!-- results:{match.group(1)} -->\n{table}\n<!-- /results:{match.group(1)} -->"
        text = text[: match.start()] + block + text[match.end() :]
    return text


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--results", type=Path, default=Path(__file__).parent / "results")
    parser.add_argument("--readme", type=Path, default=Path(__file__).parent.parent / "README.md")
    parser.add_argument("--check", action="store_true", help="exit 1 if the README is not up to date")
    args = parser.parse_args(argv)
    text = args.readme.read_text()
    if START not in text or END not in text:
        raise SystemExit(f"{args.readme} has no {START} ... {END} markers to fill.")
    head, rest = text.split(START, 1)
    _, tail = rest.split(END, 1)
    updated = fill_tables(f"{head}{START}\n{summary(args.results)}\n{END}{tail}", args.results)
    if args.check:
        return 0 if updated == text else 1
    args.readme.write_text(updated)
    print(summary(args.results))
    return 0


if __name__ == "__main__":
    sys.exit(main())
