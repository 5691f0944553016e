"""``data: {name: streaming}`` and the model folder's default prompt: shards tokenized with other prompts than
the run's folder's default prompt are refused in one line before training, naming both; shards with prompts
train with a folder that sets no default (a note names the prompts); shards converted with the run's own
folder train on the ids the file run reads."""

from __future__ import annotations

import gc
import json
import shutil
from pathlib import Path

import numpy as np
import pytest
import yaml

pytest.importorskip("streaming")
pytest.importorskip("sentence_transformers")

from composer_dynsample.cli.commands import train
from composer_dynsample.cli.main import main
from composer_dynsample.config import load_config
from composer_dynsample.config.run import build_run
from composer_dynsample.data.streaming import close_readers
from tests.cli.helpers import one_line_error, pairs_data_without_tokenizer, write_tiny_pairs_config
from tests.data.streaming.helpers import assert_same_batches, some_batches
from tests.models.folders import save_sentence_folder

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")

PROMPTS = {"query": "query: ", "passage": "passage: "}


@pytest.fixture(autouse=True)
def _forget_readers():
    yield
    close_readers()
    gc.collect()


@pytest.fixture(scope="module")
def folders(tmp_path_factory) -> dict[str, Path]:
    """Two sentence-transformers folders of one model and tokenizer: ``plain`` declares no prompts,
    ``prompted`` E5-style ones with ``query`` as its ``default_prompt_name``."""
    root = tmp_path_factory.mktemp("models")
    plain = save_sentence_folder(root / "plain", pooling="mean", max_seq_length=16)
    prompted = Path(shutil.copytree(plain, root / "prompted"))
    settings = prompted / "config_sentence_transformers.json"
    values = json.loads(settings.read_text()) if settings.is_file() else {}
    settings.write_text(json.dumps({**values, "prompts": PROMPTS, "default_prompt_name": "query"}))
    return {"plain": plain, "prompted": prompted}


def _configs(tmp_path: Path, convert_with: Path, train_with: Path) -> tuple[str, str]:
    """``(file config, streaming config)``: the tiny pairs converted to ``tmp_path/mds`` by a run of
    ``convert_with``, and the same run of ``train_with`` on those shards."""
    model = {"encoder": {"name": "transformer", "path": str(convert_with)}, "loss": {"name": "info_nce"}}
    file_config = write_tiny_pairs_config(tmp_path, pairs_data_without_tokenizer(tmp_path), model, lr=0.001)
    main(["convert", file_config, "--to", "mds", str(tmp_path / "mds"), "--shard-size", "4kb"])
    config = yaml.safe_load(Path(file_config).read_text())
    config["model"]["encoder"]["path"] = str(train_with)
    config["data"] = {"name": "streaming", "remote": str(tmp_path / "mds"), "local": str(tmp_path / "cache")}
    streaming = tmp_path / "streaming.yaml"
    streaming.write_text(yaml.safe_dump(config))
    return file_config, str(streaming)


def test_shards_without_prompts_are_refused_for_a_folder_with_a_default_prompt(folders, tmp_path, capsys):
    _, streaming = _configs(tmp_path, folders["plain"], folders["prompted"])
    error = one_line_error(capsys, ["train", streaming, "--run-dir", str(tmp_path / "run")])
    assert "tokenized without prompts" in error and 'gives {"anchor": "query: "' in error, error
    assert "convert again with this run's model folder" in error, error
    assert not (tmp_path / "run" / "checkpoints").exists()


def test_shards_with_prompts_train_with_a_folder_without_a_default_and_a_note_says_so(folders, tmp_path):
    """Prompts chosen at conversion (a folder's default, data.prompts, prompt_names) stay the texts' when the
    run's folder sets no default prompt: nothing to disagree with, and a note names them."""
    _, streaming = _configs(tmp_path, folders["prompted"], folders["plain"])
    with pytest.warns(UserWarning, match=r'the texts carry the prompts \{"anchor": "query: "'):
        splits = build_run(load_config(streaming), tmp_path / "shards").splits
    assert splits.info.prompts == dict.fromkeys(("anchor", "positive", "negative"), "query: ")


def test_shards_converted_with_the_run_s_folder_train_on_the_file_s_token_ids(folders, tmp_path):
    file_config, streaming = _configs(tmp_path, folders["prompted"], folders["prompted"])
    on_file = build_run(load_config(file_config), tmp_path / "file").splits
    on_shards = build_run(load_config(streaming), tmp_path / "shards").splits
    assert (
        on_file.info.prompts
        == on_shards.info.prompts
        == dict.fromkeys(("anchor", "positive", "negative"), "query: ")
    )
    for want, got in ((on_file.train, on_shards.train), (on_file.test, on_shards.test)):
        assert np.array_equal(want.prompt_lengths, got.prompt_lengths)
        assert_same_batches(want, got, some_batches(len(want), count=3))
    other_cache = [f"data.local={tmp_path / 'train-cache'}"]  # the build above holds its cache's readers
    assert train(streaming, other_cache, run_dir=tmp_path / "run", quiet=True)["batches"] == 2
