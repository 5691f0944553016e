"""The metrics table and metrics.json: every number shown, whatever type holds it."""

from __future__ import annotations

import json

import numpy as np
import torch

from composer_dynsample.metrics import retrieval_metrics
from composer_dynsample.reporting import format_metrics_table, write_json


def test_the_table_shows_tensor_and_numpy_numbers_and_leaves_out_the_rest():
    # retrieval_metrics returns tensors: the table used to come out empty for its output.
    metrics = retrieval_metrics(torch.tensor([[0.0], [1.0], [3.0], [4.0]]), torch.tensor([0, 0, 1, 1]))
    table = format_metrics_table(metrics, title="t")
    assert all(label in table for label in ("Recall@1", "MAP@R", "R-precision"))
    mixed = {"map_at_r": np.float32(0.5), "x": np.float64(0.25), "n": 3, "note": "text", "flag": True}
    lines = format_metrics_table(mixed, title="t").splitlines()[3:]
    assert [line.split()[-1] for line in lines] == ["0.5000", "0.2500", "3.0000"]


def test_json_takes_arrays_tensors_and_non_finite_numbers(tmp_path):
    # A numpy array raised "Object of type ndarray is not JSON serializable".
    path = tmp_path / "m.json"
    write_json(path, {"a": np.arange(3), "t": torch.tensor([1.5, float("nan")]), "inf": float("inf")})
    assert json.loads(path.read_text()) == {"a": [0, 1, 2], "t": [1.5, None], "inf": None}
    assert [p.name for p in tmp_path.iterdir()] == ["m.json"]
