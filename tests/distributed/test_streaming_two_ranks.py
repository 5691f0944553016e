"""Training on MDS shards (``data: {name: streaming}``) on 2 real processes over gloo: the same loss, table,
metrics and weights as the same config on the file, on both ranks; and a 2-rank run stopped mid-epoch and
resumed on 1 rank ends with the weights the file's 2-to-1 resume ends with, to the bit.

Run with ``bash tests/run_distributed.sh 2``.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from composer.utils import dist

pytest.importorskip("streaming")

from composer_dynsample.cli.commands import train
from composer_dynsample.data.streaming import convert_to_mds
from tests.cli.helpers import latest_checkpoint, pairs_data
from tests.data.streaming.helpers import mined_pairs_config, pairs_splits, run_weights, timeless
from tests.distributed._helpers import shared_tmp_dir
from tests.distributed.elastic_run import _free_port

pytestmark = [pytest.mark.world_size(2), pytest.mark.filterwarnings("ignore::UserWarning")]


def _config(data, **trainer):
    return mined_pairs_config(data, pairs_per_batch=8, workers=1, **trainer)


def _on_one_rank(config: dict, run_dir: Path) -> None:
    """``train`` of ``config`` in a fresh process that is rank 0 of 1 (how a checkpoint moves between world sizes
    here)."""
    data = config["data"]
    if data.get("name") == "streaming":  # the live 2-rank job holds its cache: another job caches apart
        config = {**config, "data": {**data, "local": data["local"] + "-one-rank"}}
    one_rank = {"WORLD_SIZE": "1", "RANK": "0", "LOCAL_RANK": "0", "LOCAL_WORLD_SIZE": "1", "NODE_RANK": "0"}
    env = {**os.environ, **one_rank, "MASTER_PORT": str(_free_port())}
    code = "import json, sys; from composer_dynsample.cli.commands import train; train(json.loads(sys.argv[1]), run_dir=sys.argv[2])"
    root = Path(__file__).resolve().parents[2]
    done = subprocess.run(
        [sys.executable, "-c", code, json.dumps(config), str(run_dir)], env=env, cwd=root, timeout=300,
        capture_output=True, text=True,
    )  # fmt: skip
    if done.returncode:
        raise RuntimeError(done.stderr[-3000:])


def test_shards_train_as_the_file_on_two_ranks_and_resume_across_world_sizes_as_the_file_does():
    folder = shared_tmp_dir(prefix="dynsample-streaming-")
    if dist.get_global_rank() == 0:
        convert_to_mds(pairs_splits(folder, count=96), folder / "mds", shard_size="4kb")
    dist.barrier()
    file_data = pairs_data(folder)
    shards = {
        "name": "streaming",
        "remote": str(folder / "mds"),
        "local": str(folder / "cache"),
    }  # one per node

    on_file = train(_config(file_data), run_dir=folder / "file")
    on_shards = train(_config(shards), run_dir=folder / "shards")
    assert on_file["world_size"] == 2 and on_file["batches"] == 12
    for key in ("batches", "mrr", "recall_at_1", "embedding_table", "eval_history"):
        assert timeless(on_file[key]) == timeless(on_shards[key]), key
    every_rank = dist.all_gather_object(timeless({key: on_shards[key] for key in ("mrr", "embedding_table")}))
    assert every_rank[0] == every_rank[1]

    for name, data in (
        ("file", file_data),
        ("shards", shards),
    ):  # 2 ranks to batch 9 (mid-epoch 1), then 1 rank
        train(_config(data, max_duration="9ba", save_interval="9ba"), run_dir=folder / f"{name}-stopped")
    box = [None]
    if dist.get_global_rank() == 0:  # its failure is reported on every rank instead of a hang
        try:
            box = [_resumed_on_one_rank(folder, file_data, shards)]
        except Exception as error:
            box = [f"the 1-rank resume failed: {error!r}"]
    dist.broadcast_object_list(box, src=0)
    assert box[0] == "same", box[0]

    box = [None]  # the reverse: 1 rank to batch 17 (mid-epoch 1 of 12 batches), then 2 ranks
    if dist.get_global_rank() == 0:
        try:
            for name, data in (("file", file_data), ("shards", shards)):
                _on_one_rank(_config(data, max_duration="17ba", save_interval="17ba"), folder / f"{name}-one")
            box = ["ok"]
        except Exception as error:
            box = [f"the 1-rank run failed: {error!r}"]
    dist.broadcast_object_list(box, src=0)
    assert box[0] == "ok", box[0]
    for name, data in (("file", file_data), ("shards", shards)):
        resumed = train(
            _config(data, load_path=latest_checkpoint(folder / f"{name}-one")), run_dir=folder / f"{name}-two"
        )
        assert resumed["world_size"] == 2
    want, got = run_weights(folder / "file-two"), run_weights(folder / "shards-two")
    assert all(torch.equal(want[name], value) for name, value in got.items()), "1-to-2 resumes differ"


def _resumed_on_one_rank(folder: Path, file_data: dict, shards: dict) -> str:
    for name, data in (("file", file_data), ("shards", shards)):
        _on_one_rank(
            _config(data, load_path=latest_checkpoint(folder / f"{name}-stopped")), folder / f"{name}-resumed"
        )
    want, got = run_weights(folder / "file-resumed"), run_weights(folder / "shards-resumed")
    metrics = [json.loads((folder / f"{n}-resumed" / "metrics.json").read_text()) for n in ("file", "shards")]
    if not all(torch.equal(want[name], value) for name, value in got.items()):
        return "the 2-to-1 resume on the shards ended with other weights than on the file"
    if (metrics[0]["mrr"], metrics[0]["batches"]) != (metrics[1]["mrr"], metrics[1]["batches"]):
        return f"the 2-to-1 resumes disagree: {metrics[0]['mrr']} {metrics[1]['mrr']}"
    return "same"
