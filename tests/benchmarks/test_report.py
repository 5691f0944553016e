"""benchmarks/report.py: the mining method card's figures come from benchmarks/results and --check sees drift."""

from __future__ import annotations

import shutil
from pathlib import Path

from tests.benchmarks.helpers import load_benchmark

ROOT = Path(__file__).resolve().parents[2]
CARD = ROOT / "composer_dynsample/algorithms/hard_negative_mining/README.md"


def _report():
    return load_benchmark("report")


def _copies(tmp_path: Path) -> tuple[Path, Path, Path, list[str]]:
    """Copies of the README, the benchmarks page and the method card, and the arguments naming them."""
    readme, tables, card = tmp_path / "README.md", tmp_path / "tables.md", tmp_path / "card.md"
    shutil.copy(ROOT / "README.md", readme)
    shutil.copy(ROOT / "benchmarks/README.md", tables)
    shutil.copy(CARD, card)
    return readme, tables, card, ["--readme", str(readme), "--tables", str(tables), "--card", str(card)]


def test_check_fails_on_a_hand_edited_card_figure_and_a_refill_restores_it(tmp_path: Path) -> None:
    report = _report()
    _, _, card, paths = _copies(tmp_path)
    assert report.main([*paths, "--check"]) == 0
    measured = card.read_text().split("<!-- measured:start -->")[1]
    figure = next(
        word for word in measured.split() if word.endswith("x") and word[:-1].replace(".", "").isdigit()
    )
    card.write_text(card.read_text().replace(figure, "99.99x", 1))
    assert report.main([*paths, "--check"]) == 1
    assert report.main(paths) == 0
    assert card.read_text() == CARD.read_text()


def test_check_fails_on_a_hand_edited_table_of_the_benchmarks_page(tmp_path: Path) -> None:
    report = _report()
    _, tables, _, paths = _copies(tmp_path)
    assert report.main([*paths, "--check"]) == 0
    block = tables.read_text().split("<!-- results:quality -->")[1]
    figure = next(word for word in block.split() if word.startswith("0.9") and word[2:].isdigit())
    tables.write_text(tables.read_text().replace(figure, "0.1234", 1))
    assert report.main([*paths, "--check"]) == 1
    assert report.main(paths) == 0
    assert tables.read_text() == (ROOT / "benchmarks/README.md").read_text()
