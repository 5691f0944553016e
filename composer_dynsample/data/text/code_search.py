"""Docstring -> code pairs from the Python installed here: CodeSearchNet's task (Husain et al. 2019).

:func:`build_code_search` walks the Python source of the standard library and of every distribution
pinned in ``constraints.txt`` that is installed, and makes one pair per public function or method that
has a docstring:

- **query** (``anchor``): the first paragraph of the docstring, on one line;
- **code** (``positive``): the function's source without its docstring (decorators left out, as
  CodeSearchNet does), dedented;
- **group**: the distribution it comes from (``stdlib:json``, ``torch``, ``transformers``, ...), the
  counterpart of CodeSearchNet's repository.

CodeSearchNet's filters apply: a query of at least 3 words, code of at least 3 lines, no test code (paths
under ``test``/``tests`` folders or files named ``test_*.py``), no private (``_name``) or special
(``__name__``) functions. Pairs are deduplicated: identical code (whitespace-normalised) is kept once, and
a query that more than one function shares (``Return self.``) is dropped, since no retriever could tell
its answers apart. Every dropped function is counted by reason in the manifest. ``keep_repeats=True``
keeps such queries in the training packages, as real projects have them (about 5% of docstrings repeat
across overridden methods and helpers of one family): one text, several positives.

``kind="docstring"`` makes a second kind of pairs from the same functions, text to text: the docstring's
first paragraph (a title) and the rest of the docstring (its body: the description, the arguments).

A corpus is the same file on every machine only when it reads the same files: ``stdlib=False`` leaves out
the standard library (its files change with Python's patch release) and ``distributions=[...]`` reads
exactly those distributions, each checked to be installed at its pin
(:mod:`composer_dynsample.data.text.python_sources`). The benchmarks build their corpora that way.

The split is by group, so the test packages are never seen in training (CodeSearchNet splits by
repository): the groups are shuffled with ``seed`` and taken into the test split while it stays below
``test_fraction`` of the pairs. Everything is sorted before it is used, so the corpus is a function of
the installed sources: the manifest records the Python version, every distribution and its version,
the counts and the SHA-256 of both files. The files are cached under ``cache_dir`` in a folder named by
a hash of that list and of the options, written atomically; a rerun with the same environment reads
them back.

Build it once from the command line (about a minute on 2 cores; then read from the cache)::

    python -m composer_dynsample.data.text.code_search     # prints the files, the counts and the hashes
"""

from __future__ import annotations

import ast
import hashlib
import json
import os
import random
import re
import sys
import textwrap
from collections import Counter
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypedDict

from composer_dynsample.data.splits import default_cache_dir
from composer_dynsample.data.text.python_sources import (
    named_distributions,
    pinned_distributions,
    read_source,
    source_files,
)
from composer_dynsample.file_checks import file_sha256

__all__ = ["KINDS", "CodeSearchCorpus", "CorpusKeywords", "build_code_search", "extract_pairs"]

_VERSION = 2  # bump when the extraction recipe changes: the cache key carries it
#: What a pair holds: a docstring's first paragraph and its function's code, or the rest of the docstring.
KINDS = ("code", "docstring")


class CorpusKeywords(TypedDict, total=False):
    """What corpus :func:`build_code_search` builds: its keywords besides ``cache_dir`` and ``progress``, as a
    loader hands them on (its ``**options: Unpack[...]``, PEP 692), their meaning and defaults as there."""

    constraints: str | os.PathLike[str] | None
    test_fraction: float
    seed: int
    min_query_words: int
    min_code_lines: int
    groups: Sequence[str] | None
    max_pairs_per_group: int | None
    kind: str
    keep_repeats: bool
    stdlib: bool
    distributions: Sequence[str] | None


@dataclass(frozen=True)
class CodeSearchCorpus:
    """The files of a built corpus and its manifest.

    Attributes:
        train_path (Path): JSONL of ``{"anchor", "positive", "group"}`` rows, the training packages.
        test_path (Path): The same for the test packages, never seen in training.
        manifest (dict): Python version, distributions and versions, options, counts, SHA-256 of the files.
        from_cache (bool): Whether the files were read back rather than built.
    """

    train_path: Path
    test_path: Path
    manifest: dict[str, Any] = field(repr=False)
    from_cache: bool = False


def _first_paragraph(docstring: str) -> str:
    paragraph = re.split(r"\n\s*\n", docstring.strip(), maxsplit=1)[0]
    return " ".join(paragraph.split())


def _docstring_body(docstring: str | None) -> str:
    """The docstring after its first paragraph, dedented: a title's body."""
    parts = re.split(r"\n\s*\n", (docstring or "").strip(), maxsplit=1)
    return textwrap.dedent(parts[1]).strip("\n") if len(parts) == 2 else ""


def _code_without_docstring(lines: list[str], node: ast.FunctionDef | ast.AsyncFunctionDef) -> str:
    first = node.lineno - 1  # the ``def`` line; decorators sit above it
    doc = node.body[0]
    kept = lines[first : doc.lineno - 1] + lines[doc.end_lineno : node.end_lineno]
    return textwrap.dedent("".join(kept)).strip("\n")


def _public_functions(tree: ast.Module) -> Iterator[ast.FunctionDef | ast.AsyncFunctionDef]:
    """Module-level functions and methods of module-level classes whose names (and class) are public."""
    for node in tree.body:
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            yield node
        elif isinstance(node, ast.ClassDef) and not node.name.startswith("_"):
            yield from (
                item for item in node.body if isinstance(item, ast.FunctionDef | ast.AsyncFunctionDef)
            )


def extract_pairs(
    source: str,
    *,
    min_query_words: int = 3,
    min_code_lines: int = 3,
    counts: Counter | None = None,
    kind: str = "code",
) -> list[tuple[str, str]]:
    """The ``(query, code)`` pairs of one module's source, in source order (see the module docstring).

    ``counts`` (a :class:`collections.Counter`) receives the number of functions seen and of those left
    out, by reason. ``kind="docstring"`` pairs the query with the rest of its docstring instead of the
    code (title to body, text to text), the rest at least ``min_code_lines`` lines.

    Example:
        >>> source = '''
        ... def add(a, b):
        ...     \"\"\"Add two numbers and return the sum.
        ...
        ...     More text.\"\"\"
        ...     total = a + b
        ...     return total
        ... '''
        >>> extract_pairs(source)
        [('Add two numbers and return the sum.', 'def add(a, b):\\n    total = a + b\\n    return total')]
    """
    counts = counts if counts is not None else Counter()
    try:
        tree = ast.parse(source)
    except (SyntaxError, ValueError):
        counts["files that do not parse"] += 1
        return []
    lines = source.splitlines(keepends=True)
    pairs = []
    for node in _public_functions(tree):
        counts["functions"] += 1
        docstring = ast.get_docstring(node)
        reason = _excluded(node, docstring, min_query_words)
        if reason is None:
            positive = _code_without_docstring(lines, node) if kind == "code" else _docstring_body(docstring)
            if len(positive.splitlines()) < min_code_lines:
                reason = f"{kind} under {min_code_lines} lines"
            else:
                pairs.append((_first_paragraph(docstring or ""), positive))
        if reason is not None:
            counts[reason] += 1
    return pairs


def _excluded(node: ast.AST, docstring: str | None, min_query_words: int) -> str | None:
    name = node.name  # type: ignore[attr-defined]
    if name.startswith("_"):
        return "private or special name"
    if "test" in name.lower():
        return "test function"
    if not docstring or not docstring.strip():
        return "no docstring"
    if len(_first_paragraph(docstring).split()) < min_query_words:
        return f"query under {min_query_words} words"
    return None


def _deduplicate(rows: list[dict[str, str]], counts: Counter, keep_repeats: bool) -> list[dict[str, str]]:
    """Identical code kept once (first in sorted order); a query shared by several functions dropped unless
    ``keep_repeats`` (then such pairs stay, as real projects have them, and are counted)."""
    seen_code, unique = set(), []
    for row in rows:
        key = " ".join(row["positive"].split())
        if key in seen_code:
            counts["duplicate code"] += 1
            continue
        seen_code.add(key)
        unique.append(row)
    query_counts = Counter(row["anchor"] for row in unique)
    if keep_repeats:
        counts["pairs whose query other pairs share (kept)"] += sum(n for n in query_counts.values() if n > 1)
        return unique
    kept = [row for row in unique if query_counts[row["anchor"]] == 1]
    counts["query shared by several functions"] += len(unique) - len(kept)
    return kept


def _split_groups(sizes: dict[str, int], test_fraction: float, seed: int) -> list[str]:
    """The test groups: shuffled with ``seed`` and taken while the test split stays within its share."""
    order = sorted(sizes)
    random.Random(seed).shuffle(order)
    budget, test, taken = test_fraction * sum(sizes.values()), [], 0
    for group in order:
        if taken + sizes[group] <= budget:
            test.append(group)
            taken += sizes[group]
    return sorted(test)


def _write_jsonl(path: Path, rows: Iterable[dict[str, str]]) -> None:
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    with tmp.open("w", encoding="utf-8") as handle:
        for row in rows:
            handle.write(json.dumps(row, ensure_ascii=False) + "\n")
    os.replace(tmp, path)


def _progress(items: Sequence[Any], enabled: bool) -> Iterable[Any]:
    """``items``, with a progress line on stderr every 500 files when ``enabled`` and stderr is a terminal."""
    if not enabled or not sys.stderr.isatty():
        yield from items
        return
    for number, item in enumerate(items, start=1):
        if number % 500 == 0 or number == len(items):
            print(f"\rcode search: read {number}/{len(items)} files", end="", file=sys.stderr, flush=True)
        yield item
    print(file=sys.stderr)


def build_code_search(
    cache_dir: str | os.PathLike[str] | None = None,
    *,
    constraints: str | os.PathLike[str] | None = None,
    test_fraction: float = 0.1,
    seed: int = 0,
    min_query_words: int = 3,
    min_code_lines: int = 3,
    groups: Sequence[str] | None = None,
    max_pairs_per_group: int | None = None,
    progress: bool = True,
    kind: str = "code",
    keep_repeats: bool = False,
    stdlib: bool = True,
    distributions: Sequence[str] | None = None,
) -> CodeSearchCorpus:
    """Build (or read back) the code-search corpus of the Python installed here; see the module docstring.

    Args:
        cache_dir (str | os.PathLike, optional): Where the corpus folders live.
            Default: ``default_cache_dir() / "code_search"``.
        constraints (str | os.PathLike, optional): A ``constraints.txt`` whose pinned distributions are
            read besides the standard library. Default: the one beside the package's source checkout
            when there is one, else every installed distribution.
        test_fraction (float): The share of pairs in the test packages, at most. Default: ``0.1``.
        seed (int): Seed of the package split. Default: ``0``.
        min_query_words (int): Shortest query kept, in words. Default: ``3``.
        min_code_lines (int): Shortest code kept, in lines. Default: ``3``.
        groups (Sequence[str], optional): Read only these groups (``stdlib:json``, ``numpy``): for tests
            and quick looks. Default: all.
        max_pairs_per_group (int, optional): Keep at most this many pairs of each group, the first in
            sorted order. Default: all.
        progress (bool): Print progress on a terminal. Default: ``True``.
        kind (str): ``"code"`` (docstring to code) or ``"docstring"`` (a docstring's first paragraph to the
            rest of it: text to text). Default: ``"code"``.
        keep_repeats (bool): Keep the pairs whose query other functions share (overridden methods, helpers
            of one family), as real projects have them: the same text then has several positives.
            Default: ``False`` (such pairs are dropped).
        stdlib (bool): Read the standard library, whose files change with Python's patch release. Default:
            ``True``.
        distributions (Sequence[str], optional): Read exactly these distributions, each installed at its
            pin in ``constraints`` (a :class:`~composer_dynsample.data.text.python_sources.SourcesError`
            otherwise): with ``stdlib=False`` the corpus is then the same file on every machine. Default:
            every pinned distribution that is installed.

    Returns:
        CodeSearchCorpus: the train and test JSONL files and the manifest.
    """
    if not 0 < test_fraction < 1:
        raise ValueError(f"test_fraction must be in (0, 1), got {test_fraction!r}.")
    if kind not in KINDS:
        raise ValueError(f"kind must be one of {list(KINDS)}, got {kind!r}.")
    if constraints is None:
        candidate = Path(__file__).resolve().parents[2] / "constraints.txt"
        constraints = candidate if candidate.is_file() else None
    if distributions is not None and constraints is None:
        raise ValueError("distributions needs a constraints file to check their versions against.")
    read = (
        pinned_distributions(constraints)
        if distributions is None
        else named_distributions(distributions, constraints)  # type: ignore[arg-type]
    )
    options = {
        "version": _VERSION,
        "python": sys.version.split()[0] if stdlib else None,
        "kind": kind,
        "keep_repeats": bool(keep_repeats),
        "stdlib": bool(stdlib),
        "test_fraction": test_fraction,
        "seed": seed,
        "min_query_words": min_query_words,
        "min_code_lines": min_code_lines,
        "groups": sorted(groups) if groups is not None else None,
        "max_pairs_per_group": max_pairs_per_group,
    }
    key = hashlib.sha256(json.dumps([options, read], sort_keys=True).encode()).hexdigest()[:16]
    folder = Path(cache_dir if cache_dir is not None else default_cache_dir() / "code_search") / key
    cached = _read_back(folder)
    if cached is not None:
        return cached
    rows, counts = _collect(read, options, progress)
    return _write_corpus(folder, rows, counts, options, read)


def _collect(
    distributions: dict[str, str], options: dict[str, Any], progress: bool
) -> tuple[list[dict[str, str]], Counter]:
    counts: Counter = Counter()
    wanted = set(options["groups"]) if options["groups"] is not None else None
    files = [
        (group, path)
        for group, path in source_files(distributions, stdlib=options["stdlib"])
        if wanted is None or group in wanted
    ]
    rows, per_group = [], Counter()
    for group, path in _progress(files, progress):
        source = read_source(path)
        if source is None:
            counts["files that do not decode"] += 1
            continue
        counts["files"] += 1
        for query, code in extract_pairs(
            source,
            min_query_words=options["min_query_words"],
            min_code_lines=options["min_code_lines"],
            counts=counts,
            kind=options["kind"],
        ):
            limit = options["max_pairs_per_group"]
            if limit is None or per_group[group] < limit:
                per_group[group] += 1
                rows.append({"anchor": query, "positive": code, "group": group})
    return _deduplicate(rows, counts, options["keep_repeats"]), counts


def _write_corpus(
    folder: Path,
    rows: list[dict[str, str]],
    counts: Counter,
    options: dict[str, Any],
    distributions: dict[str, str],
) -> CodeSearchCorpus:
    if not rows:
        raise ValueError(f"code search: no pair was found in the selected sources ({dict(counts)}).")
    sizes = Counter(row["group"] for row in rows)
    test_groups = set(_split_groups(sizes, options["test_fraction"], options["seed"]))
    if not test_groups or len(test_groups) == len(sizes):
        raise ValueError(
            f"code search: {len(sizes)} group(s) cannot be split into train and test packages with "
            f"test_fraction={options['test_fraction']} (sizes {dict(sizes.most_common(5))})."
        )
    folder.mkdir(parents=True, exist_ok=True)
    train_path, test_path = folder / "train.jsonl", folder / "test.jsonl"
    _write_jsonl(train_path, (row for row in rows if row["group"] not in test_groups))
    test_rows = [row for row in rows if row["group"] in test_groups]
    if options["keep_repeats"]:  # a test query with two answers cannot be scored: repeats train only
        shared = Counter(row["anchor"] for row in test_rows)
        counts["test pairs whose query other pairs share (dropped)"] += sum(
            n for n in shared.values() if n > 1
        )
        test_rows = [row for row in test_rows if shared[row["anchor"]] == 1]
    _write_jsonl(test_path, test_rows)
    manifest = {
        "options": options,
        "distributions": distributions,
        "counts": dict(sorted(counts.items())),
        "pairs": {
            "train": sum(size for group, size in sizes.items() if group not in test_groups),
            "test": len(test_rows),
        },
        "groups": {"train": len(sizes) - len(test_groups), "test": sorted(test_groups)},
        "sha256": {"train.jsonl": file_sha256(train_path), "test.jsonl": file_sha256(test_path)},
    }
    tmp = folder / f".manifest.{os.getpid()}.tmp"
    tmp.write_text(json.dumps(manifest, indent=1) + "\n")
    os.replace(tmp, folder / "manifest.json")
    return CodeSearchCorpus(train_path, test_path, manifest)


def _read_back(folder: Path) -> CodeSearchCorpus | None:
    """The corpus cached in ``folder``, or ``None`` when it is missing or its files do not match."""
    try:
        manifest = json.loads((folder / "manifest.json").read_text())
        train_path, test_path = folder / "train.jsonl", folder / "test.jsonl"
        if manifest["sha256"] != {
            "train.jsonl": file_sha256(train_path),
            "test.jsonl": file_sha256(test_path),
        }:
            return None
    except (OSError, ValueError, KeyError, TypeError):
        return None
    return CodeSearchCorpus(train_path, test_path, manifest, from_cache=True)


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m composer_dynsample.data.text.code_search [--cache-dir DIR]``: build and summarise."""
    import argparse

    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--cache-dir", default=None)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    corpus = build_code_search(args.cache_dir, seed=args.seed)
    summary = {key: corpus.manifest[key] for key in ("pairs", "counts", "sha256")}
    print(json.dumps({"train": str(corpus.train_path), "test": str(corpus.test_path), **summary}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
