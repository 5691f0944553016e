"""The package's layout: the root holds a few modules, each a concept of its own, and no module is long."""

from __future__ import annotations

from pathlib import Path

import composer_dynsample

PACKAGE = Path(composer_dynsample.__file__).parent
MAX_ROOT_MODULES = 12
MAX_LINES = 450

#: Every module at the package root, and its concept in a few words.
ROOT_MODULES: dict[str, str] = {
    "__init__": "the public names, imported on first use",
    "__main__": "python -m composer_dynsample",
    "_lazy": "the one deferred import",
    "batches": "a tensor's lookup in a Composer batch or outputs",
    "checkpoints": "checkpoint files checked before unpickling",
    "distances": "every distance, one name set",
    "distributed": "every cross-rank operation",
    "file_checks": "what a file is and its hash",
    "lightning": "PyTorch Lightning support",
    "schedulers": "learning-rate schedules as Composer schedulers",
}

# Today's modules over MAX_LINES lines, each allowed at most its line count here: they may shrink, not grow.
# The list is to be emptied by splitting each module by concept.
OVER_450: dict[str, int] = {}


def _line_count(path: Path) -> int:
    return path.read_bytes().count(b"\n")


def test_the_root_holds_only_the_listed_modules() -> None:
    found = sorted(path.stem for path in PACKAGE.glob("*.py"))
    unlisted = [name for name in found if name not in ROOT_MODULES]
    assert not unlisted, (
        f"composer_dynsample/ holds modules not in ROOT_MODULES: {unlisted}; add each to a folder of its "
        "concept, or list it in ROOT_MODULES with its concept."
    )
    gone = sorted(set(ROOT_MODULES) - set(found))
    assert not gone, (
        f"ROOT_MODULES lists modules that are not at the root: {gone}; remove them from the list."
    )
    assert len(found) <= MAX_ROOT_MODULES, (
        f"composer_dynsample/ holds {len(found)} modules, more than {MAX_ROOT_MODULES}: move some into a "
        "folder of their concept."
    )


def test_no_module_is_longer_than_the_limit() -> None:
    counts = {
        path.relative_to(PACKAGE).as_posix(): _line_count(path)
        for path in sorted(PACKAGE.rglob("*.py"))
        if "__pycache__" not in path.parts
    }
    too_long = {name: count for name, count in counts.items() if count > OVER_450.get(name, MAX_LINES)}
    assert not too_long, (
        f"modules over their limit ({MAX_LINES} lines, or their OVER_450 count): {too_long}; split each "
        "by concept."
    )
    missing = sorted(name for name in OVER_450 if name not in counts)
    assert not missing, f"OVER_450 lists modules that do not exist: {missing}; remove them from the list."
    short = {name: counts[name] for name in OVER_450 if counts[name] <= MAX_LINES}
    assert not short, (
        f"these modules are at or under {MAX_LINES} lines now: {short}; remove them from OVER_450."
    )
