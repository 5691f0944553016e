"""Which Python sources a corpus of this package reads, and which versions it was read from.

The code-search corpora (:mod:`composer_dynsample.data.text.code_search`) are made from the Python source
installed on the machine: the standard library and distributions. A corpus is the same on another machine
only when it reads the same files, so this module says which files those are and checks what can be
checked:

- :func:`pinned_distributions`: the distributions pinned in a ``constraints.txt`` that are installed, with
  their installed versions;
- :func:`named_distributions`: exactly the distributions asked for, each installed at its pin, or a
  :class:`SourcesError` naming every one that is missing or at another version (a corpus that must be
  rebuilt bit-identical anywhere reads these and leaves the standard library out, whose files change with
  Python's patch release);
- :func:`source_files`: every ``(group, path)`` to read, sorted, test code left out;
- :func:`read_source`: a file's text in its declared encoding, or ``None``.
"""

from __future__ import annotations

import importlib.metadata
import io
import os
import re
import sysconfig
import tokenize
from collections.abc import Iterator, Sequence
from pathlib import Path

__all__ = ["SourcesError", "named_distributions", "pinned_distributions", "read_source", "source_files"]

_TEST_PARTS = {"test", "tests", "testing", "_tests"}
_SKIPPED_STDLIB = {"site-packages", "dist-packages", "test", "idlelib", "lib2to3", "turtledemo", "ensurepip"}


class SourcesError(ValueError):
    """The distributions a corpus must read are not installed as pinned."""


def normalise(name: str) -> str:
    """A distribution's name as PyPI compares them (``Scikit_Learn`` -> ``scikit-learn``)."""
    return re.sub(r"[-_.]+", "-", name).lower()


def _installed() -> dict[str, tuple[str, str]]:
    installed = {}
    for dist in importlib.metadata.distributions():
        name = dist.metadata["Name"]
        if name:
            installed[normalise(name)] = (name, dist.version)
    return installed


def _pins(constraints: str | os.PathLike[str]) -> dict[str, str]:
    pins = {}
    for line in Path(constraints).read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        if "==" in line:
            name, version = line.split("==", 1)
            pins[normalise(name)] = version.split(";", 1)[0].strip()
    return pins


def pinned_distributions(constraints: str | os.PathLike[str] | None = None) -> dict[str, str]:
    """The distributions pinned in ``constraints`` (``name==version`` lines) that are installed, by name.

    Without a file, every installed distribution. The installed version is returned; a pin whose
    installed version differs is still used, and the manifest records what was read.
    """
    installed = _installed()
    if constraints is None:
        return {name: version for name, version in sorted(installed.values())}
    return dict(sorted(installed[name] for name in _pins(constraints) if name in installed))


def named_distributions(names: Sequence[str], constraints: str | os.PathLike[str]) -> dict[str, str]:
    """Exactly the distributions ``names``, each installed at its pin in ``constraints``, by name.

    Raises:
        SourcesError: Naming every distribution that is not pinned, not installed, or installed at another
            version than its pin, and how to install the pinned set.
    """
    installed, pins, problems = _installed(), _pins(constraints), []
    for name in names:
        key = normalise(name)
        if key not in pins:
            problems.append(f"{name} is not pinned in {constraints}")
        elif key not in installed:
            problems.append(f"{name} is not installed (pinned {pins[key]})")
        elif installed[key][1] != pins[key]:
            problems.append(f"{name} {installed[key][1]} is installed, {pins[key]} is pinned")
    if problems:
        raise SourcesError(
            "the corpus reads these distributions at their pinned versions, so that it is the same on every "
            f"machine: {'; '.join(problems)}. Install them with 'pip install --constraint {constraints} ...' "
            "(make test's environment and the bench extra hold them all)."
        )
    return dict(sorted(installed[normalise(name)] for name in names))


def source_files(distributions: dict[str, str], *, stdlib: bool = True) -> Iterator[tuple[str, Path]]:
    """``(group, path)`` of every Python file to read, sorted, test code left out: the standard library's
    (groups ``stdlib:MODULE``) when ``stdlib``, then each distribution's (its name as the group)."""
    if stdlib:
        yield from _stdlib_files()
    for name in distributions:
        files = importlib.metadata.distribution(name).files or []
        for file in sorted(files, key=str):
            if file.suffix == ".py" and not is_test(Path(str(file))):
                path = Path(file.locate())
                if path.is_file():
                    yield name, path


def _stdlib_files() -> Iterator[tuple[str, Path]]:
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    for entry in sorted(stdlib.iterdir()):
        if entry.name in _SKIPPED_STDLIB or entry.name.startswith((".", "_")):
            continue
        module = entry.stem if entry.suffix == ".py" else entry.name
        if entry.suffix == ".py":
            yield f"stdlib:{module}", entry
        elif entry.is_dir() and (entry / "__init__.py").exists():
            for path in sorted(entry.rglob("*.py")):
                if not is_test(path.relative_to(stdlib)):
                    yield f"stdlib:{module}", path


def is_test(relative: Path) -> bool:
    """Whether a file is test code: under a ``test``/``tests`` folder, or named ``test_*.py``."""
    return any(part in _TEST_PARTS for part in relative.parts[:-1]) or relative.name.startswith("test_")


def read_source(path: Path) -> str | None:
    """The file's text in its declared encoding; ``None`` when it does not decode."""
    data = path.read_bytes()
    try:
        encoding, _ = tokenize.detect_encoding(io.BytesIO(data).readline)
        return data.decode(encoding)
    except (SyntaxError, LookupError, UnicodeDecodeError):
        return None
