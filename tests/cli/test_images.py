"""``composer-dynsample train`` on a folder of colour images: RGB in, class names and counts out."""

from __future__ import annotations

import json
import re

import numpy as np
import pytest
import torch
import yaml

from composer_dynsample.cli.main import main
from tests.cli.helpers import COLOURS, write_colour_folder, write_image_config

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")


def first_conv_in_channels(checkpoint):
    state = torch.load(checkpoint, map_location="cpu", weights_only=False)["state"]["model"]
    weights = [value for key, value in state.items() if key.endswith("weight") and value.ndim == 4]
    return weights[0].shape[1]


def near(rgb, colour, tolerance=20):
    return int((np.abs(rgb - np.array(colour)).max(axis=1) <= tolerance).sum())


def test_a_colour_folder_trains_in_rgb_and_reports_its_class_names(tmp_path, capsys):
    from PIL import Image

    write_colour_folder(tmp_path / "flat", COLOURS)
    config = write_image_config(tmp_path, {"path": str(tmp_path / "flat")})
    main(["train", config, "--run-dir", str(tmp_path / "rgb")])
    metrics = json.loads((tmp_path / "rgb" / "metrics.json").read_text())
    assert metrics["class_names"] == ["blue", "green", "red", "yellow"]
    assert metrics["queries_without_positive"] == 0 and metrics["num_queries"] == 4
    assert first_conv_in_channels(metrics["checkpoint"]) == 3
    with Image.open(tmp_path / "rgb" / "retrievals.png") as image:
        rgb = np.asarray(image.convert("RGB")).reshape(-1, 3).astype(int)
    assert near(rgb, COLOURS["blue"]) > 500 and near(rgb, COLOURS["yellow"]) > 500  # drawn in colour

    # data.grayscale and data.size reach the loader from the YAML (they were refused as unknown keys).
    main(["train", config, "data.grayscale=true", "data.size=[8,8]", "--run-dir", str(tmp_path / "gray")])
    metrics = json.loads((tmp_path / "gray" / "metrics.json").read_text())
    assert first_conv_in_channels(metrics["checkpoint"]) == 1
    saved = yaml.safe_load((tmp_path / "gray" / "config.yaml").read_text())
    assert saved["data"]["grayscale"] is True and saved["data"]["size"] == [8, 8]


def test_test_classes_missing_from_the_train_gallery_are_counted(tmp_path, capsys):
    write_colour_folder(tmp_path / "some" / "train", ["blue", "green", "red"])
    write_colour_folder(tmp_path / "some" / "test", ["blue", "yellow"], per_class=3, seed=1)
    config = write_image_config(tmp_path, {"path": str(tmp_path / "some")})
    main(["train", config, "--run-dir", str(tmp_path / "a")])
    metrics = json.loads((tmp_path / "a" / "metrics.json").read_text())
    assert metrics["queries_without_positive"] == 3 and metrics["num_queries"] == 6
    assert 0.0 <= metrics["recall_at_1"] <= 1.0  # over the 3 blue queries
    out = capsys.readouterr().out
    assert "3 of 6 queries have no item of their class in the gallery: every metric leaves them out." in out

    write_colour_folder(tmp_path / "none" / "train", ["blue", "green"])
    write_colour_folder(tmp_path / "none" / "test", ["red", "yellow"], per_class=3, seed=1)
    config = write_image_config(tmp_path, {"path": str(tmp_path / "none")})
    main(["train", config, "--run-dir", str(tmp_path / "b")])
    metrics = json.loads((tmp_path / "b" / "metrics.json").read_text())
    assert metrics["queries_without_positive"] == metrics["num_queries"] == 6
    assert metrics["recall_at_1"] is None and metrics["map_at_r"] is None
    out = capsys.readouterr().out
    assert re.search(r"^Recall@1 +n/a$", out, re.MULTILINE) and "nan" not in out
    assert (
        "n/a: none of the 6 queries has an item of its class in the gallery, so no metric can be computed."
        in out
    )
