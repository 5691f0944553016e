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


#: What a Composer user imports from the plugin, and the application packages none of it may load.
PLUGIN_IMPORT = (
    "from composer_dynsample import HardNegativeMining, SetSamplerEpoch, PKBatchSampler, TripletMarginLoss, "
    "InfoNCELoss, mined_loss, MinedBatch, CrossBatchMemory, ProgressLines, CheckpointOnInterrupt, RankingMetrics; "
    "from composer_dynsample.samplers import build_dataloader; from composer_dynsample import mining, metrics; "
    "from composer_dynsample.callbacks import *"
)
APPLICATION = ("cli", "config", "models", "export", "data.text", "testing", "algorithms.embedding_table")


def test_the_plugin_imports_alone_and_the_table_and_the_text_store_load_when_used() -> None:
    listing = "; print(' '.join(sorted(m for m in sys.modules if m.startswith('composer_dynsample'))))"
    code = (
        f"import sys; {PLUGIN_IMPORT}{listing}; import composer_dynsample; "
        f"composer_dynsample.EmbeddingTable; composer_dynsample.TextStore{listing}"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True
    )
    plugin, used = (line.split() for line in result.stdout.splitlines())
    application = [m for m in plugin if any(m.startswith(f"composer_dynsample.{app}") for app in APPLICATION)]
    assert application == [], application
    # The plugin's own modules, a few dozen (92 with the application before it was kept apart).
    assert "composer_dynsample.algorithms.hard_negative_mining.hard_negative_mining" in plugin
    assert len(plugin) <= 60, (len(plugin), plugin)
    assert "composer_dynsample.algorithms.embedding_table.embedding_table" in used
    assert "composer_dynsample.data.text.store" in used
