"""benchmarks/results: the headline results at its root, each ablation in a folder named by its question and
listed in the index, and every stored result naming the command that made it."""

from __future__ import annotations

import json
import re
import shlex
import sys
from pathlib import Path

import pytest

from tests.benchmarks.helpers import load_benchmark

ROOT = Path(__file__).resolve().parents[2]
RESULTS = ROOT / "benchmarks" / "results"
INDEX = RESULTS / "ablations" / "README.md"


def _pages() -> str:
    return "\n".join(path.read_text() for path in (ROOT / "README.md", ROOT / "benchmarks" / "README.md"))


def test_every_result_at_the_root_is_a_headline() -> None:
    """A root result is in the summary table (report.py's headlines) or shown in a results block."""
    headlines = {name for name, _, _ in load_benchmark("report").HEADLINES}
    shown = set(re.findall(r"<!-- results:([\w./-]+) -->", _pages()))
    stray = sorted(path.stem for path in RESULTS.glob("*.json") if path.stem not in headlines | shown)
    assert not stray, f"results that are neither a headline nor shown (move them under ablations/): {stray}"
    # And what a page shows exists.
    assert not [name for name in shown | headlines if not (RESULTS / f"{name}.json").exists()]


def test_every_ablation_folder_is_indexed_and_every_indexed_folder_exists() -> None:
    listed = set(re.findall(r"^\| `(\w+)/` \|", INDEX.read_text(), re.M))
    folders = {path.name for path in (RESULTS / "ablations").iterdir() if path.is_dir()}
    assert folders and listed == folders, (sorted(folders - listed), sorted(listed - folders))
    for folder in folders:
        assert list((RESULTS / "ablations" / folder).glob("*.json")), folder


@pytest.mark.parametrize(
    "path", sorted(RESULTS.rglob("*.json")), ids=lambda path: str(path.relative_to(RESULTS))
)
def test_every_stored_result_names_the_command_that_made_it(path: Path) -> None:
    command = json.loads(path.read_text()).get("command")
    assert isinstance(command, str) and command, "no 'command'"
    # Parts joined by &&: the device machine's environment (source .device/env.sh), then scripts, each after
    # any VARIABLE=value settings.
    for part in command.split(" && "):
        words = shlex.split(part)
        if words == ["source", ".device/env.sh"]:
            continue
        while words and re.fullmatch(r"[A-Z_]+=\S*", words[0]):
            words = words[1:]
        assert words[:1] == ["python"], part
        assert (ROOT / words[1]).is_file(), f"{words[1]} is not a script of the repository"
        # A result outside the root names the folder it is written to, or its script routes it there.
        if "--out" in words:
            out = ROOT / words[words.index("--out") + 1]
            assert path.parent in (out, *out.glob("ablations/*")), (out, path.parent)


def test_a_written_result_records_its_command_relative_to_the_repository(tmp_path: Path) -> None:
    common = load_benchmark("_common")
    argv = [
        str(ROOT / "benchmarks" / "miners.py"),
        "--out",
        str(RESULTS / "ablations" / "x"),
        "--threads",
        "1",
    ]
    assert (
        common.command_line(argv)
        == "python benchmarks/miners.py --out benchmarks/results/ablations/x --threads 1"
    )
    assert common.command_line([sys.argv[0], "--out", str(tmp_path)]).endswith(f"--out {tmp_path}")
    common.write_results(tmp_path, "thing", False, {"ratio": 1.0}, "| a |")
    assert json.loads((tmp_path / "thing.json").read_text())["command"].startswith("python ")
    common.write_results(tmp_path, "own", False, {"command": "python benchmarks/x.py --y"}, "| a |")
    assert json.loads((tmp_path / "own.json").read_text())["command"] == "python benchmarks/x.py --y"
