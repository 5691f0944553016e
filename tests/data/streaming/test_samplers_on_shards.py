"""Every sampler on shards draws what it draws on the file: P x K, two-stream, hard-class and neighbour batches
(the last two fed by the embedding table) train labelled texts and digit features to the same weights."""

from __future__ import annotations

import pytest
import torch
import yaml

pytest.importorskip("streaming")

from composer_dynsample.cli.commands import train
from composer_dynsample.cli.main import main
from tests.cli.helpers import BAG, latest_checkpoint
from tests.data.text.helpers import write_texts

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")

SAMPLERS = {
    "pk": {"name": "pk", "classes_per_batch": 4, "samples_per_class": 2},
    "two_stream": {"name": "two_stream", "primary_batch_size": 4, "secondary_batch_size": 4},
    "hard_class_pk": {"name": "hard_class_pk", "classes_per_batch": 4, "samples_per_class": 2},
    "neighbours": {"name": "neighbours", "seeds_per_batch": 4, "negatives_per_seed": 1},
}
TEXTS = {"encoder": BAG, "loss": {"name": "triplet_margin", "margin": 0.2}}
DIGITS = {"encoder": {"name": "mlp", "hidden_dims": [16], "embedding_dim": 8}, "loss": TEXTS["loss"]}


def _config(data, model, sampler):
    table = sampler["name"] in ("hard_class_pk", "neighbours")
    return {
        "data": data,
        "model": model,
        "sampler": sampler,
        "algorithms": {"embedding_table": {}} if table else {},
        "optimizer": {"name": "adamw", "lr": 0.01},
        "trainer": {"max_duration": "2ep", "progress_bar": False},
        "evaluation": {"ks": [1]},
    }


@pytest.mark.parametrize("kind", ["texts", "digits"])
@pytest.mark.parametrize("sampler", list(SAMPLERS))
def test_each_sampler_trains_the_same_on_shards_as_on_the_file(tmp_path, kind, sampler):
    if kind == "texts":
        data = {"name": "texts", "path": str(write_texts(tmp_path / "t.csv", labels=12)), "vocab_size": 200,
                "cache_dir": str(tmp_path / "cache")}  # fmt: skip
    else:
        data = {"name": "digits"}
    model = TEXTS if kind == "texts" else DIGITS
    config = _config(data, model, SAMPLERS[sampler])
    (tmp_path / "c.yaml").write_text(yaml.safe_dump(config))
    main(["convert", str(tmp_path / "c.yaml"), "--to", "mds", str(tmp_path / "mds"), "--shard-size", "4kb"])
    shards = {"name": "streaming", "remote": str(tmp_path / "mds"), "local": str(tmp_path / "local")}
    on_file = train(config, run_dir=tmp_path / "file", quiet=True)
    on_shards = train(_config(shards, model, SAMPLERS[sampler]), run_dir=tmp_path / "shards", quiet=True)
    assert on_file["batches"] == on_shards["batches"] > 0
    want = torch.load(latest_checkpoint(tmp_path / "file"), weights_only=False)["state"]["model"]
    got = torch.load(latest_checkpoint(tmp_path / "shards"), weights_only=False)["state"]["model"]
    assert all(torch.equal(want[name], value) for name, value in got.items())
