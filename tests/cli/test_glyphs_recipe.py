"""The glyphs recipe: unseen test classes scored leave-one-out, in training and by eval."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from composer_dynsample.cli.main import main
from composer_dynsample.config import build_run, load_config
from composer_dynsample.metrics import retrieval_metrics

GLYPHS = str(Path(__file__).resolve().parents[2] / "yamls" / "glyphs_default.yaml")
SHORT = [
    "trainer.progress_bar=false",
    "trainer.max_duration=2ep",
    "trainer.save_interval=2ep",
    "evaluation.interval=2ep",
]

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")


def test_the_test_classes_are_scored_leave_one_out_not_against_the_train_gallery(tmp_path, capsys):
    run = build_run(load_config(GLYPHS, SHORT), tmp_path / "built")
    assert run.leave_one_out and run.gallery is None  # no train gallery is attached
    assert not set(run.splits.train.labels.tolist()) & set(run.splits.test.labels.tolist())
    main(["train", GLYPHS, *SHORT, "--run-dir", str(tmp_path / "run")])
    metrics = json.loads((tmp_path / "run" / "metrics.json").read_text())
    assert metrics["protocol"] == "leave-one-out among the test items"
    assert metrics["gallery_size"] == metrics["num_queries"] - 1
    assert "leave-one-out among themselves" in capsys.readouterr().out
    png = (tmp_path / "run" / "retrievals.png").read_bytes()
    assert png[:8] == b"\x89PNG\r\n\x1a\n" and len(png) > 20_000  # 8 x 6 glyph images, not a blank canvas
    # The same numbers from the saved test embeddings, leave-one-out by hand (the self-match removed).
    main(["eval", GLYPHS, "--checkpoint", str(tmp_path / "run" / "checkpoints" / "latest-rank0.pt"),
          "--out", str(tmp_path / "eval" / "eval.json")])  # fmt: skip
    assert json.loads((tmp_path / "eval" / "eval.json").read_text())["recall_at_1"] == pytest.approx(
        metrics["recall_at_1"], abs=1e-6
    )
    assert (tmp_path / "eval" / "retrievals.png").is_file()
    main(["embed", GLYPHS, "--checkpoint", str(tmp_path / "run" / "checkpoints" / "latest-rank0.pt"),
          "--out", str(tmp_path / "test.npz")])  # fmt: skip
    import numpy as np

    arrays = np.load(tmp_path / "test.npz")
    embeddings, labels = torch.from_numpy(arrays["embeddings"]), torch.from_numpy(arrays["labels"])
    distances = torch.cdist(embeddings.double(), embeddings.double()).fill_diagonal_(float("inf"))
    nearest = distances.argmin(dim=1)
    recall_at_1 = float((labels[nearest] == labels).double().mean())
    assert metrics["recall_at_1"] == pytest.approx(recall_at_1, abs=2e-3)
    assert metrics["recall_at_1"] == pytest.approx(
        float(retrieval_metrics(embeddings, labels, ks=(1,))["recall_at_1"]), abs=1e-6
    )
    assert metrics["recall_at_1"] > 0.05  # chance: 15 same-class items among about 5500 others
