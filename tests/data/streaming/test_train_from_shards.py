"""``composer-dynsample train`` on shards (``data: {name: streaming}``) against the same config on the file: the
same batches, loss, table, metrics and weights, to the bit; and a run stopped mid-epoch and resumed on the
shards (begun on the shards, or on the file) ends where the uninterrupted run on the file ends."""

from __future__ import annotations

import pytest
import torch
import yaml

pytest.importorskip("streaming")

from composer_dynsample.cli.commands import train
from composer_dynsample.cli.main import main
from tests.cli.helpers import latest_checkpoint, pairs_data
from tests.data.streaming.helpers import mined_pairs_config, run_weights, timeless
from tests.data.text.helpers import pair_rows, write_jsonl

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")


def _config(data, **trainer):
    return mined_pairs_config(data, pairs_per_batch=16, workers=2, **trainer)


def test_training_on_shards_is_training_on_the_file_and_resumes_exactly(tmp_path, capsys):
    write_jsonl(tmp_path / "train.jsonl", pair_rows(200, seed=0, negatives=True))
    write_jsonl(tmp_path / "test.jsonl", pair_rows(40, seed=1))
    file_config = _config(pairs_data(tmp_path))
    (tmp_path / "c.yaml").write_text(yaml.safe_dump(file_config))
    main(["convert", str(tmp_path / "c.yaml"), "--to", "mds", str(tmp_path / "mds"), "--shard-size", "8kb"])
    out = capsys.readouterr()
    assert "wrote 600 training and 80 test rows" in out.out and "convert: train: 600/600 rows" in out.err
    streaming = {"name": "streaming", "remote": str(tmp_path / "mds"), "local": str(tmp_path / "cache")}

    on_file = train(file_config, run_dir=tmp_path / "file")
    on_shards = train(_config(streaming), run_dir=tmp_path / "shards")
    assert on_file["batches"] == 24
    for key in ("batches", "mrr", "recall_at_1", "ndcg_at_10", "embedding_table", "eval_history"):
        assert timeless(on_file[key]) == timeless(on_shards[key]), key
    want = run_weights(tmp_path / "file")
    assert all(torch.equal(want[name], value) for name, value in run_weights(tmp_path / "shards").items())

    stopped = tmp_path / "stopped"
    train(_config(streaming, max_duration="17ba", save_interval="17ba"), run_dir=stopped)
    resumed = train(
        _config(streaming, load_path=latest_checkpoint(stopped)), run_dir=tmp_path / "resumed"
    )  # mid-epoch (12 batches an epoch): the rest of epoch 1 replays as the uninterrupted run drew it
    assert resumed["batches"] == 24 and resumed["mrr"] == on_file["mrr"]
    assert all(torch.equal(want[name], value) for name, value in run_weights(tmp_path / "resumed").items())

    # A run begun on the file continues on its shards (the data's identity is its rows, not where they live).
    train(
        _config(pairs_data(tmp_path), max_duration="17ba", save_interval="17ba"), run_dir=tmp_path / "on-file"
    )
    train(_config(streaming, load_path=latest_checkpoint(tmp_path / "on-file")), run_dir=tmp_path / "moved")
    assert all(torch.equal(want[name], value) for name, value in run_weights(tmp_path / "moved").items())
