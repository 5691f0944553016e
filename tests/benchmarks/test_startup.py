"""benchmarks/startup.py: reading ``python -X importtime`` output (no process is timed here)."""

from __future__ import annotations

from tests.benchmarks.helpers import load_benchmark

# a imports b (which imports c from another package) and d; e is a second top-level import.
PROFILE = """import time: self [us] | cumulative | imported package
import time:    300000 |     300000 |     other.c
import time:    100000 |     400000 |   a.b
import time:     50000 |      50000 |   a.d
import time:     20000 |     470000 | a
import time:      7000 |       7000 | e
"""


def test_each_import_is_read_with_its_importer() -> None:
    rows = load_benchmark("startup").parse_importtime(PROFILE)
    assert rows == [
        ("other.c", 300000, 300000, "a.b"),
        ("a.b", 100000, 400000, "a"),
        ("a.d", 50000, 50000, "a"),
        ("a", 20000, 470000, None),
        ("e", 7000, 7000, None),
    ]


def test_packages_add_their_modules_self_time_and_entries_cross_packages() -> None:
    startup = load_benchmark("startup")
    rows = startup.parse_importtime(PROFILE)
    assert startup.package_seconds(rows, 2) == [
        {"package": "other", "self_s": 0.3},
        {"package": "a", "self_s": 0.17},
    ]
    entered = [(row["module"], row["imported_by"]) for row in startup.heaviest_imports(rows, 5)]
    assert entered == [("a", "the command"), ("other.c", "a.b"), ("e", "the command")]


def test_the_probe_imports_every_module_of_a_command() -> None:
    startup = load_benchmark("startup")
    code = startup.import_code(startup.COMMANDS[startup.BASELINE])
    assert [line for line in code.splitlines() if line.startswith("import ") and line != "import time"] == [
        "import torch",
        "import composer",
        "import transformers",
    ]
