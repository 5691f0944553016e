"""The benchmarks as one suite: ``python -m benchmarks`` lists every benchmark with its question and the wall
time of its stored run; ``python -m benchmarks NAME [ARGS ...]`` runs ``benchmarks/NAME.py`` with ``ARGS``
(each takes ``--help`` and ``--quick``, a smoke test of a few seconds to minutes).

The time shown is the stored result's own ``total_s`` (``benchmarks/results/NAME.json``, the run that made
the tables of benchmarks/README.md), or ``-`` where the result does not record one.
"""

from __future__ import annotations

import ast
import json
import os
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
RESULTS = HERE / "results"
#: Scripts that are tools of the suite rather than benchmarks.
TOOLS = ("report",)


def benchmarks() -> dict[str, str]:
    """Every benchmark by name (its file's stem), with the first sentence of its docstring."""
    found = {}
    for path in sorted(HERE.glob("[a-z]*.py")):
        if path.stem in TOOLS:
            continue
        docstring = ast.get_docstring(ast.parse(path.read_text())) or ""
        paragraph = " ".join(docstring.split("\n\n")[0].split())
        sentence = paragraph.split(". ")[0]
        found[path.stem] = sentence if sentence.endswith((".", "?")) else sentence + "."
    return found


def stored_seconds(name: str) -> float | None:
    """The wall time the stored result of ``name`` records, if any."""
    path = RESULTS / f"{name}.json"
    try:
        value = json.loads(path.read_text()).get("total_s")
    except (OSError, ValueError, AttributeError):
        return None
    return float(value) if isinstance(value, (int, float)) else None


def listing() -> str:
    """The suite's table: name, stored wall time, question."""
    rows = []
    for name, question in benchmarks().items():
        seconds = stored_seconds(name)
        cost = "-" if seconds is None else f"{seconds / 60:.0f} min" if seconds >= 90 else f"{seconds:.0f} s"
        rows.append(f"{name:<18} {cost:>8}  {question}")
    header = f"{'benchmark':<18} {'stored':>8}  question (python -m benchmarks NAME --help)"
    return "\n".join([header, *rows])


def main(argv: list[str] | None = None) -> None:
    args = sys.argv[1:] if argv is None else argv
    if not args or args[0] in ("-h", "--help", "list"):
        print(listing())
        return
    name, rest = args[0], args[1:]
    known = benchmarks()
    if name not in known and name not in TOOLS:
        print(
            f"python -m benchmarks: no benchmark {name!r}; run python -m benchmarks to list them.",
            file=sys.stderr,
        )
        raise SystemExit(2)
    script = HERE / f"{name}.py"
    os.execv(sys.executable, [sys.executable, str(script), *rest])


if __name__ == "__main__":
    main()
