"""``composer-dynsample embed --input``: a folder of images for an image config, refused for feature vectors."""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pytest
import torch

from composer_dynsample.cli.main import main
from composer_dynsample.data import load_image_folder
from tests.cli.helpers import (
    COLOURS,
    embed_input,
    latest_checkpoint,
    train_unevaluated,
    write_colour_folder,
    write_image_config,
)

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")

DIGITS = str(Path(__file__).resolve().parents[2] / "yamls" / "digits_quick.yaml")


def test_a_folder_of_images_is_embedded_as_the_training_images(tmp_path, capsys):
    write_colour_folder(tmp_path / "flat", COLOURS)
    config = write_image_config(tmp_path, {"path": str(tmp_path / "flat"), "size": [8, 8]})
    main(["train", config, "--run-dir", str(tmp_path / "run")])
    checkpoint = latest_checkpoint(tmp_path / "run")
    (tmp_path / "inputs").mkdir()
    for name in ("red", "blue"):  # two images of 12 x 12, read at the training size 8 x 8
        shutil.copy(tmp_path / "flat" / name / "0.png", tmp_path / "inputs" / f"{name}.png")
    embed_input(config, checkpoint, tmp_path / "inputs", tmp_path / "e")
    arrays = np.load(tmp_path / "e.npz")
    assert arrays["embeddings"].shape == (2, 8) and arrays["indices"].tolist() == [0, 1]
    # The same two images embedded from the training data: the rows of blue/0.png and red/0.png.
    main(["embed", config, "--checkpoint", checkpoint, "--split", "train", "--out", str(tmp_path / "t")])
    train = np.load(tmp_path / "t.npz")
    store = load_image_folder(tmp_path / "flat", size=(8, 8)).train
    from PIL import Image

    for row, name in enumerate(("blue", "red")):  # sorted file names: blue.png, red.png
        with Image.open(tmp_path / "flat" / name / "0.png") as image:
            pixels = torch.from_numpy(np.asarray(image.convert("RGB").resize((8, 8)), dtype=np.float32) / 255)
        match = [i for i in range(len(store)) if torch.equal(store.features[i], pixels.permute(2, 0, 1))]
        np.testing.assert_allclose(arrays["embeddings"][row], train["embeddings"][match[0]], atol=1e-5)


def test_feature_vectors_take_no_input_file(tmp_path, capsys):
    config = DIGITS
    train_unevaluated(config, "1ba", tmp_path / "run")
    checkpoint = latest_checkpoint(tmp_path / "run")
    with pytest.raises(SystemExit) as stop:
        embed_input(config, checkpoint, tmp_path, tmp_path / "e")
    error = capsys.readouterr().err.strip()
    assert stop.value.code == 2 and len(error.splitlines()) == 1
    assert "'digits' holds feature vectors of shape (64,); embed one of its splits with --split" in error
