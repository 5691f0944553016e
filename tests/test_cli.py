"""The command line's demo: a real Composer run with PKBatchSampler and SetSamplerEpoch."""

from __future__ import annotations

import json

from composer_dynsample.cli import main


def test_demo_trains_and_writes_metrics(tmp_path):
    main(["demo", "--run-dir", str(tmp_path), "--epochs", "3"])
    metrics = json.loads((tmp_path / "metrics.json").read_text())
    # 1437 training digits in 10 classes of 139 to 146: 176 chunks of 8, so 22 batches of 8 classes.
    assert metrics["batches_per_epoch"] == 22
    assert metrics["test_accuracy"] > 0.8  # chance is 0.1; three epochs of a small MLP on digits reach ~0.9
