"""The top-level package: every public name resolves, and the text and Lightning names import lazily."""

from __future__ import annotations

import subprocess
import sys

import composer_dynsample


def test_every_public_name_resolves_to_its_defining_object() -> None:
    for name in composer_dynsample.__all__:
        value = getattr(composer_dynsample, name)
        assert getattr(value, "__name__", name) == name, name
    assert {"TransformerEncoder", "TextStore", "RankingMetrics", "MinedNegativesPKBatchSampler"} <= set(
        dir(composer_dynsample)
    )


def test_importing_the_package_loads_neither_transformers_nor_lightning() -> None:
    code = (
        "import sys, composer_dynsample; composer_dynsample.TransformerEncoder; "
        "print(sorted(m for m in ('transformers', 'lightning', 'tokenizers') if m in sys.modules))"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True
    )
    assert result.stdout.strip() == "[]", result.stdout
