"""The README's Python examples run as written: every ``python`` block, in order, in one namespace."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

README = Path(__file__).resolve().parents[1] / "README.md"


def python_blocks(text: str) -> list[str]:
    """The bodies of the fenced ``python`` blocks of a Markdown text, in order."""
    return re.findall(r"^```python\n(.*?)^```", text, flags=re.M | re.S)


def test_python_blocks_are_found() -> None:
    assert python_blocks("x\n```python\na = 1\n```\n```bash\nls\n```\n```python\nb = 2\n```\n") == [
        "a = 1\n",
        "b = 2\n",
    ]


def test_readme_python_examples_run(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)  # anything an example writes lands here
    blocks = python_blocks(README.read_text())
    assert len(blocks) >= 2
    namespace: dict[str, object] = {"__name__": "readme"}
    for number, block in enumerate(blocks, start=1):
        try:
            exec(compile(block, f"README.md python block {number}", "exec"), namespace)
        except Exception as error:  # pragma: no cover - the message says which block failed
            pytest.fail(f"README python block {number} failed: {type(error).__name__}: {error}\n{block}")
    assert namespace["lightning_trainer"].current_epoch == 2  # the Lightning example trained its two epochs
    trainer = namespace["trainer"]
    assert int(trainer.state.timestamp.epoch) == 4  # the last example trained its four epochs
