"""What ``train`` imports before its fit: the loader and encoder of its own recipe, not every recipe's
(``benchmarks/startup.py`` measures the time against torch, Composer and transformers alone)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
# The modules train imports whatever the recipe (the checked config's targets come on top).
TRAIN_PATH = (
    "composer_dynsample.cli.commands",
    "composer_dynsample.callbacks.checkpoint_on_interrupt",
    "composer_dynsample.config.run",
)
ARRAY_MODULES = (
    "composer_dynsample.data.digits",
    "composer_dynsample.data.glyphs",
    "composer_dynsample.data.images",
    "composer_dynsample.data.mnist1d",
    "composer_dynsample.models.encoders",
)
TEXT_MODULES = (
    "composer_dynsample.data.text.code_search_pairs",
    "composer_dynsample.data.text.pairs",
    "composer_dynsample.data.text.table",
    "composer_dynsample.data.text.texts",
    "composer_dynsample.models.text",
    "composer_dynsample.models.transformer",
)
PROBE = """
import json, sys
{imports}
from composer_dynsample.config import load_config
from composer_dynsample.config.checks import check_config

check_config(load_config({config!r}, []))  # imports the targets the config's sections name
print(json.dumps(sorted(name for name in {unused!r} if name in sys.modules)))
"""


@pytest.mark.timeout(180)
@pytest.mark.parametrize(
    ("config", "unused"),
    [("yamls/code_search_transformer.yaml", ARRAY_MODULES), ("yamls/mnist1d_default.yaml", TEXT_MODULES)],
    ids=["text", "mnist1d"],
)
def test_train_imports_the_data_and_encoder_modules_of_its_recipe_only(config: str, unused: tuple) -> None:
    imports = "\n".join(f"import {module}" for module in TRAIN_PATH)
    code = PROBE.format(imports=imports, config=config, unused=unused)
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=170)
    assert done.returncode == 0, done.stderr[-3000:]
    assert json.loads(done.stdout.strip().splitlines()[-1]) == []
