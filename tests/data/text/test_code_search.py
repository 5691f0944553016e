"""The code-search corpus: extraction rules, deduplication, the package split and the cache."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import pytest

from composer_dynsample.data.text.code_search import build_code_search, extract_pairs

SOURCE = '''
import functools


def public(a, b):
    """Add two numbers and return their sum.

    A second paragraph that is not part of the query.
    """
    total = a + b
    return total


@functools.lru_cache
def decorated(x):
    """Square a number, with a cache.
    """
    y = x * x
    return y


def _private(a):
    """A private helper that is left out."""
    a += 1
    return a


def test_something():
    """A test function that is left out."""
    x = 1
    assert x


def short(a):
    """Return the value unchanged here."""
    return a


def terse(a):
    """Too short."""
    a += 1
    return a


class Public:
    def method(self, x):
        """Multiply the value by two please.
        """
        y = x * 2
        return y

    def __repr__(self):
        """The representation of the object."""
        x = 1
        return "Public"


class _Hidden:
    def method(self, x):
        """Hidden class methods are not public API."""
        y = x
        return y
'''


def test_extract_pairs_keeps_public_documented_functions_without_their_docstrings() -> None:
    counts: Counter = Counter()
    pairs = extract_pairs(SOURCE, counts=counts)
    assert pairs == [
        ("Add two numbers and return their sum.", "def public(a, b):\n    total = a + b\n    return total"),
        ("Square a number, with a cache.", "def decorated(x):\n    y = x * x\n    return y"),
        ("Multiply the value by two please.", "def method(self, x):\n    y = x * 2\n    return y"),
    ]
    assert counts["functions"] == 8  # the hidden class is not read
    assert counts["private or special name"] == 2
    assert counts["test function"] == 1
    assert counts["code under 3 lines"] == 1
    assert counts["query under 3 words"] == 1


def test_a_file_that_does_not_parse_is_counted_not_raised() -> None:
    counts: Counter = Counter()
    assert extract_pairs("def broken(:\n", counts=counts) == []
    assert counts["files that do not parse"] == 1


GROUPS = [
    "stdlib:calendar",
    "stdlib:heapq",
    "stdlib:fnmatch",
    "stdlib:textwrap",
    "stdlib:shlex",
    "stdlib:json",
]


def _rows(path: Path) -> list[dict[str, str]]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_the_split_is_by_package_deduplicated_and_cached(tmp_path: Path) -> None:
    corpus = build_code_search(tmp_path, groups=GROUPS, test_fraction=0.4, progress=False)
    train, test = _rows(corpus.train_path), _rows(corpus.test_path)
    assert train and test
    train_groups, test_groups = {row["group"] for row in train}, {row["group"] for row in test}
    assert not train_groups & test_groups
    assert train_groups | test_groups <= set(GROUPS)
    assert len(test) <= 0.4 * (len(train) + len(test))
    codes = [" ".join(row["positive"].split()) for row in train + test]
    assert len(codes) == len(set(codes))
    queries = [row["anchor"] for row in train + test]
    assert len(queries) == len(set(queries))
    assert all(len(row["anchor"].split()) >= 3 and '"""' not in row["positive"][:200] for row in train)
    assert corpus.manifest["pairs"] == {"train": len(train), "test": len(test)}
    again = build_code_search(tmp_path, groups=GROUPS, test_fraction=0.4, progress=False)
    assert again.from_cache and not corpus.from_cache
    assert again.manifest["sha256"] == corpus.manifest["sha256"]
    other_seed = build_code_search(tmp_path, groups=GROUPS, test_fraction=0.4, seed=3, progress=False)
    assert other_seed.train_path.parent != corpus.train_path.parent


def test_a_damaged_cache_is_rebuilt(tmp_path: Path) -> None:
    corpus = build_code_search(tmp_path, groups=GROUPS, test_fraction=0.4, progress=False)
    corpus.test_path.write_text('{"anchor": "x", "positive": "y", "group": "z"}\n')
    rebuilt = build_code_search(tmp_path, groups=GROUPS, test_fraction=0.4, progress=False)
    assert not rebuilt.from_cache
    assert rebuilt.manifest["sha256"] == corpus.manifest["sha256"]


def test_bad_options_are_refused_in_one_line(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="test_fraction"):
        build_code_search(tmp_path, test_fraction=1.5)
    with pytest.raises(ValueError, match="cannot be split"):
        build_code_search(tmp_path, groups=["stdlib:calendar"], progress=False)


def test_docstring_pairs_are_a_title_and_its_body() -> None:
    source = '''
def documented(a):
    """Return the documented value here.

    The body says more,
    over several lines,
    and names the arguments.
    """
    return a
'''
    assert extract_pairs(source, kind="docstring") == [
        (
            "Return the documented value here.",
            "The body says more,\nover several lines,\nand names the arguments.",
        )
    ]
    assert extract_pairs(source, kind="docstring", min_code_lines=4) == []


def test_keep_repeats_keeps_shared_queries_in_training_only(tmp_path: Path) -> None:
    from composer_dynsample.data.text.code_search import _deduplicate, _write_corpus

    rows = [
        {"anchor": f"query {i % 7} of group", "positive": f"def f{i}():\n    return {i}\n    pass", "group": f"g{i % 5}"}
        for i in range(40)
    ]  # fmt: skip
    counts: Counter = Counter()
    assert _deduplicate(list(rows), Counter(), keep_repeats=False) == []  # every query is shared
    kept = _deduplicate(list(rows), counts, keep_repeats=True)
    assert kept == rows and counts["pairs whose query other pairs share (kept)"] == 40
    options = {"test_fraction": 0.3, "seed": 0, "keep_repeats": True}
    corpus = _write_corpus(tmp_path, kept, counts, options, {})
    train, test = _rows(corpus.train_path), _rows(corpus.test_path)
    assert max(Counter(row["anchor"] for row in train).values()) > 1  # repeats train
    assert test and len({row["anchor"] for row in test}) == len(
        test
    )  # a test query with two answers cannot be scored
    assert corpus.manifest["pairs"] == {"train": len(train), "test": len(test)}


def test_pinned_distributions_without_the_standard_library_rebuild_the_same_bytes(tmp_path: Path) -> None:
    constraints = Path(__file__).resolve().parents[3] / "constraints.txt"
    options = {"stdlib": False, "distributions": ["omegaconf"], "constraints": constraints, "progress": False,
               "test_fraction": 0.5}  # fmt: skip
    with pytest.raises(ValueError, match="cannot be split"):  # one distribution is one group
        build_code_search(tmp_path / "a", **options)
    options["distributions"] = ["omegaconf", "pyyaml"]
    first = build_code_search(tmp_path / "a", **options)
    second = build_code_search(tmp_path / "b", **options)
    assert not second.from_cache and first.manifest["sha256"] == second.manifest["sha256"]
    assert first.manifest["options"]["python"] is None and not first.manifest["options"]["stdlib"]
    assert {row["group"] for row in _rows(first.train_path) + _rows(first.test_path)} <= {
        "omegaconf",
        "PyYAML",
    }


def test_distributions_not_at_their_pins_are_named(tmp_path: Path) -> None:
    from composer_dynsample.data.text.python_sources import SourcesError

    constraints = tmp_path / "constraints.txt"
    constraints.write_text("omegaconf==0.0.1\nno-such-distribution==1.0\n")
    with pytest.raises(SourcesError) as error:
        build_code_search(tmp_path, stdlib=False, distributions=["omegaconf", "no-such-distribution", "numpy"],
                          constraints=constraints)  # fmt: skip
    message = str(error.value)
    assert "omegaconf" in message and "0.0.1 is pinned" in message
    assert "no-such-distribution is not installed" in message and "numpy is not pinned" in message
    with pytest.raises(ValueError, match="kind"):
        build_code_search(tmp_path, kind="prose")
