"""The corpora of the fine-tuning benchmarks, each the same file on every machine, and their subsets.

Each corpus is built by :func:`~composer_dynsample.data.text.code_search.build_code_search` from exactly the
distributions of :data:`DISTRIBUTIONS` (all in ``make test``'s environment plus the ``bench`` extra), each
checked to be installed at its pin in ``constraints.txt``, and without the standard library (whose files
change with Python's patch release): the same command builds the same bytes anywhere, and the results
record the corpus's SHA-256 and every distribution's version.

- ``code``: docstring -> code, a query that several functions share dropped (the benchmark's corpus;
  ``--split-seed 1`` is its second split, other test packages);
- ``code_repeats``: the same pairs with the shared queries kept in the training packages, as real projects
  have them: one docstring over several functions, each of them a positive of it;
- ``docstring``: a second kind of pairs, text to text: a docstring's first paragraph (a title) and the rest
  of it (its body), repeats kept.

The training subset draws whole queries (every pair of a drawn query text) until it holds ``train_pairs``
pairs, so a corpus with repeats keeps them in the subset at the corpus's rate.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
#: The distributions every benchmark corpus reads (the largest sources of make test's environment and the
#: bench extra; the test extra's and the text extra's installs hold each of them at its pin).
DISTRIBUTIONS = (
    "transformers", "torch", "sympy", "moto", "pandas", "scipy", "scikit-learn", "networkx", "numpy",
    "fonttools", "Pygments", "torchmetrics", "matplotlib", "lightning", "sentence-transformers", "mosaicml",
    "huggingface_hub", "datasets", "pytorch-metric-learning", "hypothesis", "pyarrow", "pillow", "accelerate",
    "pytest", "rich", "botocore", "joblib", "fsspec", "Werkzeug", "omegaconf",
)  # fmt: skip
#: ``--corpus`` -> the options of ``build_code_search`` beside ``DISTRIBUTIONS`` and the split seed.
CORPORA: dict[str, dict[str, Any]] = {
    "code": {"kind": "code", "keep_repeats": False},
    "code_repeats": {"kind": "code", "keep_repeats": True},
    "docstring": {"kind": "docstring", "keep_repeats": True},
}


def build(corpus: str, split_seed: int = 0, quick: bool = False) -> Any:
    """The built corpus (``CodeSearchCorpus``) of ``--corpus`` and ``--split-seed``."""
    from composer_dynsample.data.text.code_search import build_code_search

    return build_code_search(
        constraints=ROOT / "constraints.txt", seed=split_seed, stdlib=False, distributions=DISTRIBUTIONS,
        progress=False, **CORPORA[corpus], **({"max_pairs_per_group": 20} if quick else {}),
    )  # fmt: skip


def _subset(rows: list[dict[str, str]], count: int | None, seed: int = 0) -> list[int]:
    """Sorted row indices: every row for ``None``, else whole query texts drawn at random until ``count``
    rows (the last query's pairs cut at ``count``)."""
    import numpy as np

    if count is None:
        return list(range(len(rows)))
    by_query: dict[str, list[int]] = {}
    for index, row in enumerate(rows):
        by_query.setdefault(row["anchor"], []).append(index)
    queries = sorted(by_query)
    chosen: list[int] = []
    for position in np.random.default_rng(seed).permutation(len(queries)).tolist():
        chosen.extend(by_query[queries[position]])
        if len(chosen) >= count:
            break
    return sorted(chosen[:count])


def prepare_data(
    folder: Path,
    train_pairs: int | None,
    test_queries: int,
    quick: bool,
    split_seed: int = 0,
    corpus: str = "code",
) -> dict[str, Any]:
    """A seeded subset of the corpus's training pairs (all of them for ``None``) and of its test pairs,
    written as JSON Lines into ``folder``; what was read (distributions, options, hashes) recorded."""
    from composer_dynsample.file_checks import file_sha256

    built = build(corpus, split_seed, quick)
    written: dict[str, Any] = {}
    for split, path, count in (
        ("train", built.train_path, train_pairs),
        ("test", built.test_path, test_queries),
    ):
        rows = [json.loads(line) for line in Path(path).read_text().splitlines() if line.strip()]
        chosen = _subset(rows, count)
        target = folder / f"{split}.jsonl"
        target.write_text(
            "".join(
                json.dumps({"anchor": rows[i]["anchor"], "positive": rows[i]["positive"]}) + "\n"
                for i in chosen
            )
        )
        written[split] = {
            "path": str(target),
            "pairs": len(chosen),
            "of": len(rows),
            "sha256": file_sha256(target),
        }
    written["corpus"] = corpus
    written["corpus_sha256"] = built.manifest["sha256"]
    written["corpus_options"] = built.manifest["options"]
    written["distributions"] = built.manifest["distributions"]
    repeats = [k for k in built.manifest["counts"] if "share" in k]
    written["repeats"] = {k: built.manifest["counts"][k] for k in repeats}
    return written
