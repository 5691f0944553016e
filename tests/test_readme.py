"""The Python examples of the README and of docs/api.md run as written, in order, in one namespace.

The README's ``python`` blocks (if any) run first, then docs/api.md's examples: every ``python`` block of
that page but the script at its top and the epoch-fix regression test, which ``tests/test_docs_script.py``
runs on their own (each stands alone; the examples continue one another).
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
API = ROOT / "docs" / "api.md"


def python_blocks(text: str) -> list[str]:
    """The bodies of the fenced ``python`` blocks of a Markdown text, in order."""
    return re.findall(r"^```python\n(.*?)^```", text, flags=re.M | re.S)


def api_examples(text: str) -> list[tuple[int, str]]:
    """docs/api.md's examples, numbered as blocks of the page: all but the first and the epoch-fix test."""
    return [
        (number, block)
        for number, block in enumerate(python_blocks(text), start=1)
        if number > 1 and "reverted_batch_sampler_fix()" not in block
    ]


def test_python_blocks_are_found() -> None:
    assert python_blocks("x\n```python\na = 1\n```\n```bash\nls\n```\n```python\nb = 2\n```\n") == [
        "a = 1\n",
        "b = 2\n",
    ]


def test_api_examples_leave_out_the_blocks_test_docs_script_runs() -> None:
    page = "```python\nscript\n```\n```python\nx = 1\n```\n```python\nreverted_batch_sampler_fix()\n```\n"
    assert api_examples(page + "```python\ny = 2\n```\n") == [(2, "x = 1\n"), (4, "y = 2\n")]


def test_readme_and_api_python_examples_run(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)  # anything an example writes lands here
    readme = [
        (f"README.md python block {n}", block) for n, block in enumerate(python_blocks(README.read_text()), 1)
    ]
    api = [(f"docs/api.md python block {n}", block) for n, block in api_examples(API.read_text())]
    assert len(api) >= 3  # the samplers', Lightning's and mining's examples
    namespace: dict[str, object] = {"__name__": "readme"}
    for name, block in readme + api:
        try:
            exec(compile(block, name, "exec"), namespace)
        except Exception as error:  # pragma: no cover - the message says which block failed
            pytest.fail(f"{name} failed: {type(error).__name__}: {error}\n{block}")
    assert namespace["lightning_trainer"].current_epoch == 2  # the Lightning example trained its two epochs
    trainer = namespace["trainer"]
    assert int(trainer.state.timestamp.epoch) == 4  # the last example trained its four epochs
