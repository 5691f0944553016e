"""The metrics table and metrics.json: every number shown, whatever type holds it."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from composer_dynsample.cli.plots import plot_embeddings, plot_retrievals
from composer_dynsample.cli.reporting import format_metrics_table, write_json
from composer_dynsample.metrics import retrieval_metrics


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


def test_the_table_says_how_many_queries_have_no_positive():
    # The table printed "nan" for every metric, and nothing said why.
    metrics = {"recall_at_1": float("nan"), "map_at_r": torch.tensor(float("nan"))}
    table = format_metrics_table({**metrics, "queries_without_positive": 12, "num_queries": 12}, title="t")
    assert table.splitlines()[3:] == [
        "Recall@1    n/a",
        "MAP@R       n/a",
        "n/a: none of the 12 queries has an item of its class in the gallery, so no metric can be computed.",
    ]
    some = {"recall_at_1": 0.5, "queries_without_positive": 3, "num_queries": 10}
    assert format_metrics_table(some, title="t").splitlines()[3:] == [
        "Recall@1  0.5000",
        "3 of 10 queries have no item of their class in the gallery: every metric leaves them out.",
    ]
    none_missing = {"recall_at_1": 0.5, "queries_without_positive": 0, "num_queries": 10}
    assert format_metrics_table(none_missing, title="t").splitlines()[3:] == ["Recall@1  0.5000"]


def pixels(path):
    from PIL import Image

    with Image.open(path) as image:
        return np.asarray(image.convert("RGB")).reshape(-1, 3).astype(int)


def near(rgb, colour, tolerance=12):
    return int((np.abs(rgb - np.array(colour)).max(axis=1) <= tolerance).sum())


def test_retrievals_draw_colour_images_in_colour(tmp_path):
    # Colour images were averaged to gray and drawn inverted: blue and yellow became two grays.
    blue, yellow = torch.tensor([0.0, 0.0, 1.0]), torch.tensor([1.0, 1.0, 0.0])
    images = torch.stack([blue if i % 2 else yellow for i in range(12)])[:, :, None, None].expand(
        12, 3, 16, 16
    )
    labels, embeddings = torch.arange(12) % 2, torch.randn(12, 4)
    rgb = pixels(plot_retrievals(images, labels, embeddings, tmp_path / "colour.png", num_queries=3, k=3))
    assert near(rgb, (0, 0, 255)) > 1000 and near(rgb, (255, 255, 0)) > 1000
    gray = torch.ones(12, 1, 16, 16)  # one channel is drawn as before: 1 is ink, black
    rgb = pixels(plot_retrievals(gray, labels, embeddings, tmp_path / "gray.png", num_queries=3, k=3))
    assert near(rgb, (0, 0, 0)) > 3000 and near(rgb, (0, 0, 255)) == 0


def test_plots_name_the_classes(tmp_path, monkeypatch):
    from matplotlib.axes import Axes

    shown = []
    monkeypatch.setattr(Axes, "set_ylabel", lambda self, text, **kwargs: shown.append(text))
    original_scatter = Axes.scatter
    monkeypatch.setattr(
        Axes,
        "scatter",
        lambda self, *args, **kwargs: (
            shown.append(kwargs["label"]) or original_scatter(self, *args, **kwargs)
        ),
    )
    images, labels = torch.rand(8, 3, 4, 4), torch.tensor([0, 1] * 4)
    names = ["cat", "a very long class folder name"]
    plot_retrievals(
        images, labels, torch.randn(8, 2), tmp_path / "r.png", num_queries=8, k=1, class_names=names
    )
    assert set(shown) == {"a very long class f\u2026", "cat"}
    shown.clear()
    plot_embeddings(torch.randn(8, 3), labels, tmp_path / "e.png", class_names=names)
    assert [text for text in shown if text not in ("PC 2",)] == ["cat", "a very long class f\u2026"]
    shown.clear()
    plot_retrievals(images, labels, torch.randn(8, 2), tmp_path / "n.png", num_queries=8, k=1)
    assert set(shown) == {"class 0", "class 1"}
    with pytest.raises(ValueError, match=r"class_names holds 1 names, but the labels range over \[0, 1\]"):
        plot_embeddings(torch.randn(8, 3), labels, tmp_path / "e.png", class_names=["cat"])
